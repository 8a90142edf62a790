-- The ledger accrues periodically: every running attempt on a node the broker did not launch
-- (on-prem, pre-registered) and every live cloud instance gets entries for [accrued_until, now];
-- the final partial period is settled when the attempt or instance ends. Each entry names its
-- source (`attempt:<id>` or `instance:<id>`); (source, period_start) is unique, so an entry is
-- never written twice, and each source remembers how far it has been accrued.

ALTER TABLE ledger ADD COLUMN source TEXT;
UPDATE ledger SET source = 'instance:' || instance_id WHERE kind = 'instance';
DROP INDEX ledger_instance_once;
CREATE UNIQUE INDEX ledger_source_period ON ledger(source, period_start);
CREATE INDEX ledger_period ON ledger(period_start);
CREATE INDEX ledger_team_period ON ledger(team, period_start);
CREATE INDEX ledger_job ON ledger(job_id);
CREATE INDEX ledger_attempt ON ledger(attempt_id);

-- How far each source has been written to the ledger (NULL: from its start).
ALTER TABLE attempts ADD COLUMN accrued_until TIMESTAMPTZ;
-- What the attempt costs an hour while it runs (GPUs × the per-GPU rate of its pool and market,
-- or the team's on-prem rate for the GPU model), fixed when it is placed.
ALTER TABLE attempts ADD COLUMN hourly_rate_micros BIGINT;
ALTER TABLE instances ADD COLUMN accrued_until TIMESTAMPTZ;
-- The planner's estimate for the job this instance was launched for: reserved against the
-- team's budget until the job is placed on it.
ALTER TABLE instances ADD COLUMN estimated_cost_micros BIGINT NOT NULL DEFAULT 0;

-- Before this migration the ledger held ended instances only, settled once: they are done.
-- Attempts that ended before were never charged and stay so.
UPDATE instances SET accrued_until = ended_at WHERE state = 'terminated';
UPDATE attempts SET accrued_until = COALESCE(finished_at, started_at, created_at)
    WHERE state NOT IN ('assigned', 'running', 'preempting');
CREATE INDEX instances_node ON instances(node_id);

-- One `budget.alert` per policy, threshold and budget period.
CREATE TABLE budget_alerts (
    team          TEXT NOT NULL,
    project       TEXT NOT NULL DEFAULT '',
    period_start  TIMESTAMPTZ NOT NULL,
    threshold_ppm BIGINT NOT NULL,
    at            TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (team, project, period_start, threshold_ppm)
);
