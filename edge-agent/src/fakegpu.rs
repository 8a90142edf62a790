//! Simulated GPUs (`--fake-gpus`) that behave like GPUs, for `switchyard up`, the console, the
//! broker's metrics and every test: this module owns their model ([`FakeProbe`]), the board
//! on which runners say which attempt holds which GPUs at what level ([`GpuSim`]), and the
//! injected faults (`--fake-gpu-fault`, [`GpuFault`]).
//!
//! How a simulated GPU behaves:
//! - **Idle** (no attempt holds it): 0 % utilisation, the model's idle power, a few MiB of
//!   memory, the idle SM clock, and a temperature that settles near the model's idle figure.
//! - **Held by an attempt**: it runs at the attempt's level: the lease's
//!   `expected_gpu_utilization_pct`, else [`DEFAULT_BUSY_PCT`]. The attempt gets a file in
//!   `$SWITCHYARD_GPU_SIM` (in its own directory, owned by the job's uid) to which it may write
//!   its current level, a number from 0 to 100; it is read at every probe (each heartbeat).
//!   Anything else in it (not a number, out of range, not a regular file) is ignored and the
//!   last level kept.
//! - **Follows the level**: power = idle + level × (TDP − idle); memory used = 10 % of the
//!   card plus 80 % × level (a job holding a GPU has loaded something onto it); SM clock from
//!   idle to boost in proportion; temperature moves toward a steady level set by power (idle
//!   figure at idle power, the model's full-load figure at TDP) with a first-order lag of
//!   [`THERMAL_TAU`], so a job that starts warms its GPUs over about a minute.
//! - **Profiling**: simulated GPUs report profiling (what NVML GPM gives on Hopper) consistent
//!   with the level: `sm_active_pct` is the level itself (the level a job declares is taken as
//!   its SM activity, so that the broker's waste rule judges what the job declared),
//!   `sm_occupancy_pct` half of it and `dram_active_pct` 40 % of it.
//! - **Health**: ECC counts and retired pages are reported (0 until a fault), as NVML does on
//!   data-centre GPUs.
//!
//! Faults (`--fake-gpu-fault INDEX:KIND@DELAY`, from the agent's start): `xid=N` raises one XID
//! event (delivered once by the probe; the heartbeat keeps it until the broker answers, see
//! [`crate::agent`]); `ecc=N` sets the uncorrectable volatile ECC count to N; `overheat` holds
//! the temperature 5 °C above the model's slowdown threshold (`overheat=C`: at C °C) with
//! `hw_thermal_slowdown` among the throttle reasons (when C is at or above the threshold).

use crate::args::GpuDeclaration;
use crate::error::AgentError;
use crate::inventory::GpuProbe;
use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use switchyard_protocol::agent::{GpuHealthReport, GpuInfo, GpuProfiling};
use uuid::Uuid;

/// The level of an attempt whose lease declares none: a busy training job.
pub const DEFAULT_BUSY_PCT: f64 = 90.0;
/// Time constant of the temperature's first-order lag toward its steady level.
pub const THERMAL_TAU: Duration = Duration::from_secs(30);
/// The job's variable naming the file it may write its level to.
pub const SIM_ENV: &str = "SWITCHYARD_GPU_SIM";
/// The file's name in the attempt's directory.
pub const SIM_FILE: &str = ".switchyard-gpu-sim";
/// Memory an idle GPU reports in use (the driver's own), MiB.
const IDLE_MEMORY_MB: u64 = 4;
/// How much of the level file is read: a number needs no more.
const SIM_FILE_MAX: u64 = 32;

/// Published or typical figures of one model. TDP (board power limit) and boost clock are the
/// vendors' datasheet figures (NVIDIA H100/H200/A100/L4/L40S/T4/V100/A10 datasheets, AMD
/// Instinct MI300X/MI250X data sheets); idle power, idle SM clock, idle and full-load
/// temperature are typical `nvidia-smi -q` / `amd-smi` readings of idle and loaded data-centre
/// cards (approximate: they vary with cooling), and the slowdown threshold is the driver's
/// usual "GPU Slowdown Temp" for the family.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelFigures {
    pub tdp_w: f64,
    pub idle_w: f64,
    pub idle_clock_mhz: u32,
    pub boost_clock_mhz: u32,
    pub idle_temp_c: f64,
    pub full_load_temp_c: f64,
    pub slowdown_temp_c: u32,
}

