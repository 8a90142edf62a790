//! AMD GPUs through the `amd-smi` command ([`AmdSmiProbe`]), used when NVML is absent and
//! `amd-smi` is on `PATH`: `amd-smi static --json` once (model, memory, uuid, slowdown
//! threshold), `amd-smi metric --json` at every read (utilisation, memory used, temperature,
//! power, graphics clock, ECC counts).
//!
//! The JSON differs across amd-smi releases: a list of GPU objects (ROCm 6.0–6.2) or an object
//! with `gpu_data` (6.3 on); a reading is `{"value": N, "unit": "..."}`, a bare number, or
//! `"N/A"`; whole sections may be `"N/A"` or missing. Parsing takes what it recognises and
//! leaves the rest out (absent, never zero). Recorded outputs and where their shape comes from:
//! `edge-agent/tests/data/`.

use crate::error::AgentError;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use switchyard_core::gpu_model::normalize;
use switchyard_protocol::agent::{GpuHealthReport, GpuInfo};

/// How long one `amd-smi` run may take before it is killed.
const RUN_TIMEOUT: Duration = Duration::from_secs(10);
/// The most output read from one run.
const MAX_OUTPUT: u64 = 8 << 20;

/// AMD GPUs read with `amd-smi`.
#[derive(Debug)]
pub struct AmdSmiProbe {
    program: PathBuf,
    statics: Vec<StaticGpu>,
}

impl AmdSmiProbe {
    /// `amd-smi` on `PATH`, if there is one.
    pub fn find() -> Option<PathBuf> {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|dir| dir.join("amd-smi"))
            .find(|p| is_executable(p))
    }

    /// Reads the GPUs' static facts once.
    pub fn new(program: PathBuf) -> Result<Self, AgentError> {
        let text = run(&program, &["static", "--json"])?;
        let statics = parse_static(&text)
            .map_err(|e| AgentError::Nvml(format!("amd-smi static --json: {e}")))?;
        if statics.is_empty() {
            return Err(AgentError::Nvml(
                "amd-smi static --json lists no GPU; pass --fake-gpus 4xMI300X to simulate GPUs"
                    .into(),
            ));
        }
        Ok(AmdSmiProbe { program, statics })
    }
}

impl crate::inventory::GpuProbe for AmdSmiProbe {
    fn gpus(&self) -> Result<Vec<GpuInfo>, AgentError> {
        let text = run(&self.program, &["metric", "--json"])?;
        let metrics = parse_metric(&text)
            .map_err(|e| AgentError::Nvml(format!("amd-smi metric --json: {e}")))?;
        Ok(merge(&self.statics, &metrics))
    }

    fn simulated(&self) -> bool {
        false
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Runs `program args`, its stdout as text; killed after [`RUN_TIMEOUT`].
fn run(program: &Path, args: &[&str]) -> Result<String, AgentError> {
    let what = || format!("{} {}", program.display(), args.join(" "));
    let err = |e: String| AgentError::Nvml(format!("{}: {e}", what()));
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| err(e.to_string()))?;
    let stdout = child.stdout.take();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(out) = stdout {
            let _ = out.take(MAX_OUTPUT).read_to_string(&mut text);
        }
        text
    });
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(err(format!("no answer in {} s", RUN_TIMEOUT.as_secs())));
            }
            Err(e) => return Err(err(e.to_string())),
        }
    };
    let text = reader
        .join()
        .map_err(|_| err("reading its output failed".into()))?;
    if !status.success() {
        return Err(err(format!("exited with {status}")));
    }
    Ok(text)
}

/// A reading: `{"value": N, "unit": U}` or a bare number (or a number in a string); anything
/// else (`"N/A"`) is no reading.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Reading(Option<f64>);

impl<'de> Deserialize<'de> for Reading {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        fn number(v: &serde_json::Value) -> Option<f64> {
            match v {
                serde_json::Value::Number(n) => n.as_f64(),
                serde_json::Value::String(s) => s.trim().parse().ok(),
                serde_json::Value::Object(o) => number(o.get("value")?),
                _ => None,
            }
        }
        let value = serde_json::Value::deserialize(d)?;
        Ok(Reading(number(&value).filter(|n| n.is_finite())))
    }
}

