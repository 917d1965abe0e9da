//! Request ids and the requests in flight.
//!
//! # Design
//! [`layer`] is the outermost layer of the API: it gives every request an id as Ironic does
//! (`req-<uuid4>`, returned in `X-OpenStack-Request-Id`), opens the `request` span that every
//! log line of the request carries (fields `request_id`, `method`, `path`; never the query,
//! which may hold a token), puts the id in the request's extensions ([`RequestId`]) for handlers
//! that want it, logs one line when the answer leaves, and registers the request in
//! [`InFlight`] so a drain that runs out of time can name what it cut.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use http::HeaderValue;
use tracing::Instrument as _;

/// The response header of the request id (Ironic's, through oslo.middleware).
pub const REQUEST_ID_HEADER: &str = "x-openstack-request-id";

/// The id of the request being served (`req-<uuid4>`), in the request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

impl RequestId {
    /// A fresh id.
    pub fn new() -> RequestId {
        RequestId(format!("req-{}", uuid::Uuid::new_v4()))
    }
}

impl Default for RequestId {
    fn default() -> Self {
        RequestId::new()
    }
}

/// A request being served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlightRequest {
    /// Its id.
    pub id: String,
    /// `GET`, `PUT`, ...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// How long it has run.
    pub elapsed: Duration,
}

/// The requests being served now.
#[derive(Debug, Clone, Default)]
pub struct InFlight {
    inner: Arc<InFlightInner>,
}

#[derive(Debug, Default)]
struct InFlightInner {
    next: AtomicU64,
    requests: Mutex<HashMap<u64, (String, String, String, Instant)>>,
}

/// Removes its request from [`InFlight`] when dropped: when the answer is sent, and also when
/// the connection goes away mid-request and the handler's future is dropped.
struct InFlightGuard {
    inner: Arc<InFlightInner>,
    key: u64,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if let Ok(mut map) = self.inner.requests.lock() {
            map.remove(&self.key);
        }
    }
}

impl InFlight {
    fn enter(&self, id: &str, method: &str, path: &str) -> InFlightGuard {
        let key = self.inner.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut map) = self.inner.requests.lock() {
            map.insert(
                key,
                (
                    id.to_string(),
                    method.to_string(),
                    path.to_string(),
                    Instant::now(),
                ),
            );
        }
        InFlightGuard {
            inner: self.inner.clone(),
            key,
        }
    }

    /// The requests being served, oldest first.
    pub fn snapshot(&self) -> Vec<InFlightRequest> {
        let Ok(map) = self.inner.requests.lock() else {
            return Vec::new();
        };
        let mut list: Vec<_> = map
            .values()
            .map(|(id, method, path, started)| InFlightRequest {
                id: id.clone(),
                method: method.clone(),
                path: path.clone(),
                elapsed: started.elapsed(),
            })
            .collect();
        list.sort_by_key(|r| std::cmp::Reverse(r.elapsed));
        list
    }

    /// How many requests are being served.
    pub fn len(&self) -> usize {
        self.inner.requests.lock().map_or(0, |m| m.len())
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The request-id layer, for `axum::middleware::from_fn_with_state` (module docs).
pub async fn layer(
    State(in_flight): State<InFlight>,
    mut request: Request<Body>,
    next: Next,
) -> Response {
    let id = RequestId::new();
    let method = request.method().to_string();
    let path = request.uri().path().to_string();
    // An ERROR-level span exists whatever the configured level: at `log.level = "warn"` an
    // INFO span would be filtered out, and the warnings inside it would lose their request id.
    let span = tracing::error_span!("request", request_id = %id.0, method = %method, path = %path);
    let _guard = in_flight.enter(&id.0, &method, &path);
    request.extensions_mut().insert(id.clone());
    let started = Instant::now();
    let mut response = next.run(request).instrument(span.clone()).await;
    if let Ok(value) = HeaderValue::from_str(&id.0) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    let status = response.status().as_u16();
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    span.in_scope(|| tracing::info!(status, elapsed_ms = format!("{elapsed_ms:.1}"), "answered"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_look_like_ironics() {
        let id = RequestId::new();
        let uuid = id.0.strip_prefix("req-").expect("req- prefix");
        let parsed = uuid::Uuid::parse_str(uuid).expect("a UUID");
        assert_eq!(parsed.get_version_num(), 4);
        assert_ne!(RequestId::new(), id);
    }

    #[test]
    fn in_flight_forgets_on_drop() {
        let in_flight = InFlight::default();
        let a = in_flight.enter("req-a", "GET", "/v1");
        let b = in_flight.enter("req-b", "PUT", "/v1/nodes/x/states/power");
        assert_eq!(in_flight.len(), 2);
        drop(a);
        let left = in_flight.snapshot();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].id, "req-b");
        drop(b);
        assert!(in_flight.is_empty());
    }
}
