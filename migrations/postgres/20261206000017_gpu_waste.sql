-- Waste (issue 28): per job (its rank-0 attempt, `attempt_id`, keys a gang), the GPU time it
-- held idle, as the leader's waste loop (`broker/src/control/waste.rs`) judged it from
-- heartbeats with `switchyard_core::waste`. `idle_gpu_ms` only grows: under the team's
-- `utilization` threshold, or 10 % for a team without a rule (measured, never acted on).
-- `history_json` is what-if's record: for each of 5 fixed thresholds the longest idle
-- stretch and the idle GPU-ms (`[{threshold_pct, longest_idle_ms, idle_gpu_ms}]`, bounded).
-- `action` (notify|stop|requeue) is set once, when the rule acted, with `reason`.
CREATE TABLE gpu_waste (
    attempt_id     UUID PRIMARY KEY,
    job_id         UUID NOT NULL,
    team           TEXT NOT NULL,
    project        TEXT,
    job_name       TEXT NOT NULL,
    priority       TEXT NOT NULL,
    gpus           BIGINT NOT NULL,
    hourly_rate_micros BIGINT,
    started_at     TIMESTAMPTZ NOT NULL,
    last_sample_at TIMESTAMPTZ NOT NULL,
    idle_since     TIMESTAMPTZ,
    activity_pct   DOUBLE PRECISION,
    idle_gpu_ms    BIGINT NOT NULL DEFAULT 0,
    history_json   TEXT NOT NULL DEFAULT '[]',
    action         TEXT,
    action_at      TIMESTAMPTZ,
    reason         TEXT
);
CREATE INDEX gpu_waste_team ON gpu_waste(team, last_sample_at);
CREATE INDEX gpu_waste_sample ON gpu_waste(last_sample_at);
-- Why the broker stopped a job itself (the waste rule): the reason the job ends with instead
-- of "cancelled by user" when its agent reports the stop.
ALTER TABLE jobs ADD COLUMN stop_reason TEXT;
