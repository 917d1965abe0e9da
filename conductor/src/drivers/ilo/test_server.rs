//! A small HTTPS server for client tests: a self-signed certificate (rcgen) for 127.0.0.1,
//! tokio-rustls, one request per connection, and a handler that decides each reply, including
//! the faulty ones (hang, truncated, chunked, garbage).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One received request.
#[derive(Debug, Clone)]
pub struct Request {
    /// Method.
    pub method: String,
    /// Path.
    pub path: String,
    /// Header lines, lower-cased names.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: String,
}

impl Request {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What the server does with a request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A response with Content-Length.
    Plain {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// A 200 response with chunked transfer encoding, `body` split into `chunk`-byte chunks.
    Chunked { body: String, chunk: usize },
    /// Never answer (hold the connection for a minute).
    Hang,
    /// Announce `declared` bytes, send `body` (shorter), close.
    ShortBody { declared: usize, body: String },
}

impl Reply {
    /// 200 with a body.
    pub fn ok(body: impl Into<String>) -> Self {
        Reply::Plain {
            status: 200,
            headers: vec![],
            body: body.into(),
        }
    }

    /// A status with a body.
    pub fn status(status: u16, body: impl Into<String>) -> Self {
        Reply::Plain {
            status,
            headers: vec![],
            body: body.into(),
        }
    }
}

type Handler = dyn Fn(&Request) -> Reply + Send + Sync;

/// A running server; stops when dropped.
pub struct TestServer {
    /// `127.0.0.1:PORT`.
    pub address: String,
    /// Requests seen.
    pub requests: Arc<Mutex<Vec<Request>>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
    /// The certificate written to a file.
    pub cert_path: PathBuf,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    /// Starts a server with `handler`.
    pub async fn start(handler: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> Self {
        TestServer::start_as(&["127.0.0.1", "localhost"], false, handler).await
    }

    /// Starts a server whose self-signed certificate names `names` and, with `ca`, is marked
    /// `CA:TRUE` (as `openssl req -x509` makes it).
    pub async fn start_as(
        names: &[&str],
        ca: bool,
        handler: impl Fn(&Request) -> Reply + Send + Sync + 'static,
    ) -> Self {
        crate::net::https::install_crypto_provider();
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("certificate names");
        if ca {
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        }
        let signing_key = rcgen::KeyPair::generate().expect("a key pair");
        let cert = params
            .self_signed(&signing_key)
            .expect("generating a test certificate");
        let cert_pem = cert.pem();
        let cert_der = cert.der().clone();
        let key_der = rustls_pki_types::PrivateKeyDer::Pkcs8(
            rustls_pki_types::PrivatePkcs8KeyDer::from(signing_key.serialize_der()),
        );
        let tls = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![cert_der], key_der)
            .expect("a valid test certificate");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a loopback port");
        let address = listener.local_addr().expect("bound").to_string();
        let dir = tempfile::tempdir().expect("temp dir");
        let cert_path = dir.path().join("cert.pem");
        std::fs::write(&cert_path, &cert_pem).expect("writing the certificate");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let seen = requests.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let handler = handler.clone();
                let seen = seen.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Some(request) = read_request(&mut tls).await else {
                        return;
                    };
                    seen.lock().expect("not poisoned").push(request.clone());
                    let reply = handler(&request);
                    let _ = write_reply(&mut tls, reply).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        Self {
            address,
            requests,
            task,
            _dir: dir,
            cert_path,
        }
    }

    /// Requests received so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().expect("not poisoned").clone()
    }
}

async fn read_request<S: AsyncReadExt + Unpin>(stream: &mut S) -> Option<Request> {
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    let header_end = loop {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&buf[..n]);
        if let Some(pos) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
    };
    let head = String::from_utf8_lossy(&data[..header_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_string();
    let path = first.next()?.to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while data.len() < header_end + length {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            break;
        }
        data.extend_from_slice(&buf[..n]);
    }
    let end = data.len().min(header_end + length);
    let body = String::from_utf8_lossy(&data[header_end..end]).into_owned();
    Some(Request {
        method,
        path,
        headers,
        body,
    })
}

async fn write_reply<S: AsyncWriteExt + Unpin>(
    stream: &mut S,
    reply: Reply,
) -> std::io::Result<()> {
    match reply {
        Reply::Plain {
            status,
            headers,
            body,
        } => {
            let mut head = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            for (n, v) in headers {
                head.push_str(&format!("{n}: {v}\r\n"));
            }
            head.push_str("\r\n");
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body.as_bytes()).await?;
        }
        Reply::Chunked { body, chunk } => {
            stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
                )
                .await?;
            for piece in body.as_bytes().chunks(chunk.max(1)) {
                stream
                    .write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                    .await?;
                stream.write_all(piece).await?;
                stream.write_all(b"\r\n").await?;
                stream.flush().await?;
            }
            stream.write_all(b"0\r\n\r\n").await?;
        }
        Reply::Hang => tokio::time::sleep(Duration::from_secs(60)).await,
        Reply::ShortBody { declared, body } => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/xml\r\nContent-Length: {declared}\r\nConnection: close\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body.as_bytes()).await?;
        }
    }
    stream.flush().await
}
