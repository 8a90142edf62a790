//! GPU health: which of a node's GPUs are unhealthy, and why, from what its heartbeats say; and
//! which telemetry readings are physically impossible (dropped before anything stores them).
//!
//! A GPU is marked unhealthy for
//! - a **fatal XID** ([`fatal_xid`]): an error after which NVIDIA's XID catalogue
//!   (<https://docs.nvidia.com/deploy/xid-errors/>, "Xid catalog", the immediate action column)
//!   says the GPU must be reset, the node rebooted or the board replaced before it is trusted
//!   again;
//! - **uncorrectable ECC errors**: a volatile uncorrectable count above zero, or the driver
//!   saying a reset is required (a row remapping failed or waits for one);
//! - **overheating**: a temperature at or above its slowdown threshold (NVML's figure in the
//!   heartbeat; absent, [`DEFAULT_SLOWDOWN_C`]).
//!
//! XID and ECC marks are sticky: the error is in the past and the GPU stays suspect until an
//! operator has looked (undrain clears them; an ECC count that is still above zero, which only a
//! reset clears, marks the GPU again on the next heartbeat). An overheat mark clears itself once
//! the GPU is back under its threshold less [`HYSTERESIS_C`]. The agent repeats an XID in every
//! heartbeat until one is answered, so a mark already held is never added twice.
//!
//! What the broker does with the marks (not here): the scheduler's snapshot leaves marked GPUs
//! out of their node's free set (`control/scheduler.rs`), a job on a GPU that fell off the bus
//! (XID 79) is requeued (`store/sql/nodes.rs` `apply_gpu_health`): its process cannot be making
//! progress. Other marks leave running work alone: the GPU may still finish it (an overheating
//! GPU only slows down; an ECC error already hit the application, which fails by itself if it
//! must), and a job's own checkpoints are worth more than a blind restart. The burst controller
//! replaces a cloud instance with a sticky mark (`control/burst.rs`).
//!
//! Pure: no I/O, time is an argument.

use serde::{Deserialize, Serialize};
use switchyard_core::GpuSet;
use switchyard_protocol::agent::{GpuInfo, Inventory};

/// The slowdown temperature assumed when the agent reports none (°C): at or below the slowdown
/// thresholds NVML reports for data-centre GPUs (about 87–95 °C on A100, H100 and L4).
pub const DEFAULT_SLOWDOWN_C: u32 = 90;
/// How far under its threshold an overheated GPU must cool before its mark clears (°C): a GPU
/// hovering at the threshold does not flap in and out of placement.
pub const HYSTERESIS_C: u32 = 5;

/// Why a GPU is marked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkKind {
    Xid,
    Ecc,
    Overheat,
}

/// One reason a GPU is unhealthy, as stored with its node (`nodes.gpu_marks_json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuMark {
    pub gpu: u32,
    pub kind: MarkKind,
    /// The XID, for [`MarkKind::Xid`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid: Option<u32>,
    /// A sentence for operators: "GPU 2 fell off the bus (XID 79)".
    pub reason: String,
    /// When it was marked, milliseconds since the epoch.
    pub since: i64,
}

impl GpuMark {
    /// Stays until an operator clears it (undrain).
    pub fn sticky(&self) -> bool {
        self.kind != MarkKind::Overheat
    }
}

/// The XID meaning the GPU fell off the bus: its work cannot be making progress.
pub const XID_FELL_OFF_THE_BUS: u32 = 79;

