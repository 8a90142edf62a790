//! The edge between wire shapes (`switchyard-protocol`) and domain values (`switchyard-core`):
//! validation of what users send, and the views they get back. Dollars become micro-dollars
//! here and only here.

use switchyard_core as core;
use switchyard_core::{Money, Timestamp};
use switchyard_protocol::api as wire;

use crate::clock::{from_datetime, to_datetime};
use crate::http::error::ApiError;
use crate::store::{JobRecord, LogRecord};

/// The longest free-text name (job name, token name), in characters.
pub const MAX_NAME: usize = 128;
/// The longest team or project name, in bytes (they are ASCII).
pub const MAX_SLUG: usize = 64;
/// The longest runtime estimate a job may give: 30 days. A larger figure is a mistake or an
/// attack, and overflows the planner's finish times and cost estimates into nonsense.
pub const MAX_RUNTIME_S: i64 = 30 * 24 * 3600;
const MAX_ARGS: usize = 1024;
const MAX_ENV: usize = 256;
const MAX_GPU_MODELS: usize = 64;
/// The most nodes one job may span.
const MAX_NODES: i64 = 256;
const MAX_REGIONS: usize = 256;

/// Team and project names: 1 to 64 ASCII letters, digits, `-`, `_` or `.` (they appear in
/// URLs, metrics labels and CSV exports).
pub fn check_slug(field: &str, s: &str) -> Result<(), ApiError> {
    let ok = !s.is_empty()
        && s.len() <= MAX_SLUG
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(
            field,
            "must be 1 to 64 letters, digits, '-', '_' or '.'",
        ))
    }
}

/// Whether `c` may appear in a stored name. Control characters (ESC, NUL, BEL, CR, LF, tab,
/// DEL, C1) would drive the terminal of whoever lists the name; bidirectional overrides and
/// isolates (U+202A–U+202E, U+2066–U+2069, the marks U+200E, U+200F, U+061C) and line or
/// paragraph separators make a name read as something else than it is.
pub fn printable(c: char) -> bool {
    !c.is_control()
        && !matches!(c,
            '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{2028}' | '\u{2029}'
            | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}')
}

/// Free-text names (a job's `name`, an API token's `name`): 1 to 128 printable characters, not
/// all blank.
pub fn check_display_name(field: &str, s: &str) -> Result<(), ApiError> {
    if s.trim().is_empty() || s.chars().count() > MAX_NAME {
        return Err(ApiError::invalid(field, "must be 1 to 128 characters"));
    }
    if let Some(c) = s.chars().find(|c| !printable(*c)) {
        return Err(ApiError::invalid(
            field,
            format!(
                "must be printable: control and bidirectional-override characters such as \
                 U+{:04X} are refused",
                u32::from(c)
            ),
        ));
    }
    Ok(())
}

