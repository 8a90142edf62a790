//! Team and project policies (versioned, compare-and-swap) and the audit log.

use super::*;

impl Store {
    /// Saves a new version of the policy of `team` (and `project`) and its `policy.put` audit
    /// row in one transaction. With `expected_version`, a compare-and-swap: `Some(0)` means
    /// "there is none yet"; any other mismatch is a [`PolicyConflict`] and nothing is written.
    pub async fn put_policy(
        &self,
        team: &str,
        project: Option<&str>,
        body: &switchyard_protocol::api::PolicyBody,
        expected_version: Option<i64>,
        actor: &str,
        now: Timestamp,
    ) -> StoreResult<Result<PolicyRecord, PolicyConflict>> {
        let body_json = serde_json::to_string(body)
            .map_err(|e| corrupt(format!("policy body not serialisable: {e}")))?;
        let project_key = project.unwrap_or("");
        let mut tx = self.write_tx().await?;
        let current = query(
            "SELECT version, body_json FROM policy_versions \
             WHERE team = $1 AND project_key = $2 ORDER BY version DESC LIMIT 1",
        )
        .bind(team)
        .bind(project_key)
        .fetch_optional(&mut tx)
        .await?;
        let (current_version, before_json) = match &current {
            Some(r) => (
                Some(r.get::<i64>("version")?),
                Some(r.get::<String>("body_json")?),
            ),
            None => (None, None),
        };
        if let Some(expected) = expected_version
            && expected != current_version.unwrap_or(0)
        {
            return Ok(Err(PolicyConflict {
                current: current_version,
            }));
        }
        let version = current_version.unwrap_or(0) + 1;
        query(
            "INSERT INTO policy_versions (team, project_key, version, body_json, created_at, \
             created_by) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(team)
        .bind(project_key)
        .bind(version)
        .bind(&body_json)
        .bind(now)
        .bind(actor)
        .execute(&mut tx)
        .await?;
        insert_audit(
            &mut tx,
            &NewAuditEntry {
                at: now,
                actor: actor.to_string(),
                action: "policy.put".into(),
                target: policy_target(team, project),
                before_json,
                after_json: Some(body_json),
            },
        )
        .await?;
        tx.commit().await?;
        Ok(Ok(PolicyRecord {
            team: team.to_string(),
            project: project.map(str::to_string),
            version,
            body: body.clone(),
            updated_at: now,
            updated_by: actor.to_string(),
        }))
    }

    /// The current version of one policy.
    pub async fn policy(
        &self,
        team: &str,
        project: Option<&str>,
    ) -> StoreResult<Option<PolicyRecord>> {
        let row = query(
            "SELECT team, project_key, version, body_json, created_at, created_by \
             FROM policy_versions WHERE team = $1 AND project_key = $2 \
             ORDER BY version DESC LIMIT 1",
        )
        .bind(team)
        .bind(project.unwrap_or(""))
        .fetch_optional(&self.db)
        .await?;
        row.as_ref().map(policy_from_row).transpose()
    }

    /// The current version of every policy, by team then project (team-wide first).
    pub async fn policies(&self) -> StoreResult<Vec<PolicyRecord>> {
        let rows = query(
            "SELECT v.team, v.project_key, v.version, v.body_json, v.created_at, v.created_by \
             FROM policy_versions v \
             WHERE v.version = (SELECT MAX(w.version) FROM policy_versions w \
                                WHERE w.team = v.team AND w.project_key = v.project_key) \
             ORDER BY v.team COLLATE \"C\", v.project_key COLLATE \"C\"",
        )
        .fetch_all(&self.db)
        .await?;
        rows.iter().map(policy_from_row).collect()
    }

    /// Appends one audit row; returns its id.
    pub async fn append_audit(&self, entry: &NewAuditEntry) -> StoreResult<i64> {
        let mut tx = self.write_tx().await?;
        let id = insert_audit(&mut tx, entry).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Audit rows, newest first.
    pub async fn audit(&self, filter: &AuditFilter) -> StoreResult<Vec<AuditRecord>> {
        let rows = query(
            "SELECT id, at, actor, action, target, before_json, after_json FROM audit_log \
             WHERE (CAST($1 AS TEXT) IS NULL OR target = $1) AND (CAST($2 AS BIGINT) IS NULL OR id < $2) \
             AND (CAST($4 AS TEXT) IS NULL OR actor = $4 \
             OR substr(actor, 1, length(CAST($4 AS TEXT)) + 1) = $4 || ':') AND (CAST($5 AS TEXT) IS NULL OR action = $5) \
             AND (CAST($6 AS TIMESTAMPTZ) IS NULL OR at >= $6) AND (CAST($7 AS TIMESTAMPTZ) IS NULL OR at < $7) \
             ORDER BY id DESC LIMIT $3",
        )
        .bind(&filter.target)
        .bind(filter.before)
        .bind(filter.limit)
        .bind(&filter.actor)
        .bind(&filter.action)
        .bind(filter.from)
        .bind(filter.to)
        .fetch_all(&self.db)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(AuditRecord {
                    id: r.get("id")?,
                    at: r.time("at")?,
                    actor: r.get("actor")?,
                    action: r.get("action")?,
                    target: r.get("target")?,
                    before_json: r.get("before_json")?,
                    after_json: r.get("after_json")?,
                })
            })
            .collect()
    }
}

/// Appends one audit row inside a caller's transaction; returns its id.
pub(super) async fn insert_audit(tx: &mut Tx, e: &NewAuditEntry) -> StoreResult<i64> {
    let id: i64 = query_scalar(
        "INSERT INTO audit_log (at, actor, action, target, before_json, after_json) \
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(e.at)
    .bind(&e.actor)
    .bind(&e.action)
    .bind(&e.target)
    .bind(&e.before_json)
    .bind(&e.after_json)
    .fetch_one(&mut *tx)
    .await?;
    Ok(id)
}
