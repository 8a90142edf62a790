-- Cloud instances the broker launches (burst), and the ledger that records what they cost.

CREATE TABLE instances (
    id                TEXT PRIMARY KEY,          -- the broker's key: idempotency token and tag
    provider          TEXT NOT NULL,
    provider_id       TEXT,                      -- set once the provider accepted the launch
    pool_id           TEXT NOT NULL REFERENCES pools(id),
    region_id         TEXT NOT NULL,
    market            TEXT NOT NULL,
    -- requested → booting → ready → draining → terminated
    state             TEXT NOT NULL,
    hourly_price_micros INTEGER NOT NULL,
    for_job           TEXT,
    node_id           TEXT,
    launch_attempts   INTEGER NOT NULL DEFAULT 0,
    next_attempt_at   INTEGER NOT NULL DEFAULT 0,
    last_error        TEXT,
    requested_at      INTEGER NOT NULL,
    launched_at       INTEGER,
    ready_at          INTEGER,
    idle_since        INTEGER,
    ended_at          INTEGER,
    billed            INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX instances_state ON instances(state);

ALTER TABLE enrolment_tokens ADD COLUMN instance_id TEXT;
ALTER TABLE pools ADD COLUMN backoff_until INTEGER NOT NULL DEFAULT 0;

-- Append-only: the source of truth for spend.
CREATE TABLE ledger (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    at            INTEGER NOT NULL,
    kind          TEXT NOT NULL,                 -- 'instance' (a cloud machine's lifetime), …
    team          TEXT,
    project       TEXT,
    job_id        TEXT,
    attempt_id    TEXT,
    instance_id   TEXT,
    provider      TEXT NOT NULL,
    region_id     TEXT NOT NULL,
    pool_id       TEXT NOT NULL,
    period_start  INTEGER NOT NULL,
    period_end    INTEGER NOT NULL,
    amount_micros INTEGER NOT NULL
);
CREATE INDEX ledger_at ON ledger(at);
CREATE UNIQUE INDEX ledger_instance_once ON ledger(instance_id) WHERE kind = 'instance';
