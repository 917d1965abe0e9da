//! The built-in store's HTTPS server: `GET` and `HEAD` of
//! `/v1/AUTH_vmdeploy/<container>/<object>?temp_url_sig=…&temp_url_expires=…`.
//!
//! # Design
//! The path has Swift's shape and the temp URL is checked by `vmdeploy_shared::tempurl`, so a
//! BMC or agent cannot tell this store from Swift (docs/ironic-protocols.md §4.1). The
//! answers are Swift's too: 401 for a missing, wrong or expired signature (checked before the
//! object is looked up, so a 404 tells nothing to someone without a key), 404 for a missing
//! or expired object, 206/416 for ranges ([`super::range`]). Bodies are streamed from the file
//! in [`CHUNK`]-sized frames, never read whole. The signature and the query string never
//! reach a log line: a temp URL is a credential.
//!
//! # Limitations
//! HTTP/1.1 only (what iLO and QEMU's curl driver speak). `If-*` conditional headers are
//! ignored; the answer is always the current object.

use std::convert::Infallible;
use std::io::SeekFrom;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncSeekExt as _, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use vmdeploy_shared::tempurl::{self, TempUrlDigest, TempUrlParams};

use super::range::{parse_range, RangeReply};
use super::{BuiltinStore, ACCOUNT};
use crate::net::admission::{self, Activity, Admission, HeldBody};
use crate::objects::ObjectPath;
use vmdeploy_shared::error::Chain;

/// Bytes per body frame: large enough for hundreds of MB/s over TLS, small enough that a slow
/// BMC does not pin much memory per connection.
const CHUNK: usize = 256 * 1024;
/// Time allowed for a TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed for a request head (an idle keep-alive connection is closed after it).
const HEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// Digests accepted in temp URLs: Swift's default set (SHA-1 is deprecated there but still
/// accepted; Kilo-era clients sign with it, docs/ironic-protocols.md §4.1).
const ALLOWED_DIGESTS: [TempUrlDigest; 3] = [
    TempUrlDigest::Sha1,
    TempUrlDigest::Sha256,
    TempUrlDigest::Sha512,
];

/// Accepts connections until `shutdown` turns true.
pub async fn serve(
    store: Arc<BuiltinStore>,
    listener: TcpListener,
    acceptor: TlsAcceptor,
    mut shutdown: watch::Receiver<bool>,
) {
    // GET and HEAD only, so no body to time out; one address cannot hold every descriptor.
    let admission = Admission::new(
        "object store",
        admission::DEFAULT_MAX_CONNECTIONS,
        admission::DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
    );
    loop {
        if *shutdown.borrow() {
            return;
        }
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %Chain(&e), "object store: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            changed = shutdown.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        let Ok(ticket) = admission.admit(peer.ip()) else {
            continue;
        };
        let store = store.clone();
        let acceptor = acceptor.clone();
        let mut conn_shutdown = shutdown.clone();
        tokio::spawn(async move {
            // A full listener may close the connection for room while it waits for a request.
            tokio::select! {
                () = serve_connection(tcp, peer, acceptor, store, ticket.activity(), &mut conn_shutdown) => {}
                () = ticket.evicted() => tracing::debug!(%peer, "object store: closed for room while waiting for a request"),
            }
        });
    }
}

