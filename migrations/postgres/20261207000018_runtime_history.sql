-- Runtime history (issue 29): one `switchyard_core::predict::Sketch` per key, as JSON, so a
-- restart keeps what the predictor learnt. `key` is `JobKey::storage_key` (level|team|user|…)
-- or `JobKey::ratio_key` (ratio|team|user); `level` is the key's head. Updated in the
-- transaction that ends a succeeded attempt; the leader reloads rows by `updated_at`.
CREATE TABLE runtime_history (
    key         TEXT PRIMARY KEY,
    level       TEXT NOT NULL,
    sketch_json TEXT NOT NULL,
    runs        BIGINT NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL
);
CREATE INDEX runtime_history_updated ON runtime_history(updated_at);
