//! [`ServingModel`]: how long an LLM inference replica takes to answer a request, as a GPU
//! server does it — a prompt's prefill, then one decode step per generated token, with several
//! requests decoded together (continuous batching) up to a hard bound of `slots`, beyond which
//! requests wait inside the replica. The model emulator (`tests/src/bin/model-emulator.rs`)
//! answers HTTP requests on this timing, and the simulator and benches can use the same
//! functions, so a replayed day and a live one agree on what a replica can do.
//!
//! Pure like the rest of `core`: times are plain microseconds passed in and returned, nothing
//! here reads a clock or sleeps. [`TimeCompression`] turns model time into wall time so a bench
//! can replay a day in minutes.
//!
//! The constants in [`ServingModel::DEFAULT`] are OUR OWN ASSUMPTION, not a measurement: roughly
//! an 8B-parameter model with 8-bit weights on one 24 GB L4/A10G-class GPU. Their reasoning is
//! written beside each one so anyone can swap in figures measured on their own hardware.

use serde::{Deserialize, Serialize};

/// The timing of one inference replica (one model on one GPU). All times in microseconds of
/// model time (before any [`TimeCompression`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServingModel {
    /// Prefill cost per prompt token. Prefill is compute-bound: an 8B model needs ~16 GFLOP per
    /// token, and at ~60 % of an L4/A10G's ~125 dense fp16/int8 TFLOPS that is ~0.2 ms per token.
    /// Prefill gains nothing from batching (the GPU is already busy), so the emulator runs one
    /// prefill at a time per replica.
    pub prefill_us_per_token: u64,
    /// Decode cost per generated token when the request runs alone. Decode is memory-bound:
    /// every step reads all weights once — 8 GB of 8-bit weights at ~70 % of an A10G's 600 GB/s
    /// is ~19 ms, so 20 ms per token (~50 tokens/s for one stream).
    pub decode_us_per_token: u64,
    /// How much longer each decode step gets for every *other* request decoded in the same
    /// batch: their KV cache reads and a little compute. 0.4 ms is 2 % of a step, so a full batch
    /// of 16 decodes each stream at ~26 ms per token, ~600 tokens/s for the replica — continuous
    /// batching's point: throughput grows almost with the batch, latency only mildly.
    pub decode_growth_us_per_peer: u64,
    /// Fixed cost per request: tokenising, scheduling, the HTTP exchange inside the server.
    pub base_us: u64,
    /// Requests in service at once (the batch bound). It is set by KV-cache memory: ~12 GB left
    /// after weights and activations, at ~128 KiB per token for an 8B model with grouped-query
    /// attention, holds ~90 k tokens — 16 sequences of up to ~4 k tokens with some headroom.
    /// Requests beyond it wait inside the replica for a slot.
    pub slots: u32,
}

impl ServingModel {
    /// Our assumed 8B model on one L4/A10G-class GPU (see each field for the reasoning).
    pub const DEFAULT: ServingModel = ServingModel {
        prefill_us_per_token: 200,
        decode_us_per_token: 20_000,
        decode_growth_us_per_peer: 400,
        base_us: 5_000,
        slots: 16,
    };

    /// A replica that answers at once: every time is zero. For measuring what sits in front of
    /// replicas (a gateway) without the model's time drowning it. `slots` still bounds
    /// concurrency.
    pub const fn instant(slots: u32) -> ServingModel {
        ServingModel {
            prefill_us_per_token: 0,
            decode_us_per_token: 0,
            decode_growth_us_per_peer: 0,
            base_us: 0,
            slots,
        }
    }

    /// The prefill time of a prompt of `prompt_tokens`, alone on the GPU.
    pub fn prefill_us(&self, prompt_tokens: u32) -> u64 {
        self.prefill_us_per_token
            .saturating_mul(u64::from(prompt_tokens))
    }

    /// One decode step (one generated token) when `running` requests are in service on the
    /// replica, this one included. `running` is clamped to `1..=slots`: more never decode together.
    pub fn decode_step_us(&self, running: u32) -> u64 {
        let batch = running.clamp(1, self.slots.max(1));
        let peers = u64::from(batch - 1);
        self.decode_us_per_token
            .saturating_add(self.decode_growth_us_per_peer.saturating_mul(peers))
    }

