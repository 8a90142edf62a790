-- The time requests held replicas in each reported second (`TrafficSecond::busy_us`): the
-- autoscaler's load signal, exact for streamed answers too.
ALTER TABLE gateway_reports ADD COLUMN busy_us INTEGER NOT NULL DEFAULT 0;