/// Validates a submitted spec (the checks that need no catalogue). `now` rules out deadlines in
/// the past.
pub fn job_spec(spec: &wire::JobSpec, now: Timestamp) -> Result<core::JobSpec, ApiError> {
    check_display_name("name", &spec.name)?;
    check_slug("team", &spec.team)?;
    if let Some(p) = &spec.project {
        check_slug("project", p)?;
    }
    match spec.command.first() {
        None => return Err(ApiError::invalid("command", "must not be empty")),
        Some(program) if program.trim().is_empty() => {
            return Err(ApiError::invalid(
                "command",
                "the program (first element) is empty",
            ));
        }
        _ => {}
    }
    if spec.command.len() > MAX_ARGS || spec.command.iter().any(|a| a.contains('\0')) {
        return Err(ApiError::invalid(
            "command",
            "at most 1024 arguments, none containing NUL",
        ));
    }
    if spec.env.len() > MAX_ENV {
        return Err(ApiError::invalid("env", "at most 256 variables"));
    }
    for (k, v) in &spec.env {
        let valid_key = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid_key {
            return Err(ApiError::invalid(
                format!("env.{k}"),
                "variable names are letters, digits and '_', not starting with a digit",
            ));
        }
        if k == "CUDA_VISIBLE_DEVICES" {
            return Err(ApiError::invalid(
                format!("env.{k}"),
                "is set by the agent to the GPUs the job was given",
            ));
        }
        if crate::rules::gang::ENV.contains(&k.as_str()) {
            return Err(ApiError::invalid(
                format!("env.{k}"),
                "is set by the broker to the job's place in its gang of nodes",
            ));
        }
        if v.contains('\0') {
            return Err(ApiError::invalid(format!("env.{k}"), "contains NUL"));
        }
    }
    let r = &spec.resources;
    let gpus = u32::try_from(r.gpus)
        .ok()
        .filter(|g| (1..=64).contains(g))
        .ok_or_else(|| ApiError::invalid("resources.gpus", "must be between 1 and 64"))?;
    let non_negative = |v: Option<i64>, field: &str| -> Result<u32, ApiError> {
        match v {
            None => Ok(0),
            Some(x) => u32::try_from(x)
                .map_err(|_| ApiError::invalid(field, "must be a non-negative integer")),
        }
    };
    // A multi-node job (a gang): `gpus` on each of `nodes` nodes of one pool.
    let nodes = match r.nodes {
        None => 1,
        Some(n) if (1..=MAX_NODES).contains(&n) => u32::try_from(n).unwrap_or(1),
        Some(_) => {
            return Err(ApiError::invalid(
                "resources.nodes",
                format!("must be between 1 and {MAX_NODES}"),
            ));
        }
    };
    if r.gpu_models.len() > MAX_GPU_MODELS {
        return Err(ApiError::invalid(
            "resources.gpu_models",
            "at most 64 models",
        ));
    }
    let gpu_models: Vec<String> = r.gpu_models.iter().map(|m| m.trim().to_string()).collect();
    if gpu_models.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "resources.gpu_models",
            "empty model name",
        ));
    }
    let accelerator = accelerator(r.accelerator.as_deref(), &gpu_models)?;
    if let Some(rt) = spec.estimated_runtime_s
        && !(1..=MAX_RUNTIME_S).contains(&rt)
    {
        return Err(ApiError::invalid(
            "estimated_runtime_s",
            "must be a positive number of seconds, at most 30 days (2592000)",
        ));
    }
    let deadline = spec.deadline.map(from_datetime);
    if let Some(d) = deadline
        && d <= now
    {
        return Err(ApiError::invalid("deadline", "is in the past"));
    }
    let max_price_per_hour = match spec.max_price_per_hour {
        None => None,
        Some(p) => Some(
            Money::from_dollars(p)
                .filter(|m| m.micros() > 0)
                .ok_or_else(|| {
                    ApiError::invalid("max_price_per_hour", "must be a positive amount of USD")
                })?,
        ),
    };
    if spec.regions.len() > MAX_REGIONS {
        return Err(ApiError::invalid("regions", "at most 256 regions"));
    }
    let mut regions = Vec::with_capacity(spec.regions.len());
    for reg in &spec.regions {
        match reg.split_once(':') {
            Some((p, c)) if !p.is_empty() && !c.is_empty() => {
                regions.push(core::RegionId(reg.clone()))
            }
            _ => {
                return Err(ApiError::invalid(
                    "regions",
                    format!("{reg:?} is not provider:code"),
                ));
            }
        }
    }
    let data = match &spec.data {
        None => None,
        Some(d) => {
            if !d.region.contains(':') {
                return Err(ApiError::invalid("data.region", "must be provider:code"));
            }
            Some(core::DataLocation {
                region: core::RegionId(d.region.clone()),
                size_gb: u32::try_from(d.size_gb)
                    .map_err(|_| ApiError::invalid("data.size_gb", "must be non-negative"))?,
            })
        }
    };
    let kind = match spec.kind.unwrap_or(wire::JobKind::Batch) {
        wire::JobKind::Batch => core::JobKind::Batch,
        wire::JobKind::Service => core::JobKind::Service,
    };
    if spec.max_latency_ms.is_some() && kind != core::JobKind::Service {
        return Err(ApiError::invalid(
            "max_latency_ms",
            "applies only to jobs of kind \"service\"",
        ));
    }
    let expected_gpu_utilization_pct = match spec.expected_gpu_utilization {
        None => None,
        Some(v) if v.is_finite() && (0.0..=100.0).contains(&v) => {
            // In range, so the rounded value fits.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Some(v.round() as u8)
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "expected_gpu_utilization",
                "must be a percentage from 0 to 100",
            ));
        }
    };
    Ok(core::JobSpec {
        expected_gpu_utilization_pct,
        name: spec.name.trim().to_string(),
        team: spec.team.clone(),
        project: spec.project.clone(),
        command: spec.command.clone(),
        env: spec.env.clone(),
        resources: core::Resources {
            gpus,
            gpu_models,
            accelerator,
            min_gpu_memory_gb: non_negative(r.min_gpu_memory_gb, "resources.min_gpu_memory_gb")?,
            cpus: non_negative(r.cpus, "resources.cpus")?,
            memory_gb: non_negative(r.memory_gb, "resources.memory_gb")?,
            nodes,
        },
        estimated_runtime_s: spec.estimated_runtime_s,
        deadline,
        priority: match spec.priority.unwrap_or(wire::Priority::Normal) {
            wire::Priority::Low => core::Priority::Low,
            wire::Priority::Normal => core::Priority::Normal,
            wire::Priority::High => core::Priority::High,
            wire::Priority::Critical => core::Priority::Critical,
        },
        spot: match spec.spot.unwrap_or(wire::SpotRule::Allowed) {
            wire::SpotRule::Never => core::SpotRule::Never,
            wire::SpotRule::Allowed => core::SpotRule::Allowed,
            wire::SpotRule::Preferred => core::SpotRule::Preferred,
        },
        max_price_per_hour,
        regions,
        data,
        kind,
        max_latency_ms: spec.max_latency_ms,
        callers: Vec::new(),
    })
}

