//! What this machine offers: GPUs, CPUs and memory. A [`GpuProbe`] is read once at enrolment
//! and again on every heartbeat (metrics change); [`probe_for`] picks it: simulated GPUs
//! ([`crate::fakegpu`]), NVIDIA's through NVML ([`crate::nvml`]), AMD's through `amd-smi`
//! ([`crate::amdsmi`]). Probing blocks (NVML calls into the driver, `amd-smi` is a process);
//! callers run it off the async executor.

use crate::amdsmi::AmdSmiProbe;
use crate::args::GpuDeclaration;
use crate::error::AgentError;
pub use crate::fakegpu::FakeProbe;
use crate::fakegpu::{GpuFault, GpuSim};
pub use crate::nvml::NvmlProbe;
use std::sync::Arc;
use switchyard_protocol::agent::{GpuInfo, Inventory};

/// A source of GPU facts.
pub trait GpuProbe: Send + Sync {
    /// The GPUs now, with whatever metrics the source has. XID events appear once, in the
    /// first reading after they happened (`health.xid_events`); the heartbeat keeps them until
    /// the broker has them.
    fn gpus(&self) -> Result<Vec<GpuInfo>, AgentError>;
    /// True when the GPUs are declared rather than real.
    fn simulated(&self) -> bool;
    /// The board on which runners say what runs on simulated GPUs; `None` for real ones.
    fn gpu_sim(&self) -> Option<Arc<GpuSim>> {
        None
    }
}

/// The probe the flags ask for: declared GPUs (`--fake-gpus`, with their faults); else NVML;
/// else `amd-smi` when it is on `PATH`; else NVML's error, which says what to do.
pub fn probe_for(
    declarations: &[GpuDeclaration],
    faults: &[GpuFault],
    agent_name: &str,
) -> Result<Box<dyn GpuProbe>, AgentError> {
    if !declarations.is_empty() {
        let sim = Arc::new(GpuSim::new());
        return Ok(Box::new(FakeProbe::with_faults(
            declarations,
            agent_name,
            sim,
            faults.to_vec(),
        )?));
    }
    if let Some(f) = faults.first() {
        return Err(AgentError::Config(format!(
            "--fake-gpu-fault {f}: faults are injected into simulated GPUs only; pass --fake-gpus"
        )));
    }
    match NvmlProbe::new() {
        Ok(probe) => Ok(Box::new(probe)),
        Err(nvml_error) => match AmdSmiProbe::find() {
            Some(program) => {
                tracing::info!(error = %nvml_error, program = %program.display(),
                    "no NVIDIA driver: reading AMD GPUs with amd-smi");
                Ok(Box::new(AmdSmiProbe::new(program)?))
            }
            None => Err(nvml_error),
        },
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
        // Idle simulated GPUs: 0 %, from NVIDIA, with a slowdown threshold.
        assert!(inv.gpus.iter().all(|g| g.utilization_pct == Some(0)
            && g.uuid.starts_with("GPU-")
            && g.vendor.as_deref() == Some("nvidia")
            && g.slowdown_temp_c.is_some()));
    }

    #[test]
    fn a_fault_needs_simulated_gpus() {
        let fault: GpuFault = "0:xid=79@0s".parse().unwrap();
        let err = probe_for(&[], &[fault], "a").err().unwrap().to_string();
        assert!(err.contains("--fake-gpu-fault 0:xid=79@0s"), "{err}");
        assert!(err.contains("--fake-gpus"), "{err}");
        let err = probe_for(&[decl("2xH100")], &["2:ecc=1@0s".parse().unwrap()], "a")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("--fake-gpu-fault 2:ecc=1@0s"), "{err}");
        assert!(err.contains("GPU 2 is not declared"), "{err}");
        assert!(probe_for(&[decl("2xH100")], &["1:overheat@0s".parse().unwrap()], "a").is_ok());
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
    /// report utilisation, memory used, temperature, power, SM clock, its slowdown threshold
    /// and vendor, throttle state; ECC and profiling where the GPU has them, and a second read
    /// brings GPM profiling on Hopper and later); elsewhere checks the error says what to do.
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
                        assert!(g.temperature_c.is_some_and(|t| t > 0 && t < 150), "{g:?}");
                        assert!(g.power_w.is_some_and(|p| p > 0.0), "{g:?}");
                        assert_eq!(g.vendor.as_deref(), Some("nvidia"), "{g:?}");
                        assert!(g.sm_clock_mhz.is_some_and(|c| c > 0 && c < 5000), "{g:?}");
                        assert!(
                            g.slowdown_temp_c.is_some_and(|t| (60..130).contains(&t)),
                            "{g:?}"
                        );
                        assert!(g.uuid.starts_with("GPU-"), "{g:?}");
                        // Data-centre GPUs report ECC; whatever is reported is sane.
                        if let Some(h) = &g.health {
                            assert!(h.throttle_reasons.iter().all(|r| !r.is_empty()
                                && r.chars().all(|c| c.is_ascii_lowercase() || c == '_')));
                        }
                        // Profiling is never there after a single sample.
                        assert!(g.profiling.is_none(), "{g:?}");
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1200));
                    let again = probe.gpus().unwrap();
                    assert_eq!(again.len(), gpus.len());
                    for g in &again {
                        let hopper_or_later = ["H100", "H200", "H20", "GH200", "B200", "B300"]
                            .contains(&g.model.as_str());
                        if let Some(p) = &g.profiling {
                            for v in [p.sm_active_pct, p.sm_occupancy_pct, p.dram_active_pct]
                                .into_iter()
                                .flatten()
                            {
                                assert!((0.0..=100.0).contains(&v), "{g:?}");
                            }
                        } else {
                            assert!(!hopper_or_later, "GPM expected on {}: {g:?}", g.model);
                        }
                    }
                    eprintln!("NVML reported: {again:#?}");
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
