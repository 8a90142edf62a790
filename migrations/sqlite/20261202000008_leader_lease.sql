-- The leader election among broker replicas: one row, the current lease. `epoch` grows by one
-- at every change of holder and fences the leader's writes (scheduler, burst controller,
-- ledger): a write made under an older epoch is rejected in its own transaction.
CREATE TABLE leader_lease (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    holder TEXT NOT NULL,
    -- One process's run of the holder (a fresh id at every start).
    holder_instance TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    acquired_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