/// `resources.accelerator`: `nvidia`, `amd`, `intel`, `google`, `aws` or `any` (absent: any
/// GPU). A vendor with `gpu_models` of another vendor contradicts itself: refused naming
/// `resources.accelerator`.
fn accelerator(
    text: Option<&str>,
    gpu_models: &[String],
) -> Result<Option<core::Accelerator>, ApiError> {
    let Some(text) = text else {
        return Ok(None);
    };
    let accelerator = core::Accelerator::parse(text).ok_or_else(|| {
        ApiError::invalid(
            "resources.accelerator",
            format!(
                "{text:?} is not an accelerator; use {}",
                core::Accelerator::NAMES
            ),
        )
    })?;
    if let Some(vendor) = accelerator.vendor()
        && let Some(other) = gpu_models
            .iter()
            .find(|m| core::gpu_model::vendor(m) != vendor)
    {
        return Err(ApiError::invalid(
            "resources.accelerator",
            format!(
                "is \"{vendor}\" but gpu_models names {other:?}, made by {}",
                core::gpu_model::vendor(other)
            ),
        ));
    }
    Ok(Some(accelerator))
}

pub fn job_state(s: core::JobState) -> wire::JobState {
    match s {
        core::JobState::Queued => wire::JobState::Queued,
        core::JobState::Provisioning => wire::JobState::Provisioning,
        core::JobState::Held => wire::JobState::Held,
        core::JobState::Placed => wire::JobState::Placed,
        core::JobState::Running => wire::JobState::Running,
        core::JobState::Succeeded => wire::JobState::Succeeded,
        core::JobState::Failed => wire::JobState::Failed,
        core::JobState::Cancelled => wire::JobState::Cancelled,
    }
}

pub fn market_name(m: core::Market) -> &'static str {
    match m {
        core::Market::OnDemand => "on_demand",
        core::Market::Spot => "spot",
    }
}

pub fn job_view(job: &JobRecord) -> Result<wire::JobView, ApiError> {
    let spec: wire::JobSpec = serde_json::from_str(&job.spec_json)
        .map_err(|e| ApiError::Internal(format!("stored spec of {} unreadable: {e}", job.id)))?;
    Ok(wire::JobView {
        id: job.id.0,
        name: job.spec.name.clone(),
        team: job.spec.team.clone(),
        project: job.spec.project.clone(),
        state: job_state(job.state),
        priority: spec.priority.unwrap_or(wire::Priority::Normal),
        kind: spec.kind.unwrap_or(wire::JobKind::Batch),
        submitted_at: to_datetime(job.submitted_at),
        started_at: job.started_at.map(to_datetime),
        finished_at: job.finished_at.map(to_datetime),
        exit_code: job.exit_code,
        reason: job.reason.clone(),
        placement: job.placement.as_ref().map(|p| wire::PlacementView {
            region: p.region.clone(),
            pool: p.pool.to_string(),
            node: p.node.to_string(),
            gpus: p.gpus.clone(),
            market: market_name(p.market).to_string(),
            ranks: p
                .ranks
                .iter()
                .map(|r| wire::RankView {
                    rank: r.rank,
                    node: r.node.to_string(),
                    gpus: r.gpus.clone(),
                    state: r.state.clone(),
                    exit_code: r.exit_code,
                })
                .collect(),
        }),
        attempts: job.attempts,
        cancel_requested: job.cancel_requested,
        cost_usd: job.cost.as_dollars(),
        spec,
        runtime_prediction: None,
    })
}

