//! The one HTTPS client builder: a client states what it trusts ([`Trust`]), how long it waits
//! ([`Timeouts`]) and how it treats redirects, proxies and idle connections ([`ClientSpec`]);
//! [`ClientSpec::build`] makes the reqwest client.
//!
//! # Design
//! The workspace builds reqwest with `rustls-no-provider` (root Cargo.toml), so rustls needs a
//! process-wide crypto provider before the first client or server configuration is made:
//! [`install_crypto_provider`] installs ring, and the builder calls it, so no caller can forget.
//! Certificates an operator or a peer hands over are read here once, with one set of messages:
//! a CA file that cannot be read, PEM that does not parse, and text holding no certificate at
//! all are each refused by name before any connection is tried (docs/architecture.md §7).
//! A CA file is checked by [`super::ca_file`]: webpki's rules, plus the operator's pin of a
//! self-signed `CA:TRUE` certificate presented as itself, which OpenSSL-based clients accept.
//!
//! Two shapes of client exist. A *management* client (a BMC, an agent) talks to a host on a
//! management or provisioning network: no proxy from the environment, no redirect followed
//! (a redirect could carry credentials or the agent token elsewhere), every request bounded as
//! a whole. A *transfer* client (Swift, image downloads) moves large bodies: a stalled
//! connection fails, a slow but moving one does not, so it has connect and read timeouts and no
//! bound on the whole request, and it honours `HTTP(S)_PROXY`.

use std::path::PathBuf;
use std::time::Duration;

/// Longest wait to open a management connection: a BMC or an agent that does not accept within
/// this is down or unreachable, however long the caller allows for the request itself.
pub const MAX_MANAGEMENT_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Installs rustls' ring provider once per process (the workspace builds rustls and reqwest
/// without a default provider). A second install fails harmlessly.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// How an operator asked for a server's certificate to be checked (`ilo_verify_ca`,
/// `redfish_verify_ca`, Swift's `verify_ca`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TlsVerify {
    /// Verify against the system's trust store (the default).
    #[default]
    System,
    /// Verify against the CA certificates in this PEM file only.
    CaFile(PathBuf),
    /// Do not verify (`--insecure`, `*_verify_ca: false`). iLOs ship self-signed certificates,
    /// so operators need this; it is never the default.
    Insecure,
}

/// PEM text holding one or more certificates, and what it is called in an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PemCertificates {
    /// Where the text came from, as an operator knows it (`agent_verify_ca`).
    pub source: String,
    /// The PEM text.
    pub pem: String,
}

impl PemCertificates {
    /// `pem`, called `source` in errors.
    pub fn new(source: impl Into<String>, pem: impl Into<String>) -> PemCertificates {
        PemCertificates {
            source: source.into(),
            pem: pem.into(),
        }
    }
}

/// Which server certificates a client accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// Those the system's trust store vouches for.
    System,
    /// Those the CA certificates in this PEM file vouch for; the system's store is not used.
    CaFile(PathBuf),
    /// Any (certificate checks off).
    Insecure,
    /// Those the system's store or these extra CA certificates vouch for (the image cache trusts
    /// the built-in object store's generated CA besides the system's).
    SystemAnd(PemCertificates),
    /// Only this certificate, pinned (an agent's self-signed certificate from its heartbeat), and
    /// `https://` URLs only: no public CA can vouch for an impostor.
    Pinned(PemCertificates),
    /// `http://` only: no certificate is ever checked, so no trust store is loaded (the host may
    /// have none).
    PlainHttp,
}

impl From<&TlsVerify> for Trust {
    fn from(verify: &TlsVerify) -> Trust {
        match verify {
            TlsVerify::System => Trust::System,
            TlsVerify::CaFile(path) => Trust::CaFile(path.clone()),
            TlsVerify::Insecure => Trust::Insecure,
        }
    }
}

