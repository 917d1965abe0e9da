//! Every failure of the API as Ironic reports it: a status code and the fault body
//! `{"error_message": "<JSON string of {faultcode, faultstring, debuginfo}>"}` (docs/ironic-protocols.md §5.1;
//! `error_message` is a JSON-encoded *string*, which is what python-ironicclient parses).
//!
//! # Design
//! Handlers return [`ApiError`]; `From` impls map [`StoreError`] and [`ManagerError`] here and
//! nowhere else. [`fault_bodies`] gives the same body to errors the framework makes itself
//! (unknown route, wrong method, a path that does not parse), so every 4xx/5xx is parsable.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::header::CONTENT_TYPE;
use http::{HeaderValue, StatusCode};
use serde_json::json;

use crate::manager::ManagerError;
use crate::store::StoreError;

/// A failed request: the status and the `faultstring`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, in words naming the field or the node.
    pub message: String,
    /// Seconds to send in `Retry-After` (a 429).
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    /// Any status.
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            retry_after_secs: None,
        }
    }

    /// 429 with `Retry-After`: too many failed call-back checks (`crate::net::failed_checks`).
    pub fn too_many(message: impl Into<String>, retry_after_secs: u64) -> ApiError {
        ApiError {
            retry_after_secs: Some(retry_after_secs),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, message)
        }
    }

    /// 400: the request is wrong (Ironic's `Invalid*` exceptions).
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    /// 406: the microversion does not allow this (Ironic's `NotAcceptable`).
    pub fn not_acceptable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_ACCEPTABLE, message)
    }

    /// 409.
    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, message)
    }

    /// The fault body Ironic sends (`faultcode` is `Client` for 4xx, `Server` for 5xx).
    pub fn body(&self) -> serde_json::Value {
        let faultcode = if self.status.is_server_error() {
            "Server"
        } else {
            "Client"
        };
        let inner = json!({
            "faultcode": faultcode,
            "faultstring": self.message,
            "debuginfo": null,
        });
        json!({ "error_message": inner.to_string() })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status.as_u16(), self.message)
    }
}

impl std::error::Error for ApiError {}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        let status = match &e {
            StoreError::NotFound { .. } => StatusCode::NOT_FOUND,
            StoreError::Duplicate { .. } | StoreError::Locked { .. } | StoreError::InUse(_) => {
                StatusCode::CONFLICT
            }
            StoreError::Database(_) => StatusCode::INTERNAL_SERVER_ERROR,
            StoreError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            StoreError::Invalid(_) => StatusCode::BAD_REQUEST,
        };
        let message = match &e {
            // Ironic's words (`NodeNotFound`, `PortNotFound`), which clients and operators grep.
            StoreError::NotFound { kind, ident } => {
                let kind = capitalised(kind);
                format!("{kind} {ident} could not be found.")
            }
            // Ironic's `NodeLocked`.
            StoreError::Locked { node, holder } => format!(
                "Node {node} is locked by host {holder}, please retry after the current \
                 operation is completed."
            ),
            other => other.to_string(),
        };
        ApiError::new(status, message)
    }
}

impl From<ManagerError> for ApiError {
    fn from(e: ManagerError) -> ApiError {
        if let ManagerError::Store(store) = e {
            return store.into();
        }
        let status = match &e {
            ManagerError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ManagerError::InvalidState { .. }
            | ManagerError::InvalidInput { .. }
            | ManagerError::Unsupported { .. }
            | ManagerError::InMaintenance { .. } => StatusCode::BAD_REQUEST,
            // A driver_info that does not say how to reach the BMC is the operator's to fix.
            bmc @ ManagerError::Bmc { .. } if bmc.is_bmc_settings() => StatusCode::BAD_REQUEST,
            ManagerError::StateConflict { .. } => StatusCode::CONFLICT,
            // Ironic answers a bad agent token with 400 ("Invalid or missing agent token") on
            // heartbeats and 403 elsewhere; 403 is the one a client cannot mistake for bad JSON.
            ManagerError::CallbackRefused { .. } => StatusCode::FORBIDDEN,
            ManagerError::Bmc { .. } | ManagerError::Flow { .. } => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        // The whole cause chain: the BMC's or the flow's words are what the operator acts on.
        ApiError::new(status, e.chain())
    }
}

fn capitalised(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = self.status.as_u16(), error = %self.message, "API request failed");
        } else {
            tracing::debug!(status = self.status.as_u16(), error = %self.message, "API request refused");
        }
        let body = self.body().to_string();
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = self.status;
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// The fallback of the router: no such resource.
pub(super) async fn not_found(uri: http::Uri) -> ApiError {
    ApiError::not_found(format!("The resource {} could not be found.", uri.path()))
}