/// What a fatal XID means, as the end of "GPU n …"; `None` for an XID that does not make the
/// GPU unhealthy.
///
/// Chosen from NVIDIA's XID catalogue, the errors whose immediate action is a GPU reset, a node
/// reboot or a board replacement:
/// 48 (double-bit ECC error), 62 (internal micro-controller halt), 64 (a page retirement or row
/// remapping could not be recorded), 74 (NVLink error), 79 (fallen off the bus), 94 and 95
/// (contained and uncontained ECC errors: the memory row is bad until a reset remaps it), 119 and
/// 120 (GSP timeout and error: the GPU's firmware stopped answering), 140 (unrecovered ECC
/// error) and 154 (the driver says a reset or reboot is required).
/// Left out: application faults (13, 31, 43, 45: the job's bug, not the GPU's), 61 (a
/// micro-controller warning, often benign), 63 (a row remapping recorded: the GPU works, and
/// `reset_required` says when it must be reset) and 92 (a high corrected-error rate: a
/// warning).
pub fn fatal_xid(xid: u32) -> Option<&'static str> {
    Some(match xid {
        48 => "had a double-bit ECC error",
        62 => "halted its internal micro-controller",
        64 => "could not record a page retirement or row remapping",
        74 => "has an NVLink error",
        79 => "fell off the bus",
        94 => "had a contained ECC error",
        95 => "had an uncontained ECC error",
        119 => "stopped answering (GSP timeout)",
        120 => "had a GSP firmware error",
        140 => "had an unrecovered ECC error",
        154 => "needs a reset (the driver's recovery action)",
        _ => return None,
    })
}

/// The temperature at which `gpu` counts as overheating.
pub fn slowdown_c(gpu: &GpuInfo) -> u32 {
    gpu.slowdown_temp_c
        .filter(|t| (1..=MAX_TEMPERATURE_C).contains(t))
        .unwrap_or(DEFAULT_SLOWDOWN_C)
}

fn holds(marks: &[GpuMark], gpu: u32, kind: MarkKind, xid: Option<u32>) -> bool {
    marks
        .iter()
        .any(|m| m.gpu == gpu && m.kind == kind && (kind != MarkKind::Xid || m.xid == xid))
}

fn ecc_bad(gpu: &GpuInfo) -> bool {
    gpu.health
        .as_ref()
        .is_some_and(|h| h.ecc_uncorrected_volatile.is_some_and(|n| n > 0) || h.reset_required)
}

fn overheats(gpu: &GpuInfo) -> bool {
    gpu.temperature_c.is_some_and(|t| t >= slowdown_c(gpu))
}

/// An overheat mark on `gpu` that may go: the GPU reports a temperature back under its
/// threshold less the hysteresis. (A GPU that reports no temperature keeps its mark.)
fn cooled(gpu: &GpuInfo) -> bool {
    gpu.temperature_c
        .is_some_and(|t| t + HYSTERESIS_C < slowdown_c(gpu))
}

/// Whether `gpus` change `marks` at all. Every heartbeat passes here: allocates nothing.
pub fn changes(gpus: &[GpuInfo], marks: &[GpuMark]) -> bool {
    gpus.iter().any(|g| {
        let new_xid = g.health.as_ref().is_some_and(|h| {
            h.xid_events
                .iter()
                .any(|&x| fatal_xid(x).is_some() && !holds(marks, g.index, MarkKind::Xid, Some(x)))
        });
        let overheat = holds(marks, g.index, MarkKind::Overheat, None);
        new_xid
            || (ecc_bad(g) && !holds(marks, g.index, MarkKind::Ecc, None))
            || (!overheat && overheats(g))
            || (overheat && cooled(g))
    })
}

/// A node's marks after a heartbeat.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assessment {
    /// The node's marks now, by GPU, kind and XID.
    pub marks: Vec<GpuMark>,
    /// GPUs newly marked as fallen off the bus: their work is requeued.
    pub fell_off: Vec<u32>,
}

