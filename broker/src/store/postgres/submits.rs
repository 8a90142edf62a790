//! Submissions written in batches. Each submitted job is still acknowledged only after the
//! transaction holding its row committed, but the rows that arrive while one batch commits go
//! into the next batch together, one `INSERT … SELECT FROM UNNEST(…)` and one commit (one WAL
//! flush) for all of them. With PostgreSQL's default durability (`fsync`,
//! `synchronous_commit` on) a commit per row caps submissions at what the disk flushes a
//! second; batched, the flush is shared. An idle broker writes a lone row at once: nothing
//! waits for a batch to fill.
//!
//! A batch that fails (a duplicate id, say) is written again row by row, so each submission
//! gets its own answer and one bad row fails no other.

use crate::store::DbTime;

type Tz = chrono::DateTime<chrono::Utc>;
use crate::store::{NewJob, StoreError, StoreResult};
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

/// The most rows one batch writes.
const MAX_BATCH: usize = 512;

/// The most submissions that wait for a batch: beyond it a submission waits for room before it
/// queues, so a database slower than the submitters holds them back (each still holds its HTTP
/// request) rather than growing the queue without end.
const MAX_WAITING: usize = 8 * MAX_BATCH;

/// One job row as stored, owned so it can wait in the queue.
struct Row {
    id: Uuid,
    team: String,
    project: Option<String>,
    name: String,
    priority: &'static str,
    kind: &'static str,
    spec_json: String,
    core_spec_json: String,
    submitted_at: Tz,
    deadline: Option<Tz>,
    trace_parent: Option<String>,
}

struct Pending {
    row: Row,
    done: oneshot::Sender<StoreResult<()>>,
}

/// The handle the store keeps: queues a row and waits for its commit.
#[derive(Clone, Debug)]
pub(crate) struct Submits {
    queue: mpsc::Sender<Pending>,
}

impl Submits {
    /// Starts the writer task on the current runtime.
    pub(crate) fn start(pool: PgPool) -> Submits {
        let (queue, rx) = mpsc::channel(MAX_WAITING);
        tokio::spawn(write_batches(pool, rx));
        Submits { queue }
    }

    /// Writes `job` as a queued job; returns once its row committed (or failed).
    pub(crate) async fn insert(&self, job: &NewJob) -> StoreResult<()> {
        let core_spec_json = serde_json::to_string(&job.spec)
            .map_err(|e| StoreError::Corrupt(format!("spec: {e}")))?;
        let row = Row {
            id: job.id.0,
            team: job.spec.team.clone(),
            project: job.spec.project.clone(),
            name: job.spec.name.clone(),
            priority: job.spec.priority.as_str(),
            kind: match job.spec.kind {
                switchyard_core::JobKind::Batch => "batch",
                switchyard_core::JobKind::Service => "service",
            },
            spec_json: job.spec_json.clone(),
            core_spec_json,
            submitted_at: DbTime(job.submitted_at).to_tz(),
            deadline: job.spec.deadline.map(|d| DbTime(d).to_tz()),
            trace_parent: job.trace_parent.clone(),
        };
        let (done, answer) = oneshot::channel();
        let gone = || StoreError::Corrupt("the submission writer has stopped".into());
        self.queue
            .send(Pending { row, done })
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

async fn write_batches(pool: PgPool, mut rx: mpsc::Receiver<Pending>) {
    let mut batch: Vec<Pending> = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let rows: Vec<&Row> = batch.iter().map(|p| &p.row).collect();
        match insert_rows(&pool, &rows).await {
            Ok(()) => {
                for p in batch.drain(..) {
                    let _ = p.done.send(Ok(()));
                }
            }
            Err(e) if batch.len() == 1 => {
                if let Some(p) = batch.pop() {
                    let _ = p.done.send(Err(e));
                }
            }
            Err(_) => {
                for p in batch.drain(..) {
                    let result = insert_rows(&pool, &[&p.row]).await;
                    let _ = p.done.send(result);
                }
            }
        }
    }
}

/// One statement, one transaction (autocommit) for all of `rows`.
async fn insert_rows(pool: &PgPool, rows: &[&Row]) -> StoreResult<()> {
    let col = |f: fn(&Row) -> String| rows.iter().map(|r| f(r)).collect::<Vec<String>>();
    let opt = |f: fn(&Row) -> Option<String>| rows.iter().map(|r| f(r)).collect::<Vec<_>>();
    sqlx::query(
        "INSERT INTO jobs (id, team, project, name, state, priority, kind, spec_json, \
         core_spec_json, submitted_at, deadline, trace_parent) \
         SELECT id, team, project, name, 'queued', priority, kind, spec_json, core_spec_json, \
                submitted_at, deadline, trace_parent \
         FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], \
                     $7::text[], $8::text[], $9::timestamptz[], $10::timestamptz[], $11::text[]) \
              AS v(id, team, project, name, priority, kind, spec_json, core_spec_json, \
                   submitted_at, deadline, trace_parent)",
    )
    .bind(rows.iter().map(|r| r.id).collect::<Vec<Uuid>>())
    .bind(col(|r| r.team.clone()))
    .bind(opt(|r| r.project.clone()))
    .bind(col(|r| r.name.clone()))
    .bind(col(|r| r.priority.to_string()))
    .bind(col(|r| r.kind.to_string()))
    .bind(col(|r| r.spec_json.clone()))
    .bind(col(|r| r.core_spec_json.clone()))
    .bind(rows.iter().map(|r| r.submitted_at).collect::<Vec<Tz>>())
    .bind(rows.iter().map(|r| r.deadline).collect::<Vec<Option<Tz>>>())
    .bind(opt(|r| r.trace_parent.clone()))
    .execute(pool)
    .await?;
    Ok(())
}
