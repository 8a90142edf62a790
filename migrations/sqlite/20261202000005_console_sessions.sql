-- Console sessions: a browser signs in with an API token and gets a session cookie. Only the
-- SHA-256 of the session id is stored; the CSRF token is echoed by the page in `X-CSRF-Token`
-- (it is readable by the page's script by design, so it is stored as is).
CREATE TABLE console_sessions (
    id_hash      TEXT PRIMARY KEY,
    api_token_id TEXT NOT NULL REFERENCES api_tokens(id),
    csrf_token   TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    revoked_at   INTEGER
);

CREATE INDEX console_sessions_token ON console_sessions (api_token_id);