/// The marks a heartbeat's `gpus` leave the node with, from `marks`; `None` when nothing
/// changes (the common case, decided without allocating).
pub fn assess(gpus: &[GpuInfo], marks: &[GpuMark], now_ms: i64) -> Option<Assessment> {
    if !changes(gpus, marks) {
        return None;
    }
    let mut out = Assessment {
        marks: marks
            .iter()
            .filter(|m| {
                m.kind != MarkKind::Overheat || !gpus.iter().any(|g| g.index == m.gpu && cooled(g))
            })
            .cloned()
            .collect(),
        fell_off: Vec::new(),
    };
    for g in gpus {
        let n = g.index;
        if let Some(h) = &g.health {
            for &x in &h.xid_events {
                if let Some(what) = fatal_xid(x)
                    && !holds(&out.marks, n, MarkKind::Xid, Some(x))
                {
                    out.marks.push(GpuMark {
                        gpu: n,
                        kind: MarkKind::Xid,
                        xid: Some(x),
                        reason: format!("GPU {n} {what} (XID {x})"),
                        since: now_ms,
                    });
                    if x == XID_FELL_OFF_THE_BUS {
                        out.fell_off.push(n);
                    }
                }
            }
            if ecc_bad(g) && !holds(&out.marks, n, MarkKind::Ecc, None) {
                let reason = match h.ecc_uncorrected_volatile {
                    Some(c) if c > 0 => format!(
                        "GPU {n} has {c} uncorrectable ECC error{} since its driver loaded",
                        if c == 1 { "" } else { "s" }
                    ),
                    _ => format!(
                        "GPU {n} needs a reset (a memory row remapping is pending or failed)"
                    ),
                };
                out.marks.push(GpuMark {
                    gpu: n,
                    kind: MarkKind::Ecc,
                    xid: None,
                    reason,
                    since: now_ms,
                });
            }
        }
        if overheats(g) && !holds(&out.marks, n, MarkKind::Overheat, None) {
            out.marks.push(GpuMark {
                gpu: n,
                kind: MarkKind::Overheat,
                xid: None,
                reason: format!(
                    "GPU {n} is at {} °C, at or above its slowdown threshold of {} °C",
                    g.temperature_c.unwrap_or_default(),
                    slowdown_c(g)
                ),
                since: now_ms,
            });
        }
    }
    out.marks.sort_by_key(|m| (m.gpu, m.kind, m.xid));
    out.fell_off.sort_unstable();
    out.fell_off.dedup();
    Some(out)
}

/// The GPUs `marks` make unhealthy.
pub fn unhealthy(marks: &[GpuMark]) -> GpuSet {
    let mut set = GpuSet::EMPTY;
    for m in marks {
        set.insert(m.gpu);
    }
    set
}

/// The reasons GPU `gpu` is unhealthy (empty: healthy).
pub fn reasons(marks: &[GpuMark], gpu: u32) -> Vec<String> {
    marks
        .iter()
        .filter(|m| m.gpu == gpu)
        .map(|m| m.reason.clone())
        .collect()
}

/// The first sticky mark: a cloud instance with one is replaced.
pub fn first_sticky(marks: &[GpuMark]) -> Option<&GpuMark> {
    marks.iter().find(|m| m.sticky())
}

/// Marks as stored: `None` for none.
pub fn to_json(marks: &[GpuMark]) -> Option<String> {
    if marks.is_empty() {
        None
    } else {
        serde_json::to_string(marks).ok()
    }
}

// ---- Telemetry sanity ----------------------------------------------------------------------

/// A GPU's temperature, at most, for a reading to be believed (°C).
pub const MAX_TEMPERATURE_C: u32 = 150;
/// A GPU's power draw, at most (W): above the largest boards' (about 1,200 W).
pub const MAX_POWER_W: f64 = 2000.0;
/// An SM clock, at most (MHz): no GPU clocks near it.
pub const MAX_SM_CLOCK_MHZ: u32 = 5000;