/// How long a client waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeouts {
    /// Every request bounded as a whole; connecting bounded by the smaller of this and
    /// [`MAX_MANAGEMENT_CONNECT_TIMEOUT`].
    Request(Duration),
    /// Connecting bounded, and each wait for the next bytes; the whole request is not.
    Transfer {
        /// Opening the connection.
        connect: Duration,
        /// The longest wait for any read.
        read: Duration,
    },
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum HttpsClientError {
    /// The CA file could not be read.
    #[error("reading CA file {}: {source}", path.display())]
    ReadCaFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The certificates' PEM does not parse.
    #[error("{what} is not valid PEM: {source}")]
    NotPem {
        /// The certificates (`CA file /etc/…`, `agent_verify_ca`).
        what: String,
        /// The parser's error.
        source: reqwest::Error,
    },
    /// The text holds no PEM certificate (not PEM at all, or an empty file).
    #[error("{what} holds no PEM certificate")]
    NoCertificate {
        /// The certificates.
        what: String,
    },
    /// The certificates could not be made into a verifier.
    #[error("{what}: {message}")]
    Verifier {
        /// The certificates.
        what: String,
        /// Why.
        message: String,
    },
    /// reqwest refused the configuration.
    #[error("building the HTTPS client: {0}")]
    Build(reqwest::Error),
}

/// What one client needs: trust, timeouts, and the few switches that differ between clients.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    trust: Trust,
    timeouts: Timeouts,
    follow_redirects: bool,
    proxy_from_env: bool,
    max_idle_per_host: Option<usize>,
}

impl ClientSpec {
    /// A client of a management endpoint (a BMC, an agent): see the module's Design.
    pub fn management(trust: Trust, timeout: Duration) -> ClientSpec {
        ClientSpec {
            trust,
            timeouts: Timeouts::Request(timeout),
            follow_redirects: false,
            proxy_from_env: false,
            max_idle_per_host: None,
        }
    }

    /// A client moving large bodies (an object store, image downloads): see the module's Design.
    /// Redirects are followed (reqwest's default, at most 10).
    pub fn transfer(trust: Trust, connect: Duration, read: Duration) -> ClientSpec {
        ClientSpec {
            trust,
            timeouts: Timeouts::Transfer { connect, read },
            follow_redirects: true,
            proxy_from_env: true,
            max_idle_per_host: None,
        }
    }

    /// Follows no redirect: the caller handles them (Redfish) or none is expected (Swift).
    pub fn no_redirects(mut self) -> ClientSpec {
        self.follow_redirects = false;
        self
    }

    /// Keeps at most `n` idle connections per host (a BMC handles few sessions at once).
    pub fn max_idle_per_host(mut self, n: usize) -> ClientSpec {
        self.max_idle_per_host = Some(n);
        self
    }

    /// What the client trusts.
    pub fn trust(&self) -> &Trust {
        &self.trust
    }

    /// The reqwest client.
    pub fn build(&self) -> Result<reqwest::Client, HttpsClientError> {
        install_crypto_provider();
        let mut builder = reqwest::Client::builder();
        builder = match self.timeouts {
            Timeouts::Request(timeout) => builder
                .connect_timeout(timeout.min(MAX_MANAGEMENT_CONNECT_TIMEOUT))
                .timeout(timeout),
            Timeouts::Transfer { connect, read } => {
                builder.connect_timeout(connect).read_timeout(read)
            }
        };
        if !self.follow_redirects {
            builder = builder.redirect(reqwest::redirect::Policy::none());
        }
        if !self.proxy_from_env {
            builder = builder.no_proxy();
        }
        if let Some(n) = self.max_idle_per_host {
            builder = builder.pool_max_idle_per_host(n);
        }
        builder = match &self.trust {
            Trust::System => builder,
            Trust::CaFile(path) => {
                let pem = std::fs::read(path).map_err(|source| HttpsClientError::ReadCaFile {
                    path: path.clone(),
                    source,
                })?;
                let what = format!("CA file {}", path.display());
                // Checked as reqwest would read it, for the same messages; then verified by
                // the CA-file rule that also takes a pinned self-signed CA:TRUE certificate.
                certificates(&what, &pem)?;
                let ders = der_certificates(&pem);
                let config = super::ca_file::client_config(ders).map_err(|e| {
                    HttpsClientError::Verifier {
                        what: what.clone(),
                        message: e.to_string(),
                    }
                })?;
                builder.tls_backend_preconfigured(config)
            }
            Trust::Insecure => builder.danger_accept_invalid_certs(true),
            Trust::SystemAnd(extra) => certificates(&extra.source, extra.pem.as_bytes())?
                .into_iter()
                .fold(builder, |b, cert| b.add_root_certificate(cert)),
            Trust::Pinned(pinned) => builder
                .tls_certs_only(certificates(&pinned.source, pinned.pem.as_bytes())?)
                .https_only(true),
            Trust::PlainHttp => builder.tls_certs_only(std::iter::empty::<reqwest::Certificate>()),
        };
        builder
            .build()
            .map_err(|e| HttpsClientError::Build(e.without_url()))
    }
}

