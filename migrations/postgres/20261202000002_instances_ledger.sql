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
    hourly_price_micros BIGINT NOT NULL,
    for_job           UUID,
    node_id           TEXT,
    launch_attempts   BIGINT NOT NULL DEFAULT 0,
    next_attempt_at   TIMESTAMPTZ NOT NULL DEFAULT TIMESTAMPTZ '1970-01-01 00:00:00+00',
    last_error        TEXT,
    requested_at      TIMESTAMPTZ NOT NULL,
    launched_at       TIMESTAMPTZ,
    ready_at          TIMESTAMPTZ,
    idle_since        TIMESTAMPTZ,
    ended_at          TIMESTAMPTZ,
    billed            BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX instances_state ON instances(state);

ALTER TABLE enrolment_tokens ADD COLUMN instance_id TEXT;
ALTER TABLE pools ADD COLUMN backoff_until TIMESTAMPTZ NOT NULL
    DEFAULT TIMESTAMPTZ '1970-01-01 00:00:00+00';

-- Append-only: the source of truth for spend.
CREATE TABLE ledger (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at            TIMESTAMPTZ NOT NULL,
    kind          TEXT NOT NULL,                 -- 'instance' (a cloud machine's lifetime), …
    team          TEXT,
    project       TEXT,
    job_id        UUID,
    attempt_id    UUID,
    instance_id   TEXT,
    provider      TEXT NOT NULL,
    region_id     TEXT NOT NULL,
    pool_id       TEXT NOT NULL,
    period_start  TIMESTAMPTZ NOT NULL,
    period_end    TIMESTAMPTZ NOT NULL,
    amount_micros BIGINT NOT NULL
);
CREATE INDEX ledger_at ON ledger(at);
CREATE UNIQUE INDEX ledger_instance_once ON ledger(instance_id) WHERE kind = 'instance';
