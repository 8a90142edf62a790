//! Notifications between broker replicas: what one replica's handlers tell the scheduler and
//! the agents' long-polls reaches the others through PostgreSQL `LISTEN`/`NOTIFY`. A job
//! submitted to a follower wakes the leader's scheduler; a lease the leader commits wakes the
//! agent's long-poll on whichever replica it waits.
//!
//! Notifications are hints, never the record: everything they point at is already committed
//! (they are sent after the commit), and a lost one only delays work. The leader also reloads
//! its mirror from the database every [`RESYNC_EVERY`] while the bus is on, and after the
//! listener reconnects. With SQLite (one process) the bus is off and costs nothing.

use std::time::Duration;
use switchyard_core::{JobId, NodeId};
use tokio::sync::mpsc;

/// How often a leader with the bus on reloads its mirror, whatever it was told.
pub const RESYNC_EVERY: Duration = Duration::from_secs(5);

const SCHEDULER: &str = "switchyard_scheduler";
const AGENTS: &str = "switchyard_agents";

/// What a replica tells the others.
#[derive(Clone, Debug, PartialEq)]
pub enum Note {
    /// A job was stored and waits for placement.
    JobSubmitted(JobId),
    /// A waiting job left the queue (cancelled).
    JobRemoved(JobId),
    /// Anything else the scheduler mirrors changed: reload.
    Resync,
    /// There is work or a stop for this node's agent.
    Wake(NodeId),
}

impl Note {
    fn channel(&self) -> &'static str {
        match self {
            Note::Wake(_) => AGENTS,
            _ => SCHEDULER,
        }
    }

    fn body(&self) -> String {
        match self {
            Note::JobSubmitted(id) => format!("job {id}"),
            Note::JobRemoved(id) => format!("removed {id}"),
            Note::Resync => "resync".into(),
            Note::Wake(node) => format!("wake {node}"),
        }
    }

    fn parse(body: &str) -> Option<Note> {
        let (kind, arg) = body.split_once(' ').unwrap_or((body, ""));
        match kind {
            "job" => arg.parse().ok().map(|u| Note::JobSubmitted(JobId(u))),
            "removed" => arg.parse().ok().map(|u| Note::JobRemoved(JobId(u))),
            "resync" => Some(Note::Resync),
            "wake" if !arg.is_empty() => Some(Note::Wake(NodeId::new(arg))),
            _ => None,
        }
    }
}

/// The sending side, shared by the scheduler handle and the agent wakers. Off (a no-op)
/// unless [`Bus::start`] made it.
#[derive(Clone, Default)]
pub struct Bus {
    origin: String,
    tx: Option<mpsc::UnboundedSender<Note>>,
}

impl Bus {
    /// Whether notes leave this process (several replicas may run).
    pub fn is_on(&self) -> bool {
        self.tx.is_some()
    }

    /// This process's tag on what it sends; its own notes come back to it and are skipped.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Queues `note` for the other replicas; never blocks, never fails the caller.
    pub fn publish(&self, note: Note) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(note);
        }
    }
}

/// `origin body` on the wire.
fn encode(origin: &str, note: &Note) -> String {
    format!("{origin} {}", note.body())
}

/// A received note from another replica (`None` for this process's own and for garbage).
pub fn decode(origin: &str, payload: &str) -> Option<Note> {
    let (from, body) = payload.split_once(' ')?;
    if from == origin {
        return None;
    }
    Note::parse(body)
}

pub use pg::{listen, start};

mod pg {
    use super::*;
    use crate::control::scheduler::SchedulerEvent;
    use crate::state::App;
    use sqlx::PgPool;
    use sqlx::postgres::PgListener;

    /// Most notes sent in one statement.
    const BATCH: usize = 512;

    /// A bus over `pool`: a task sends what is published in batches
    /// (`pg_notify` over arrays: one round trip for many notes).
    pub fn start(pool: PgPool, origin: String) -> Bus {
        let (tx, mut rx) = mpsc::unbounded_channel::<Note>();
        let bus = Bus {
            origin: origin.clone(),
            tx: Some(tx),
        };
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(BATCH);
            while rx.recv_many(&mut batch, BATCH).await > 0 {
                batch.dedup();
                let channels: Vec<&str> = batch.iter().map(Note::channel).collect();
                let payloads: Vec<String> = batch.iter().map(|n| encode(&origin, n)).collect();
                let sent = sqlx::query(
                    "SELECT pg_notify(c, p) FROM UNNEST($1::text[], $2::text[]) AS t(c, p)",
                )
                .bind(&channels)
                .bind(&payloads)
                .execute(&pool)
                .await;
                if let Err(e) = sent {
                    // Hints only: the leader's periodic resync covers what is lost.
                    tracing::warn!(error = %e, notes = batch.len(), "could not notify the other replicas");
                }
                batch.clear();
            }
        });
        bus
    }

    /// Receives the other replicas' notes for the life of the process and hands them to this
    /// one's scheduler (when it leads) and agent long-polls.
    pub async fn listen(app: App, pool: PgPool) {
        loop {
            match listen_once(&app, &pool).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "replica notifications: listener failed; reconnecting");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    async fn listen_once(app: &App, pool: &PgPool) -> Result<(), sqlx::Error> {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen_all([SCHEDULER, AGENTS]).await?;
        // Whatever was sent while nobody listened: reload, and let every waiting agent look.
        app.scheduler.send_local(SchedulerEvent::InstancesChanged);
        app.agents.wake_all_local();
        let origin = app.agents.bus().origin().to_string();
        loop {
            // `try_recv` reports a lost connection as `None` instead of reconnecting silently,
            // so a gap is followed by the resync above.
            let Some(n) = listener.try_recv().await? else {
                return Err(sqlx::Error::PoolClosed);
            };
            match decode(&origin, n.payload()) {
                Some(Note::Wake(node)) => app.agents.wake_local(&node),
                Some(note) if app.leadership.is_leader() => deliver(app, note).await,
                _ => {}
            }
        }
    }

    async fn deliver(app: &App, note: Note) {
        let event = match note {
            Note::JobSubmitted(id) => match app.store.job(id).await {
                Ok(Some(job)) if job.state == switchyard_core::JobState::Queued => {
                    SchedulerEvent::JobSubmitted(Box::new(job))
                }
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(job.id = %id, error = %e, "could not read a job another replica stored; resyncing");
                    SchedulerEvent::InstancesChanged
                }
            },
            Note::JobRemoved(id) => SchedulerEvent::JobRemoved(id),
            Note::Resync | Note::Wake(_) => SchedulerEvent::InstancesChanged,
        };
        app.scheduler.send_local(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_round_trip_and_own_notes_are_skipped() {
        let id = JobId(uuid::Uuid::now_v7());
        for note in [
            Note::JobSubmitted(id),
            Note::JobRemoved(id),
            Note::Resync,
            Note::Wake(NodeId::new("node-7")),
        ] {
            let wire = encode("a1", &note);
            assert_eq!(decode("b2", &wire), Some(note.clone()), "{wire}");
            assert_eq!(decode("a1", &wire), None, "own note {wire}");
        }
        assert_eq!(decode("b2", "a1 job not-a-uuid"), None);
        assert_eq!(decode("b2", "a1 wake"), None);
        assert_eq!(decode("b2", "garbage"), None);
    }
}
