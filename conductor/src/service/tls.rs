//! TLS for the API and the built-in object store: the operator's PEM files, or a CA and a server
//! certificate generated in the state directory (`api.tls = "auto"`, docs/architecture.md §6a).
//!
//! # Design
//! [`AutoTls::ensure`] keeps four files in `<state>/tls`: `ca.pem`, `ca-key.pem`, `server.pem`,
//! `server-key.pem` (keys 0600), and `server.json`, which records the names the server
//! certificate was made for, its expiry and the CA it was signed by. The CA is made once and
//! kept: agents get it on their floppy, and a deploy in flight must keep trusting the
//! conductor. The server certificate is made again when the names asked for are no longer all
//! in it (a new listen address or public URL), when it is near its end, or when the CA changed.
//!
//! The CA is rebuilt as an rcgen issuer from its key alone: its subject names the SHA-256 of its
//! public key, and rcgen derives the key identifiers from the key, so a certificate signed after
//! a restart chains to the `ca.pem` written at first start (no X.509 parser needed).
//!
//! # Limitations
//! For an unspecified listen address (`0.0.0.0`), the certificate names the host name, the
//! loopback addresses and the public URL's host, not every interface address: set
//! `api.public_url` to the address the ramdisk uses.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use time::OffsetDateTime;

/// The CA's lifetime (10 years): agents of deploys in flight trust it.
const CA_DAYS: i64 = 3650;
/// The server certificate's lifetime; it is made again 30 days before its end.
const SERVER_DAYS: i64 = 397;
/// Renew a server certificate this close to its end.
const RENEW_DAYS: i64 = 30;

const CA_CERT: &str = "ca.pem";
const CA_KEY: &str = "ca-key.pem";
const SERVER_CERT: &str = "server.pem";
const SERVER_KEY: &str = "server-key.pem";
const SERVER_INFO: &str = "server.json";

/// A certificate chain and its key, ready for rustls.
pub struct CertifiedKey {
    /// Leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's key.
    pub key: PrivateKeyDer<'static>,
    /// The CA clients should trust, PEM (goes on the floppy as `ipa-agent-ca`).
    pub ca_pem: Option<String>,
}

impl std::fmt::Debug for CertifiedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertifiedKey")
            .field("chain", &self.chain.len())
            .finish_non_exhaustive()
    }
}

impl CertifiedKey {
    /// A rustls server configuration offering HTTP/1.1.
    pub fn server_config(&self) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        install_crypto_provider();
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .context("building the TLS server configuration")?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Installs rustls' ring provider once per process: the same one the clients use.
pub use crate::net::https::install_crypto_provider;

/// Loads an operator's certificate chain and key; `ca` (else the chain's last certificate) is
/// what the ramdisk will trust.
pub fn load_files(cert: &Path, key: &Path, ca: Option<&Path>) -> anyhow::Result<CertifiedKey> {
    let chain = CertificateDer::pem_file_iter(cert)
        .with_context(|| format!("reading the certificate {}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing the certificate {}", cert.display()))?;
    if chain.is_empty() {
        anyhow::bail!("{}: no PEM certificate in it", cert.display());
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading the private key {}", key.display()))?;
    let ca_pem = match ca {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("reading the CA {}", path.display()))?,
        None => {
            let last = chain.last().expect("checked non-empty above");
            pem_encode("CERTIFICATE", last)
        }
    };
    let loaded = CertifiedKey {
        chain,
        key: private,
        ca_pem: Some(ca_pem),
    };
    // Fails here, not at the first handshake, when the key does not match the certificate.
    loaded.server_config().with_context(|| {
        format!(
            "{} and {} do not make a pair",
            cert.display(),
            key.display()
        )
    })?;
    Ok(loaded)
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// What [`AutoTls::ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoOutcome {
    /// Everything was there and still fits.
    Reused,
    /// A new CA and server certificate (first start).
    CreatedCa,
    /// The CA was kept; the server certificate was made again (names, expiry).
    RenewedServer,
}

/// `server.json`: what the server certificate was made for.
#[derive(Debug, Serialize, Deserialize)]
struct ServerInfo {
    names: BTreeSet<String>,
    not_after: i64,
    ca_id: String,
}

/// The generated CA and server certificate in a state directory.
#[derive(Debug)]
pub struct AutoTls {
    dir: PathBuf,
}

impl AutoTls {
    /// The certificates in `<state_dir>/tls`.
    pub fn new(state_dir: &Path) -> AutoTls {
        AutoTls {
            dir: state_dir.join(crate::service::config::TLS_DIR),
        }
    }