    /// The time a request spends in service (after it got a slot): base cost, its prefill, then
    /// `output_tokens` decode steps with `running` requests in the batch. The batch is taken as
    /// constant through the request — close enough under steady load, and what makes the model
    /// a pure function.
    pub fn service_us(&self, prompt_tokens: u32, output_tokens: u32, running: u32) -> u64 {
        self.base_us
            .saturating_add(self.prefill_us(prompt_tokens))
            .saturating_add(
                self.decode_step_us(running)
                    .saturating_mul(u64::from(output_tokens)),
            )
    }

    /// Generated tokens per second the replica sustains with every slot busy: its capacity, the
    /// figure an autoscaler's per-replica target should stay under.
    pub fn peak_decode_tokens_per_s(&self) -> u64 {
        let step = self.decode_step_us(self.slots);
        if step == 0 {
            return u64::MAX;
        }
        u64::from(self.slots.max(1)).saturating_mul(1_000_000) / step
    }
}

impl Default for ServingModel {
    fn default() -> ServingModel {
        ServingModel::DEFAULT
    }
}

/// How many times faster than model time the wall clock runs: 60 replays an hour in a minute,
/// 1 is real time. Never zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeCompression(u32);

impl TimeCompression {
    pub const REAL_TIME: TimeCompression = TimeCompression(1);

    /// `None` for zero: time cannot stop.
    pub const fn new(factor: u32) -> Option<TimeCompression> {
        if factor == 0 {
            None
        } else {
            Some(TimeCompression(factor))
        }
    }

    pub const fn factor(self) -> u32 {
        self.0
    }

    /// Wall-clock microseconds for `model_us` of model time, rounded to nearest.
    pub fn wall_us(self, model_us: u64) -> u64 {
        let f = u64::from(self.0);
        model_us.saturating_add(f / 2) / f
    }

    /// Model microseconds for `wall_us` of wall time.
    pub fn model_us(self, wall_us: u64) -> u64 {
        wall_us.saturating_mul(u64::from(self.0))
    }
}

/// One replica as a queue, in model time: each request takes the slot that frees first, waits
/// for it if every slot is busy, and is served with the batch it finds when it starts. What the
/// simulator needs to turn arrivals into latencies without running an emulator; deterministic
/// for a given order of arrivals.
#[derive(Clone, Debug)]
pub struct ReplicaQueue {
    model: ServingModel,
    /// When each slot is next free (microseconds of model time).
    slot_free_at: Vec<u64>,
}

/// What [`ReplicaQueue::admit`] decided for one request (microseconds of model time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admitted {
    /// When it got a slot: its arrival, or later if every slot was busy.
    pub start_us: u64,
    /// When its last token is out.
    pub finish_us: u64,
    /// Requests in service when it started, itself included.
    pub running: u32,
}

impl Admitted {
    /// From arrival to its last token.
    pub fn latency_us(&self, arrival_us: u64) -> u64 {
        self.finish_us.saturating_sub(arrival_us)
    }

    /// Time spent waiting for a slot.
    pub fn queued_us(&self, arrival_us: u64) -> u64 {
        self.start_us.saturating_sub(arrival_us)
    }
}

impl ReplicaQueue {
    /// An idle replica. A model with zero slots is given one: a replica serves something.
    pub fn new(model: ServingModel) -> ReplicaQueue {
        let slots = model.slots.max(1) as usize;
        ReplicaQueue {
            model,
            slot_free_at: vec![0; slots],
        }
    }

    pub fn model(&self) -> &ServingModel {
        &self.model
    }

    /// Requests still in service (or waiting for a slot) at `now_us`.
    pub fn busy_at(&self, now_us: u64) -> u32 {
        self.slot_free_at.iter().filter(|&&t| t > now_us).count() as u32
    }

