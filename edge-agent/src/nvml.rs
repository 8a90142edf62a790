//! NVIDIA GPUs through NVML ([`NvmlProbe`]): per GPU its identity, utilisation, memory,
//! temperature, power, SM clock and slowdown threshold; XID errors since the last read (an
//! event set registered for critical XID errors, polled without blocking); volatile ECC counts;
//! current throttle reasons; retired pages and whether a retirement waits for a reset; and, on
//! GPUs with GPM (Hopper and later), SM activity, SM occupancy and DRAM bandwidth between two
//! reads (so from the second heartbeat on).
//!
//! Every optional reading the GPU or driver cannot give (`NotSupported`, or any other error of
//! that one call) is left out, never zero. A GPU that fell off the bus (`GpuLost`) is reported
//! with the identity it last had, with XID 79 once, instead of failing the whole probe.
//!
//! NVML's event set and GPM samples borrow the library handle and are not `Sync`: they live
//! on a thread of their own, which owns the handle and answers [`NvmlProbe::gpus`] over a
//! channel. Remapped rows (Ampere and later) are not read: nvml-wrapper 0.13 has no safe call
//! for `nvmlDeviceGetRemappedRows`, and the workspace forbids `unsafe`.

use crate::error::AgentError;
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, RetirementCause, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::gpm::{GpmSample, gpm_metrics_get};
use nvml_wrapper::{Device, EventSet, Nvml};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, mpsc};
use switchyard_core::gpu_model::normalize;
use switchyard_protocol::agent::{GpuHealthReport, GpuInfo, GpuProfiling};

/// XID 79: the GPU has fallen off the bus.
pub const XID_FALLEN_OFF_BUS: u32 = 79;

type Reply = mpsc::Sender<Result<Vec<GpuInfo>, AgentError>>;

/// Real GPUs through the NVIDIA management library, read on a thread of its own.
pub struct NvmlProbe {
    requests: Mutex<mpsc::Sender<Reply>>,
}

