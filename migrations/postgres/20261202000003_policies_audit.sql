-- Team and project policies (every version kept) and the append-only audit log.

-- One row per saved version; the current policy of (team, project) is its highest version.
-- project_key is '' for the team-wide policy (a UNIQUE constraint treats NULLs as distinct).
CREATE TABLE policy_versions (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team        TEXT NOT NULL,
    project_key TEXT NOT NULL DEFAULT '',
    version     BIGINT NOT NULL CHECK (version >= 1),
    body_json   TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    created_by  TEXT NOT NULL,
    UNIQUE (team, project_key, version)
);

-- Infra's edits to pools (PATCH /pools/{id}); they win over the seeded catalogue, so a restart
-- or a price refresh does not undo them.
CREATE TABLE pool_overrides (
    pool_id          TEXT PRIMARY KEY REFERENCES pools(id),
    node_limit       BIGINT,
    on_demand_micros BIGINT,
    launchable       BOOLEAN,
    updated_at       TIMESTAMPTZ NOT NULL
);

-- Append-only: who changed what, with the value before and after (JSON text, NULL if none).
CREATE TABLE audit_log (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          TIMESTAMPTZ NOT NULL,
    actor       TEXT NOT NULL,
    action      TEXT NOT NULL,
    target      TEXT NOT NULL,
    before_json TEXT,
    after_json  TEXT
);
CREATE INDEX audit_log_target ON audit_log(target, id);

-- One function for both tables: refuses any UPDATE or DELETE (TRUNCATE too, below).
CREATE FUNCTION switchyard_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only', TG_TABLE_NAME USING ERRCODE = 'restrict_violation';
END;
$$;

CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION switchyard_append_only();
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION switchyard_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION switchyard_append_only();

-- Past versions are history too.
CREATE TRIGGER policy_versions_no_update BEFORE UPDATE ON policy_versions
    FOR EACH ROW EXECUTE FUNCTION switchyard_append_only();
CREATE TRIGGER policy_versions_no_delete BEFORE DELETE ON policy_versions
    FOR EACH ROW EXECUTE FUNCTION switchyard_append_only();
CREATE TRIGGER policy_versions_no_truncate BEFORE TRUNCATE ON policy_versions
    FOR EACH STATEMENT EXECUTE FUNCTION switchyard_append_only();
