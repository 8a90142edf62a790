-- `Idempotency-Key` of `POST /api/v1/jobs`: a key, scoped to the caller's team (or, for a
-- token without one, to the token), names the job its first request created, with a digest of
-- that request's spec. Written in the transaction that inserts the job, so a key is never
-- stored without its job nor a job acknowledged without its key; kept 24 hours.
CREATE TABLE idempotency_keys (
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    job_id UUID NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_keys_by_age ON idempotency_keys (created_at);
