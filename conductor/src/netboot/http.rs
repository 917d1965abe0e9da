//! HTTP serving of the boot root for iPXE: `GET` and `HEAD` of any file under it, plain
//! HTTP/1.1 (iPXE ROMs in the field speak no TLS without a trusted CA built in).
//!
//! # Design
//! The same root as TFTP, the same confinement ([`super::path::resolve`]). Bodies stream from
//! the file in frames ([`crate::objects::builtin::server::ReplyBody`]); a kernel is never read
//! whole. Each request is logged with its peer, so an operator sees a server fetch its
//! script and then its kernel.
//!
//! # Limitations
//! No ranges and no conditional requests: iPXE fetches whole files.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::path::{resolve, PathError};
use crate::net::admission::{self, Admission, HeldBody};
use crate::objects::builtin::server::ReplyBody;
use vmdeploy_shared::error::Chain;

/// Bytes per body frame.
const CHUNK: usize = 256 * 1024;
/// Time allowed for a request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(60);

/// Accepts connections on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    root: PathBuf,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    // The confinement compares canonical paths.
    let root = Arc::new(root.canonicalize().unwrap_or(root));
    tokio::pin!(shutdown);
    // GET and HEAD only, so no body to time out; one address cannot hold every descriptor.
    let admission = Admission::new(
        "netboot HTTP",
        admission::DEFAULT_MAX_CONNECTIONS,
        admission::DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
    );
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %Chain(&e), "netboot HTTP: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let Ok(ticket) = admission.admit(peer.ip()) else {
            continue;
        };
        let root = root.clone();
        tokio::spawn(async move {
            let activity = ticket.activity();
            let service = hyper::service::service_fn(move |req| {
                let root = root.clone();
                let busy = activity.busy();
                async move {
                    let reply = handle(&root, &req, peer).await;
                    Ok::<_, Infallible>(reply.map(|body| HeldBody::new(body, busy)))
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(tcp), service);
            // A full listener may close the connection for room while it waits for a request.
            tokio::select! {
                result = conn => {
                    if let Err(e) = result {
                        tracing::debug!(%peer, error = %Chain(&e), "netboot HTTP: connection ended with an error");
                    }
                }
                () = ticket.evicted() => tracing::debug!(%peer, "netboot HTTP: closed for room while waiting for a request"),
            }
        });
    }
}