impl Reading {
    fn number(&self) -> Option<f64> {
        self.0
    }
}

fn num(r: &Option<Reading>) -> Option<f64> {
    r.as_ref().and_then(Reading::number)
}

/// A section that may be `"N/A"` or of an unexpected shape: `None` then, not an error.
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(value).ok())
}

/// Either shape of the document: `{"gpu_data": [...]}` or `[...]`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Doc {
    Wrapped { gpu_data: Vec<serde_json::Value> },
    List(Vec<serde_json::Value>),
}

fn gpu_objects<T: DeserializeOwned>(text: &str) -> Result<Vec<T>, String> {
    let doc: Doc = serde_json::from_str(text).map_err(|e| format!("not the JSON expected: {e}"))?;
    let items = match doc {
        Doc::Wrapped { gpu_data } => gpu_data,
        Doc::List(items) => items,
    };
    // A GPU object of an unexpected shape is skipped, not the whole document.
    Ok(items
        .into_iter()
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect())
}

#[derive(Debug, Default, Deserialize)]
struct StaticGpu {
    #[serde(default, deserialize_with = "lenient")]
    gpu: Option<u32>,
    #[serde(default, deserialize_with = "lenient")]
    uuid: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    asic: Option<Asic>,
    #[serde(default, deserialize_with = "lenient")]
    vram: Option<Vram>,
    #[serde(default, deserialize_with = "lenient")]
    limit: Option<Limit>,
    #[serde(default, deserialize_with = "lenient")]
    bus: Option<Bus>,
}

