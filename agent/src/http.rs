//! The agent's HTTP client settings: one reqwest/rustls client builder for every caller (the
//! conductor API client, the iSCSI deploy report, the `https://` image download), and the error
//! helpers they share.
//!
//! # Design
//! rustls with ring; trust is either the given CA bundle only, or the platform store, or (the
//! ramdisk has no CA store) nothing at all, so that `http://` still works and `https://` needs the
//! conductor's CA (docs/crates.md). A TLS failure is told apart from a network one
//! by the error's type ([`is_tls_error`]), never by its message.
//!
//! # Limitations
//! HTTP/1.1 only, no proxy.

use std::time::Duration;

use anyhow::Context;

pub use vmdeploy_shared::error::chain as error_chain;

/// How a client connects and waits (and, for image downloads, how long it pauses between retries).
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// The only CAs to trust for `https://` URLs (PEM, may be a bundle); `None` uses the platform
    /// verifier.
    pub ca_pem: Option<Vec<u8>>,
    /// TCP + TLS connect timeout.
    pub connect_timeout: Duration,
    /// Longest wait for the next bytes of a response.
    pub read_timeout: Duration,
    /// Pause before the first retry of an image download; doubles each time (capped at 10 s).
    pub retry_backoff: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            ca_pem: None,
            connect_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
            retry_backoff: Duration::from_millis(500),
        }
    }
}

/// Builds the HTTP client: rustls with ring, trusting only `ca_pem` when given
/// (docs/crates.md: the ramdisk has no CA bundle; pin the conductor's CA).
pub fn build_client(opts: &HttpOptions) -> anyhow::Result<reqwest::Client> {
    // Fails only when a provider is already installed, which is what we want anyway.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let base = || {
        reqwest::Client::builder()
            .connect_timeout(opts.connect_timeout)
            .read_timeout(opts.read_timeout)
            .no_proxy()
            .http1_only()
    };
    if let Some(pem) = &opts.ca_pem {
        let certs =
            reqwest::Certificate::from_pem_bundle(pem).context("parsing the CA certificates")?;
        if certs.is_empty() {
            anyhow::bail!("the CA file holds no PEM certificate");
        }
        return base()
            .tls_certs_only(certs)
            .build()
            .context("building the HTTP client");
    }
    // The ramdisk has no system CA store, and reqwest refuses to build a client without one:
    // fall back to an empty trust store, so plain http works and https needs the given CA.
    match base().build() {
        Ok(client) => Ok(client),
        Err(e) => {
            tracing::info!(
                "no system CA certificates ({e}): https URLs need a CA from the parameters"
            );
            base()
                .tls_certs_only(std::iter::empty::<reqwest::Certificate>())
                .build()
                .context("building the HTTP client")
        }
    }
}

/// Whether the TLS handshake failed (a certificate the pinned CA does not vouch for, an alert
/// from the peer): a `rustls::Error` somewhere in the source chain, found by type.
pub fn is_tls_error(e: &(dyn std::error::Error + 'static)) -> bool {
    vmdeploy_shared::error::find_cause::<rustls::Error>(e).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{self, Read, Write};
    use std::sync::Arc;

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    // A self-signed P-256 certificate for "localhost" (openssl req -x509 -newkey ec, 100 years):
    // the server side of the handshake tests below. No client here trusts it.
    const CERT_PEM: &str = include_str!("http/test-cert.pem");
    const KEY_PEM: &str = include_str!("http/test-key.pem");

    /// A TLS server on 127.0.0.1 that completes (or fails) one handshake and answers one request.
    fn tls_server() -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let certs = vec![CertificateDer::from_pem_slice(CERT_PEM.as_bytes()).expect("test cert")];
        let key = PrivateKeyDer::from_pem_slice(KEY_PEM.as_bytes()).expect("test key");
        let config = Arc::new(
            rustls::ServerConfig::builder()
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .expect("server config"),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("addr");
        let thread = std::thread::spawn(move || {
            let (sock, _) = listener.accept().expect("accept");
            let conn = rustls::ServerConnection::new(config).expect("server connection");
            let mut tls = rustls::StreamOwned::new(conn, sock);
            let mut buf = [0u8; 1024];
            // The client refuses the certificate: the handshake ends in an error here.
            if tls.read(&mut buf).is_ok() {
                let _ = tls.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
            }
        });
        (addr, thread)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn an_untrusted_certificate_is_a_tls_error_by_type() {
        let (addr, server) = tls_server();
        let opts = HttpOptions {
            ca_pem: None,
            connect_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(5),
            ..Default::default()
        };
        let url = format!("https://localhost:{}/", addr.port());
        let err = runtime()
            .block_on(async { build_client(&opts).expect("client").get(url).send().await })
            .expect_err("no CA trusts the test certificate");
        assert!(is_tls_error(&err), "{}", error_chain(&err));
        server.join().expect("server thread");
    }

    #[test]
    fn a_refused_connection_is_not_a_tls_error() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let url = format!("https://127.0.0.1:{port}/");
        let err = runtime()
            .block_on(async {
                let client = build_client(&HttpOptions::default()).expect("client");
                client.get(url).send().await
            })
            .expect_err("nothing listens there");
        assert!(!is_tls_error(&err), "{}", error_chain(&err));
        // The message still names the cause.
        assert!(
            error_chain(&err).contains("onnect"),
            "{}",
            error_chain(&err)
        );
    }

    #[test]
    fn an_io_error_carrying_a_rustls_error_counts_and_a_plain_one_does_not() {
        let tls = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        assert!(is_tls_error(&tls));
        let other = io::Error::new(io::ErrorKind::InvalidData, "invalid peer certificate");
        assert!(!is_tls_error(&other), "the message alone proves nothing");
        let nested = io::Error::other(tls);
        assert!(is_tls_error(&nested), "an io::Error inside an io::Error");
        let wrapped = anyhow::Error::new(nested).context("sending");
        assert!(is_tls_error(wrapped.as_ref()));
    }
}
