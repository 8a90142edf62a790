-- The time requests held replicas in each reported second (`TrafficSecond::busy_us`): the
-- autoscaler's load signal, exact for streamed answers too.
ALTER TABLE gateway_reports ADD COLUMN busy_us INTEGER NOT NULL DEFAULT 0;
-- The most requests at the gateway at once in each reported second, held and queued
-- (`TrafficSecond::peak_in_system`): the autoscaler's headroom for bursts.
ALTER TABLE gateway_reports ADD COLUMN peak_in_system INTEGER NOT NULL DEFAULT 0;
