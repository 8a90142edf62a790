//! The broker's one clock. `core` never reads time; the shell reads it from the [`Clock`] in the
//! app state (`App::clock`) and passes it in.
//!
//! Production runs on [`Clock::system`]. Tests start the broker on a [`Clock::manual`] and move
//! it ([`Clock::advance`], [`Clock::set`]) instead of sleeping for leases, idle TTLs, budget
//! windows or token lifetimes to run out. The loops that wait on an interval and then act on
//! the time (the ledger's accrual, the burst controller) also wake when a manual clock moves
//! ([`Clock::moves`]), so a test sees the effect of the time it moved without waiting for their
//! next tick; the scheduler ticks every `scheduler_tick_ms` and sees it on its next round.
//!
//! Durations that are not broker time — the cadence of the loops, network and body timeouts,
//! rate-limit buckets, how long a plan took — are measured on the monotonic clocks
//! (`std`/`tokio` `Instant`, `governor`'s), not here.

use chrono::{DateTime, TimeZone, Utc};
use std::sync::Arc;
use std::time::Duration;
use switchyard_core::Timestamp;
use tokio::sync::watch;

/// Where the broker reads the time: cheap to clone, shared by every handler and loop.
#[derive(Clone, Debug)]
pub struct Clock(Source);

#[derive(Clone, Debug)]
enum Source {
    System,
    /// Moves only when told to; its receivers hear each move.
    Manual(Arc<watch::Sender<Timestamp>>),
}

impl Clock {
    /// The wall clock.
    pub fn system() -> Clock {
        Clock(Source::System)
    }

    /// A clock that stands at `start` until [`Clock::advance`] or [`Clock::set`] moves it.
    pub fn manual(start: Timestamp) -> Clock {
        Clock(Source::Manual(Arc::new(watch::Sender::new(start))))
    }

    pub fn now(&self) -> Timestamp {
        match &self.0 {
            Source::System => Timestamp(Utc::now().timestamp_millis()),
            Source::Manual(t) => *t.borrow(),
        }
    }

    /// Moves a manual clock forward by `by`; returns the new time.
    ///
    /// # Panics
    /// On the system clock, which only time moves.
    pub fn advance(&self, by: Duration) -> Timestamp {
        let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        let t = Timestamp(self.now().millis().saturating_add(by));
        self.set(t);
        t
    }

    /// Sets a manual clock to `t` (backwards too: a clock step).
    ///
    /// # Panics
    /// On the system clock, which only time moves.
    pub fn set(&self, t: Timestamp) {
        match &self.0 {
            Source::System => panic!("the system clock cannot be set; start on Clock::manual"),
            Source::Manual(sender) => {
                sender.send_replace(t);
            }
        }
    }

    /// The moves of this clock from now on, for a loop that sleeps between passes.
    pub fn moves(&self) -> Moves {
        Moves(match &self.0 {
            Source::System => None,
            Source::Manual(sender) => Some(sender.subscribe()),
        })
    }
}

/// See [`Clock::moves`].
#[derive(Debug)]
pub struct Moves(Option<watch::Receiver<Timestamp>>);

impl Moves {
    /// Waits until the manual clock moved since the last call (or since [`Clock::moves`]); never
    /// returns for the system clock, whose time the loops' own intervals see pass.
    pub async fn next(&mut self) {
        if let Some(rx) = &mut self.0
            && rx.changed().await.is_ok()
        {
            return;
        }
        std::future::pending::<()>().await;
    }
}

pub fn to_datetime(t: Timestamp) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(t.millis())
        .single()
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

pub fn from_datetime(t: DateTime<Utc>) -> Timestamp {
    Timestamp(t.timestamp_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_stands_still_until_moved() {
        let clock = Clock::manual(Timestamp(1_000));
        let shared = clock.clone();
        assert_eq!(clock.now(), Timestamp(1_000));
        assert_eq!(
            shared.advance(Duration::from_millis(2_500)),
            Timestamp(3_500)
        );
        assert_eq!(clock.now(), Timestamp(3_500));
        clock.set(Timestamp(10));
        assert_eq!(shared.now(), Timestamp(10));
    }

    #[tokio::test]
    async fn a_move_wakes_a_waiting_loop_even_when_it_came_first() {
        let clock = Clock::manual(Timestamp(0));
        let mut moves = clock.moves();
        clock.advance(Duration::from_secs(1));
        // The move happened before the wait: it is not lost.
        tokio::time::timeout(Duration::from_secs(5), moves.next())
            .await
            .expect("woken by the earlier move");
        let waiting = tokio::time::timeout(Duration::from_millis(20), moves.next()).await;
        assert!(waiting.is_err(), "no move since: still waiting");
    }

    #[tokio::test]
    async fn the_system_clock_never_wakes_a_loop() {
        let clock = Clock::system();
        let before = clock.now();
        let waiting = tokio::time::timeout(Duration::from_millis(20), clock.moves().next()).await;
        assert!(waiting.is_err());
        assert!(clock.now() >= before);
    }
}