/// One connection: the TLS handshake, then requests until the client, an error or `shutdown`
/// ends it.
async fn serve_connection(
    tcp: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    acceptor: TlsAcceptor,
    store: Arc<BuiltinStore>,
    activity: Activity,
    conn_shutdown: &mut watch::Receiver<bool>,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %Chain(&e), "object store: TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "object store: TLS handshake timed out");
            return;
        }
    };
    let service = hyper::service::service_fn(move |req| {
        let store = store.clone();
        let busy = activity.busy();
        async move {
            let reply = handle(&store, &req).await;
            Ok::<_, Infallible>(reply.map(|body| HeldBody::new(body, busy)))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(tls), service);
    tokio::select! {
        result = conn => {
            if let Err(e) = result {
                tracing::debug!(%peer, error = %Chain(&e), "object store: connection ended with an error");
            }
        }
        _ = conn_shutdown.changed() => {}
    }
}

/// A reply body: nothing, a short text, or a byte range of a file.
pub enum ReplyBody {
    /// No body (HEAD, 416).
    Empty,
    /// A short text (error pages).
    Text(Option<Bytes>),
    /// `remaining` bytes of `file` from its current position.
    File {
        /// The object's data, positioned at the first byte to send.
        file: tokio::fs::File,
        /// Bytes still to send.
        remaining: u64,
        /// Read buffer, reused for every frame.
        buf: Vec<u8>,
    },
}

impl Body for ReplyBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.get_mut() {
            ReplyBody::Empty => Poll::Ready(None),
            ReplyBody::Text(text) => Poll::Ready(text.take().map(|t| Ok(Frame::data(t)))),
            ReplyBody::File {
                file,
                remaining,
                buf,
            } => {
                if *remaining == 0 {
                    return Poll::Ready(None);
                }
                let want = usize::try_from(*remaining).map_or(buf.len(), |r| r.min(buf.len()));
                let mut read_buf = ReadBuf::new(&mut buf[..want]);
                match Pin::new(file).poll_read(cx, &mut read_buf) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
                    Poll::Ready(Ok(())) => {
                        let filled = read_buf.filled();
                        if filled.is_empty() {
                            // The file shrank under us: end the connection rather than send a
                            // short body the client would take as whole.
                            return Poll::Ready(Some(Err(std::io::Error::new(
                                std::io::ErrorKind::UnexpectedEof,
                                "object data ended early",
                            ))));
                        }
                        *remaining -= filled.len() as u64;
                        Poll::Ready(Some(Ok(Frame::data(Bytes::copy_from_slice(filled)))))
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ReplyBody::Empty => true,
            ReplyBody::Text(text) => text.is_none(),
            ReplyBody::File { remaining, .. } => *remaining == 0,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ReplyBody::Empty => SizeHint::with_exact(0),
            ReplyBody::Text(text) => {
                SizeHint::with_exact(text.as_ref().map_or(0, |t| t.len() as u64))
            }
            ReplyBody::File { remaining, .. } => SizeHint::with_exact(*remaining),
        }
    }
}

/// A short plain-text answer, as Swift gives (`401 Unauthorized: Temp URL invalid`).
fn text(status: StatusCode, message: &str) -> Response<ReplyBody> {
    let mut response = Response::new(ReplyBody::Text(Some(Bytes::from(format!(
        "{} {}: {message}\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    )))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=UTF-8"),
    );
    response
}

/// The object a request path names, with the path the signature covers.
fn parse_path(raw: &str) -> Option<(ObjectPath, String)> {
    let rest = raw.strip_prefix("/v1/")?.strip_prefix(ACCOUNT)?;
    let (container, object) = rest.strip_prefix('/')?.split_once('/')?;
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .ok()
            .map(|c| c.into_owned())
    };
    let path = ObjectPath::new(decode(container)?, decode(object)?);
    // Swift signs the decoded path (WSGI PATH_INFO); so do our temp URLs.
    let signed = format!("/v1/{ACCOUNT}/{}/{}", path.container, path.object);
    Some((path, signed))
}

fn http_date(unix: u64) -> Option<HeaderValue> {
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    let at = time::OffsetDateTime::from_unix_timestamp(i64::try_from(unix).ok()?).ok()?;
    HeaderValue::from_str(&at.format(&format).ok()?).ok()
}

async fn handle(store: &BuiltinStore, req: &Request<Incoming>) -> Response<ReplyBody> {
    let response = answer(store, req).await;
    // The path only: the query holds the signature.
    tracing::debug!(
        method = %req.method(),
        path = req.uri().path(),
        status = response.status().as_u16(),
        "object store request"
    );
    response
}

async fn answer(store: &BuiltinStore, req: &Request<Incoming>) -> Response<ReplyBody> {
    let method = req.method();
    if method != Method::GET && method != Method::HEAD {
        let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let Some((path, signed)) = parse_path(req.uri().path()) else {
        return text(StatusCode::NOT_FOUND, "no such object");
    };
    let verified = TempUrlParams::from_query(req.uri().query().unwrap_or("")).and_then(|p| {
        tempurl::verify(
            std::slice::from_ref(&store.key),
            &ALLOWED_DIGESTS,
            method.as_str(),
            &signed,
            &p,
            super::now_ms() / 1000,
        )
    });
    if let Err(e) = verified {
        tracing::debug!(object = %path, reason = %e, "object store: temp URL refused");
        return text(StatusCode::UNAUTHORIZED, "Temp URL invalid");
    }
    match serve_object(store, req, &path).await {
        Ok(Some(response)) => response,
        Ok(None) => text(StatusCode::NOT_FOUND, "no such object"),
        Err(e) => {
            tracing::warn!(object = %path, error = %Chain(e.as_ref()), "object store: reading an object failed");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "reading the object failed",
            )
        }
    }
}

/// The object's answer; `None` when it does not exist (or has expired).
async fn serve_object(
    store: &BuiltinStore,
    req: &Request<Incoming>,
    path: &ObjectPath,
) -> anyhow::Result<Option<Response<ReplyBody>>> {
    if path.validate().is_err() {
        return Ok(None);
    }
    let Some(sidecar) = store.files.sidecar(path).await? else {
        return Ok(None);
    };
    if sidecar.expired(super::now_ms()) {
        return Ok(None);
    }
    let mut file = match tokio::fs::File::open(store.files.data_path(path)?).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    // The open file's length, not the sidecar's: the body comes from this file.
    let len = file.metadata().await?.len();
    let range = if req.method() == Method::GET {
        let value = req
            .headers()
            .get(header::RANGE)
            .and_then(|v| v.to_str().ok());
        parse_range(value, len)
    } else {
        RangeReply::Full
    };
    let mut builder = Response::builder()
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::ETAG, format!("\"{}\"", sidecar.sha256));
    if let Some(date) = http_date(sidecar.modified) {
        builder = builder.header(header::LAST_MODIFIED, date);
    }
    if let Some(at) = sidecar.delete_at_ms {
        // Swift's header: whole seconds, rounded up so it is never earlier than the deletion.
        builder = builder.header("x-delete-at", at.div_ceil(1000));
    }
    let (status, start, count) = match range {
        RangeReply::Full => (StatusCode::OK, 0, len),
        RangeReply::Partial { start, end } => {
            builder = builder.header(header::CONTENT_RANGE, format!("bytes {start}-{end}/{len}"));
            (StatusCode::PARTIAL_CONTENT, start, end - start + 1)
        }
        RangeReply::Unsatisfiable => {
            let response = builder
                .status(StatusCode::RANGE_NOT_SATISFIABLE)
                .header(header::CONTENT_RANGE, format!("bytes */{len}"))
                .header(header::CONTENT_LENGTH, 0)
                .body(ReplyBody::Empty)?;
            return Ok(Some(response));
        }
    };
    builder = builder.status(status).header(header::CONTENT_LENGTH, count);
    if req.method() == Method::HEAD {
        return Ok(Some(builder.body(ReplyBody::Empty)?));
    }
    if start > 0 {
        file.seek(SeekFrom::Start(start)).await?;
    }
    let buf_len = usize::try_from(count).map_or(CHUNK, |c| c.min(CHUNK));
    Ok(Some(builder.body(ReplyBody::File {
        file,
        remaining: count,
        buf: vec![0; buf_len],
    })?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_paths() {
        let (path, signed) = parse_path("/v1/AUTH_vmdeploy/c/dir/o%20x.iso").expect("parses");
        assert_eq!(path, ObjectPath::new("c", "dir/o x.iso"));
        assert_eq!(signed, "/v1/AUTH_vmdeploy/c/dir/o x.iso");
        for bad in [
            "/",
            "/v1/AUTH_other/c/o",
            "/v1/AUTH_vmdeploy/c",
            "/v1/AUTH_vmdeployx/c/o",
            "/v2/AUTH_vmdeploy/c/o",
            "/v1/AUTH_vmdeploy/c/%FF",
        ] {
            assert_eq!(parse_path(bad), None, "{bad}");
        }
    }

    #[test]
    fn last_modified_is_an_http_date() {
        let date = http_date(784_111_777).expect("formats");
        assert_eq!(date, "Sun, 06 Nov 1994 08:49:37 GMT");
    }
}
