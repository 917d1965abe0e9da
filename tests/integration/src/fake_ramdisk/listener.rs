//! One listener for every node's command API (the harness's step 4): a connection belongs to
//! the node whose address it was made to.
//!
//! # Design
//! Each running ramdisk registers its [`Endpoint`] (the agent's own
//! [`CommandApi`], and its TLS configuration under auto-TLS) under the node's loopback
//! address; the [`Registration`] it holds takes it out again when the ramdisk ends, however it
//! ends, and closes the connections still open to it, as a powered-off node's would go. An
//! accepted connection is looked up by its local address: nobody registered there, and it is
//! closed before a byte is read. Requests are answered by [`CommandApi::handle`] with the
//! agent's default limits ([`ServerLimits`]), so the conductor meets the agent's status codes,
//! token check and `wait` semantics.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use vmdeploy_agent::api::server::{CommandApi, ServerLimits, HANDSHAKE_TIMEOUT};

use super::{Shared, Stats};

/// A running ramdisk's command API.
pub(crate) struct Endpoint {
    /// The server's index.
    pub(crate) index: usize,
    /// The agent's command API over the fake executor.
    pub(crate) api: Arc<CommandApi>,
    /// Auto-TLS: the handshake with this node's certificate.
    pub(crate) tls: Option<TlsAcceptor>,
    /// Turns true when the ramdisk ends.
    stopped: watch::Receiver<bool>,
}

/// Keeps an endpoint registered; dropping it unregisters it and closes its connections.
pub(crate) struct Registration {
    shared: Arc<Shared>,
    ip: IpAddr,
    endpoint: Arc<Endpoint>,
    stop: watch::Sender<bool>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut map) = self.shared.endpoints.write() {
            if map
                .get(&self.ip)
                .is_some_and(|e| Arc::ptr_eq(e, &self.endpoint))
            {
                map.remove(&self.ip);
            }
        }
        let _ = self.stop.send(true);
    }
}

/// Serves `api` for node `index` at `ip` until the returned registration drops.
pub(crate) fn register(
    shared: &Arc<Shared>,
    ip: IpAddr,
    index: usize,
    api: Arc<CommandApi>,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Registration {
    let (stop, stopped) = watch::channel(false);
    let endpoint = Arc::new(Endpoint {
        index,
        api,
        tls: tls.map(TlsAcceptor::from),
        stopped,
    });
    if let Ok(mut map) = shared.endpoints.write() {
        map.insert(ip, Arc::clone(&endpoint));
    }
    Registration {
        shared: Arc::clone(shared),
        ip,
        endpoint,
        stop,
    }
}

/// Accepts connections until `stop` changes.
pub(crate) async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    shared.stats.error(format!("accepting a command API connection: {e}"));
                    // EMFILE and friends: pause rather than spin on the same error.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.changed() => return,
        };
        let endpoint = stream.local_addr().ok().and_then(|local| {
            shared
                .endpoints
                .read()
                .ok()
                .and_then(|map| map.get(&local.ip()).cloned())
        });
        match endpoint {
            // No ramdisk runs at that address: as a node that is off, nobody answers.
            None => Stats::bump(&shared.stats.api_connections_refused),
            Some(endpoint) => {
                tokio::spawn(connection(Arc::clone(&shared), endpoint, stream, peer));
            }
        }
    }
}

/// Serves one connection until it ends or its ramdisk does.
async fn connection(
    shared: Arc<Shared>,
    endpoint: Arc<Endpoint>,
    stream: TcpStream,
    peer: SocketAddr,
) {
    let mut stopped = endpoint.stopped.clone();
    let serving = async {
        match &endpoint.tls {
            None => serve_http(&shared, &endpoint, stream).await,
            Some(acceptor) => {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => {
                        Stats::bump(&shared.stats.api_tls_connections);
                        serve_http(&shared, &endpoint, tls).await
                    }
                    // The conductor refused the node's certificate (not the pinned one?).
                    Ok(Err(e)) => shared.stats.error(format!(
                        "server {}: command API TLS handshake with {peer} failed: {e}",
                        endpoint.index
                    )),
                    Err(_) => shared.stats.error(format!(
                        "server {}: command API TLS handshake with {peer} timed out",
                        endpoint.index
                    )),
                }
            }
        }
    };
    tokio::select! {
        () = serving => {}
        _ = stopped.wait_for(|s| *s) => {}
    }
}

async fn serve_http<S>(shared: &Shared, endpoint: &Endpoint, stream: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let limits = ServerLimits::default();
    let api = Arc::clone(&endpoint.api);
    let stats = Arc::clone(&shared.stats);
    let service = hyper::service::service_fn(move |req| {
        let api = Arc::clone(&api);
        let stats = Arc::clone(&stats);
        async move {
            Stats::bump(&stats.api_requests);
            Ok::<_, Infallible>(api.handle(req, &limits).await)
        }
    });
    // A connection the conductor drops midway is its business, as for the agent.
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}
