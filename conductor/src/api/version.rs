//! Microversion negotiation (docs/ironic-protocols.md §5.1): `X-OpenStack-Ironic-API-Version: 1.N` or
//! `latest`, or `OpenStack-API-Version: baremetal 1.N` (keystoneauth sends both); no header is
//! the minimum; anything malformed, of another major version or outside the range is 406. Every
//! response carries the minimum and maximum, and `/v1` responses the effective version.
//!
//! # Why [`MAX_VERSION`] is 1.73
//! It is the lowest version that has everything the parts of vmdeploy speak: heartbeats with
//! `agent_version` (1.36), `agent_token` (1.62), `agent_verify_ca` (1.68) and
//! `agent_status`/`agent_status_message` (1.72, the agent's write progress), `network_data` on
//! nodes (1.66), and the `deploy`/`undeploy` verbs (1.73). Each node and port field Ironic added
//! up to 1.73 is rendered at its version (`render`), from the record or as the fixed value this
//! conductor has (interfaces named after the driver, no chassis), so a client sees one
//! consistent Ironic 1.73. The next versions add fields we have nothing behind
//! (1.75 `boot_mode`/`secure_boot` as node fields, 1.78 node history, 1.81 inventory, 1.82
//! shards, 1.83 parent nodes). python-ironicclient asks for its own newest (1.115) and
//! negotiates down from the maximum header; openstacksdk asks for the range it needs (≤ 1.73
//! for the calls here).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue};
use vmdeploy_shared::api::ipa::ApiVersion;

use super::error::ApiError;
use super::ApiState;

/// The oldest microversion served (Kilo's first).
pub const MIN_VERSION: ApiVersion = ApiVersion::new(1, 1);
/// The newest microversion served (see the module docs for why).
pub const MAX_VERSION: ApiVersion = ApiVersion::new(1, 73);

/// Request header with the version asked for.
pub const VERSION_HEADER: &str = "x-openstack-ironic-api-version";
/// The generic microversion header (`baremetal 1.N`).
pub const GENERIC_HEADER: &str = "openstack-api-version";
/// Response header: oldest version.
pub const MIN_HEADER: &str = "x-openstack-ironic-api-minimum-version";
/// Response header: newest version.
pub const MAX_HEADER: &str = "x-openstack-ironic-api-maximum-version";

/// What every handler knows about its request.
#[derive(Debug, Clone)]
pub(super) struct Ctx {
    /// The negotiated microversion.
    pub version: ApiVersion,
    /// Where clients reach this API (for links), without a trailing slash.
    pub base_url: String,
}

impl Ctx {
    /// Whether the negotiated version is at least `1.minor`.
    pub fn at_least(&self, minor: u32) -> bool {
        self.version >= ApiVersion::new(1, minor)
    }

    /// 406 unless the version is at least `1.minor`, naming `what`.
    pub fn require(&self, minor: u32, what: &str) -> Result<(), ApiError> {
        if self.at_least(minor) {
            Ok(())
        } else {
            Err(ApiError::not_acceptable(format!(
                "{what} requires API version 1.{minor} or later; this request was made at {}.",
                self.version
            )))
        }
    }

    /// `base_url` + `path` (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }
}

/// The version a request asks for, from its headers.
pub(super) fn requested(headers: &HeaderMap) -> Result<ApiVersion, ApiError> {
    let text = if let Some(v) = headers.get(VERSION_HEADER) {
        Some(
            v.to_str()
                .map_err(|_| malformed("a value that is not text"))?
                .trim()
                .to_string(),
        )
    } else if let Some(v) = headers.get(GENERIC_HEADER) {
        let v = v
            .to_str()
            .map_err(|_| malformed("a value that is not text"))?;
        // `baremetal 1.N[, compute 2.M]`: only our service's entry counts.
        v.split(',').find_map(|entry| {
            let mut words = entry.split_whitespace();
            match (words.next(), words.next()) {
                (Some(service), Some(version)) if service.eq_ignore_ascii_case("baremetal") => {
                    Some(version.to_string())
                }
                _ => None,
            }
        })
    } else {
        None
    };
    let Some(text) = text else {
        return Ok(MIN_VERSION);
    };
    if text.eq_ignore_ascii_case("latest") {
        return Ok(MAX_VERSION);
    }
    let version = ApiVersion::parse(&text).map_err(|_| malformed(&text))?;
    if version.major != 1 {
        return Err(ApiError::not_acceptable(format!(
            "Version {version} was requested but the major version is not supported by this \
             service. The supported version range is: [{MIN_VERSION}, {MAX_VERSION}]."
        )));
    }
    if version < MIN_VERSION || version > MAX_VERSION {
        return Err(ApiError::not_acceptable(format!(
            "Version {version} was requested but the minor version is not supported by this \
             service. The supported version range is: [{MIN_VERSION}, {MAX_VERSION}]."
        )));
    }
    Ok(version)
}

