//! A small HTTP/1.1 (and HTTPS) file server for tests of HTTP clients: serves one in-memory body
//! at any path, honours `Range: bytes=N-`, and can misbehave on purpose (drop the connection
//! once mid-body, or announce more bytes than it ever sends). It binds 127.0.0.1:0 and stops when
//! dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A listener on 127.0.0.1 (ephemeral port) that hands each connection, in blocking mode, to a
/// handler on a thread of its own, until it is dropped. The test servers here and the conductor
/// stand-ins are built on it.
pub struct AcceptLoop {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl AcceptLoop {
    /// Binds and starts accepting.
    pub fn start(handler: impl Fn(TcpStream) + Send + Sync + 'static) -> AcceptLoop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
        // Non-blocking, so that the loop sees `stop` without a connection arriving.
        listener
            .set_nonblocking(true)
            .expect("making the listener non-blocking");
        let addr = listener.local_addr().expect("bound address");
        let stop = Arc::new(AtomicBool::new(false));
        let handler = Arc::new(handler);
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            if stream.set_nonblocking(false).is_err() {
                                continue;
                            }
                            let handler = Arc::clone(&handler);
                            std::thread::spawn(move || handler(stream));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                        Err(_) => break,
                    }
                }
            })
        };
        AcceptLoop {
            addr,
            stop,
            thread: Some(thread),
        }
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for AcceptLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How the server answers.
#[derive(Clone, Default)]
pub struct ServerConfig {
    /// The body served at every path.
    pub body: Arc<Vec<u8>>,
    /// Close the first full (non-range) response after this many body bytes, once.
    pub drop_once_at: Option<u64>,
    /// Never send bytes at or past this offset (but announce the full length): a server whose
    /// copy of the file is truncated.
    pub truncate_at: Option<u64>,
    /// Send an `ETag` header with this value.
    pub etag: Option<String>,
    /// Serve TLS with this configuration.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// One request the server saw.
#[derive(Debug, Clone)]
pub struct RequestLog {
    /// Request target.
    pub path: String,
    /// The `Range` header, if any.
    pub range: Option<String>,
    /// The `If-Range` header, if any.
    pub if_range: Option<String>,
}

/// A running server; stops on drop.
pub struct TestHttpServer {
    accept: AcceptLoop,
    scheme: &'static str,
    /// Every request seen, in order.
    pub requests: Arc<Mutex<Vec<RequestLog>>>,
}

impl TestHttpServer {
    /// Starts serving `config` on 127.0.0.1 (ephemeral port).
    pub fn start(config: ServerConfig) -> TestHttpServer {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let scheme = if config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let accept = {
            let requests = Arc::clone(&requests);
            let dropped = AtomicBool::new(false);
            AcceptLoop::start(move |stream| {
                let _ = serve_connection(stream, &config, &requests, &dropped);
            })
        };
        TestHttpServer {
            accept,
            scheme,
            requests,
        }
    }

    /// URL of `path` on this server, by IP address (`path` starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}://{}{}", self.scheme, self.accept.addr(), path)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.accept.addr()
    }
}

fn serve_connection(
    tcp: TcpStream,
    config: &ServerConfig,
    requests: &Mutex<Vec<RequestLog>>,
    dropped: &AtomicBool,
) -> std::io::Result<()> {
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    tcp.set_write_timeout(Some(Duration::from_secs(30)))?;
    match &config.tls {
        Some(tls) => {
            let conn =
                rustls::ServerConnection::new(Arc::clone(tls)).map_err(std::io::Error::other)?;
            let stream = rustls::StreamOwned::new(conn, tcp);
            serve_stream(stream, config, requests, dropped)
        }
        None => serve_stream(tcp, config, requests, dropped),
    }
}

fn serve_stream<S: Read + Write>(
    stream: S,
    config: &ServerConfig,
    requests: &Mutex<Vec<RequestLog>>,
    dropped: &AtomicBool,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream);
    // One request per connection (the response says `Connection: close`).
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let mut range = None;
    let mut if_range = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            let value = value.trim().to_owned();
            match name.trim().to_ascii_lowercase().as_str() {
                "range" => range = Some(value),
                "if-range" => if_range = Some(value),
                _ => {}
            }
        }
    }
    requests.lock().expect("request log lock").push(RequestLog {
        path: path.clone(),
        range: range.clone(),
        if_range: if_range.clone(),
    });
    let mut stream = reader.into_inner();
    if method != "GET" && method != "HEAD" {
        stream.write_all(
            b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )?;
        return stream.flush();
    }
    let body = &config.body;
    let len = body.len() as u64;
    let start = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|s| s.parse::<u64>().ok());
    let validator_ok = match (&if_range, &config.etag) {
        (Some(got), Some(etag)) => got == etag,
        _ => true,
    };
    let mut head = String::new();
    let start = match start {
        Some(s) if validator_ok && s < len => {
            head.push_str("HTTP/1.1 206 Partial Content\r\n");
            head.push_str(&format!("Content-Range: bytes {s}-{}/{len}\r\n", len - 1));
            head.push_str(&format!("Content-Length: {}\r\n", len - s));
            s
        }
        Some(s) if validator_ok => {
            head.push_str("HTTP/1.1 416 Range Not Satisfiable\r\n");
            head.push_str(&format!(
                "Content-Range: bytes */{len}\r\nContent-Length: 0\r\n"
            ));
            let _ = s;
            len
        }
        _ => {
            head.push_str("HTTP/1.1 200 OK\r\n");
            head.push_str(&format!("Content-Length: {len}\r\n"));
            0
        }
    };
    if let Some(etag) = &config.etag {
        head.push_str(&format!("ETag: {etag}\r\n"));
    }
    head.push_str("Accept-Ranges: bytes\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes())?;
    if method == "HEAD" {
        return stream.flush();
    }
    let mut end = len;
    if let Some(t) = config.truncate_at {
        end = end.min(t);
    }
    if start == 0 && range.is_none() {
        if let Some(d) = config.drop_once_at {
            if !dropped.swap(true, Ordering::SeqCst) {
                end = end.min(d);
            }
        }
    }
    let mut pos = start;
    while pos < end {
        let n = (end - pos).min(256 * 1024);
        stream.write_all(&body[pos as usize..(pos + n) as usize])?;
        pos += n;
    }
    stream.flush()
    // Dropping the stream closes the connection (without a TLS close_notify when cut short:
    // the client must see an unexpected EOF).
}

/// A test CA and a server certificate for 127.0.0.1 and localhost signed by it.
pub struct TestPki {
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// TLS configuration presenting the server certificate.
    pub server_config: Arc<rustls::ServerConfig>,
}

impl TestPki {
    /// Makes a fresh CA and server certificate (rcgen, ring).
    pub fn new() -> TestPki {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "vmdeploy test CA");
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = rcgen::Issuer::new(ca_params, ca_key);

        let mut leaf_params =
            rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("leaf params");
        leaf_params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress(std::net::IpAddr::from([
                127, 0, 0, 1,
            ])));
        let leaf_key = rcgen::KeyPair::generate().expect("leaf key");
        let leaf = leaf_params
            .signed_by(&leaf_key, &issuer)
            .expect("leaf certificate");
        let key = rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der())
            .expect("a PKCS#8 key");
        let server_config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone(), ca_cert.der().clone()], key)
            .expect("server TLS config");
        TestPki {
            ca_pem: ca_cert.pem(),
            server_config: Arc::new(server_config),
        }
    }
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}
