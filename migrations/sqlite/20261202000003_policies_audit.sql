-- Team and project policies (every version kept) and the append-only audit log.

-- One row per saved version; the current policy of (team, project) is its highest version.
-- project_key is '' for the team-wide policy (a UNIQUE constraint treats NULLs as distinct).
CREATE TABLE policy_versions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    team        TEXT NOT NULL,
    project_key TEXT NOT NULL DEFAULT '',
    version     INTEGER NOT NULL CHECK (version >= 1),
    body_json   TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    created_by  TEXT NOT NULL,
    UNIQUE (team, project_key, version)
);

-- Infra's edits to pools (PATCH /pools/{id}); they win over the seeded catalogue, so a restart
-- or a price refresh does not undo them.
CREATE TABLE pool_overrides (
    pool_id          TEXT PRIMARY KEY REFERENCES pools(id),
    node_limit       INTEGER,
    on_demand_micros INTEGER,
    launchable       INTEGER,
    updated_at       INTEGER NOT NULL
);

-- Append-only: who changed what, with the value before and after (JSON text, NULL if none).
CREATE TABLE audit_log (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    at          INTEGER NOT NULL,
    actor       TEXT NOT NULL,
    action      TEXT NOT NULL,
    target      TEXT NOT NULL,
    before_json TEXT,
    after_json  TEXT
);
CREATE INDEX audit_log_target ON audit_log(target, id);

CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only');
END;

CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only');
END;

-- Past versions are history too.
CREATE TRIGGER policy_versions_no_update BEFORE UPDATE ON policy_versions
BEGIN
    SELECT RAISE(ABORT, 'policy_versions is append-only');
END;

CREATE TRIGGER policy_versions_no_delete BEFORE DELETE ON policy_versions
BEGIN
    SELECT RAISE(ABORT, 'policy_versions is append-only');
END;