/// The figures of a normalised model name, or [`GENERIC`] for one not in the table.
pub fn figures(model: &str) -> ModelFigures {
    let f = |tdp_w, idle_w, idle_clock_mhz, boost_clock_mhz, slowdown_temp_c| ModelFigures {
        tdp_w,
        idle_w,
        idle_clock_mhz,
        boost_clock_mhz,
        idle_temp_c: 32.0,
        full_load_temp_c: 72.0,
        slowdown_temp_c,
    };
    match model {
        "B200" => f(1000.0, 140.0, 345, 1965, 90),
        "H200" => f(700.0, 75.0, 345, 1980, 90),
        "H100" => f(700.0, 70.0, 345, 1980, 90),
        "A100-80GB" | "A100" => f(400.0, 55.0, 210, 1410, 89),
        "L40S" | "L40" => f(350.0, 35.0, 210, 2520, 88),
        "A40" | "A6000" => f(300.0, 30.0, 210, 1740, 88),
        "L4" => f(72.0, 16.0, 210, 2040, 88),
        "A10G" | "A10" => f(150.0, 18.0, 210, 1710, 88),
        "T4" => f(70.0, 10.0, 300, 1590, 85),
        "V100" | "V100-32GB" => f(300.0, 40.0, 135, 1530, 87),
        "MI300X" => f(750.0, 140.0, 150, 2100, 95),
        "MI250X" | "MI250" => f(560.0, 90.0, 500, 1700, 95),
        _ => GENERIC,
    }
}

/// Figures for a model the table does not know: a mid-range data-centre card.
pub const GENERIC: ModelFigures = ModelFigures {
    tdp_w: 300.0,
    idle_w: 40.0,
    idle_clock_mhz: 210,
    boost_clock_mhz: 1700,
    idle_temp_c: 32.0,
    full_load_temp_c: 72.0,
    slowdown_temp_c: 88,
};

/// Who makes a model (`nvidia`, `amd`, `intel`, `google`, `aws`): the broker's rule
/// (`switchyard_core::gpu_model::vendor`), NVIDIA for a name no rule knows.
pub fn vendor_of(model: &str) -> &'static str {
    switchyard_core::gpu_model::vendor(model).as_str()
}

// ---------------------------------------------------------------------------------------------
// Faults

/// What a fault does to its GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// One XID event of this code.
    Xid(u32),
    /// The uncorrectable volatile ECC count becomes N.
    Ecc(u64),
    /// The temperature is held here (°C); `None`: 5 °C above the slowdown threshold.
    Overheat(Option<u32>),
}

/// One `--fake-gpu-fault INDEX:KIND@DELAY`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuFault {
    pub gpu: u32,
    pub kind: FaultKind,
    /// From the agent's start.
    pub after: Duration,
}

impl FromStr for GpuFault {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |part: &str, why: &str| {
            format!(
                "invalid fault `{s}`: {why} (`{part}`); expected INDEX:KIND@DELAY with KIND \
                 xid=N, ecc=N, overheat or overheat=C and DELAY such as 0s, 30s, 2m, 1h"
            )
        };
        let (index, rest) = s
            .trim()
            .split_once(':')
            .ok_or_else(|| bad(s, "no `:` after the GPU index"))?;
        let gpu: u32 = index
            .trim()
            .parse()
            .map_err(|_| bad(index, "the GPU index is not a number"))?;
        let (kind, delay) = rest
            .split_once('@')
            .ok_or_else(|| bad(rest, "no `@DELAY`"))?;
        let after = parse_delay(delay).ok_or_else(|| bad(delay, "bad delay"))?;
        let (name, value) = match kind.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim())),
            None => (kind.trim(), None),
        };
        let kind = match (name, value) {
            ("xid", Some(v)) => FaultKind::Xid(
                v.parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad(v, "an XID is a positive number"))?,
            ),
            ("ecc", Some(v)) => FaultKind::Ecc(
                v.parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad(v, "an ECC error count is a positive number"))?,
            ),
            ("overheat", None) => FaultKind::Overheat(None),
            ("overheat", Some(v)) => FaultKind::Overheat(Some(
                v.parse()
                    .ok()
                    .filter(|c| (1..=150).contains(c))
                    .ok_or_else(|| bad(v, "a temperature is 1 to 150 °C"))?,
            )),
            _ => return Err(bad(kind, "unknown fault kind")),
        };
        Ok(GpuFault { gpu, kind, after })
    }
}

