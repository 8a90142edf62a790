-- Inference services (issue 26). A service is a spec with versions; its replicas are jobs
-- (kind `service`) that carry the service's id and the spec version they run, placed, leased,
-- preempted and charged like any job. The service row keeps what the autoscaler decided
-- (desired replicas and why); `service_events` every scaling and placement decision.
CREATE TABLE services (
    id UUID PRIMARY KEY,
    team TEXT NOT NULL,
    project TEXT,
    name TEXT NOT NULL,
    spec_json TEXT NOT NULL,
    spec_version BIGINT NOT NULL,
    desired_replicas BIGINT NOT NULL,
    desired_reason TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    -- Set by DELETE: its replicas drain, then it is gone from lists.
    deleted_at TIMESTAMPTZ
);
CREATE UNIQUE INDEX services_live_name ON services (team, name) WHERE deleted_at IS NULL;

CREATE TABLE service_events (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    service_id UUID NOT NULL REFERENCES services(id),
    at TIMESTAMPTZ NOT NULL,
    kind TEXT NOT NULL,
    message TEXT NOT NULL,
    details_json TEXT
);
CREATE INDEX service_events_by_service ON service_events (service_id, id);

ALTER TABLE jobs ADD COLUMN service_id UUID REFERENCES services(id);
ALTER TABLE jobs ADD COLUMN service_version BIGINT;
-- The replica's `Lease::serve` (readiness probe), as JSON, fixed for its spec version.
ALTER TABLE jobs ADD COLUMN serve_json TEXT;
-- When the reconciler began draining the replica: the gateway sends it nothing new from
-- then on, and its job is cancelled once its requests in flight are done.
ALTER TABLE jobs ADD COLUMN drain_at TIMESTAMPTZ;
CREATE INDEX jobs_service ON jobs (service_id) WHERE service_id IS NOT NULL;

-- Where a running replica listens (the agent's report) and whether its readiness probe passes.
ALTER TABLE attempts ADD COLUMN serve_host TEXT;
ALTER TABLE attempts ADD COLUMN serve_port BIGINT;
ALTER TABLE attempts ADD COLUMN ready BOOLEAN NOT NULL DEFAULT FALSE;
