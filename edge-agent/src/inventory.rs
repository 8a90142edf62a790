//! What this machine offers: GPUs (from NVML, or simulated with `--fake-gpus`), CPUs and memory.
//! A [`GpuProbe`] is read once at enrolment and again on every heartbeat (NVML metrics change).
//! Probing blocks (NVML calls into the driver); callers run it off the async executor.

use crate::args::GpuDeclaration;
use crate::error::AgentError;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::error::NvmlError;
use switchyard_core::gpu_model::normalize;
use switchyard_protocol::agent::{GpuInfo, Inventory};
use uuid::Uuid;

/// A source of GPU facts.
pub trait GpuProbe: Send + Sync {
    /// The GPUs now, with whatever metrics the source has.
    fn gpus(&self) -> Result<Vec<GpuInfo>, AgentError>;
    /// True when the GPUs are declared rather than real.
    fn simulated(&self) -> bool;
}

/// GPUs declared with `--fake-gpus`: no metrics, uuids stable for one agent name.
#[derive(Debug)]
pub struct FakeProbe {
    gpus: Vec<GpuInfo>,
}

impl FakeProbe {
    /// `agent_name` seeds the uuids so that several simulated agents on one machine report
    /// distinct GPUs, and a restarted agent reports the same ones.
    pub fn new(declarations: &[GpuDeclaration], agent_name: &str) -> Self {
        let models = declarations
            .iter()
            .flat_map(|d| (0..d.count).map(move |_| d));
        let gpus = models
            .enumerate()
            .map(|(i, d)| {
                let index = u32::try_from(i).unwrap_or(u32::MAX);
                GpuInfo {
                    index,
                    uuid: fake_uuid(agent_name, index),
                    model: d.model.clone(),
                    memory_mb: u64::from(d.memory_gb) * 1024,
                    memory_used_mb: None,
                    utilization_pct: None,
                    temperature_c: None,
                    power_w: None,
                    ..GpuInfo::default()
                }
            })
            .collect();
        FakeProbe { gpus }
    }
}

impl GpuProbe for FakeProbe {
    fn gpus(&self) -> Result<Vec<GpuInfo>, AgentError> {
        Ok(self.gpus.clone())
    }

    fn simulated(&self) -> bool {
        true
    }
}

/// `GPU-` plus a uuid derived from the agent name and the index (FNV-1a, two seeds).
fn fake_uuid(agent_name: &str, index: u32) -> String {
    let hash = |seed: u64| {
        let mut h = seed;
        for b in agent_name.bytes().chain(index.to_le_bytes()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    };
    let id = Uuid::from_u64_pair(hash(0xcbf2_9ce4_8422_2325), hash(0x8422_2325_cbf2_9ce4));
    format!("GPU-{id}")
}

/// Real GPUs through the NVIDIA management library.
pub struct NvmlProbe {
    nvml: Nvml,
}

impl NvmlProbe {
    /// Loads `libnvidia-ml.so.1`; a missing driver is a clear error, never a panic.
    pub fn new() -> Result<Self, AgentError> {
        match Nvml::init() {
            Ok(nvml) => Ok(NvmlProbe { nvml }),
            Err(NvmlError::LibloadingError(e)) => Err(AgentError::NoDriver(e.to_string())),
            Err(NvmlError::DriverNotLoaded) => Err(AgentError::DriverNotLoaded),
            Err(e) => Err(AgentError::Nvml(e.to_string())),
        }
    }
}

impl GpuProbe for NvmlProbe {
    fn gpus(&self) -> Result<Vec<GpuInfo>, AgentError> {
        let nvml_err = |e: NvmlError| AgentError::Nvml(e.to_string());
        let count = self.nvml.device_count().map_err(nvml_err)?;
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            let device = self.nvml.device_by_index(index).map_err(nvml_err)?;
            let name = device.name().map_err(nvml_err)?;
            let memory = device.memory_info().map_err(nvml_err)?;
            // Decimal GB for the model's memory variant: an "80GB" card reports 79–80 GiB,
            // which must still name the 80 GB variant.
            let memory_gb = u32::try_from((memory.total + 500_000_000) / 1_000_000_000).ok();
            gpus.push(GpuInfo {
                index,
                uuid: device.uuid().map_err(nvml_err)?,
                model: normalize(&name, memory_gb),
                memory_mb: memory.total / (1024 * 1024),
                memory_used_mb: Some(memory.used / (1024 * 1024)),
                // Metrics some GPUs do not support are left out rather than failing the probe.
                utilization_pct: device.utilization_rates().ok().map(|u| u.gpu),
                temperature_c: device.temperature(TemperatureSensor::Gpu).ok(),
                power_w: device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                ..GpuInfo::default()
            });
        }
        Ok(gpus)
    }

    fn simulated(&self) -> bool {
        false
    }
}