impl fmt::Display for GpuFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.gpu)?;
        match self.kind {
            FaultKind::Xid(n) => write!(f, "xid={n}")?,
            FaultKind::Ecc(n) => write!(f, "ecc={n}")?,
            FaultKind::Overheat(None) => write!(f, "overheat")?,
            FaultKind::Overheat(Some(c)) => write!(f, "overheat={c}")?,
        }
        write!(f, "@{}s", self.after.as_secs())
    }
}

/// `30s`, `2m`, `1h`, `0s` (a whole number and a unit).
fn parse_delay(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

// ---------------------------------------------------------------------------------------------
// The board: which attempt holds which simulated GPUs

/// Shared by the runners (which attach and detach attempts) and the probe (which reads it at
/// every heartbeat). A plain mutex, never held across an await or a file read.
#[derive(Debug, Default)]
pub struct GpuSim {
    holdings: Mutex<HashMap<Uuid, Holding>>,
}

#[derive(Debug, Clone)]
struct Holding {
    gpus: Vec<u32>,
    level: f64,
    file: Option<PathBuf>,
}

impl GpuSim {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Uuid, Holding>> {
        self.holdings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An attempt runs on `gpus` at `expected` percent (the lease's; [`DEFAULT_BUSY_PCT`] when
    /// absent), and may change it through `file`. Dropping the guard detaches it.
    pub fn attach(
        self: &Arc<Self>,
        attempt: Uuid,
        gpus: &[u32],
        expected: Option<u32>,
        file: Option<PathBuf>,
    ) -> SimHold {
        let level = expected.map_or(DEFAULT_BUSY_PCT, |p| f64::from(p.min(100)));
        self.lock().insert(
            attempt,
            Holding {
                gpus: gpus.to_vec(),
                level,
                file,
            },
        );
        SimHold {
            sim: self.clone(),
            attempt,
        }
    }

    /// Each GPU's level now: the highest of the attempts that hold it, 0 when none does. The
    /// attempts' files are read outside the lock.
    fn levels(&self, count: usize) -> Vec<Option<f64>> {
        let snapshot: Vec<(Uuid, Holding)> =
            self.lock().iter().map(|(k, v)| (*k, v.clone())).collect();
        let mut levels = vec![None; count];
        for (attempt, mut holding) in snapshot {
            if let Some(level) = holding.file.as_deref().and_then(read_level)
                && level != holding.level
            {
                holding.level = level;
                if let Some(h) = self.lock().get_mut(&attempt) {
                    h.level = level;
                }
            }
            for gpu in &holding.gpus {
                if let Some(slot) = levels.get_mut(*gpu as usize) {
                    *slot = Some(slot.map_or(holding.level, |l: f64| l.max(holding.level)));
                }
            }
        }
        levels
    }
}

/// An attempt's hold on its simulated GPUs; dropping it frees them.
#[derive(Debug)]
pub struct SimHold {
    sim: Arc<GpuSim>,
    attempt: Uuid,
}

impl Drop for SimHold {
    fn drop(&mut self) {
        self.sim.lock().remove(&self.attempt);
    }
}

/// Writes the attempt's level file with its first level, owned by the job's uid so that an
/// isolated job can write it. The directory is the attempt's own, new and not yet the job's.
pub fn create_level_file(
    dir: &Path,
    level: Option<u32>,
    uid: Option<u32>,
) -> std::io::Result<PathBuf> {
    use std::io::Write;
    let path = dir.join(SIM_FILE);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    let level = level.map_or(DEFAULT_BUSY_PCT, |l| f64::from(l.min(100)));
    writeln!(file, "{level}")?;
    if let Some(uid) = uid {
        std::os::unix::fs::chown(&path, Some(uid), Some(uid))?;
    }
    Ok(path)
}

/// The level a job wrote: a number 0–100 in a regular file (never following a link, never
/// blocking on a FIFO); `None` for anything else.
fn read_level(path: &Path) -> Option<f64> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    file.take(SIM_FILE_MAX).read_to_string(&mut text).ok()?;
    let level: f64 = text.trim().parse().ok()?;
    (level.is_finite() && (0.0..=100.0).contains(&level)).then_some(level)
}

// ---------------------------------------------------------------------------------------------
// The probe

/// GPUs declared with `--fake-gpus`: uuids stable for one agent name, readings that follow the
/// board ([`GpuSim`]) and the faults.
#[derive(Debug)]
pub struct FakeProbe {
    gpus: Vec<GpuInfo>,
    sim: Arc<GpuSim>,
    faults: Vec<GpuFault>,
    started: Instant,
    state: Mutex<ProbeState>,
}

#[derive(Debug)]
struct ProbeState {
    /// Per GPU: temperature now (°C).
    temps: Vec<f64>,
    /// When the temperatures were last stepped.
    at: Instant,
    /// Per fault: whether its XID was delivered.
    delivered: Vec<bool>,
}

impl FakeProbe {
    /// `agent_name` seeds the uuids so that several simulated agents on one machine report
    /// distinct GPUs, and a restarted agent reports the same ones.
    pub fn new(declarations: &[GpuDeclaration], agent_name: &str) -> Self {
        Self::build(
            declarations,
            agent_name,
            Arc::new(GpuSim::new()),
            Vec::new(),
        )
    }

    /// As [`FakeProbe::new`], on `sim`, with faults; a fault on a GPU that is not declared is
    /// refused.
    pub fn with_faults(
        declarations: &[GpuDeclaration],
        agent_name: &str,
        sim: Arc<GpuSim>,
        faults: Vec<GpuFault>,
    ) -> Result<Self, AgentError> {
        let probe = Self::build(declarations, agent_name, sim, faults);
        let count = probe.gpus.len();
        if let Some(f) = probe.faults.iter().find(|f| f.gpu as usize >= count) {
            return Err(AgentError::Config(format!(
                "--fake-gpu-fault {f}: GPU {} is not declared (--fake-gpus declares {count} \
                 GPU{}, indexes 0 to {})",
                f.gpu,
                if count == 1 { "" } else { "s" },
                count.saturating_sub(1)
            )));
        }
        Ok(probe)
    }

    fn build(
        declarations: &[GpuDeclaration],
        agent_name: &str,
        sim: Arc<GpuSim>,
        faults: Vec<GpuFault>,
    ) -> Self {
        let models = declarations
            .iter()
            .flat_map(|d| (0..d.count).map(move |_| d));
        let gpus: Vec<GpuInfo> = models
            .enumerate()
            .map(|(i, d)| {
                let index = u32::try_from(i).unwrap_or(u32::MAX);
                let fig = figures(&d.model);
                GpuInfo {
                    index,
                    uuid: fake_uuid(agent_name, index),
                    model: d.model.clone(),
                    memory_mb: u64::from(d.memory_gb) * 1024,
                    vendor: Some(vendor_of(&d.model).to_string()),
                    slowdown_temp_c: Some(fig.slowdown_temp_c),
                    ..GpuInfo::default()
                }
            })
            .collect();
        let started = Instant::now();
        let temps = gpus.iter().map(|g| figures(&g.model).idle_temp_c).collect();
        let delivered = vec![false; faults.len()];
        FakeProbe {
            gpus,
            sim,
            faults,
            started,
            state: Mutex::new(ProbeState {
                temps,
                at: started,
                delivered,
            }),
        }
    }

    /// The board the runners attach attempts to.
    pub fn sim(&self) -> &Arc<GpuSim> {
        &self.sim
    }

    /// The readings at `now` (tests step time by hand).
    pub fn read_at(&self, now: Instant) -> Vec<GpuInfo> {
        let levels = self.sim.levels(self.gpus.len());
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let dt = now.saturating_duration_since(state.at);
        state.at = state.at.max(now);
        let since_start = now.saturating_duration_since(self.started);
        let alpha = 1.0 - (-dt.as_secs_f64() / THERMAL_TAU.as_secs_f64()).exp();
        let mut out = Vec::with_capacity(self.gpus.len());
        for (i, gpu) in self.gpus.iter().enumerate() {
            let fig = figures(&gpu.model);
            let held = levels.get(i).copied().flatten();
            let level = held.unwrap_or(0.0).clamp(0.0, 100.0);
            let frac = level / 100.0;
            let power = fig.idle_w + frac * (fig.tdp_w - fig.idle_w);
            let steady = fig.idle_temp_c + frac * (fig.full_load_temp_c - fig.idle_temp_c);
            let temp = match state.temps.get_mut(i) {
                Some(t) => {
                    *t += (steady - *t) * alpha;
                    *t
                }
                None => steady,
            };
            let memory_used = match held {
                Some(_) => {
                    let share = 0.10 + 0.80 * frac;
                    (gpu.memory_mb as f64 * share).round() as u64
                }
                None => IDLE_MEMORY_MB.min(gpu.memory_mb),
            };
            let clock = f64::from(fig.idle_clock_mhz)
                + frac * f64::from(fig.boost_clock_mhz.saturating_sub(fig.idle_clock_mhz));
            let mut info = gpu.clone();
            info.utilization_pct = Some(level.round() as u32);
            info.memory_used_mb = Some(memory_used);
            info.power_w = Some((power * 10.0).round() / 10.0);
            info.temperature_c = Some(temp.round().max(0.0) as u32);
            info.sm_clock_mhz = Some(clock.round() as u32);
            info.profiling = Some(GpuProfiling {
                sm_active_pct: Some(level),
                sm_occupancy_pct: Some(level * 0.5),
                dram_active_pct: Some(level * 0.4),
            });
            let mut health = GpuHealthReport {
                ecc_corrected_volatile: Some(0),
                ecc_uncorrected_volatile: Some(0),
                retired_pages: Some(0),
                ..GpuHealthReport::default()
            };
            for (k, fault) in self.faults.iter().enumerate() {
                if fault.gpu as usize != i || since_start < fault.after {
                    continue;
                }
                match fault.kind {
                    FaultKind::Xid(code) => {
                        if let Some(done) = state.delivered.get_mut(k)
                            && !*done
                        {
                            *done = true;
                            health.xid_events.push(code);
                        }
                    }
                    FaultKind::Ecc(n) => health.ecc_uncorrected_volatile = Some(n),
                    FaultKind::Overheat(at) => {
                        let c = at.unwrap_or(fig.slowdown_temp_c + 5);
                        info.temperature_c = Some(c);
                        if c >= fig.slowdown_temp_c
                            && !health
                                .throttle_reasons
                                .iter()
                                .any(|r| r == "hw_thermal_slowdown")
                        {
                            health.throttle_reasons.push("hw_thermal_slowdown".into());
                        }
                    }
                }
            }
            info.health = Some(health);
            out.push(info);
        }
        out
    }
}

impl GpuProbe for FakeProbe {
    fn gpus(&self) -> Result<Vec<GpuInfo>, AgentError> {
        Ok(self.read_at(Instant::now()))
    }

    fn simulated(&self) -> bool {
        true
    }

    fn gpu_sim(&self) -> Option<Arc<GpuSim>> {
        Some(self.sim.clone())
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

#[cfg(test)]
mod tests;
