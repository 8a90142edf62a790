-- Two costs (issue 29): what the company pays in cash beside what the ledger bills teams.
--
-- A fixed (on-prem) pool's marginal cost: what one more node-hour of use costs in power and
-- wear, set by finance (config `marginal_usd_per_gpu_hour`, PATCH /pools/{id}). NULL: the
-- documented default share of the internal rate (`switchyard_core::DEFAULT_MARGINAL_SHARE`).
ALTER TABLE pools ADD COLUMN marginal_micros INTEGER;
ALTER TABLE pool_overrides ADD COLUMN marginal_micros INTEGER;

-- What an attempt costs the company an hour while it runs on a node the broker did not launch
-- (GPUs × its pool's cash rate), fixed when it is placed, as `hourly_rate_micros` is.
ALTER TABLE attempts ADD COLUMN hourly_cash_micros INTEGER;

-- Each ledger entry's cash beside its chargeback amount: a cloud instance's time is cash as
-- billed; an attempt on an owned node costs its pool's marginal cost.
ALTER TABLE ledger ADD COLUMN cash_micros INTEGER;
UPDATE ledger SET cash_micros = amount_micros WHERE kind <> 'attempt';
-- Entries written before: an owned pool's default marginal cost (a fifth of its internal rate
-- per node-hour, per GPU rounded up) × the attempt's GPUs × the entry's seconds. Approximate to
-- the micro-dollar (the ledger rounds each source's total up to whole seconds).
UPDATE ledger SET cash_micros = COALESCE((
    SELECT CASE WHEN COALESCE(o.launchable, p.launchable) THEN ledger.amount_micros ELSE
        CAST((((COALESCE(o.on_demand_micros, p.on_demand_micros) + 4) / 5
                + MAX(p.gpus_per_node, 1) - 1) / MAX(p.gpus_per_node, 1))
             * json_array_length(a.gpus_json) * (ledger.period_end - ledger.period_start)
             / 3600000 AS INTEGER) END
    FROM attempts a JOIN pools p ON p.id = a.pool_id
    LEFT JOIN pool_overrides o ON o.pool_id = p.id
    WHERE a.id = ledger.attempt_id), amount_micros)
WHERE kind = 'attempt';

-- Owned GPUs' idle time: per owned (not launchable) pool and UTC hour, the GPU time of its
-- nodes that no attempt held and its worth at the internal rate (a cost of ownership, in
-- neither total). Accrued by the ledger's pass; each pool remembers how far (from this
-- migration on: nothing before it).
CREATE TABLE owned_idle (
    pool_id      TEXT NOT NULL,
    region_id    TEXT NOT NULL,
    provider     TEXT NOT NULL,
    period_start INTEGER NOT NULL,
    period_end   INTEGER NOT NULL,
    idle_gpu_ms  INTEGER NOT NULL,
    worth_micros INTEGER NOT NULL,
    PRIMARY KEY (pool_id, period_start)
);
CREATE INDEX owned_idle_period ON owned_idle(period_start);
ALTER TABLE pools ADD COLUMN idle_accrued_until INTEGER;
UPDATE pools SET idle_accrued_until = CAST(strftime('%s', 'now') AS INTEGER) * 1000;
