-- Switchyard schema, PostgreSQL flavour (mirrors migrations/sqlite, version for version).
-- Native types: UUID for ids that are UUIDs (tokens, jobs, attempts), TIMESTAMPTZ for times
-- (the broker writes whole milliseconds, so they round-trip exactly), BOOLEAN for flags, BIGINT
-- micro-dollars for money and BIGINT for every other integer (the store binds i64). JSON
-- documents are TEXT, as on SQLite: the spec is served back byte for byte as submitted (JSONB
-- would reorder keys and drop whitespace) and the broker never queries inside them.
-- Pool, region, node and instance ids are TEXT: they are names or provider-facing keys.

CREATE TABLE regions (
    id                   TEXT PRIMARY KEY,
    provider             TEXT NOT NULL,
    code                 TEXT NOT NULL,
    latitude             DOUBLE PRECISION,
    longitude            DOUBLE PRECISION,
    egress_per_gb_micros BIGINT NOT NULL,
    latency_ms           BIGINT NOT NULL,
    ingress_gbps         BIGINT NOT NULL
);

CREATE TABLE pools (
    id                       TEXT PRIMARY KEY,
    region_id                TEXT NOT NULL REFERENCES regions(id),
    provider                 TEXT NOT NULL,
    instance_type            TEXT NOT NULL,
    gpu_model                TEXT NOT NULL,
    gpus_per_node            BIGINT NOT NULL,
    gpu_memory_gb            BIGINT NOT NULL,
    vcpus                    BIGINT NOT NULL,
    memory_gb                BIGINT NOT NULL,
    on_demand_micros         BIGINT NOT NULL,
    spot_micros              BIGINT,
    node_limit               BIGINT NOT NULL,
    launchable               BOOLEAN NOT NULL,
    boot_time_s              BIGINT NOT NULL,
    price_updated_at         TIMESTAMPTZ NOT NULL,
    recent_capacity_failures BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE api_tokens (
    id         UUID PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    role       TEXT NOT NULL CHECK (role IN ('admin', 'finance', 'infra', 'developer')),
    team       TEXT,
    name       TEXT,
    created_at TIMESTAMPTZ NOT NULL,
    revoked_at TIMESTAMPTZ
);

CREATE TABLE enrolment_tokens (
    token_hash TEXT PRIMARY KEY,
    pool_id    TEXT NOT NULL REFERENCES pools(id),
    created_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    used_at    TIMESTAMPTZ,
    node_id    TEXT
);

CREATE TABLE nodes (
    id             TEXT PRIMARY KEY,
    pool_id        TEXT NOT NULL REFERENCES pools(id),
    token_hash     TEXT NOT NULL UNIQUE,
    hostname       TEXT NOT NULL,
    gpus_total     BIGINT NOT NULL,
    inventory_json TEXT NOT NULL,
    healthy        BOOLEAN NOT NULL,
    draining       BOOLEAN NOT NULL DEFAULT FALSE,
    revoked        BOOLEAN NOT NULL DEFAULT FALSE,
    registered_at  TIMESTAMPTZ NOT NULL,
    last_heartbeat TIMESTAMPTZ NOT NULL
);
CREATE INDEX nodes_pool ON nodes(pool_id);

CREATE TABLE jobs (
    id               UUID PRIMARY KEY,
    team             TEXT NOT NULL,
    project          TEXT,
    name             TEXT NOT NULL,
    state            TEXT NOT NULL,
    priority         TEXT NOT NULL,
    kind             TEXT NOT NULL,
    spec_json        TEXT NOT NULL, -- as submitted (wire JSON)
    core_spec_json   TEXT NOT NULL, -- validated, as the planner reads it
    submitted_at     TIMESTAMPTZ NOT NULL,
    deadline         TIMESTAMPTZ,
    started_at       TIMESTAMPTZ,
    finished_at      TIMESTAMPTZ,
    exit_code        BIGINT,
    reason           TEXT,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    attempts         BIGINT NOT NULL DEFAULT 0,
    current_attempt  UUID,
    explanation_json TEXT,
    version          BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX jobs_team_id ON jobs(team, id);
CREATE INDEX jobs_state ON jobs(state);

CREATE TABLE attempts (
    id              UUID PRIMARY KEY,
    job_id          UUID NOT NULL REFERENCES jobs(id),
    attempt_no      BIGINT NOT NULL,
    node_id         TEXT NOT NULL REFERENCES nodes(id),
    pool_id         TEXT NOT NULL,
    epoch           BIGINT NOT NULL,
    gpus_json       TEXT NOT NULL,
    market          TEXT NOT NULL,
    -- assigned → running → finished; or lost (lease expired) / cancelled (before it started)
    state           TEXT NOT NULL,
    estimated_cost_micros BIGINT NOT NULL,
    expected_end    TIMESTAMPTZ NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL,
    started_at      TIMESTAMPTZ,
    finished_at     TIMESTAMPTZ,
    exit_code       BIGINT,
    signal          BIGINT,
    error           TEXT,
    UNIQUE (job_id, attempt_no)
);
CREATE INDEX attempts_node_state ON attempts(node_id, state);
CREATE INDEX attempts_state ON attempts(state);

CREATE TABLE log_chunks (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     UUID NOT NULL,
    attempt_id UUID NOT NULL,
    attempt_no BIGINT NOT NULL,
    seq        BIGINT NOT NULL,
    stream     TEXT NOT NULL,
    data       TEXT NOT NULL,
    at         TIMESTAMPTZ NOT NULL,
    UNIQUE (attempt_id, seq)
);
CREATE INDEX log_chunks_job ON log_chunks(job_id, id);
