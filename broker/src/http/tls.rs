//! HTTPS for the broker's listener: a rustls server configuration from the PEM files of
//! `tls_cert` and `tls_key`. The crypto backend is aws-lc-rs, the one reqwest and the AWS SDK
//! already use, named explicitly rather than read from the process default (which is ambiguous
//! when a second backend is linked in). ALPN offers HTTP/2 and HTTP/1.1; TLS 1.2 and 1.3 with
//! rustls' safe defaults.

use anyhow::{Context, bail};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::aws_lc_rs;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::Config;

/// The TLS settings of `config`: `None` for plain HTTP (neither file set), an error for one
/// without the other or a file that does not hold what it should.
pub fn server_config(config: &Config) -> anyhow::Result<Option<Arc<ServerConfig>>> {
    match (&config.tls_cert, &config.tls_key) {
        (None, None) => Ok(None),
        (Some(cert), Some(key)) => load(cert, key).map(Some),
        _ => bail!("tls_cert and tls_key go together: set both (HTTPS) or neither (HTTP)"),
    }
}

/// A server configuration for the chain in `cert_path` and the key in `key_path`.
pub fn load(cert_path: &Path, key_path: &Path) -> anyhow::Result<Arc<ServerConfig>> {
    let pem = std::fs::read(cert_path)
        .with_context(|| format!("reading tls_cert {}", cert_path.display()))?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing tls_cert {}", cert_path.display()))?;
    if chain.is_empty() {
        bail!("tls_cert {} holds no PEM certificate", cert_path.display());
    }
    let pem = std::fs::read(key_path)
        .with_context(|| format!("reading tls_key {}", key_path.display()))?;
    let key = PrivateKeyDer::from_pem_slice(&pem)
        .with_context(|| format!("parsing tls_key {} (a PEM private key)", key_path.display()))?;
    let mut tls = ServerConfig::builder_with_provider(Arc::new(aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .with_context(|| {
            format!(
                "tls_key {} does not fit tls_cert {}",
                key_path.display(),
                cert_path.display()
            )
        })?;
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(tls))
}