async fn handle<B>(
    root: &std::path::Path,
    req: &Request<B>,
    peer: SocketAddr,
) -> Response<ReplyBody> {
    let head = match *req.method() {
        Method::GET => false,
        Method::HEAD => true,
        _ => return text(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD only"),
    };
    let raw = req.uri().path();
    let decoded = percent_encoding::percent_decode_str(raw).decode_utf8_lossy();
    let (root, name) = (root.to_path_buf(), decoded.into_owned());
    let resolved = tokio::task::spawn_blocking(move || resolve(&root, &name)).await;
    let path = match resolved {
        Ok(Ok(path)) if path.is_file() => path,
        Ok(Ok(_)) => return text(StatusCode::NOT_FOUND, "not found"),
        Ok(Err(refused)) => {
            tracing::info!(%peer, path = %raw, reason = %refused, "netboot HTTP: refused");
            return match refused {
                PathError::Escapes | PathError::OutsideRoot => {
                    text(StatusCode::FORBIDDEN, "outside the boot root")
                }
                PathError::Empty | PathError::NotFound => text(StatusCode::NOT_FOUND, "not found"),
                PathError::Io(_) => text(StatusCode::FORBIDDEN, "cannot read the file"),
            };
        }
        Err(e) => {
            tracing::warn!(%peer, path = %raw, error = %Chain(&e), "netboot HTTP: resolving the name failed");
            return text(StatusCode::INTERNAL_SERVER_ERROR, "cannot read the file");
        }
    };
    let file = match tokio::fs::File::open(&path).await {
        Ok(file) => file,
        Err(e) => {
            tracing::warn!(%peer, path = %raw, error = %Chain(&e), "netboot HTTP: cannot open");
            return text(StatusCode::NOT_FOUND, "not found");
        }
    };
    let size = match file.metadata().await {
        Ok(m) => m.len(),
        Err(e) => {
            tracing::warn!(%peer, path = %raw, error = %Chain(&e), "netboot HTTP: cannot stat");
            return text(StatusCode::INTERNAL_SERVER_ERROR, "cannot read the file");
        }
    };
    tracing::info!(%peer, path = %raw, bytes = size, head, "netboot HTTP: serving");
    let body = if head {
        ReplyBody::Empty
    } else {
        ReplyBody::File {
            file,
            remaining: size,
            buf: vec![0; CHUNK],
        }
    };
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn text(status: StatusCode, message: &str) -> Response<ReplyBody> {
    let mut response = Response::new(ReplyBody::Text(Some(Bytes::from(format!("{message}\n")))));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn files_under_the_root_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("n")).expect("dir");
        let kernel: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(root.join("n/k"), &kernel).expect("kernel");
        std::fs::write(dir.path().join("secret"), b"s").expect("secret");
        std::os::unix::fs::symlink("../secret", root.join("out")).expect("link");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, root, async {
            let _ = stopped.await;
        }));
        crate::net::https::install_crypto_provider();
        let client = reqwest::Client::new();
        let url = |p: &str| format!("http://{addr}{p}");
        let got = client.get(url("/n/k")).send().await.expect("get");
        assert_eq!(got.status(), 200);
        assert_eq!(got.bytes().await.expect("body").as_ref(), kernel.as_slice());
        let head = client.head(url("/n/k")).send().await.expect("head");
        assert_eq!(
            head.headers()["content-length"],
            kernel.len().to_string().as_str()
        );
        for (path, status) in [("/nothing", 404), ("/out", 403), ("/n", 404)] {
            let r = client.get(url(path)).send().await.expect("get");
            assert_eq!(r.status().as_u16(), status, "{path}");
        }
        // A URL library resolves the dots before sending: raw requests, as an attacker sends
        // them.
        for path in ["/n/../../secret", "/n/%2e%2e/%2e%2e/secret", "/../secret"] {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            tcp.write_all(request.as_bytes()).await.expect("send");
            let mut answer = String::new();
            tcp.read_to_string(&mut answer).await.expect("read");
            assert!(answer.starts_with("HTTP/1.1 403"), "{path}: {answer}");
        }
        let r = client.post(url("/n/k")).send().await.expect("post");
        assert_eq!(r.status().as_u16(), 405);

        // One address that opens more than its share of idle connections: those beyond it
        // are closed at once, and another address is served meanwhile.
        use tokio::io::AsyncReadExt as _;
        let share = admission::DEFAULT_MAX_CONNECTIONS_PER_CLIENT;
        let mut idle = Vec::new();
        for _ in 0..share + 20 {
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket
                .bind("127.0.0.2:0".parse().expect("address"))
                .expect("binding 127.0.0.2 (loopback)");
            idle.push(socket.connect(addr).await.expect("connect"));
        }
        let got = client
            .get(url("/n/k"))
            .send()
            .await
            .expect("get during the flood");
        assert_eq!(got.status(), 200);
        let mut closed = 0;
        // An admitted idle connection waits for its headers (nothing to read by the deadline);
        // a refused one reads EOF or a reset (a timeout polls its read once even past it).
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        for tcp in &mut idle {
            let mut byte = [0u8; 1];
            match tokio::time::timeout_at(deadline, tcp.read(&mut byte)).await {
                Ok(Ok(0) | Err(_)) => closed += 1,
                Ok(Ok(_)) => panic!("an idle connection got bytes"),
                Err(_) => {}
            }
        }
        assert_eq!(closed, 20, "the connections beyond the share were closed");
        drop(idle);
        let _ = stop.send(());
        server.await.expect("server ends");
    }
}