/// Gives an error response without a JSON body (made by axum itself: 405, a path parameter
/// that does not parse, a body it could not read) Ironic's fault body.
pub(super) async fn fault_bodies(
    axum::extract::State(max_body): axum::extract::State<usize>,
    response: Response,
) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return response;
    }
    let (parts, _) = response.into_parts();
    let message = match status {
        StatusCode::METHOD_NOT_ALLOWED => "The method is not allowed for this resource.".into(),
        StatusCode::PAYLOAD_TOO_LARGE => {
            format!("The request body is larger than {max_body} bytes.")
        }
        other => other
            .canonical_reason()
            .unwrap_or("The request failed.")
            .to_string(),
    };
    let mut fixed = ApiError::new(status, message).into_response();
    // Keep what the layers below set (the microversion headers, `Allow` on a 405).
    for (name, value) in parts.headers.iter() {
        if name != CONTENT_TYPE && name != http::header::CONTENT_LENGTH {
            fixed.headers_mut().insert(name.clone(), value.clone());
        }
    }
    fixed
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn fault(e: &ApiError) -> serde_json::Value {
        let body = e.body();
        let inner = body["error_message"]
            .as_str()
            .expect("error_message is a string");
        serde_json::from_str(inner).expect("error_message holds JSON")
    }

    #[test]
    fn fault_body_is_a_json_string_inside_json() {
        let e = ApiError::bad_request("Invalid field \"driver\"");
        let inner = fault(&e);
        assert_eq!(inner["faultcode"], "Client");
        assert_eq!(inner["faultstring"], "Invalid field \"driver\"");
        assert!(inner["debuginfo"].is_null());
        let e = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "boom");
        assert_eq!(fault(&e)["faultcode"], "Server");
    }

    #[test]
    fn store_errors_map_to_ironic_statuses() {
        let node = Uuid::nil();
        let cases: Vec<(StoreError, StatusCode, &str)> = vec![
            (
                StoreError::NotFound {
                    kind: "node",
                    ident: "n1".into(),
                },
                StatusCode::NOT_FOUND,
                "Node n1 could not be found.",
            ),
            (
                StoreError::Duplicate {
                    kind: "port",
                    field: "address",
                    value: "aa".into(),
                },
                StatusCode::CONFLICT,
                "port with address aa already exists",
            ),
            (
                StoreError::Locked {
                    node,
                    holder: "c1".into(),
                },
                StatusCode::CONFLICT,
                "is locked by host c1",
            ),
            (
                StoreError::InUse("has ports".into()),
                StatusCode::CONFLICT,
                "has ports",
            ),
            (
                StoreError::Database("disk full".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
                "disk full",
            ),
            (
                StoreError::Unavailable("the server closed the connection".into()),
                StatusCode::SERVICE_UNAVAILABLE,
                "database unavailable: the server closed the connection",
            ),
            (
                StoreError::Invalid("the node's last_error holds a NUL character".into()),
                StatusCode::BAD_REQUEST,
                "holds a NUL character",
            ),
        ];
        for (e, status, words) in cases {
            let api = ApiError::from(e);
            assert_eq!(api.status, status, "{api}");
            assert!(api.message.contains(words), "{api}");
        }
    }

    #[test]
    fn manager_errors_map_to_ironic_statuses() {
        use crate::states::ProvisionState;
        let cases: Vec<(ManagerError, StatusCode)> = vec![
            (
                ManagerError::InvalidState {
                    action: "provide".into(),
                    node: Uuid::nil(),
                    state: ProvisionState::Active,
                },
                StatusCode::BAD_REQUEST,
            ),
            (
                ManagerError::InvalidInput {
                    field: "timeout",
                    message: "x".into(),
                },
                StatusCode::BAD_REQUEST,
            ),
            (
                ManagerError::Unsupported {
                    node: Uuid::nil(),
                    message: "x".into(),
                },
                StatusCode::BAD_REQUEST,
            ),
            (
                ManagerError::InMaintenance {
                    node: Uuid::nil(),
                    reason: None,
                },
                StatusCode::BAD_REQUEST,
            ),
            (
                ManagerError::StateConflict {
                    node: Uuid::nil(),
                    message: "x".into(),
                },
                StatusCode::CONFLICT,
            ),
            (
                ManagerError::CallbackRefused {
                    node: Uuid::nil(),
                    message: "x".into(),
                },
                StatusCode::FORBIDDEN,
            ),
            (
                ManagerError::flow("x", anyhow::anyhow!("y")),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
            (
                ManagerError::Bmc {
                    action: "x".into(),
                    source: crate::bmc::BmcError::PowerTimeout {
                        bmc: "iLO",
                        address: "10.0.0.9".into(),
                        now: crate::drivers::PowerState::Off,
                        want: crate::drivers::PowerState::On,
                        seconds: 60,
                    },
                },
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
            (
                ManagerError::Store(StoreError::Locked {
                    node: Uuid::nil(),
                    holder: "h".into(),
                }),
                StatusCode::CONFLICT,
            ),
        ];
        for (e, status) in cases {
            assert_eq!(ApiError::from(e).status, status);
        }
    }
}
