-- The services gateway (issue 26). Each gateway reports what it saw every second, per service
-- and per replica; brokers read the rows into their in-memory traffic windows, so the leader's
-- autoscaler sees every gateway's traffic whichever broker took the report. Rows are kept
-- about ten minutes.
CREATE TABLE gateway_reports (
    gateway TEXT NOT NULL,
    service_id UUID NOT NULL,
    -- The replica's job id; '' for the whole service.
    replica TEXT NOT NULL,
    -- Unix seconds.
    at_s BIGINT NOT NULL,
    -- The gateway's report number: a gateway may send rows of one second in two reports;
    -- a retried report carries the same number, so its rows are taken once.
    batch BIGINT NOT NULL,
    requests BIGINT NOT NULL,
    errors BIGINT NOT NULL,
    latency_sum_us BIGINT NOT NULL,
    queue_peak BIGINT NOT NULL,
    in_flight BIGINT NOT NULL,
    -- The latency histogram, a JSON array of counts (see `TrafficSecond::buckets`).
    buckets TEXT NOT NULL,
    received_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (gateway, service_id, replica, at_s, batch)
);
CREATE INDEX gateway_reports_received ON gateway_reports (received_at);

-- Per-service invoke tokens, issued by an admin, shown once, stored hashed: the gateway lets
-- their bearer call that one service.
CREATE TABLE service_tokens (
    id UUID PRIMARY KEY,
    service_id UUID NOT NULL REFERENCES services(id),
    token_hash TEXT NOT NULL UNIQUE,
    name TEXT,
    created_at TIMESTAMPTZ NOT NULL,
    revoked_at TIMESTAMPTZ
);
CREATE INDEX service_tokens_by_service ON service_tokens (service_id);
