//! The API's listeners: TCP, optionally TLS (tokio-rustls), HTTP/1.1 (hyper), and the drain.
//!
//! # Design
//! [`bind`] binds every address before anything is served, so a taken port fails the start
//! before the first request. [`run`] accepts on all of them (one accept task per listener,
//! connections handed to one loop that owns hyper-util's `GracefulShutdown`), serves each
//! connection with hyper's HTTP/1 server (header read timeout 30 s, TLS handshake timeout
//! 10 s, the body's deadline [`Limits::body_timeout`]), and when `shutdown` completes: stops accepting (the listeners close), asks every
//! connection to finish its request in flight and close, and waits at most `grace`. What was
//! still running then is returned, named by request id, so the caller can log what it cut.
//!
//! Every accepted connection first asks for a place ([`crate::net::admission`]): beyond
//! [`Limits::max_connections_per_client`] from one address it is closed at once, so a client
//! that stalls thousands of connections holds only its own share and never the process's open
//! files; at [`Limits::max_connections`] in all, the connection that has waited longest for a
//! request is closed to make room, so a flood from many addresses cannot keep others out.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

use super::request::{InFlight, InFlightRequest};
use crate::api::ClientAddr;
use crate::net::admission::{Activity, Admission, HeldBody, PausingBody, Ticket};
use crate::net::timed_body::TimedBody;
use vmdeploy_shared::error::Chain;

/// How long a client may take to send a request's headers (slow clients hold a connection).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a TLS handshake may take.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How much the API's clients may hold (`api.body_timeout`, `api.max_connections`,
/// `api.max_connections_per_client`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a request's body may take to arrive, from the end of its headers (408 after).
    pub body_timeout: Duration,
    /// Connections at once, all clients together.
    pub max_connections: usize,
    /// Connections at once from one client address.
    pub max_connections_per_client: usize,
}

impl Default for Limits {
    fn default() -> Self {
        use super::config;
        Limits {
            body_timeout: config::DEFAULT_BODY_TIMEOUT,
            max_connections: config::DEFAULT_MAX_CONNECTIONS,
            max_connections_per_client: config::DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
        }
    }
}

/// A bound listener.
pub struct Bound {
    /// The address it is bound to (the real port when 0 was asked for).
    pub addr: SocketAddr,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
}

impl std::fmt::Debug for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound")
            .field("addr", &self.addr)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Bound {
    /// `http://addr` or `https://addr`.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Whether it speaks TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }
}

/// Binds every address, with TLS when `tls` is given.
pub async fn bind(
    addrs: &[SocketAddr],
    tls: Option<Arc<rustls::ServerConfig>>,
) -> anyhow::Result<Vec<Bound>> {
    let acceptor = tls.map(TlsAcceptor::from);
    let mut bound = Vec::with_capacity(addrs.len());
    for addr in addrs {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the API to {addr}"))?;
        let addr = listener
            .local_addr()
            .with_context(|| format!("reading the bound address of {addr}"))?;
        bound.push(Bound {
            addr,
            listener,
            tls: acceptor.clone(),
        });
    }
    Ok(bound)
}

/// How a drain ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Every connection finished within the grace period.
    pub clean: bool,
    /// The requests still running when the grace period ended (cut).
    pub cut: Vec<InFlightRequest>,
}

/// Serves `app` on `listeners` until `shutdown` completes, then drains within `grace` (module
/// docs). `in_flight` is the registry the app's request layer fills. The accept loops and the
/// connections (and so every request handler) run on `runtime`: the service gives the API a
/// runtime of its own, so a request never queues behind the node tasks' work
/// (`crate::service::run`).
pub async fn run(
    runtime: tokio::runtime::Handle,
    listeners: Vec<Bound>,
    app: axum::Router,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
    in_flight: InFlight,
    limits: Limits,
) -> DrainReport {
    type Accepted = (TcpStream, IpAddr, Option<TlsAcceptor>, Ticket);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Accepted>(64);
    let admission = Admission::new(
        "API",
        limits.max_connections,
        limits.max_connections_per_client,
    );
    let mut accepters = Vec::new();
    for bound in listeners {
        let tx = tx.clone();
        let admission = admission.clone();
        accepters.push(runtime.spawn(async move {
            loop {
                match bound.listener.accept().await {
                    Ok((stream, peer)) => {
                        // Refused: dropping the stream closes it before a byte is read.
                        let Ok(ticket) = admission.admit(peer.ip()) else {
                            continue;
                        };
                        let _ = stream.set_nodelay(true);
                        let accepted = (stream, peer.ip(), bound.tls.clone(), ticket);
                        if tx.send(accepted).await.is_err() {
                            return;
                        }
                    }
                    Err(err) => {
                        // EMFILE and friends: pause instead of spinning, keep the listener.
                        tracing::warn!(address = %bound.addr, error = %Chain(&err), "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }));
    }
    drop(tx);

    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            next = rx.recv() => match next {
                Some((stream, client, tls, ticket)) => {
                    let watcher = graceful.watcher();
                    let app = app.clone();
                    let body_timeout = limits.body_timeout;
                    runtime.spawn(async move {
                        // Held until the connection ends, however it ends; a full listener
                        // may close it for room while it waits for a request (admission.rs).
                        let activity = ticket.activity();
                        let connection = async move {
                            match tls {
                                None => serve_connection(stream, client, app, watcher, body_timeout, activity).await,
                                Some(acceptor) => {
                                    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                                        Ok(Ok(tls)) => serve_connection(tls, client, app, watcher, body_timeout, activity).await,
                                        Ok(Err(err)) => tracing::debug!(error = %Chain(&err), "TLS handshake failed"),
                                        Err(_) => tracing::debug!("TLS handshake timed out"),
                                    }
                                }
                            }
                        };
                        tokio::select! {
                            () = connection => {}
                            () = ticket.evicted() => tracing::debug!(%client, "closed for room while waiting for a request"),
                        }
                    });
                }
                None => break,
            },
        }
    }

    // Stop accepting: dropping the accept tasks closes the listening sockets.
    for task in &accepters {
        task.abort();
    }
    for task in accepters {
        let _ = task.await;
    }
    let connections = graceful.count();
    let waiting = in_flight.len();
    tracing::info!(
        connections,
        requests_in_flight = waiting,
        grace_s = grace.as_secs(),
        "stopped accepting; draining"
    );
    match tokio::time::timeout(grace, graceful.shutdown()).await {
        Ok(()) => DrainReport {
            clean: true,
            cut: Vec::new(),
        },
        Err(_) => DrainReport {
            clean: false,
            cut: in_flight.snapshot(),
        },
    }
}

async fn serve_connection<I>(
    io: I,
    client: IpAddr,
    app: axum::Router,
    watcher: Watcher,
    body_timeout: Duration,
    activity: Activity,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
        let app = app.clone();
        let busy = activity.busy();
        let body_activity = activity.clone();
        let mut request = request.map(|body| {
            let timed = TimedBody::new(body, body_timeout);
            Body::new(PausingBody::new(timed, body_activity))
        });
        // The call-backs count failed checks per address (`crate::net::failed_checks`).
        request.extensions_mut().insert(ClientAddr(client));
        async move {
            let response = app.oneshot(request).await?;
            Ok::<_, std::convert::Infallible>(
                response.map(|body| Body::new(HeldBody::new(body, busy))),
            )
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    if let Err(err) = watcher.watch(connection).await {
        tracing::debug!(error = %Chain(&err), "connection ended with an error");
    }
}
