//! Who may act: API tokens (stored hashed), console sessions, enrolment tokens.

use super::*;

impl Store {
    pub async fn insert_api_token(&self, token: &ApiTokenRecord) -> StoreResult<()> {
        query(
            "INSERT INTO api_tokens (id, token_hash, role, team, name, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(token.id)
        .bind(&token.token_hash)
        .bind(role_name(token.role))
        .bind(&token.team)
        .bind(&token.name)
        .bind(token.created_at)
        .execute(&self.db)
        .await?;
        Ok(())
    }

    pub async fn api_token_by_hash(&self, hash: &str) -> StoreResult<Option<ApiTokenRecord>> {
        let row = query("SELECT * FROM api_tokens WHERE token_hash = $1")
            .bind(hash)
            .fetch_optional(&self.db)
            .await?;
        row.map(|r| token_from_row(&r, "created_at", "revoked_at"))
            .transpose()
    }

    /// Every API token, oldest first, revoked ones included.
    pub async fn api_tokens(&self) -> StoreResult<Vec<ApiTokenRecord>> {
        let rows = query("SELECT * FROM api_tokens ORDER BY created_at, id")
            .fetch_all(&self.db)
            .await?;
        rows.iter()
            .map(|r| token_from_row(r, "created_at", "revoked_at"))
            .collect()
    }

    /// Revokes API token `id` and the console sessions that act as it, in one transaction.
    /// Returns the token as it was before (already revoked: unchanged), `None` when there is
    /// no such token.
    pub async fn revoke_api_token(
        &self,
        id: Uuid,
        now: Timestamp,
    ) -> StoreResult<Option<ApiTokenRecord>> {
        let mut tx = self.write_tx().await?;
        let Some(row) = query("SELECT * FROM api_tokens WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut tx)
            .await?
        else {
            return Ok(None);
        };
        let before = token_from_row(&row, "created_at", "revoked_at")?;
        query("UPDATE api_tokens SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL")
            .bind(id)
            .bind(now)
            .execute(&mut tx)
            .await?;
        query(
            "UPDATE console_sessions SET revoked_at = $2 \
             WHERE api_token_id = $1 AND revoked_at IS NULL",
        )
        .bind(id)
        .bind(now)
        .execute(&mut tx)
        .await?;
        tx.commit().await?;
        Ok(Some(before))
    }

    pub async fn insert_console_session(&self, session: &ConsoleSessionRecord) -> StoreResult<()> {
        query(
            "INSERT INTO console_sessions \
             (id_hash, api_token_id, csrf_token, created_at, expires_at, revoked_at) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&session.id_hash)
        .bind(session.api_token_id)
        .bind(&session.csrf_token)
        .bind(session.created_at)
        .bind(session.expires_at)
        .bind(session.revoked_at)
        .execute(&self.db)
        .await?;
        Ok(())
    }

    /// The session with this id hash and the API token it acts as, whatever their state (the
    /// caller checks expiry and revocation).
    pub async fn console_session(
        &self,
        id_hash: &str,
    ) -> StoreResult<Option<(ConsoleSessionRecord, ApiTokenRecord)>> {
        let row = query(
            "SELECT s.id_hash, s.api_token_id, s.csrf_token, s.created_at AS s_created_at, \
             s.expires_at, s.revoked_at AS s_revoked_at, t.id, t.token_hash, t.role, t.team, \
             t.name, t.created_at, t.revoked_at \
             FROM console_sessions s JOIN api_tokens t ON t.id = s.api_token_id \
             WHERE s.id_hash = $1",
        )
        .bind(id_hash)
        .fetch_optional(&self.db)
        .await?;
        row.map(|r| {
            let session = ConsoleSessionRecord {
                id_hash: r.get("id_hash")?,
                api_token_id: r.uuid("api_token_id")?,
                csrf_token: r.get("csrf_token")?,
                created_at: r.time("s_created_at")?,
                expires_at: r.time("expires_at")?,
                revoked_at: r.time_opt("s_revoked_at")?,
            };
            Ok((session, token_from_row(&r, "created_at", "revoked_at")?))
        })
        .transpose()
    }

    /// Marks the session revoked; false when there was no live session with this hash.
    pub async fn revoke_console_session(&self, id_hash: &str, now: Timestamp) -> StoreResult<bool> {
        let done = query(
            "UPDATE console_sessions SET revoked_at = $2 \
             WHERE id_hash = $1 AND revoked_at IS NULL",
        )
        .bind(id_hash)
        .bind(now)
        .execute(&self.db)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    pub async fn insert_enrolment_token(&self, token: &EnrolmentTokenRecord) -> StoreResult<()> {
        query(
            "INSERT INTO enrolment_tokens (token_hash, pool_id, created_at, expires_at, instance_id) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&token.token_hash)
        .bind(token.pool.as_str())
        .bind(token.created_at)
        .bind(token.expires_at)
        .bind(&token.instance)
        .execute(&self.db)
        .await?;
        Ok(())
    }

    /// Consumes a one-time enrolment token and creates the node in one transaction.
    /// Whether `enrolment_hash` names an enrolment token that could enrol an agent now (issued,
    /// unused, unexpired); read only, so that a registration's token is checked before its
    /// body is read. [`Store::register_node`] checks again and consumes it.
    pub async fn check_enrolment_token(
        &self,
        enrolment_hash: &str,
        now: Timestamp,
    ) -> StoreResult<Result<(), RegisterRefusal>> {
        let Some(row) =
            query("SELECT used_at, expires_at FROM enrolment_tokens WHERE token_hash = $1")
                .bind(enrolment_hash)
                .fetch_optional(&self.db)
                .await?
        else {
            return Ok(Err(RegisterRefusal::UnknownToken));
        };
        if row.time_opt("used_at")?.is_some() {
            return Ok(Err(RegisterRefusal::AlreadyUsed));
        }
        if row.time("expires_at")? < now {
            return Ok(Err(RegisterRefusal::Expired));
        }
        Ok(Ok(()))
    }
}