fn malformed(what: &str) -> ApiError {
    ApiError::not_acceptable(format!(
        "Invalid value for X-OpenStack-Ironic-API-Version header: {:?} (expected 1.N or \
         \"latest\").",
        super::body::cut(what)
    ))
}

/// The middleware: negotiates, hands the handlers a [`Ctx`], and sets the version headers.
pub(super) async fn negotiate(
    State(state): State<Arc<ApiState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let base_url = base_url(&state, req.headers());
    // The root document lists the versions; it answers whatever a client asks for.
    let is_root = req.uri().path() == "/";
    let negotiated = if is_root {
        Ok(MAX_VERSION)
    } else {
        requested(req.headers())
    };
    let mut response = match negotiated {
        Ok(version) => {
            req.extensions_mut().insert(Ctx { version, base_url });
            let mut response = next.run(req).await;
            if !is_root {
                set(&mut response, VERSION_HEADER, version);
            }
            response
        }
        Err(e) => e.into_response(),
    };
    set(&mut response, MIN_HEADER, MIN_VERSION);
    set(&mut response, MAX_HEADER, MAX_VERSION);
    response
}

fn set(response: &mut Response, name: &'static str, version: ApiVersion) {
    if let Ok(value) = HeaderValue::from_str(&version.to_string()) {
        response.headers_mut().insert(name, value);
    }
}

/// The configured public URL, else `http://<Host>` (a TLS deployment configures its URL).
fn base_url(state: &ApiState, headers: &HeaderMap) -> String {
    if let Some(url) = &state.options.public_url {
        return url.trim_end_matches('/').to_string();
    }
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            // A Host header is outside input that lands in every link: only host[:port].
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b))
        })
        .unwrap_or("localhost:6385");
    format!("http://{host}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("header value"));
        }
        h
    }

    #[test]
    fn negotiation_table() {
        let ok: &[(&[(&'static str, &str)], ApiVersion)] = &[
            (&[], MIN_VERSION),
            (&[(VERSION_HEADER, "1.1")], ApiVersion::new(1, 1)),
            (&[(VERSION_HEADER, "1.31")], ApiVersion::new(1, 31)),
            (&[(VERSION_HEADER, " 1.73 ")], MAX_VERSION),
            (&[(VERSION_HEADER, "latest")], MAX_VERSION),
            (&[(VERSION_HEADER, "LATEST")], MAX_VERSION),
            (
                &[(GENERIC_HEADER, "baremetal 1.50")],
                ApiVersion::new(1, 50),
            ),
            (
                &[(GENERIC_HEADER, "compute 2.1, baremetal 1.22")],
                ApiVersion::new(1, 22),
            ),
            (&[(GENERIC_HEADER, "baremetal latest")], MAX_VERSION),
            // Another service's entry only: as if none was sent.
            (&[(GENERIC_HEADER, "compute 2.1")], MIN_VERSION),
            // The Ironic header wins when both are sent (keystoneauth sends the same in both).
            (
                &[(VERSION_HEADER, "1.40"), (GENERIC_HEADER, "baremetal 1.41")],
                ApiVersion::new(1, 40),
            ),
        ];
        for (h, want) in ok {
            assert_eq!(requested(&headers(h)), Ok(*want), "{h:?}");
        }
        let refused: &[&str] = &[
            "1.0", "1.74", "1.115", "2.1", "0.9", "1", "1.x", "one", "", "1.1.1", "-1.5",
        ];
        for v in refused {
            let e = requested(&headers(&[(VERSION_HEADER, v)])).expect_err(v);
            assert_eq!(e.status, http::StatusCode::NOT_ACCEPTABLE, "{v}");
            assert!(
                e.message.contains("1.73") || e.message.contains("Invalid value"),
                "{e}"
            );
        }
    }
}