    /// The directory of the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA and a server certificate covering `names` (IP addresses and DNS names), made or
    /// reused as the module docs say.
    pub fn ensure(&self, names: &BTreeSet<String>) -> anyhow::Result<(CertifiedKey, AutoOutcome)> {
        create_private_dir(&self.dir)?;
        let ca_cert_path = self.dir.join(CA_CERT);
        let ca_key_path = self.dir.join(CA_KEY);
        let mut outcome = AutoOutcome::Reused;
        let ca_key = match (ca_cert_path.exists(), ca_key_path.exists()) {
            (true, true) => {
                let pem = std::fs::read_to_string(&ca_key_path)
                    .with_context(|| format!("reading {}", ca_key_path.display()))?;
                KeyPair::from_pem(&pem)
                    .with_context(|| format!("parsing the CA key {}", ca_key_path.display()))?
            }
            (false, false) => {
                let key = KeyPair::generate().context("generating the CA key")?;
                let cert = ca_params(&key)
                    .self_signed(&key)
                    .context("signing the CA certificate")?;
                write_private(&ca_key_path, key.serialize_pem().as_bytes())?;
                write_public(&ca_cert_path, cert.pem().as_bytes())?;
                outcome = AutoOutcome::CreatedCa;
                key
            }
            (cert, _) => anyhow::bail!(
                "{}: {} is there but {} is not; move the directory away to start with a new CA \
                 (agents of deploys in flight trust the old one)",
                self.dir.display(),
                if cert { CA_CERT } else { CA_KEY },
                if cert { CA_KEY } else { CA_CERT },
            ),
        };
        let ca_pem = std::fs::read_to_string(&ca_cert_path)
            .with_context(|| format!("reading {}", ca_cert_path.display()))?;
        let ca_id = key_id(&ca_key);

        let server_cert_path = self.dir.join(SERVER_CERT);
        let server_key_path = self.dir.join(SERVER_KEY);
        let info_path = self.dir.join(SERVER_INFO);
        let now = OffsetDateTime::now_utc();
        let fits = std::fs::read(&info_path)
            .ok()
            .and_then(|b| serde_json::from_slice::<ServerInfo>(&b).ok())
            .is_some_and(|info| {
                info.ca_id == ca_id
                    && names.is_subset(&info.names)
                    && info.not_after > (now + time::Duration::days(RENEW_DAYS)).unix_timestamp()
            })
            && server_cert_path.exists()
            && server_key_path.exists();
        if !fits {
            let key = KeyPair::generate().context("generating the server key")?;
            let mut params = CertificateParams::new(names.iter().cloned().collect::<Vec<_>>())
                .context("naming the server certificate")?;
            let mut dn = DistinguishedName::new();
            dn.push(
                DnType::CommonName,
                names
                    .iter()
                    .next()
                    .cloned()
                    .unwrap_or_else(|| "vmdeploy".into()),
            );
            params.distinguished_name = dn;
            params.is_ca = IsCa::NoCa;
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            params.use_authority_key_identifier_extension = true;
            params.not_before = now - time::Duration::hours(1);
            params.not_after = now + time::Duration::days(SERVER_DAYS);
            let issuer = Issuer::new(ca_params(&ca_key), &ca_key);
            let cert = params
                .signed_by(&key, &issuer)
                .context("signing the server certificate")?;
            write_private(&server_key_path, key.serialize_pem().as_bytes())?;
            write_public(&server_cert_path, cert.pem().as_bytes())?;
            let info = ServerInfo {
                names: names.clone(),
                not_after: params.not_after.unix_timestamp(),
                ca_id,
            };
            write_public(
                &info_path,
                &serde_json::to_vec_pretty(&info).context("encoding server.json")?,
            )?;
            if outcome == AutoOutcome::Reused {
                outcome = AutoOutcome::RenewedServer;
            }
        }
        let mut loaded = load_files(&server_cert_path, &server_key_path, Some(&ca_cert_path))?;
        loaded.ca_pem = Some(ca_pem);
        Ok((loaded, outcome))
    }
}

/// The CA's parameters, rebuilt the same from its key at every start (module docs).
fn ca_params(key: &KeyPair) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "vmdeploy");
    dn.push(
        DnType::CommonName,
        format!("vmdeploy conductor CA {}", &key_id(key)[..16]),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(CA_DAYS);
    params
}

/// Hex SHA-256 of a key's public half.
fn key_id(key: &KeyPair) -> String {
    hex::encode(sha2::Sha256::digest(key.public_key_raw()))
}