/// The certificates of a PEM text as DER (what rustls takes); those that do not parse are left
/// out (reqwest's reading of the same text has named the problem already).
fn der_certificates(pem: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect()
}

/// The certificates in `pem`, at least one.
fn certificates(what: &str, pem: &[u8]) -> Result<Vec<reqwest::Certificate>, HttpsClientError> {
    let certs =
        reqwest::Certificate::from_pem_bundle(pem).map_err(|source| HttpsClientError::NotPem {
            what: what.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(HttpsClientError::NoCertificate {
            what: what.to_owned(),
        });
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drivers::ilo::test_server::{Reply, TestServer};

    const QUICK: Duration = Duration::from_secs(5);

    async fn server() -> TestServer {
        TestServer::start(|_| Reply::ok("hello")).await
    }

    fn pem_of(server: &TestServer) -> String {
        std::fs::read_to_string(&server.cert_path).expect("reading the test certificate")
    }

    /// `GET /` with `spec`: the body, or the error chain.
    async fn fetch(spec: ClientSpec, url: &str) -> Result<String, String> {
        let client = spec.build().map_err(|e| e.to_string())?;
        let reply = client
            .get(url)
            .send()
            .await
            .map_err(|e| vmdeploy_shared::error::chain(&e))?;
        reply
            .text()
            .await
            .map_err(|e| vmdeploy_shared::error::chain(&e))
    }

    fn https(server: &TestServer) -> String {
        format!("https://{}/", server.address)
    }

    #[test]
    fn a_missing_ca_file_names_the_file() {
        let path = PathBuf::from("/nonexistent/ca.pem");
        let err = ClientSpec::management(Trust::CaFile(path.clone()), QUICK)
            .build()
            .expect_err("no such file");
        assert!(
            matches!(&err, HttpsClientError::ReadCaFile { path: p, .. } if *p == path),
            "{err:?}"
        );
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn a_ca_file_that_is_not_pem_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ca.der");
        std::fs::write(&path, b"\x30\x82\x01\x0a not a PEM file").expect("writing");
        let err = ClientSpec::transfer(Trust::CaFile(path.clone()), QUICK, QUICK)
            .build()
            .expect_err("no certificate in it");
        assert!(
            matches!(err, HttpsClientError::NoCertificate { .. }),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("holds no PEM certificate"), "{text}");

        // A PEM block whose body is not base64 is a parse error, also named.
        std::fs::write(
            &path,
            "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        )
        .expect("writing");
        let err = ClientSpec::transfer(Trust::CaFile(path.clone()), QUICK, QUICK)
            .build()
            .expect_err("broken PEM");
        assert!(matches!(err, HttpsClientError::NotPem { .. }), "{err:?}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn pinned_text_without_a_certificate_is_refused_by_name() {
        let pinned = PemCertificates::new("agent_verify_ca", "hello");
        let err = ClientSpec::management(Trust::Pinned(pinned), QUICK)
            .build()
            .expect_err("nothing to pin");
        assert_eq!(err.to_string(), "agent_verify_ca holds no PEM certificate");
    }

    #[tokio::test]
    async fn a_ca_file_verifies_the_server_and_the_system_store_does_not() {
        let server = server().await;
        let with_ca = ClientSpec::management(Trust::CaFile(server.cert_path.clone()), QUICK);
        assert_eq!(
            fetch(with_ca, &https(&server)).await.as_deref(),
            Ok("hello")
        );
        // The test certificate is self-signed: no system root vouches for it.
        let system = ClientSpec::management(Trust::System, QUICK);
        let err = fetch(system, &https(&server))
            .await
            .expect_err("unknown issuer");
        assert!(err.to_lowercase().contains("certificate"), "{err}");
    }

    #[tokio::test]
    async fn a_pinned_self_signed_ca_certificate_is_accepted_and_nothing_else() {
        // An iLO certificate as `openssl req -x509` makes it: self-signed and CA:TRUE.
        let hello = |_: &crate::drivers::ilo::test_server::Request| Reply::ok("hello");
        let ilo = TestServer::start_as(&["127.0.0.1"], true, hello).await;
        let pinned = ClientSpec::management(Trust::CaFile(ilo.cert_path.clone()), QUICK);
        assert_eq!(
            fetch(pinned.clone(), &https(&ilo)).await.as_deref(),
            Ok("hello"),
            "the operator's pin of the iLO's own certificate"
        );
        // Another CA:TRUE certificate for the same name is refused by that pin.
        let impostor = TestServer::start_as(&["127.0.0.1"], true, hello).await;
        let err = fetch(pinned, &https(&impostor))
            .await
            .expect_err("another certificate");
        assert!(err.to_lowercase().contains("certificate"), "{err}");
        // The pinned certificate does not stand for a name it does not carry.
        let wrong_name = TestServer::start_as(&["ilo.example"], true, hello).await;
        let spec = ClientSpec::management(Trust::CaFile(wrong_name.cert_path.clone()), QUICK);
        let err = fetch(spec, &https(&wrong_name))
            .await
            .expect_err("not valid for 127.0.0.1");
        assert!(err.to_lowercase().contains("certificate"), "{err}");
    }

    #[tokio::test]
    async fn verify_off_accepts_a_self_signed_certificate() {
        let server = server().await;
        let insecure = ClientSpec::transfer(Trust::Insecure, QUICK, QUICK);
        assert_eq!(
            fetch(insecure, &https(&server)).await.as_deref(),
            Ok("hello")
        );
    }

    #[tokio::test]
    async fn extra_cas_are_trusted_besides_the_system_store() {
        let server = server().await;
        let extra = PemCertificates::new("the extra CA", pem_of(&server));
        let spec = ClientSpec::transfer(Trust::SystemAnd(extra), QUICK, QUICK);
        assert_eq!(fetch(spec, &https(&server)).await.as_deref(), Ok("hello"));
    }

    #[tokio::test]
    async fn a_pinned_certificate_is_the_only_one_accepted() {
        let server = server().await;
        let other = server_with_another_certificate().await;
        let pinned = PemCertificates::new("agent_verify_ca", pem_of(&server));
        let spec = ClientSpec::management(Trust::Pinned(pinned), QUICK);
        assert_eq!(
            fetch(spec.clone(), &https(&server)).await.as_deref(),
            Ok("hello")
        );
        // Another self-signed certificate for the same address is an impostor.
        let err = fetch(spec.clone(), &https(&other))
            .await
            .expect_err("not the pinned certificate");
        assert!(err.to_lowercase().contains("certificate"), "{err}");
        // And a pinned client never speaks plain HTTP.
        let err = fetch(spec, &format!("http://{}/", server.address))
            .await
            .expect_err("https only");
        assert!(err.to_lowercase().contains("scheme"), "{err}");
    }

    async fn server_with_another_certificate() -> TestServer {
        TestServer::start(|_| Reply::ok("impostor")).await
    }

    #[tokio::test]
    async fn a_management_client_bounds_the_whole_request() {
        let server = TestServer::start(|_| Reply::Hang).await;
        let spec = ClientSpec::management(
            Trust::CaFile(server.cert_path.clone()),
            Duration::from_millis(300),
        );
        let started = std::time::Instant::now();
        let err = spec
            .build()
            .expect("client")
            .get(https(&server))
            .send()
            .await
            .expect_err("the server never answers");
        assert!(err.is_timeout(), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(3));
    }

    #[tokio::test]
    async fn a_management_client_follows_no_redirect() {
        let server = TestServer::start(|req| {
            if req.path == "/" {
                Reply::Plain {
                    status: 302,
                    headers: vec![("Location".into(), "/elsewhere".into())],
                    body: String::new(),
                }
            } else {
                Reply::ok("followed")
            }
        })
        .await;
        let client = ClientSpec::management(Trust::CaFile(server.cert_path.clone()), QUICK)
            .build()
            .expect("client");
        let reply = client.get(https(&server)).send().await.expect("reply");
        assert_eq!(reply.status(), 302);
        assert_eq!(server.requests.lock().expect("not poisoned").len(), 1);
    }
}
