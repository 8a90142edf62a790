-- GPU health (issue 28): the node's unhealthy GPUs and why, as the broker's health rules
-- (`broker/src/rules/health.rs`) judged them from its heartbeats: a JSON array of marks
-- `{gpu, kind: xid|ecc|overheat, xid, reason, since}`. NULL (or `[]`): every GPU is healthy.
-- XID and ECC marks stay until an operator undrains the node; an overheat mark clears itself.
ALTER TABLE nodes ADD COLUMN gpu_marks_json TEXT;
