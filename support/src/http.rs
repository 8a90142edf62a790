//! Settings of the HTTP clients that talk to a broker: the agent's and the `switchyard` CLI's.

use std::path::Path;
use std::time::Duration;

/// Idle keep-alive connections are dropped after this, before the broker closes them (it
/// does after `header_timeout_ms`, 10 s by default): a request sent on a connection the
/// broker is closing at that moment fails with a reset.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// The certificates of the PEM file `path` (at least one): what `--ca-cert` reads, on the
/// agent and on the CLI. The error says which file and why, naming the option.
pub fn read_ca(path: &Path) -> Result<Vec<reqwest::Certificate>, String> {
    let bad = |why: String| format!("--ca-cert {}: {why}", path.display());
    let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_without_a_certificate_is_refused_naming_it() {
        let dir = std::env::temp_dir().join(format!("sy-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("written");
        let err = read_ca(&empty).expect_err("refused");
        assert!(
            err.starts_with("--ca-cert ") && err.contains("empty.pem"),
            "{err}"
        );
        let missing = read_ca(&dir.join("missing.pem")).expect_err("refused");
        assert!(missing.contains("missing.pem"), "{missing}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
