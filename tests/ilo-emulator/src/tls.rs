//! The emulator's TLS: PEM files, or a self-signed certificate made at start (rcgen) whose SAN is
//! the listen IP, so a client can verify it with `cacert=<written file>` (docs/ilo-management.md §5.2).

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// A TLS server configuration and the certificate PEM clients may pin.
pub struct TlsMaterial {
    /// Server configuration for tokio-rustls.
    pub config: Arc<rustls::ServerConfig>,
    /// The leaf certificate, PEM.
    pub cert_pem: String,
}

fn server_config(
    certs: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("choosing TLS versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("loading the TLS certificate and key")?;
    // One request per connection is the RIBCL norm; HTTP/1.1 only (iLO 4 speaks nothing else).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Loads PEM files.
pub fn from_pem_files(cert: &Path, key: &Path) -> anyhow::Result<TlsMaterial> {
    let certs = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("opening {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("reading certificates from {}", cert.display()))?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in {}", cert.display());
    let key_der = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading the private key from {}", key.display()))?;
    let cert_pem =
        std::fs::read_to_string(cert).with_context(|| format!("reading {}", cert.display()))?;
    Ok(TlsMaterial {
        config: server_config(certs, key_der)?,
        cert_pem,
    })
}

/// Makes a self-signed certificate for `ip` (plus 127.0.0.1 and localhost when `ip` is
/// unspecified, so loopback clients can verify it).
pub fn self_signed(ip: IpAddr) -> anyhow::Result<TlsMaterial> {
    let mut names = vec![ip.to_string()];
    if ip.is_unspecified() {
        names.push("127.0.0.1".into());
    }
    names.push("localhost".into());
    let certified = rcgen::generate_simple_self_signed(names)
        .context("generating a self-signed certificate")?;
    let cert_pem = certified.cert.pem();
    let cert_der = certified.cert.der().clone();
    let key_der = PrivateKeyDer::try_from(certified.signing_key.serialize_der())
        .map_err(|e| anyhow::anyhow!("encoding the generated key: {e}"))?;
    Ok(TlsMaterial {
        config: server_config(vec![cert_der], key_der)?,
        cert_pem,
    })
}