/// A runtime prediction as the API shows it (issue 29).
pub fn prediction_view(p: &core::predict::Prediction) -> wire::RuntimePredictionView {
    use core::predict::Source;
    let (source, level, runs) = match &p.source {
        Source::History { level, runs } => {
            ("history", Some(level.as_str().to_string()), Some(*runs))
        }
        Source::Calibrated { runs, .. } => ("calibrated", None, Some(*runs)),
        Source::UserEstimate { .. } => ("user_estimate", None, None),
        Source::Default => ("default", None, None),
    };
    wire::RuntimePredictionView {
        p50_s: p.p50_s,
        p90_s: p.p90_s,
        source: source.to_string(),
        level,
        runs,
        explanation: p.explain(),
    }
}

pub fn explanation_view(e: &core::Explanation) -> wire::PlacementExplanation {
    wire::PlacementExplanation {
        job_id: e.job.0,
        planned_at: to_datetime(e.at),
        outcome: outcome_view(&e.outcome),
        candidates: e
            .candidates
            .iter()
            .map(|c| wire::CandidateView {
                pool: c.pool.to_string(),
                region: c.region.to_string(),
                node: c.node.as_ref().map(ToString::to_string),
                kind: match c.kind {
                    core::CandidateKind::FreeNow => "free_now",
                    core::CandidateKind::Wait => "wait",
                    core::CandidateKind::Launch => "launch",
                    core::CandidateKind::Preempt => "preempt",
                }
                .to_string(),
                market: market_name(c.market).to_string(),
                start: to_datetime(c.start),
                finish: to_datetime(c.finish),
                cost_usd: c.cost.as_dollars(),
                rejected: c.rejected.as_ref().map(rejection_view),
            })
            .collect(),
        launch_round: None,
        runtime_prediction: None,
    }
}

/// A round's decision as users read it: times as RFC 3339, money in dollars.
fn outcome_view(o: &core::Outcome) -> serde_json::Value {
    use serde_json::json;
    match o {
        core::Outcome::Assigned { node, pool } => {
            json!({"decision": "assigned", "node": node.to_string(), "pool": pool.to_string()})
        }
        core::Outcome::Wait {
            pool,
            expected_start,
        } => json!({
            "decision": "wait",
            "pool": pool.to_string(),
            "expected_start": to_datetime(*expected_start),
        }),
        core::Outcome::Launch { pool, market } => json!({
            "decision": "launch",
            "pool": pool.to_string(),
            "market": market_name(*market),
        }),
        core::Outcome::Hold { reason } => json!({"decision": "hold", "reason": reason}),
    }
}

fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Why a candidate lost or was ruled out: its `code`, the figures that decided it (times as
/// RFC 3339, money in dollars) and a `message` in words.
fn rejection_view(r: &core::Rejection) -> serde_json::Value {
    use core::Rejection as R;
    use serde_json::json;
    let time = |t: Timestamp| to_datetime(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let (code, figures, message) = match r {
        R::RegionNotAllowed => (
            "region_not_allowed",
            json!({}),
            "region not in the job's allow-list".to_string(),
        ),
        R::GpuModelNotAllowed { model } => (
            "gpu_model_not_allowed",
            json!({"model": model}),
            format!("GPU model {model} not in the job's list"),
        ),
        R::AcceleratorNotAllowed { model } => (
            "accelerator_not_allowed",
            json!({"model": model, "vendor": core::gpu_model::vendor(model)}),
            format!("{model} is not an accelerator the job asks for (resources.accelerator)"),
        ),
        R::GpuMemoryTooSmall { have_gb, need_gb } => (
            "gpu_memory_too_small",
            json!({"have_gb": have_gb, "need_gb": need_gb}),
            format!("{have_gb} GB of GPU memory, needs {need_gb} GB"),
        ),
        R::TooFewGpusPerNode { have, need } => (
            "too_few_gpus_per_node",
            json!({"have": have, "need": need}),
            format!("{have} GPU{} per node, needs {need}", plural(*have)),
        ),
        R::TooFewCpus { have, need } => (
            "too_few_cpus",
            json!({"have": have, "need": need}),
            format!("{have} vCPU{} per node, needs {need}", plural(*have)),
        ),
        R::TooLittleMemory { have_gb, need_gb } => (
            "too_little_memory",
            json!({"have_gb": have_gb, "need_gb": need_gb}),
            format!("{have_gb} GB of memory per node, needs {need_gb} GB"),
        ),
        R::OverMaxPrice {
            price_per_hour,
            max_per_hour,
        } => (
            "over_max_price",
            json!({"price_per_hour_usd": price_per_hour.as_dollars(),
                   "max_per_hour_usd": max_per_hour.as_dollars()}),
            format!(
                "{}/h, over the job's maximum of {}/h",
                price_per_hour.usd_text(),
                max_per_hour.usd_text()
            ),
        ),
        R::LatencyTooHigh { latency_ms, max_ms } => (
            "latency_too_high",
            json!({"latency_ms": latency_ms, "max_ms": max_ms}),
            format!("{latency_ms} ms from the callers, over the maximum of {max_ms} ms"),
        ),
        R::NoSpotMarket => (
            "no_spot_market",
            json!({}),
            "no spot market here".to_string(),
        ),
        R::NoCapacity => (
            "no_capacity",
            json!({}),
            "no healthy node has or will free enough GPUs".to_string(),
        ),
        R::BurstDisabled => (
            "burst_disabled",
            json!({}),
            "needs a new node but bursting is off".to_string(),
        ),
        R::QuotaReached { node_limit } => (
            "quota_reached",
            json!({"node_limit": node_limit}),
            format!("the pool's limit of {node_limit} nodes is reached"),
        ),
        R::MissesDeadline { finish, deadline } => (
            "misses_deadline",
            json!({"finish": time(*finish), "deadline": time(*deadline)}),
            format!(
                "misses the deadline: would finish {}, deadline {}",
                time(*finish),
                time(*deadline)
            ),
        ),
        R::Outscored => (
            "outscored",
            json!({}),
            "another candidate cost less or finished sooner".to_string(),
        ),
        R::ProviderNotAllowedByPolicy => (
            "provider_not_allowed_by_policy",
            json!({}),
            "provider not allowed by the team's policy".to_string(),
        ),
        R::RegionNotAllowedByPolicy => (
            "region_not_allowed_by_policy",
            json!({}),
            "region not allowed by the team's policy".to_string(),
        ),
        R::OverPolicyMaxPrice {
            price_per_gpu_hour,
            max_per_gpu_hour,
        } => (
            "over_policy_max_price",
            json!({"price_per_gpu_hour_usd": price_per_gpu_hour.as_dollars(),
                   "max_per_gpu_hour_usd": max_per_gpu_hour.as_dollars()}),
            format!(
                "{}/GPU-h, over the team's maximum of {}/GPU-h",
                price_per_gpu_hour.usd_text(),
                max_per_gpu_hour.usd_text()
            ),
        ),
        R::PreemptsBatchWorkFirst => (
            "preempts_batch_work_first",
            json!({}),
            "a high or critical service takes GPUs back from batch work before it launches a \
             new node"
                .to_string(),
        ),
        R::BurstNotAllowedByPolicy => (
            "burst_not_allowed_by_policy",
            json!({}),
            "needs a new node but the team's policy forbids bursting".to_string(),
        ),
        R::OutsideTimeWindow => (
            "outside_time_window",
            json!({}),
            "outside the time windows the team's policy allows for its priority".to_string(),
        ),
        R::BudgetExhausted { cost, remaining } => (
            "budget_exhausted",
            json!({"cost_usd": cost.as_dollars(), "remaining_usd": remaining.as_dollars()}),
            format!(
                "over budget: needs {}, {} left",
                cost.usd_text(),
                remaining.usd_text()
            ),
        ),
        R::ContendedCapacity => (
            "contended_capacity",
            json!({}),
            "cheaper, but this round gave the capacity to other jobs".to_string(),
        ),
        R::ReservedForJobsWithoutSpot { reserve } => (
            "reserved_for_jobs_without_spot",
            json!({"reserve_usd": reserve.as_dollars()}),
            format!(
                "cheaper, but its last GPUs are kept for jobs that cannot use spot (ranked {} dearer)",
                reserve.usd_text()
            ),
        ),
    };
    let mut out = serde_json::Map::new();
    out.insert("code".into(), json!(code));
    if let serde_json::Value::Object(f) = figures {
        out.extend(f);
    }
    out.insert("message".into(), json!(message));
    serde_json::Value::Object(out)
}

pub fn log_entry(l: &LogRecord) -> wire::LogEntry {
    wire::LogEntry {
        offset: l.offset,
        attempt: l.attempt_no,
        stream: match l.stream.as_str() {
            "stderr" => wire::LogStream::Stderr,
            "system" => wire::LogStream::System,
            _ => wire::LogStream::Stdout,
        },
        text: l.data.clone(),
        at: to_datetime(l.at),
    }
}

/// Pools with live capacity figures from the nodes that joined them.
pub fn pool_view(
    pool: &core::Pool,
    region: Option<&core::Region>,
    nodes: u32,
    gpus_total: u32,
    gpus_free: u32,
) -> wire::PoolView {
    wire::PoolView {
        id: pool.id.to_string(),
        provider: pool.provider.clone(),
        region: pool.region.to_string(),
        instance_type: pool.instance_type.clone(),
        gpu_model: pool.gpu_model.clone(),
        gpu_memory_gb: pool.gpu_memory_gb,
        gpus_per_node: pool.gpus_per_node,
        nodes,
        node_limit: pool.node_limit,
        launchable: pool.launchable,
        unlaunchable_reason: None,
        gpus_total,
        gpus_free,
        price_per_gpu_hour: pool.on_demand_per_gpu_hour().as_dollars(),
        spot_price_per_gpu_hour: pool.spot_per_gpu_hour().map(Money::as_dollars),
        cash_per_gpu_hour: pool.cash_per_gpu_hour(core::Market::OnDemand).as_dollars(),
        marginal_set: !pool.launchable && pool.marginal_per_hour.is_some(),
        latency_ms: region.map_or(0, |r| r.latency_ms),
        boot_time_s: pool.boot_time_s,
        price_updated_at: to_datetime(pool.price_updated_at),
        node_list: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(resources: serde_json::Value) -> Result<core::JobSpec, ApiError> {
        let wire: wire::JobSpec = serde_json::from_value(serde_json::json!({
            "name": "j", "team": "t", "command": ["true"], "resources": resources
        }))
        .expect("a wire spec");
        job_spec(&wire, Timestamp::from_secs(1_800_000_000))
    }

    fn field(e: ApiError) -> Option<String> {
        match e {
            ApiError::BadRequest { field, .. } => field,
            other => panic!("not a 400: {other:?}"),
        }
    }

    /// Issue 28: `resources.accelerator` parsed, absent kept absent, and a vendor that the
    /// model list contradicts refused naming the field.
    #[test]
    fn accelerator_is_checked_against_the_model_list() {
        let accel = |r| spec(r).map(|s| s.resources.accelerator);
        assert_eq!(accel(serde_json::json!({"gpus": 1})).ok(), Some(None));
        assert_eq!(
            accel(serde_json::json!({"gpus": 1, "accelerator": "Google"})).ok(),
            Some(Some(core::Accelerator::Google))
        );
        assert_eq!(
            accel(serde_json::json!({"gpus": 1, "accelerator": "any",
                "gpu_models": ["H100", "MI300X", "TPU-v5e"]}))
            .ok(),
            Some(Some(core::Accelerator::Any))
        );
        assert_eq!(
            accel(serde_json::json!({"gpus": 1, "accelerator": "amd",
                "gpu_models": ["MI300X"]}))
            .ok(),
            Some(Some(core::Accelerator::Amd))
        );
        for bad in [
            serde_json::json!({"gpus": 1, "accelerator": "gpu"}),
            serde_json::json!({"gpus": 1, "accelerator": "nvidia", "gpu_models": ["H100", "MI300X"]}),
            serde_json::json!({"gpus": 1, "accelerator": "google", "gpu_models": ["H100"]}),
        ] {
            let err = spec(bad.clone()).expect_err("refused");
            assert_eq!(
                field(err).as_deref(),
                Some("resources.accelerator"),
                "{bad}"
            );
        }
    }
}