/// The names a server certificate needs for these addresses and URLs: each specified IP, and
/// for an unspecified one the loopback addresses and the host name; each URL's host.
pub fn names_for(addresses: &[SocketAddr], urls: &[&str]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for addr in addresses {
        match addr.ip() {
            IpAddr::V4(ip) if ip == Ipv4Addr::UNSPECIFIED => {
                names.insert(Ipv4Addr::LOCALHOST.to_string());
                names.insert("localhost".to_string());
                names.insert(crate::service::config::host_name());
            }
            IpAddr::V6(ip) if ip == Ipv6Addr::UNSPECIFIED => {
                names.insert(Ipv4Addr::LOCALHOST.to_string());
                names.insert(Ipv6Addr::LOCALHOST.to_string());
                names.insert("localhost".to_string());
                names.insert(crate::service::config::host_name());
            }
            ip => {
                names.insert(ip.to_string());
                if ip.is_loopback() {
                    names.insert("localhost".to_string());
                }
            }
        }
    }
    for url in urls {
        if let Ok(url) = url::Url::parse(url) {
            match url.host() {
                Some(url::Host::Domain(d)) => {
                    names.insert(d.to_string());
                }
                Some(url::Host::Ipv4(ip)) => {
                    names.insert(ip.to_string());
                }
                Some(url::Host::Ipv6(ip)) => {
                    names.insert(ip.to_string());
                }
                None => {}
            }
        }
    }
    names
}

fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("making {} private", dir.display()))
}

/// Writes through a temporary file and a rename, so a crash leaves the old file or the new one.
fn write_with_mode(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    write_with_mode(path, bytes, 0o600)
}

fn write_public(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    write_with_mode(path, bytes, 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn first_start_creates_later_starts_reuse_new_names_renew() {
        let dir = tempfile::tempdir().expect("temp dir");
        let auto = AutoTls::new(dir.path());
        let (first, outcome) = auto
            .ensure(&set(&["127.0.0.1", "localhost"]))
            .expect("first");
        assert_eq!(outcome, AutoOutcome::CreatedCa);
        let mode = |f: &str| {
            std::fs::metadata(auto.dir().join(f))
                .expect("file")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode(CA_KEY), 0o600);
        assert_eq!(mode(SERVER_KEY), 0o600);

        let (again, outcome) = auto.ensure(&set(&["127.0.0.1"])).expect("second");
        assert_eq!(outcome, AutoOutcome::Reused);
        assert_eq!(again.chain, first.chain, "same server certificate");

        let (renewed, outcome) = auto
            .ensure(&set(&["127.0.0.1", "10.0.0.5"]))
            .expect("third");
        assert_eq!(outcome, AutoOutcome::RenewedServer);
        assert_ne!(renewed.chain, first.chain);
        assert_eq!(renewed.ca_pem, first.ca_pem, "the CA stays");
        renewed.server_config().expect("usable by rustls");
    }

    #[test]
    fn a_renewed_certificate_chains_to_the_first_ca() {
        install_crypto_provider();
        let dir = tempfile::tempdir().expect("temp dir");
        let auto = AutoTls::new(dir.path());
        let (first, _) = auto.ensure(&set(&["127.0.0.1"])).expect("first");
        let (renewed, _) = auto.ensure(&set(&["127.0.0.1", "::1"])).expect("renew");
        let ca_pem = first.ca_pem.expect("ca");
        let ca = CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("ca pem");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca).expect("root");
        let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
            .build()
            .expect("verifier");
        let name = rustls_pki_types::ServerName::try_from("::1").expect("name");
        let now = rustls_pki_types::UnixTime::now();
        use rustls::client::danger::ServerCertVerifier as _;
        verifier
            .verify_server_cert(&renewed.chain[0], &[], &name, &[], now)
            .expect("the renewed leaf chains to the CA written at first start");
    }

    #[test]
    fn half_a_ca_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let auto = AutoTls::new(dir.path());
        auto.ensure(&set(&["127.0.0.1"])).expect("first");
        std::fs::remove_file(auto.dir().join(CA_KEY)).expect("rm");
        let err = auto.ensure(&set(&["127.0.0.1"])).expect_err("half a CA");
        assert!(format!("{err:#}").contains(CA_KEY), "{err:#}");
    }

    #[test]
    fn names_cover_unspecified_and_urls() {
        let any: SocketAddr = "0.0.0.0:6385".parse().expect("addr");
        let names = names_for(&[any], &["https://conductor.example:6385"]);
        assert!(names.contains("127.0.0.1"));
        assert!(names.contains("localhost"));
        assert!(names.contains("conductor.example"));
        let one: SocketAddr = "10.1.2.3:6385".parse().expect("addr");
        assert_eq!(names_for(&[one], &[]), set(&["10.1.2.3"]));
    }
}