impl NvmlProbe {
    /// Loads `libnvidia-ml.so.1`; a missing driver is a clear error, never a panic.
    pub fn new() -> Result<Self, AgentError> {
        let (requests, incoming) = mpsc::channel::<Reply>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), AgentError>>();
        std::thread::Builder::new()
            .name("nvml".into())
            .spawn(move || {
                let nvml = match Nvml::init() {
                    Ok(nvml) => nvml,
                    Err(e) => {
                        let _ = ready_tx.send(Err(init_error(e)));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                let mut reader = Reader::new(&nvml);
                for reply in incoming {
                    let _ = reply.send(reader.read());
                }
            })
            .map_err(|e| AgentError::Nvml(format!("cannot start the NVML thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(NvmlProbe {
                requests: Mutex::new(requests),
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(AgentError::Nvml("the NVML thread ended at start".into())),
        }
    }
}

fn init_error(e: NvmlError) -> AgentError {
    match e {
        NvmlError::LibloadingError(e) => AgentError::NoDriver(e.to_string()),
        NvmlError::DriverNotLoaded => AgentError::DriverNotLoaded,
        e => AgentError::Nvml(e.to_string()),
    }
}

impl crate::inventory::GpuProbe for NvmlProbe {
    fn gpus(&self) -> Result<Vec<GpuInfo>, AgentError> {
        let (tx, rx) = mpsc::channel();
        self.requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .send(tx)
            .map_err(|_| AgentError::Nvml("the NVML thread has ended".into()))?;
        rx.recv()
            .map_err(|_| AgentError::Nvml("the NVML thread has ended".into()))?
    }

    fn simulated(&self) -> bool {
        false
    }
}

/// What the NVML thread keeps between reads.
struct Reader<'n> {
    nvml: &'n Nvml,
    /// Registered for critical XID errors on every GPU that supports them.
    events: Option<EventSet<'n>>,
    /// Per GPU index: the last GPM sample (GPUs with GPM only).
    gpm: BTreeMap<u32, GpmSample<'n>>,
    /// Per GPU index: whether it has GPM (asked once).
    gpm_support: BTreeMap<u32, bool>,
    /// Per GPU index: its identity when last read, for when it is lost.
    known: BTreeMap<u32, GpuInfo>,
    /// GPUs already reported lost (their XID 79 went out).
    lost: BTreeSet<u32>,
}

impl<'n> Reader<'n> {
    fn new(nvml: &'n Nvml) -> Self {
        let events = register_xid_events(nvml);
        Reader {
            nvml,
            events,
            gpm: BTreeMap::new(),
            gpm_support: BTreeMap::new(),
            known: BTreeMap::new(),
            lost: BTreeSet::new(),
        }
    }

    fn read(&mut self) -> Result<Vec<GpuInfo>, AgentError> {
        let nvml_err = |e: NvmlError| AgentError::Nvml(e.to_string());
        let count = self.nvml.device_count().map_err(nvml_err)?;
        let mut xids = self.poll_xids();
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            let read = self
                .nvml
                .device_by_index(index)
                .and_then(|device| self.read_device(index, &device));
            match read {
                Ok(mut gpu) => {
                    self.lost.remove(&index);
                    if let Some(codes) = xids.remove(&index) {
                        gpu.health
                            .get_or_insert_with(GpuHealthReport::default)
                            .xid_events
                            .extend(codes);
                    }
                    self.known.insert(index, identity(&gpu));
                    gpus.push(gpu);
                }
                Err(NvmlError::GpuLost) => gpus.push(self.lost_gpu(index)),
                Err(e) => return Err(nvml_err(e)),
            }
        }
        Ok(gpus)
    }

    /// A GPU that fell off the bus: its last identity, XID 79 the first time.
    fn lost_gpu(&mut self, index: u32) -> GpuInfo {
        let mut gpu = self.known.get(&index).cloned().unwrap_or_else(|| GpuInfo {
            index,
            uuid: format!("GPU-lost-{index}"),
            model: "unknown".into(),
            vendor: Some("nvidia".into()),
            ..GpuInfo::default()
        });
        let first = self.lost.insert(index);
        if first {
            tracing::error!(gpu = index, uuid = %gpu.uuid, "GPU has fallen off the bus");
            gpu.health = Some(GpuHealthReport {
                xid_events: vec![XID_FALLEN_OFF_BUS],
                ..GpuHealthReport::default()
            });
        }
        self.gpm.remove(&index);
        gpu
    }

    /// The XIDs raised since the last read, by GPU index; never blocks.
    fn poll_xids(&mut self) -> BTreeMap<u32, Vec<u32>> {
        let mut found: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        let Some(set) = &self.events else {
            return found;
        };
        // Bounded: a storm of events is read over several heartbeats.
        for _ in 0..256 {
            match set.wait(0) {
                Ok(event) => {
                    if !event.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                        continue;
                    }
                    let Ok(index) = event.device.index() else {
                        continue;
                    };
                    match event.event_data {
                        Some(XidError::Value(code)) => found
                            .entry(index)
                            .or_default()
                            .push(u32::try_from(code).unwrap_or(u32::MAX)),
                        _ => tracing::warn!(gpu = index, "an XID error of unknown code"),
                    }
                }
                Err(NvmlError::Timeout) => break,
                Err(NvmlError::GpuLost) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "polling NVML XID events failed");
                    break;
                }
            }
        }
        found
    }

    fn read_device(&mut self, index: u32, device: &Device<'n>) -> Result<GpuInfo, NvmlError> {
        let name = device.name()?;
        let uuid = device.uuid()?;
        let memory = device.memory_info()?;
        // Decimal GB for the model's memory variant: an "80GB" card reports 79–80 GiB, which
        // must still name the 80 GB variant.
        let memory_gb = u32::try_from((memory.total + 500_000_000) / 1_000_000_000).ok();
        let mut lost = false;
        let utilization_pct = optional(device.utilization_rates(), &mut lost).map(|u| u.gpu);
        let temperature_c = optional(device.temperature(TemperatureSensor::Gpu), &mut lost);
        let power_w = optional(device.power_usage(), &mut lost).map(|mw| f64::from(mw) / 1000.0);
        let sm_clock_mhz = optional(device.clock_info(Clock::SM), &mut lost);
        let slowdown_temp_c = optional(
            device.temperature_threshold(TemperatureThreshold::Slowdown),
            &mut lost,
        );
        let health = self.health(device, &mut lost);
        let profiling = self.profiling(index, device, &mut lost);
        if lost {
            return Err(NvmlError::GpuLost);
        }
        Ok(GpuInfo {
            index,
            uuid,
            model: normalize(&name, memory_gb),
            memory_mb: memory.total / (1024 * 1024),
            memory_used_mb: Some(memory.used / (1024 * 1024)),
            utilization_pct,
            temperature_c,
            power_w,
            vendor: Some("nvidia".into()),
            sm_clock_mhz,
            slowdown_temp_c,
            profiling,
            health,
        })
    }

    fn health(&self, device: &Device<'n>, lost: &mut bool) -> Option<GpuHealthReport> {
        let ecc = |kind| device.total_ecc_errors(kind, EccCounter::Volatile);
        let ecc_corrected_volatile = optional(ecc(MemoryError::Corrected), lost);
        let ecc_uncorrected_volatile = optional(ecc(MemoryError::Uncorrected), lost);
        let throttle_reasons = optional(device.current_throttle_reasons(), lost)
            .map(throttle_names)
            .unwrap_or_default();
        let retired = [
            RetirementCause::MultipleSingleBitEccErrors,
            RetirementCause::DoubleBitEccError,
        ]
        .map(|cause| optional(device.retired_pages(cause), lost).map(|p| p.len() as u64));
        let retired_pages = match retired {
            [None, None] => None,
            [a, b] => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        let reset_required = optional(device.are_pages_pending_retired(), lost).unwrap_or(false);
        let health = GpuHealthReport {
            xid_events: Vec::new(),
            ecc_corrected_volatile,
            ecc_uncorrected_volatile,
            throttle_reasons,
            retired_pages,
            reset_required,
        };
        (health != GpuHealthReport::default()).then_some(health)
    }

    /// GPM metrics between the last sample and one taken now; `None` on the first read and
    /// on GPUs without GPM.
    fn profiling(
        &mut self,
        index: u32,
        device: &Device<'n>,
        lost: &mut bool,
    ) -> Option<GpuProfiling> {
        let supported = *self
            .gpm_support
            .entry(index)
            .or_insert_with(|| device.gpm_support().unwrap_or(false));
        if !supported {
            return None;
        }
        let sample = optional(device.gpm_sample(), lost)?;
        let previous = self.gpm.insert(index, sample)?;
        let current = self.gpm.get(&index)?;
        let metrics = [
            GpmMetricId::SmUtil,
            GpmMetricId::SmOccupancy,
            GpmMetricId::DramBwUtil,
        ];
        let results = optional(
            gpm_metrics_get(self.nvml, &previous, current, &metrics),
            lost,
        )?;
        let value = |i: usize| {
            results
                .get(i)
                .and_then(|r| r.as_ref().ok())
                .map(|m| m.value)
                .filter(|v| v.is_finite() && (0.0..=100.0).contains(v))
        };
        let profiling = GpuProfiling {
            sm_active_pct: value(0),
            sm_occupancy_pct: value(1),
            dram_active_pct: value(2),
        };
        (profiling != GpuProfiling::default()).then_some(profiling)
    }
}