/// The probe the flags ask for: declared GPUs, or NVML.
pub fn probe_for(
    declarations: &[GpuDeclaration],
    agent_name: &str,
) -> Result<Box<dyn GpuProbe>, AgentError> {
    if declarations.is_empty() {
        Ok(Box::new(NvmlProbe::new()?))
    } else {
        Ok(Box::new(FakeProbe::new(declarations, agent_name)))
    }
}

/// The full inventory: GPUs from the probe, CPUs and memory from the OS, and whether jobs run
/// isolated (see [`crate::isolation`]).
pub fn inventory(probe: &dyn GpuProbe, isolation: bool) -> Result<Inventory, AgentError> {
    Ok(Inventory {
        gpus: probe.gpus()?,
        cpus: std::thread::available_parallelism()
            .map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX)),
        memory_mb: std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| mem_total_mb(&m))
            .unwrap_or(0),
        simulated: probe.simulated(),
        isolation,
    })
}

/// `MemTotal` of `/proc/meminfo`, in MiB.
fn mem_total_mb(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

/// `CUDA_VISIBLE_DEVICES` for a lease's GPU indexes: `0,1,3`; empty hides every GPU.
pub fn cuda_visible_devices(gpus: &[u32]) -> String {
    gpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn decl(s: &str) -> GpuDeclaration {
        s.parse().unwrap()
    }

    #[test]
    fn fake_gpus_become_an_inventory() {
        let probe = FakeProbe::new(&[decl("2xL4"), decl("1xA100-80GB")], "node-a");
        let inv = inventory(&probe, false).unwrap();
        assert!(inv.simulated);
        assert!(!inv.isolation);
        assert!(inventory(&probe, true).unwrap().isolation);
        let got: Vec<(u32, &str, u64)> = inv
            .gpus
            .iter()
            .map(|g| (g.index, g.model.as_str(), g.memory_mb))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, "L4", 24 * 1024),
                (1, "L4", 24 * 1024),
                (2, "A100-80GB", 80 * 1024)
            ]
        );
        assert!(inv.cpus >= 1);
        assert!(inv.memory_mb > 0);
        assert!(
            inv.gpus
                .iter()
                .all(|g| g.utilization_pct.is_none() && g.uuid.starts_with("GPU-"))
        );
    }

    #[test]
    fn fake_uuids_are_stable_per_agent_and_distinct_across_agents() {
        let a1 = FakeProbe::new(&[decl("2xH100")], "a").gpus().unwrap();
        let a2 = FakeProbe::new(&[decl("2xH100")], "a").gpus().unwrap();
        let b = FakeProbe::new(&[decl("2xH100")], "b").gpus().unwrap();
        assert_eq!(a1, a2);
        assert_ne!(a1[0].uuid, a1[1].uuid);
        assert_ne!(a1[0].uuid, b[0].uuid);
    }

    #[test]
    fn cuda_visible_devices_joins_indexes() {
        let cases: &[(&[u32], &str)] = &[
            (&[], ""),
            (&[0], "0"),
            (&[0, 1, 3], "0,1,3"),
            (&[7, 2], "7,2"),
        ];
        for (gpus, want) in cases {
            assert_eq!(cuda_visible_devices(gpus), *want);
        }
    }

    #[test]
    fn reads_mem_total() {
        assert_eq!(
            mem_total_mb("MemTotal:       24576000 kB\nMemFree: 1 kB\n"),
            Some(24000)
        );
        assert_eq!(mem_total_mb("nothing"), None);
    }

    /// Runs where an NVIDIA driver is present (`SWITCHYARD_TEST_NVML=1`: then every GPU must
    /// report utilisation, memory used, temperature and power); elsewhere checks the error
    /// says what to do.
    #[test]
    fn nvml_probe_reads_gpus_or_explains() {
        match NvmlProbe::new() {
            Ok(probe) => {
                let gpus = probe.gpus().unwrap();
                assert!(!gpus.is_empty());
                assert!(gpus.iter().all(|g| g.memory_mb > 0 && !g.model.is_empty()));
                if std::env::var_os("SWITCHYARD_TEST_NVML").is_some() {
                    // What heartbeats report and `/metrics` exports as DCGM_FI_DEV_*.
                    for g in &gpus {
                        assert!(g.utilization_pct.is_some_and(|u| u <= 100), "{g:?}");
                        assert!(g.memory_used_mb.is_some_and(|m| m <= g.memory_mb), "{g:?}");
                        assert!(g.temperature_c.is_some_and(|t| t > 0), "{g:?}");
                        assert!(g.power_w.is_some_and(|p| p > 0.0), "{g:?}");
                    }
                    eprintln!("NVML reported: {gpus:#?}");
                }
            }
            Err(e) => {
                assert!(
                    std::env::var_os("SWITCHYARD_TEST_NVML").is_none(),
                    "NVML expected: {e}"
                );
                assert!(e.to_string().contains("--fake-gpus"), "{e}");
            }
        }
    }
}
