-- Multi-node jobs (gangs): one attempt per node, each its own lease. `node_rank` orders them
-- (0 for single-node jobs); `gang_lead` is the rank-0 attempt's id on every rank of a gang
-- (NULL on single-node attempts), the key the job's `current_attempt` holds; `master_port` is
-- the rendezvous port rank 0 listens on (MASTER_PORT), the same on every rank.
ALTER TABLE attempts ADD COLUMN node_rank BIGINT NOT NULL DEFAULT 0;
ALTER TABLE attempts ADD COLUMN gang_lead UUID;
ALTER TABLE attempts ADD COLUMN master_port BIGINT;
CREATE INDEX attempts_gang_lead ON attempts(gang_lead);
-- The address other nodes reach this one at (the agent's `--advertise-host`): a gang's
-- SWITCHYARD_NODE_IPS and MASTER_ADDR. NULL for agents that did not say (the hostname then).
ALTER TABLE nodes ADD COLUMN address TEXT;
