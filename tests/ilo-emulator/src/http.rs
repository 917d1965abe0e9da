//! HTTPS serving of one emulated iLO: TLS accept, routing (`/ribcl`, `/xmldata`, `/redfish/`,
//! `/rest/v1`, `/_emulator/`), the transport-level faults, and the reply framing.
//!
//! RIBCL replies are framed like a real iLO's (docs/ilo-management.md §1.2, §5.2): HTTP/1.1 200,
//! `Content-Type: text/xml`, chunked transfer encoding (one chunk per document; python-hpilo
//! refuses a Content-Length reply), `Connection: close`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::fault::{FaultKind, FaultSpec};
use crate::profile::Quirk;
use crate::server::Server;
use crate::{admin, redfish, ribcl, ris};
use vmdeploy_shared::error::Chain;

/// Largest request body accepted (RIBCL requests are a few hundred bytes).
const MAX_REQUEST_BYTES: usize = 1 << 20;
/// Time allowed for a TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed to receive a request body.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a `timeout` fault holds a request when no `seconds` is given.
const DEFAULT_HANG: Duration = Duration::from_secs(600);

/// A reply body: a list of chunks, sent with Content-Length (`exact`) or chunked, optionally cut
/// short (the `truncated` fault: an error ends the stream, hyper aborts the connection without
/// the terminating chunk).
pub struct ReplyBody {
    chunks: VecDeque<Bytes>,
    exact: Option<u64>,
    cut: bool,
    /// Before the cut, a pause so the head and the first half reach the client.
    cut_pause: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl ReplyBody {
    /// One buffer with a Content-Length.
    pub fn full(bytes: impl Into<Bytes>) -> Self {
        let b: Bytes = bytes.into();
        ReplyBody {
            exact: Some(b.len() as u64),
            chunks: VecDeque::from([b]),
            cut: false,
            cut_pause: None,
        }
    }

    /// Chunked transfer encoding, a chunk per item.
    pub fn chunked(chunks: impl IntoIterator<Item = Bytes>) -> Self {
        ReplyBody {
            chunks: chunks.into_iter().filter(|c| !c.is_empty()).collect(),
            exact: None,
            cut: false,
            cut_pause: None,
        }
    }

    /// The same bytes sent chunked, without a Content-Length (iLO 5 and later send every body
    /// this way: the `chunked` quirk).
    fn into_chunked(mut self) -> Self {
        self.exact = None;
        self
    }

    /// Cuts the body after half its bytes and forces chunked encoding.
    fn truncate(mut self) -> Self {
        let all: Vec<u8> = self.chunks.iter().flat_map(|c| c.iter().copied()).collect();
        let half = all.len() / 2;
        self.chunks = VecDeque::from([Bytes::from(all[..half].to_vec())]);
        self.exact = None;
        self.cut = true;
        self.cut_pause = Some(Box::pin(tokio::time::sleep(Duration::from_millis(100))));
        self
    }
}

impl Body for ReplyBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        if let Some(chunk) = this.chunks.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if let Some(pause) = this.cut_pause.as_mut() {
            if pause.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.cut_pause = None;
        }
        if this.cut {
            this.cut = false;
            return Poll::Ready(Some(Err(std::io::Error::other(
                "reply truncated (injected fault)",
            ))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty() && !self.cut
    }

    fn size_hint(&self) -> SizeHint {
        match self.exact {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

/// The response type of every handler.
pub type Reply = Response<ReplyBody>;

/// A plain reply.
pub fn simple(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(ReplyBody::full(body));
    *r.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

fn ribcl_reply(docs: Vec<String>) -> Reply {
    let mut r = Response::new(ReplyBody::chunked(docs.into_iter().map(Bytes::from)));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/xml"),
    );
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    h.insert(
        header::EXPIRES,
        header::HeaderValue::from_static("Thu, 26 Oct 1995 00:00:00 GMT"),
    );
    h.insert(
        header::SERVER,
        header::HeaderValue::from_static("HP-iLO-Server/1.30"),
    );
    h.insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    r
}

/// Reads a request body within the size and time limits.
pub async fn read_body(body: Incoming) -> Result<Bytes, Reply> {
    let limited = http_body_util::Limited::new(body, MAX_REQUEST_BYTES);
    match tokio::time::timeout(BODY_TIMEOUT, limited.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) => Err(simple(
            StatusCode::BAD_REQUEST,
            "text/plain",
            format!("bad request body: {e}\n"),
        )),
        Err(_) => Err(simple(
            StatusCode::REQUEST_TIMEOUT,
            "text/plain",
            "request body timed out\n",
        )),
    }
}

/// Why a request is not answered (the `timeout` fault): hyper drops the connection.
#[derive(Debug, thiserror::Error)]
#[error("request deliberately left unanswered (timeout fault)")]
pub struct Unanswered;

async fn route(server: Arc<Server>, req: Request<Incoming>) -> Result<Reply, Unanswered> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if path.starts_with("/_emulator/") {
        return Ok(admin::handle(&server, req).await);
    }
    let _in_flight = server.gauge.enter();
    let fault = server.begin_request();
    tracing::info!(server = server.index, %method, %path, fault = ?fault.as_ref().map(|f| f.kind), "request");
    if let Some(f) = &fault {
        match f.kind {
            FaultKind::Delay => {
                tokio::time::sleep(Duration::from_secs_f64(f.seconds.max(0.0))).await;
            }
            FaultKind::Timeout => {
                let hang = if f.seconds > 0.0 {
                    Duration::from_secs_f64(f.seconds)
                } else {
                    DEFAULT_HANG
                };
                tokio::time::sleep(hang).await;
                return Err(Unanswered);
            }
            FaultKind::Http500 => {
                return Ok(simple(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/html",
                    "<html><body><h1>500 Internal Server Error</h1></body></html>\n",
                ))
            }
            FaultKind::NonXml => {
                return Ok(simple(
                    StatusCode::OK,
                    "text/html",
                    "<html><head><title>iLO 4</title></head><body>Integrated Lights-Out 4</body></html>\n",
                ))
            }
            _ => {}
        }
    }
    let truncated = fault
        .as_ref()
        .is_some_and(|f| f.kind == FaultKind::Truncated);
    let reply = dispatch(&server, req, &method, &path, fault.as_ref()).await;
    let (mut parts, body) = reply.into_parts();
    if server.config.clock_skew_secs != 0 {
        // hyper adds a Date header only when the reply has none.
        let skew = Duration::from_secs(server.config.clock_skew_secs.unsigned_abs());
        let now = std::time::SystemTime::now();
        let clock = if server.config.clock_skew_secs > 0 {
            now.checked_add(skew)
        } else {
            now.checked_sub(skew)
        };
        if let Some(v) = clock
            .map(httpdate::fmt_http_date)
            .and_then(|d| header::HeaderValue::from_str(&d).ok())
        {
            parts.headers.insert(header::DATE, v);
        }
    }
    let body = if truncated {
        body.truncate()
    } else if server.quirk(Quirk::Chunked) {
        body.into_chunked()
    } else {
        body
    };
    Ok(Response::from_parts(parts, body))
}

async fn dispatch(
    server: &Arc<Server>,
    req: Request<Incoming>,
    method: &Method,
    path: &str,
    fault: Option<&FaultSpec>,
) -> Reply {
    let wrong_root = fault.is_some_and(|f| f.kind == FaultKind::WrongRoot);
    if path == "/ribcl" {
        if method != Method::POST {
            return simple(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "POST only\n");
        }
        let body = match read_body(req.into_body()).await {
            Ok(b) => b,
            Err(reply) => return reply,
        };
        if wrong_root {
            return ribcl_reply(vec![
                "<?xml version=\"1.0\"?>\r\n<RESPONSE STATUS=\"0x0000\" MESSAGE='No error'/>\n"
                    .to_owned(),
            ]);
        }
        if server.quirk(Quirk::RibclDisabled) {
            return ribcl_reply(ribcl::disabled());
        }
        let text = String::from_utf8_lossy(&body);
        let reply = ribcl::handle(server, &text, fault).await;
        return ribcl_reply(reply.into_docs());
    }
    if path == "/xmldata" && method == Method::GET {
        return simple(StatusCode::OK, "text/xml", xmldata(server));
    }
    if path == "/redfish" || path.starts_with("/redfish/") {
        if server.quirk(Quirk::NoRedfish) {
            return simple(
                StatusCode::NOT_FOUND,
                "text/html",
                "<html><body>Not Found</body></html>\n",
            );
        }
        if wrong_root {
            return simple(StatusCode::OK, "application/json", "[]");
        }
        return redfish::handle(server, req, fault).await;
    }
    if ris::is_ris_path(path) {
        // iLO 5 and 6 send every RIS path to Redfish (docs/ilo-quirks.md §0); an iLO 4 answers
        // it only with RIS (the `ris` quirk), else as any unknown path.
        if ris::redirects_to_redfish(server) {
            return ris::redirect_to_redfish(path, req.uri().query());
        }
        if server.quirk(Quirk::Ris) {
            return ris::handle(server, req, fault).await;
        }
    }
    simple(
        StatusCode::NOT_FOUND,
        "text/html",
        "<html><body>Not Found</body></html>\n",
    )
}

/// `GET /xmldata?item=all`: the unauthenticated RIMP document (docs/ilo-management.md §1.5, used by
/// proliantutils' get_host_uuid).
fn xmldata(server: &Server) -> String {
    use crate::xml::escape;
    let identity = &server.config.profile.identity;
    format!(
        "<?xml version=\"1.0\"?>\r\n<RIMP>\n<HSI>\n<SBSN>{serial}</SBSN>\n<SPN>{product}</SPN>\n<UUID>{serial}</UUID>\n<SP>1</SP>\n<cUUID>{uuid}</cUUID>\n<VIRTUAL>\n<STATE>Inactive</STATE>\n<VID><BSN/><cUUID/></VID>\n</VIRTUAL>\n</HSI>\n<MP>\n<ST>1</ST>\n<PN>{pn}</PN>\n<FWRI>{fw}</FWRI>\n<HWRI>ASIC:  16</HWRI>\n<SN>ILO{serial}</SN>\n<UUID>ILO{serial}</UUID>\n</MP>\n</RIMP>\n",
        serial = escape(&server.serial),
        product = escape(&server.config.product),
        uuid = escape(&server.uuid),
        fw = identity.firmware,
        pn = identity.generation.product_name(),
    )
}

/// Serves one emulated iLO until `shutdown` turns true.
pub async fn serve(
    server: Arc<Server>,
    listener: TcpListener,
    acceptor: TlsAcceptor,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(server = server.index, error = %Chain(&e), "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => break,
        };
        let server = server.clone();
        let acceptor = acceptor.clone();
        let mut conn_shutdown = shutdown.clone();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(server = server.index, %peer, error = %Chain(&e), "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(server = server.index, %peer, "TLS handshake timed out");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |req| route(server.clone(), req));
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .serve_connection(TokioIo::new(tls), service);
            tokio::select! {
                result = conn => {
                    if let Err(e) = result {
                        tracing::debug!(%peer, error = %Chain(&e), "connection ended with an error");
                    }
                }
                _ = conn_shutdown.changed() => {}
            }
        });
    }
}

/// For `service_fn`'s error bound.
impl From<Infallible> for Unanswered {
    fn from(never: Infallible) -> Self {
        match never {}
    }
}
