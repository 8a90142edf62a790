-- The services gateway (issue 26). Each gateway reports what it saw every second, per service
-- and per replica; brokers read the rows into their in-memory traffic windows, so the leader's
-- autoscaler sees every gateway's traffic whichever broker took the report. Rows are kept
-- about ten minutes.
CREATE TABLE gateway_reports (
    gateway TEXT NOT NULL,
    service_id TEXT NOT NULL,
    -- The replica's job id; '' for the whole service.
    replica TEXT NOT NULL,
    -- Unix seconds.
    at_s INTEGER NOT NULL,
    -- The gateway's report number: a gateway may send rows of one second in two reports;
    -- a retried report carries the same number, so its rows are taken once.
    batch INTEGER NOT NULL,
    requests INTEGER NOT NULL,
    errors INTEGER NOT NULL,
    latency_sum_us INTEGER NOT NULL,
    queue_peak INTEGER NOT NULL,
    in_flight INTEGER NOT NULL,
    -- The latency histogram, a JSON array of counts (see `TrafficSecond::buckets`).
    buckets TEXT NOT NULL,
    received_at INTEGER NOT NULL,
    PRIMARY KEY (gateway, service_id, replica, at_s, batch)
);
CREATE INDEX gateway_reports_received ON gateway_reports (received_at);

-- Per-service invoke tokens, issued by an admin, shown once, stored hashed: the gateway lets
-- their bearer call that one service.
CREATE TABLE service_tokens (
    id TEXT PRIMARY KEY,
    service_id TEXT NOT NULL REFERENCES services(id),
    token_hash TEXT NOT NULL UNIQUE,
    name TEXT,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);
CREATE INDEX service_tokens_by_service ON service_tokens (service_id);
