-- Why an instance ended (idle past its TTL, a boot timeout, gone at the provider…), apart from
-- `last_error`, which now holds only the last error of a launch or terminate: a normal idle
-- shutdown is not an error.
ALTER TABLE instances ADD COLUMN end_reason TEXT;
UPDATE instances SET end_reason = last_error WHERE state = 'terminated';
UPDATE instances SET last_error = NULL WHERE state = 'terminated' AND last_error = 'idle';