/// A GPU's identity, without readings: what is reported once it is lost.
fn identity(gpu: &GpuInfo) -> GpuInfo {
    GpuInfo {
        index: gpu.index,
        uuid: gpu.uuid.clone(),
        model: gpu.model.clone(),
        memory_mb: gpu.memory_mb,
        vendor: gpu.vendor.clone(),
        slowdown_temp_c: gpu.slowdown_temp_c,
        ..GpuInfo::default()
    }
}

/// An optional reading: left out on any error; `GpuLost` also marks the GPU lost.
fn optional<T>(result: Result<T, NvmlError>, lost: &mut bool) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(NvmlError::GpuLost) => {
            *lost = true;
            None
        }
        Err(NvmlError::NotSupported) => None,
        Err(e) => {
            tracing::debug!(error = %e, "an NVML reading failed; left out");
            None
        }
    }
}

/// An event set registered for critical XID errors on every GPU that raises them; `None`
/// when none does (or NVML cannot make one).
fn register_xid_events(nvml: &Nvml) -> Option<EventSet<'_>> {
    let count = nvml.device_count().ok()?;
    let mut set = nvml.create_event_set().ok()?;
    let mut registered = 0;
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        let supported = device
            .supported_event_types()
            .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
        if !supported {
            continue;
        }
        match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                set = s;
                registered += 1;
            }
            Err(e) => {
                // The set is gone with the error: start again without this GPU's events.
                tracing::warn!(gpu = index, error = %e.error, "cannot watch this GPU's XID errors");
                set = nvml.create_event_set().ok()?;
                registered = 0;
            }
        }
    }
    (registered > 0).then_some(set)
}

/// Throttle reasons as the snake-case names heartbeats carry.
pub fn throttle_names(reasons: ThrottleReasons) -> Vec<String> {
    const NAMES: [(ThrottleReasons, &str); 9] = [
        (ThrottleReasons::GPU_IDLE, "gpu_idle"),
        (
            ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
            "applications_clocks_setting",
        ),
        (ThrottleReasons::SW_POWER_CAP, "sw_power_cap"),
        (ThrottleReasons::HW_SLOWDOWN, "hw_slowdown"),
        (ThrottleReasons::SYNC_BOOST, "sync_boost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw_thermal_slowdown"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw_thermal_slowdown"),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            "hw_power_brake_slowdown",
        ),
        (
            ThrottleReasons::DISPLAY_CLOCK_SETTING,
            "display_clock_setting",
        ),
    ];
    NAMES
        .iter()
        .filter(|(flag, _)| !flag.is_empty() && reasons.contains(*flag))
        .map(|(_, name)| (*name).to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_reasons_are_snake_case_names() {
        assert!(throttle_names(ThrottleReasons::NONE).is_empty());
        assert_eq!(
            throttle_names(ThrottleReasons::HW_THERMAL_SLOWDOWN | ThrottleReasons::SW_POWER_CAP),
            vec!["sw_power_cap", "hw_thermal_slowdown"]
        );
    }

    #[test]
    fn optional_readings_are_left_out_and_a_lost_gpu_is_noticed() {
        let mut lost = false;
        assert_eq!(
            optional::<u32>(Err(NvmlError::NotSupported), &mut lost),
            None
        );
        assert!(!lost);
        assert_eq!(optional::<u32>(Err(NvmlError::Unknown), &mut lost), None);
        assert!(!lost);
        assert_eq!(optional(Ok(3u32), &mut lost), Some(3));
        assert_eq!(optional::<u32>(Err(NvmlError::GpuLost), &mut lost), None);
        assert!(lost);
    }
}
