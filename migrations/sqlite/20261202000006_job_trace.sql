-- The W3C trace context of a job's submit span, when the broker exports traces: placement,
-- launch, the agent's run and the report join that trace.
ALTER TABLE jobs ADD COLUMN trace_parent TEXT;
