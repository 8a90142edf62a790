-- Switchyard schema, SQLite flavour. Times are INTEGER milliseconds since the Unix epoch (UTC);
-- money is INTEGER micro-dollars; ids are TEXT (UUIDs in their hyphenated form).

CREATE TABLE regions (
    id                   TEXT PRIMARY KEY,
    provider             TEXT NOT NULL,
    code                 TEXT NOT NULL,
    latitude             REAL,
    longitude            REAL,
    egress_per_gb_micros INTEGER NOT NULL,
    latency_ms           INTEGER NOT NULL,
    ingress_gbps         INTEGER NOT NULL
);

CREATE TABLE pools (
    id                       TEXT PRIMARY KEY,
    region_id                TEXT NOT NULL REFERENCES regions(id),
    provider                 TEXT NOT NULL,
    instance_type            TEXT NOT NULL,
    gpu_model                TEXT NOT NULL,
    gpus_per_node            INTEGER NOT NULL,
    gpu_memory_gb            INTEGER NOT NULL,
    vcpus                    INTEGER NOT NULL,
    memory_gb                INTEGER NOT NULL,
    on_demand_micros         INTEGER NOT NULL,
    spot_micros              INTEGER,
    node_limit               INTEGER NOT NULL,
    launchable               INTEGER NOT NULL,
    boot_time_s              INTEGER NOT NULL,
    price_updated_at         INTEGER NOT NULL,
    recent_capacity_failures INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE api_tokens (
    id         TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    role       TEXT NOT NULL CHECK (role IN ('admin', 'finance', 'infra', 'developer')),
    team       TEXT,
    name       TEXT,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);

CREATE TABLE enrolment_tokens (
    token_hash TEXT PRIMARY KEY,
    pool_id    TEXT NOT NULL REFERENCES pools(id),
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    used_at    INTEGER,
    node_id    TEXT
);

CREATE TABLE nodes (
    id             TEXT PRIMARY KEY,
    pool_id        TEXT NOT NULL REFERENCES pools(id),
    token_hash     TEXT NOT NULL UNIQUE,
    hostname       TEXT NOT NULL,
    gpus_total     INTEGER NOT NULL,
    inventory_json TEXT NOT NULL,
    healthy        INTEGER NOT NULL,
    draining       INTEGER NOT NULL DEFAULT 0,
    revoked        INTEGER NOT NULL DEFAULT 0,
    registered_at  INTEGER NOT NULL,
    last_heartbeat INTEGER NOT NULL
);
CREATE INDEX nodes_pool ON nodes(pool_id);

CREATE TABLE jobs (
    id               TEXT PRIMARY KEY,
    team             TEXT NOT NULL,
    project          TEXT,
    name             TEXT NOT NULL,
    state            TEXT NOT NULL,
    priority         TEXT NOT NULL,
    kind             TEXT NOT NULL,
    spec_json        TEXT NOT NULL, -- as submitted (wire JSON)
    core_spec_json   TEXT NOT NULL, -- validated, as the planner reads it
    submitted_at     INTEGER NOT NULL,
    deadline         INTEGER,
    started_at       INTEGER,
    finished_at      INTEGER,
    exit_code        INTEGER,
    reason           TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    attempts         INTEGER NOT NULL DEFAULT 0,
    current_attempt  TEXT,
    explanation_json TEXT,
    version          INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX jobs_team_id ON jobs(team, id);
CREATE INDEX jobs_state ON jobs(state);

CREATE TABLE attempts (
    id              TEXT PRIMARY KEY,
    job_id          TEXT NOT NULL REFERENCES jobs(id),
    attempt_no      INTEGER NOT NULL,
    node_id         TEXT NOT NULL REFERENCES nodes(id),
    pool_id         TEXT NOT NULL,
    epoch           INTEGER NOT NULL,
    gpus_json       TEXT NOT NULL,
    market          TEXT NOT NULL,
    -- assigned → running → finished; or lost (lease expired) / cancelled (before it started)
    state           TEXT NOT NULL,
    estimated_cost_micros INTEGER NOT NULL,
    expected_end    INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    started_at      INTEGER,
    finished_at     INTEGER,
    exit_code       INTEGER,
    signal          INTEGER,
    error           TEXT,
    UNIQUE (job_id, attempt_no)
);
CREATE INDEX attempts_node_state ON attempts(node_id, state);
CREATE INDEX attempts_state ON attempts(state);

CREATE TABLE log_chunks (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id     TEXT NOT NULL,
    attempt_id TEXT NOT NULL,
    attempt_no INTEGER NOT NULL,
    seq        INTEGER NOT NULL,
    stream     TEXT NOT NULL,
    data       TEXT NOT NULL,
    at         INTEGER NOT NULL,
    UNIQUE (attempt_id, seq)
);
CREATE INDEX log_chunks_job ON log_chunks(job_id, id);