#[derive(Debug, Default, Deserialize)]
struct Asic {
    #[serde(default, deserialize_with = "lenient")]
    market_name: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    asic_serial: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Vram {
    /// MB.
    #[serde(default)]
    size: Option<Reading>,
}

#[derive(Debug, Default, Deserialize)]
struct Limit {
    #[serde(default)]
    slowdown_hotspot_temperature: Option<Reading>,
    #[serde(default)]
    slowdown_edge_temperature: Option<Reading>,
}

#[derive(Debug, Default, Deserialize)]
struct Bus {
    #[serde(default, deserialize_with = "lenient")]
    bdf: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct MetricGpu {
    #[serde(default, deserialize_with = "lenient")]
    gpu: Option<u32>,
    #[serde(default, deserialize_with = "lenient")]
    usage: Option<Usage>,
    #[serde(default, deserialize_with = "lenient")]
    power: Option<Power>,
    #[serde(default, deserialize_with = "lenient")]
    clock: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(default, deserialize_with = "lenient")]
    temperature: Option<Temperature>,
    #[serde(default, deserialize_with = "lenient")]
    ecc: Option<Ecc>,
    #[serde(default, deserialize_with = "lenient")]
    mem_usage: Option<MemUsage>,
}

#[derive(Debug, Default, Deserialize)]
struct Usage {
    #[serde(default)]
    gfx_activity: Option<Reading>,
}

#[derive(Debug, Default, Deserialize)]
struct Power {
    #[serde(default)]
    socket_power: Option<Reading>,
    #[serde(default)]
    average_socket_power: Option<Reading>,
}

#[derive(Debug, Default, Deserialize)]
struct Temperature {
    #[serde(default)]
    hotspot: Option<Reading>,
    #[serde(default)]
    edge: Option<Reading>,
}

#[derive(Debug, Default, Deserialize)]
struct Ecc {
    #[serde(default)]
    total_correctable_count: Option<Reading>,
    #[serde(default)]
    total_uncorrectable_count: Option<Reading>,
}

#[derive(Debug, Default, Deserialize)]
struct MemUsage {
    /// MB.
    #[serde(default)]
    total_vram: Option<Reading>,
    #[serde(default)]
    used_vram: Option<Reading>,
}

fn parse_static(text: &str) -> Result<Vec<StaticGpu>, String> {
    gpu_objects(text)
}

fn parse_metric(text: &str) -> Result<Vec<MetricGpu>, String> {
    gpu_objects(text)
}

/// `AMD Instinct MI300X` → `MI300X`; `AMD Instinct MI250X / MI250` → `MI250X`.
pub fn amd_model(market_name: &str) -> String {
    let upper = market_name.trim().to_ascii_uppercase();
    let first = upper.split('/').next().unwrap_or("");
    let kept: Vec<&str> = first
        .split([' ', '-', '_'])
        .filter(|t| !t.is_empty() && !matches!(*t, "AMD" | "INSTINCT" | "OAM" | "VF" | "PCIE"))
        .collect();
    if kept.is_empty() {
        return "AMD-GPU".to_string();
    }
    normalize(&kept.join(" "), None).replace(' ', "")
}

/// Percent to a whole number in 0–100; else left out.
fn pct(v: Option<f64>) -> Option<u32> {
    v.filter(|p| (0.0..=100.0).contains(p))
        .map(|p| p.round() as u32)
}

fn whole(v: Option<f64>) -> Option<u64> {
    v.filter(|n| *n >= 0.0 && *n < 1e15)
        .map(|n| n.round() as u64)
}

/// One [`GpuInfo`] per static GPU, with the metrics of the same `gpu` index (by position when
/// the documents carry no index).
fn merge(statics: &[StaticGpu], metrics: &[MetricGpu]) -> Vec<GpuInfo> {
    statics
        .iter()
        .enumerate()
        .map(|(pos, s)| {
            let index = s.gpu.unwrap_or(u32::try_from(pos).unwrap_or(u32::MAX));
            let metric = metrics
                .iter()
                .find(|m| m.gpu == Some(index))
                .or_else(|| metrics.get(pos).filter(|m| m.gpu.is_none()));
            let model = s
                .asic
                .as_ref()
                .and_then(|a| a.market_name.as_deref())
                .filter(|n| !n.trim().is_empty() && n.trim() != "N/A")
                .map_or_else(|| "AMD-GPU".to_string(), amd_model);
            let uuid = s
                .uuid
                .clone()
                .or_else(|| {
                    s.asic
                        .as_ref()
                        .and_then(|a| a.asic_serial.clone())
                        .filter(|v| v != "N/A")
                })
                .or_else(|| s.bus.as_ref().and_then(|b| b.bdf.clone()))
                .map_or_else(|| format!("AMD-{index}"), |id| format!("AMD-{id}"));
            let mem_usage = metric.and_then(|m| m.mem_usage.as_ref());
            let memory_mb = whole(s.vram.as_ref().and_then(|v| num(&v.size)))
                .or_else(|| whole(mem_usage.and_then(|u| num(&u.total_vram))))
                .unwrap_or(0);
            let slowdown_temp_c = s
                .limit
                .as_ref()
                .and_then(|l| {
                    num(&l.slowdown_hotspot_temperature).or(num(&l.slowdown_edge_temperature))
                })
                .and_then(temp_c);
            let mut gpu = GpuInfo {
                index,
                uuid,
                model,
                memory_mb,
                vendor: Some("amd".into()),
                slowdown_temp_c,
                ..GpuInfo::default()
            };
            if let Some(m) = metric {
                gpu.utilization_pct = pct(m.usage.as_ref().and_then(|u| num(&u.gfx_activity)));
                gpu.memory_used_mb = whole(mem_usage.and_then(|u| num(&u.used_vram)));
                gpu.temperature_c = m
                    .temperature
                    .as_ref()
                    .and_then(|t| num(&t.hotspot).or(num(&t.edge)))
                    .and_then(temp_c);
                gpu.power_w = m
                    .power
                    .as_ref()
                    .and_then(|p| num(&p.socket_power).or(num(&p.average_socket_power)))
                    .filter(|w| (0.0..100_000.0).contains(w));
                gpu.sm_clock_mhz = m.clock.as_ref().and_then(gfx_clock);
                let ecc = m.ecc.as_ref();
                let corrected = whole(ecc.and_then(|e| num(&e.total_correctable_count)));
                let uncorrected = whole(ecc.and_then(|e| num(&e.total_uncorrectable_count)));
                if corrected.is_some() || uncorrected.is_some() {
                    gpu.health = Some(GpuHealthReport {
                        ecc_corrected_volatile: corrected,
                        ecc_uncorrected_volatile: uncorrected,
                        ..GpuHealthReport::default()
                    });
                }
            }
            gpu
        })
        .collect()
}

/// A temperature in °C within what a GPU can report.
fn temp_c(t: f64) -> Option<u32> {
    (t > 0.0 && t < 200.0).then(|| t.round() as u32)
}

/// The graphics clock: `gfx_0.clk` (or the first `gfx_*` with one), MHz.
fn gfx_clock(clock: &BTreeMap<String, serde_json::Value>) -> Option<u32> {
    clock
        .iter()
        .filter(|(k, _)| k.starts_with("gfx"))
        .filter_map(|(_, v)| {
            let reading: Reading = serde_json::from_value(v.get("clk")?.clone()).ok()?;
            reading.number()
        })
        .find(|mhz| *mhz > 0.0 && *mhz < 10_000.0)
        .map(|mhz| mhz.round() as u32)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const STATIC_MI300X: &str = include_str!("../tests/data/amd-smi-static-mi300x.json");
    const METRIC_MI300X: &str = include_str!("../tests/data/amd-smi-metric-mi300x.json");
    const METRIC_LIST: &str = include_str!("../tests/data/amd-smi-metric-list.json");

    #[test]
    fn recorded_mi300x_outputs_parse() {
        let statics = parse_static(STATIC_MI300X).unwrap();
        let metrics = parse_metric(METRIC_MI300X).unwrap();
        let gpus = merge(&statics, &metrics);
        assert_eq!(gpus.len(), 2);
        let g = &gpus[0];
        assert_eq!(g.index, 0);
        assert_eq!(g.model, "MI300X");
        assert_eq!(g.vendor.as_deref(), Some("amd"));
        assert_eq!(g.memory_mb, 196_592);
        assert!(g.uuid.starts_with("AMD-"), "{g:?}");
        assert_ne!(gpus[0].uuid, gpus[1].uuid);
        assert_eq!(g.utilization_pct, Some(87));
        assert_eq!(g.memory_used_mb, Some(151_220));
        assert_eq!(g.temperature_c, Some(71));
        assert_eq!(g.power_w, Some(612.0));
        assert_eq!(g.sm_clock_mhz, Some(2100));
        assert_eq!(g.slowdown_temp_c, Some(105));
        let h = g.health.as_ref().unwrap();
        assert_eq!(h.ecc_corrected_volatile, Some(0));
        assert_eq!(h.ecc_uncorrected_volatile, Some(0));
        // The second GPU: idle, and "N/A" where the tool had nothing (left out, not zero).
        let g = &gpus[1];
        assert_eq!(g.utilization_pct, Some(0));
        assert_eq!(g.power_w, None);
        assert_eq!(g.sm_clock_mhz, None);
        assert_eq!(g.health.as_ref().unwrap().ecc_uncorrected_volatile, Some(2));
        assert_eq!(g.profiling, None);
    }

    #[test]
    fn the_older_list_shape_parses_too() {
        let statics = parse_static(STATIC_MI300X).unwrap();
        let metrics = parse_metric(METRIC_LIST).unwrap();
        let gpus = merge(&statics, &metrics);
        assert_eq!(gpus[0].utilization_pct, Some(12));
        assert_eq!(gpus[0].temperature_c, Some(48));
        assert_eq!(gpus[1].utilization_pct, None);
    }

    #[test]
    fn bad_documents_are_errors_and_odd_fields_are_left_out() {
        assert!(parse_metric("not json").is_err());
        assert!(parse_metric("{\"other\": 1}").is_err());
        let m = parse_metric(r#"[{"gpu": 0, "usage": "N/A", "power": {"socket_power": "N/A"}}]"#)
            .unwrap();
        let gpus = merge(&[StaticGpu::default()], &m);
        assert_eq!(gpus[0].utilization_pct, None);
        assert_eq!(gpus[0].power_w, None);
        assert_eq!(gpus[0].model, "AMD-GPU");
    }

    #[test]
    fn market_names_are_normalised() {
        assert_eq!(amd_model("AMD Instinct MI300X"), "MI300X");
        assert_eq!(amd_model("AMD Instinct MI300X OAM"), "MI300X");
        assert_eq!(amd_model("AMD Instinct MI250X / MI250"), "MI250X");
        assert_eq!(amd_model("Instinct MI325X"), "MI325X");
        assert_eq!(amd_model(""), "AMD-GPU");
    }
}
