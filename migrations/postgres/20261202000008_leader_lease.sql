-- The leader election among broker replicas: one row, the current lease. `epoch` grows by one
-- at every change of holder and fences the leader's writes (scheduler, burst controller,
-- ledger): a write made under an older epoch is rejected in its own transaction. Times are the
-- database's clock, so replicas' clocks need not agree.
CREATE TABLE leader_lease (
    id SMALLINT PRIMARY KEY CHECK (id = 1),
    holder TEXT NOT NULL,
    holder_instance UUID NOT NULL,
    epoch BIGINT NOT NULL,
    acquired_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