    /// Admits a request arriving at `arrival_us`. Arrivals must come in time order.
    pub fn admit(&mut self, arrival_us: u64, prompt_tokens: u32, output_tokens: u32) -> Admitted {
        // The slot that frees first; ties to the lowest index, so the result is deterministic.
        let (slot, free_at) = self
            .slot_free_at
            .iter()
            .copied()
            .enumerate()
            .min_by_key(|&(i, t)| (t, i))
            .unwrap_or((0, 0));
        let start_us = arrival_us.max(free_at);
        let running = self.busy_at(start_us) + 1;
        let finish_us =
            start_us.saturating_add(self.model.service_us(prompt_tokens, output_tokens, running));
        if let Some(s) = self.slot_free_at.get_mut(slot) {
            *s = finish_us;
        }
        Admitted {
            start_us,
            finish_us,
            running,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_time_is_base_plus_prefill_plus_decode() {
        let m = ServingModel::DEFAULT;
        // 500-token prompt, 100 tokens out, alone: 5 ms + 100 ms + 2 s.
        assert_eq!(m.service_us(500, 100, 1), 5_000 + 100_000 + 2_000_000);
        // Prefill grows with the prompt, decode with the output.
        assert!(m.service_us(1_000, 100, 1) > m.service_us(500, 100, 1));
        assert!(m.service_us(500, 200, 1) > m.service_us(500, 100, 1));
    }

    #[test]
    fn decode_slows_mildly_with_the_batch_and_never_beyond_slots() {
        let m = ServingModel::DEFAULT;
        let alone = m.decode_step_us(1);
        let full = m.decode_step_us(m.slots);
        assert!(full > alone);
        // Mildly: a full batch costs each stream well under twice the solo step...
        assert!(full < 2 * alone, "{full} vs {alone}");
        // ...so the replica's throughput grows almost with the batch.
        let solo_tps = 1_000_000 / alone;
        assert!(m.peak_decode_tokens_per_s() > 10 * solo_tps);
        // More than `slots` never decode together; zero counts as the request alone.
        assert_eq!(m.decode_step_us(m.slots + 50), full);
        assert_eq!(m.decode_step_us(0), alone);
    }

    #[test]
    fn instant_model_takes_no_time() {
        let m = ServingModel::instant(4);
        assert_eq!(m.service_us(10_000, 10_000, 4), 0);
        assert_eq!(m.peak_decode_tokens_per_s(), u64::MAX);
    }

    #[test]
    fn huge_inputs_saturate_instead_of_overflowing() {
        let m = ServingModel {
            decode_us_per_token: u64::MAX / 2,
            ..ServingModel::DEFAULT
        };
        assert_eq!(m.service_us(u32::MAX, u32::MAX, u32::MAX), u64::MAX);
    }

    #[test]
    fn compression_divides_time_and_refuses_zero() {
        assert_eq!(TimeCompression::new(0), None);
        let c = TimeCompression::new(60).expect("non-zero");
        assert_eq!(c.wall_us(60_000_000), 1_000_000);
        assert_eq!(c.wall_us(89), 1); // rounded to nearest
        assert_eq!(c.wall_us(29), 0);
        assert_eq!(c.model_us(1_000_000), 60_000_000);
        assert_eq!(TimeCompression::REAL_TIME.wall_us(1234), 1234);
    }

    #[test]
    fn replica_queue_bounds_concurrency_and_makes_the_excess_wait() {
        let model = ServingModel {
            slots: 2,
            ..ServingModel::DEFAULT
        };
        let mut q = ReplicaQueue::new(model);
        let a = q.admit(0, 100, 10);
        let b = q.admit(0, 100, 10);
        // Two slots: both start at once, the second sees a batch of two.
        assert_eq!((a.start_us, a.running), (0, 1));
        assert_eq!((b.start_us, b.running), (0, 2));
        assert_eq!(q.busy_at(0), 2);
        // The third waits for the first slot to free, and its latency includes the wait.
        let c = q.admit(0, 100, 10);
        assert_eq!(c.start_us, a.finish_us.min(b.finish_us));
        assert_eq!(c.queued_us(0), c.start_us);
        assert!(c.latency_us(0) > b.latency_us(0));
        assert!(q.busy_at(c.start_us) <= 2);
    }

    #[test]
    fn replica_queue_is_idle_between_spaced_arrivals() {
        let mut q = ReplicaQueue::new(ServingModel::DEFAULT);
        let first = q.admit(0, 200, 20);
        let later = q.admit(first.finish_us + 1, 200, 20);
        assert_eq!(later.running, 1);
        assert_eq!(later.queued_us(first.finish_us + 1), 0);
        assert_eq!(later.latency_us(first.finish_us + 1), first.latency_us(0));
    }
}
