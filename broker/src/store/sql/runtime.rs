//! Runtime history (issue 29): the sketches of `switchyard_core::predict`, one row per key in
//! `runtime_history`. A job that succeeds adds its run to its keys in the transaction that ends
//! it ([`record_success`]); the leader's scheduler loads the rows into its
//! [`Predictor`](switchyard_core::Predictor) at start and reloads those updated since
//! ([`Store::runtime_history_since`]).
//!
//! Only successes are recorded: a failed, cancelled or requeued attempt's runtime says how
//! long until it broke, not how long the work takes.

use super::*;
use switchyard_core::JobSpec;
use switchyard_core::predict::{JobKey, Level, Prediction, Predictor, Sketch};

/// The prediction key of a job: its team, name, command and GPUs, and as its user its
/// project (jobs carry no submitter; a job without a project is its team's unnamed user).
pub fn runtime_key(spec: &JobSpec) -> JobKey {
    JobKey::from_spec(spec, spec.project.as_deref().unwrap_or(""))
}

/// One stored sketch.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeRow {
    pub key: String,
    pub sketch: Sketch,
    pub updated_at: Timestamp,
}

impl Store {
    /// What the broker predicts `spec` runs now, from the stored sketches of its keys (the
    /// same prediction the leader's scheduler makes from its copy of them).
    pub async fn runtime_prediction(&self, spec: &JobSpec) -> StoreResult<Prediction> {
        let key = runtime_key(spec);
        let mut predictor = Predictor::new();
        let keys = Level::ALL
            .iter()
            .map(|&l| key.storage_key(l))
            .chain(std::iter::once(key.ratio_key()));
        for k in keys {
            let stored: Option<String> =
                query_scalar("SELECT sketch_json FROM runtime_history WHERE key = $1")
                    .bind(&k)
                    .fetch_optional(&self.db)
                    .await?;
            if let Some(sketch) = stored.and_then(|s| serde_json::from_str::<Sketch>(&s).ok()) {
                predictor.load(k, sketch);
            }
        }
        Ok(predictor.predict(&key, spec.estimated_runtime_s))
    }

    /// The sketches updated at or after `since` (all with `None`), oldest first. A row whose
    /// sketch does not parse is skipped with a warning: history is advice.
    pub async fn runtime_history_since(
        &self,
        since: Option<Timestamp>,
    ) -> StoreResult<Vec<RuntimeRow>> {
        let rows = query(
            "SELECT key, sketch_json, updated_at FROM runtime_history \
             WHERE updated_at >= $1 ORDER BY updated_at, key",
        )
        .bind(since.unwrap_or(Timestamp(0)))
        .fetch_all(&self.db)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let key: String = r.get("key")?;
            match serde_json::from_str::<Sketch>(&r.get::<String>("sketch_json")?) {
                Ok(sketch) if sketch.is_valid() => out.push(RuntimeRow {
                    key,
                    sketch,
                    updated_at: r.time("updated_at")?,
                }),
                _ => tracing::warn!(key, "runtime history: a stored sketch does not parse"),
            }
        }
        Ok(out)
    }
}

/// Adds a succeeded job's run (from its `started_at` to `end`) to its runtime history, in the
/// transaction that ends it. Services (which run until stopped) and jobs that never started
/// are not recorded.
pub(super) async fn record_success(tx: &mut Tx, job: Uuid, end: Timestamp) -> StoreResult<()> {
    let Some(row) = query("SELECT core_spec_json, started_at FROM jobs WHERE id = $1")
        .bind(job)
        .fetch_optional(&mut *tx)
        .await?
    else {
        return Ok(());
    };
    let spec = parse_spec(&row.get::<String>("core_spec_json")?)?;
    let Some(started) = row.time_opt("started_at")? else {
        return Ok(());
    };
    if spec.kind == switchyard_core::JobKind::Service {
        return Ok(());
    }
    let actual_s = (end.millis() - started.millis()).max(0) / 1000;
    let key = runtime_key(&spec);
    for (k, value) in Predictor::observations(&key, spec.estimated_runtime_s, actual_s) {
        let stored: Option<String> =
            query_scalar("SELECT sketch_json FROM runtime_history WHERE key = $1")
                .bind(&k)
                .fetch_optional(&mut *tx)
                .await?;
        let mut sketch = stored
            .and_then(|s| serde_json::from_str::<Sketch>(&s).ok())
            .filter(Sketch::is_valid)
            .unwrap_or_default();
        sketch.add(value);
        let json =
            serde_json::to_string(&sketch).map_err(|e| corrupt(format!("runtime sketch: {e}")))?;
        let level = k.split('|').next().unwrap_or_default().to_string();
        query(
            "INSERT INTO runtime_history (key, level, sketch_json, runs, updated_at) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (key) DO UPDATE SET level = excluded.level, \
             sketch_json = excluded.sketch_json, runs = excluded.runs, \
             updated_at = excluded.updated_at",
        )
        .bind(&k)
        .bind(level)
        .bind(json)
        .bind(i64::from(sketch.n))
        .bind(end)
        .execute(&mut *tx)
        .await?;
    }
    Ok(())
}