/// Sets every reading of `inventory` that is out of physical range (a percentage outside
/// 0–100, a temperature outside 0–150 °C, power outside 0–2,000 W or not finite, memory used
/// above the total, an SM clock above 5,000 MHz) to absent, calling `dropped` with the field's
/// name once per reading dropped. A broken sensor or a hostile agent then shows no figure
/// rather than a wrong one. Allocates nothing.
pub fn drop_out_of_range(inventory: &mut Inventory, mut dropped: impl FnMut(&'static str)) {
    fn pct(v: &mut Option<f64>, field: &'static str, dropped: &mut impl FnMut(&'static str)) {
        if v.is_some_and(|p| !(p.is_finite() && (0.0..=100.0).contains(&p))) {
            *v = None;
            dropped(field);
        }
    }
    for g in &mut inventory.gpus {
        if g.utilization_pct.is_some_and(|u| u > 100) {
            g.utilization_pct = None;
            dropped("utilization_pct");
        }
        if g.temperature_c.is_some_and(|t| t > MAX_TEMPERATURE_C) {
            g.temperature_c = None;
            dropped("temperature_c");
        }
        if g.slowdown_temp_c.is_some_and(|t| t > MAX_TEMPERATURE_C) {
            g.slowdown_temp_c = None;
            dropped("slowdown_temp_c");
        }
        if g.power_w
            .is_some_and(|p| !(p.is_finite() && (0.0..=MAX_POWER_W).contains(&p)))
        {
            g.power_w = None;
            dropped("power_w");
        }
        if g.memory_used_mb.is_some_and(|used| used > g.memory_mb) {
            g.memory_used_mb = None;
            dropped("memory_used_mb");
        }
        if g.sm_clock_mhz.is_some_and(|c| c > MAX_SM_CLOCK_MHZ) {
            g.sm_clock_mhz = None;
            dropped("sm_clock_mhz");
        }
        if let Some(p) = &mut g.profiling {
            pct(&mut p.sm_active_pct, "sm_active_pct", &mut dropped);
            pct(&mut p.sm_occupancy_pct, "sm_occupancy_pct", &mut dropped);
            pct(&mut p.dram_active_pct, "dram_active_pct", &mut dropped);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use switchyard_protocol::agent::{GpuHealthReport, GpuProfiling};

    fn inventory() -> Inventory {
        Inventory {
            gpus: Vec::new(),
            cpus: 8,
            memory_mb: 65536,
            simulated: true,
            isolation: false,
        }
    }

    fn gpu(index: u32) -> GpuInfo {
        GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            model: "H100".into(),
            memory_mb: 81920,
            temperature_c: Some(50),
            ..GpuInfo::default()
        }
    }

    fn with_health(index: u32, h: GpuHealthReport) -> GpuInfo {
        GpuInfo {
            health: Some(h),
            ..gpu(index)
        }
    }

    fn xids(index: u32, x: &[u32]) -> GpuInfo {
        with_health(
            index,
            GpuHealthReport {
                xid_events: x.to_vec(),
                ..GpuHealthReport::default()
            },
        )
    }

    #[test]
    fn healthy_gpus_change_nothing() {
        assert_eq!(assess(&[gpu(0), gpu(1)], &[], 1), None);
        // Application XIDs are the job's fault, not the GPU's.
        assert_eq!(assess(&[xids(0, &[13, 31, 43])], &[], 1), None);
    }

    #[test]
    fn a_fatal_xid_marks_its_gpu_once_with_a_sentence() {
        let a = assess(&[gpu(0), xids(2, &[79])], &[], 7).unwrap();
        assert_eq!(a.fell_off, [2]);
        assert_eq!(a.marks.len(), 1);
        assert_eq!(a.marks[0].reason, "GPU 2 fell off the bus (XID 79)");
        assert_eq!((a.marks[0].gpu, a.marks[0].since), (2, 7));
        // The agent repeats the XID until a heartbeat is answered: nothing new.
        assert_eq!(assess(&[gpu(0), xids(2, &[79])], &a.marks, 8), None);
        // A second fatal XID on the same GPU is a second reason; not fallen off again.
        let b = assess(&[xids(2, &[79, 48])], &a.marks, 9).unwrap();
        assert_eq!(b.marks.len(), 2);
        assert!(b.fell_off.is_empty());
        assert_eq!(reasons(&b.marks, 2).len(), 2);
        assert_eq!(unhealthy(&b.marks).len(), 1);
        for x in [48, 74, 94, 95, 119, 120] {
            assert!(assess(&[xids(0, &[x])], &[], 1).is_some(), "XID {x}");
        }
    }

    #[test]
    fn xid_marks_are_sticky() {
        let a = assess(&[xids(1, &[48])], &[], 1).unwrap();
        // The next heartbeat carries no XID: the mark stays.
        assert_eq!(assess(&[gpu(1)], &a.marks, 2), None);
        assert!(first_sticky(&a.marks).is_some());
    }

    #[test]
    fn uncorrectable_ecc_or_a_pending_reset_marks_the_gpu() {
        let ecc = with_health(
            0,
            GpuHealthReport {
                ecc_corrected_volatile: Some(1000),
                ecc_uncorrected_volatile: Some(3),
                ..GpuHealthReport::default()
            },
        );
        let a = assess(std::slice::from_ref(&ecc), &[], 1).unwrap();
        assert_eq!(
            a.marks[0].reason,
            "GPU 0 has 3 uncorrectable ECC errors since its driver loaded"
        );
        assert_eq!(assess(&[ecc], &a.marks, 2), None);
        // Corrected errors alone are not a fault.
        let corrected = with_health(
            0,
            GpuHealthReport {
                ecc_corrected_volatile: Some(1000),
                ecc_uncorrected_volatile: Some(0),
                ..GpuHealthReport::default()
            },
        );
        assert_eq!(assess(&[corrected], &[], 1), None);
        let reset = with_health(
            3,
            GpuHealthReport {
                reset_required: true,
                ..GpuHealthReport::default()
            },
        );
        assert!(
            assess(&[reset], &[], 1).unwrap().marks[0]
                .reason
                .contains("needs a reset")
        );
    }

    #[test]
    fn overheating_clears_itself_below_the_threshold_less_the_hysteresis() {
        let hot = GpuInfo {
            temperature_c: Some(88),
            slowdown_temp_c: Some(87),
            ..gpu(0)
        };
        let a = assess(&[hot], &[], 1).unwrap();
        assert_eq!(
            a.marks[0].reason,
            "GPU 0 is at 88 °C, at or above its slowdown threshold of 87 °C"
        );
        assert!(!a.marks[0].sticky());
        // Just under the threshold: still marked (no flapping).
        let warm = GpuInfo {
            temperature_c: Some(84),
            slowdown_temp_c: Some(87),
            ..gpu(0)
        };
        assert_eq!(assess(&[warm], &a.marks, 2), None);
        let cool = GpuInfo {
            temperature_c: Some(81),
            slowdown_temp_c: Some(87),
            ..gpu(0)
        };
        assert_eq!(assess(&[cool], &a.marks, 3).unwrap().marks, []);
        // No threshold reported: the default.
        let hot = GpuInfo {
            temperature_c: Some(DEFAULT_SLOWDOWN_C),
            ..gpu(1)
        };
        assert!(assess(&[hot], &[], 1).is_some());
    }

    #[test]
    fn a_sticky_mark_outlives_cooling() {
        let hot_and_broken = GpuInfo {
            temperature_c: Some(99),
            ..xids(0, &[95])
        };
        let a = assess(&[hot_and_broken], &[], 1).unwrap();
        assert_eq!(a.marks.len(), 2);
        let b = assess(&[gpu(0)], &a.marks, 2).unwrap();
        assert_eq!(b.marks.len(), 1);
        assert_eq!(b.marks[0].xid, Some(95));
    }

    #[test]
    fn readings_out_of_physical_range_are_dropped_and_counted() {
        let mut inv = Inventory {
            gpus: vec![GpuInfo {
                utilization_pct: Some(101),
                temperature_c: Some(151),
                power_w: Some(f64::NAN),
                memory_used_mb: Some(90_000),
                sm_clock_mhz: Some(5001),
                profiling: Some(GpuProfiling {
                    sm_active_pct: Some(-0.5),
                    sm_occupancy_pct: Some(f64::INFINITY),
                    dram_active_pct: Some(40.0),
                }),
                ..gpu(0)
            }],
            ..inventory()
        };
        let mut fields = Vec::new();
        drop_out_of_range(&mut inv, |f| fields.push(f));
        assert_eq!(
            fields,
            [
                "utilization_pct",
                "temperature_c",
                "power_w",
                "memory_used_mb",
                "sm_clock_mhz",
                "sm_active_pct",
                "sm_occupancy_pct"
            ]
        );
        let g = &inv.gpus[0];
        assert_eq!(
            (
                g.utilization_pct,
                g.temperature_c,
                g.power_w,
                g.memory_used_mb
            ),
            (None, None, None, None)
        );
        assert_eq!(g.profiling.as_ref().unwrap().dram_active_pct, Some(40.0));
        // In range: untouched.
        let mut fine = Inventory {
            gpus: vec![GpuInfo {
                utilization_pct: Some(100),
                power_w: Some(700.0),
                ..gpu(0)
            }],
            ..inventory()
        };
        let before = fine.clone();
        drop_out_of_range(&mut fine, |f| panic!("{f} dropped"));
        assert_eq!(fine, before);
    }
}
