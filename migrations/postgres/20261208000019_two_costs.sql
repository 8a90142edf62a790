-- Two costs (issue 29): what the company pays in cash beside what the ledger bills teams.
-- The same as migrations/sqlite/20261208000019_two_costs.sql, which explains each step.
ALTER TABLE pools ADD COLUMN marginal_micros BIGINT;
ALTER TABLE pool_overrides ADD COLUMN marginal_micros BIGINT;
ALTER TABLE attempts ADD COLUMN hourly_cash_micros BIGINT;

ALTER TABLE ledger ADD COLUMN cash_micros BIGINT;
UPDATE ledger SET cash_micros = amount_micros WHERE kind <> 'attempt';
UPDATE ledger SET cash_micros = COALESCE((
    SELECT CASE WHEN COALESCE(o.launchable, p.launchable) THEN ledger.amount_micros ELSE
        CAST((((COALESCE(o.on_demand_micros, p.on_demand_micros) + 4) / 5
                + GREATEST(p.gpus_per_node, 1) - 1) / GREATEST(p.gpus_per_node, 1))
             * json_array_length(a.gpus_json::json)
             * (EXTRACT(EPOCH FROM (ledger.period_end - ledger.period_start)) * 1000)
             / 3600000 AS BIGINT) END
    FROM attempts a JOIN pools p ON p.id = a.pool_id
    LEFT JOIN pool_overrides o ON o.pool_id = p.id
    WHERE a.id = ledger.attempt_id), amount_micros)
WHERE kind = 'attempt';

CREATE TABLE owned_idle (
    pool_id      TEXT NOT NULL,
    region_id    TEXT NOT NULL,
    provider     TEXT NOT NULL,
    period_start TIMESTAMPTZ NOT NULL,
    period_end   TIMESTAMPTZ NOT NULL,
    idle_gpu_ms  BIGINT NOT NULL,
    worth_micros BIGINT NOT NULL,
    PRIMARY KEY (pool_id, period_start)
);
CREATE INDEX owned_idle_period ON owned_idle(period_start);
ALTER TABLE pools ADD COLUMN idle_accrued_until TIMESTAMPTZ;
UPDATE pools SET idle_accrued_until = now();
