//! API authentication: `noauth`, or HTTP basic against an htpasswd file with bcrypt hashes
//! (Ironic's `http_basic` strategy).
//!
//! # Design
//! [`Htpasswd::load`] reads the file once at start and refuses anything but bcrypt (`$2y$`,
//! `$2a$`, `$2b$`) with the line number: Ironic accepts only bcrypt, and a weaker hash should
//! not pass silently. [`layer`] wraps the API router: a request whose path
//! [`crate::api::is_public`] names (root documents, the ramdisk's call-backs, which carry their
//! own token) passes; any other needs `Authorization: Basic` with a user and password that
//! verify, else 401 with `WWW-Authenticate: Basic realm="Baremetal API"` and Ironic's fault body.
//! bcrypt is slow on purpose, so verification runs on the blocking pool.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use http::{header, HeaderValue, StatusCode};

/// The realm Ironic names in its challenge.
pub const REALM: &str = "Baremetal API";

/// Users and their bcrypt hashes.
#[derive(Clone)]
pub struct Htpasswd {
    users: Arc<HashMap<String, String>>,
}

impl std::fmt::Debug for Htpasswd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Htpasswd")
            .field("users", &self.users.len())
            .finish()
    }
}

/// Why an htpasswd file was refused.
#[derive(Debug, thiserror::Error)]
pub enum HtpasswdError {
    /// A line is not `user:hash`.
    #[error("line {line}: not \"user:hash\"")]
    Malformed {
        /// 1-based.
        line: usize,
    },
    /// The hash is not bcrypt.
    #[error("line {line}: user {user:?} has a hash that is not bcrypt ($2y$...); make it with htpasswd -B")]
    NotBcrypt {
        /// 1-based.
        line: usize,
        /// The user.
        user: String,
    },
    /// A user appears twice.
    #[error("line {line}: user {user:?} appears twice")]
    Duplicate {
        /// 1-based.
        line: usize,
        /// The user.
        user: String,
    },
    /// No users at all.
    #[error("no users in the file")]
    Empty,
}

impl Htpasswd {
    /// Parses htpasswd text; blank lines and `#` comments are skipped.
    pub fn parse(text: &str) -> Result<Htpasswd, HtpasswdError> {
        let mut users = HashMap::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let (user, hash) = trimmed
                .split_once(':')
                .filter(|(u, h)| !u.is_empty() && !h.is_empty())
                .ok_or(HtpasswdError::Malformed { line })?;
            let bcrypt = ["$2y$", "$2a$", "$2b$"].iter().any(|p| hash.starts_with(p))
                && hash.parse::<bcrypt::HashParts>().is_ok();
            if !bcrypt {
                return Err(HtpasswdError::NotBcrypt {
                    line,
                    user: user.to_string(),
                });
            }
            if users.insert(user.to_string(), hash.to_string()).is_some() {
                return Err(HtpasswdError::Duplicate {
                    line,
                    user: user.to_string(),
                });
            }
        }
        if users.is_empty() {
            return Err(HtpasswdError::Empty);
        }
        Ok(Htpasswd {
            users: Arc::new(users),
        })
    }

    /// Reads and parses `path`.
    pub fn load(path: &Path) -> anyhow::Result<Htpasswd> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the htpasswd file {}", path.display()))?;
        Htpasswd::parse(&text).with_context(|| format!("htpasswd file {}", path.display()))
    }

    /// Whether `user` with `password` verifies (blocking: bcrypt).
    pub fn verify(&self, user: &str, password: &str) -> bool {
        match self.users.get(user) {
            Some(hash) => bcrypt::verify(password, hash).unwrap_or(false),
            None => {
                // Spend the same time for an unknown user as for a known one, so the answer's
                // timing does not say which users exist: verify against some user's hash and
                // ignore the result.
                if let Some(hash) = self.users.values().next() {
                    let _ = bcrypt::verify(password, hash);
                }
                false
            }
        }
    }
}

/// Decodes `Authorization: Basic base64(user:password)`.
fn basic_credentials(value: &HeaderValue) -> Option<(String, String)> {
    let value = value.to_str().ok()?;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// 401 with the challenge and Ironic's fault body (the CLI reads `error_message`).
pub fn unauthorized(reason: &str) -> Response {
    let fault =
        serde_json::json!({ "faultstring": reason, "faultcode": "Client", "debuginfo": null });
    let body = serde_json::json!({ "error_message": fault.to_string() });
    let mut response = (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_str(&format!("Basic realm=\"{REALM}\""))
            .expect("the realm is plain ASCII"),
    );
    response
}

/// The `http_basic` check, for `axum::middleware::from_fn_with_state`.
pub async fn layer(State(users): State<Htpasswd>, request: Request<Body>, next: Next) -> Response {
    // With the query: `POST .../vendor_passthru?method=pass_deploy_info` is a call-back.
    let target = request
        .uri()
        .path_and_query()
        .map_or_else(|| request.uri().path(), |pq| pq.as_str());
    if crate::api::is_public(request.method(), target) {
        return next.run(request).await;
    }
    let Some((user, password)) = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(basic_credentials)
    else {
        tracing::info!("refused: no basic credentials");
        return unauthorized("Authorization required: HTTP basic credentials are missing");
    };
    let check_user = user.clone();
    let ok = tokio::task::spawn_blocking(move || users.verify(&check_user, &password))
        .await
        .unwrap_or(false);
    if !ok {
        tracing::info!(user = %user, "refused: wrong user or password");
        return unauthorized("Authorization failed: wrong user or password");
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bcrypt_only_with_the_line_number() {
        let hash = bcrypt::hash("secret", 4).expect("hash");
        let good = format!("# users\n\nadmin:{hash}\n");
        let users = Htpasswd::parse(&good).expect("bcrypt file");
        assert!(users.verify("admin", "secret"));
        assert!(!users.verify("admin", "wrong"));
        assert!(!users.verify("nobody", "secret"));

        let cases: &[(&str, String, &str)] = &[
            (
                "apr1",
                format!("admin:{hash}\nold:$apr1$abc$def\n"),
                "line 2",
            ),
            (
                "sha",
                "u:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=\n".into(),
                "line 1",
            ),
            ("crypt", "\n\nu:abcdefghijklm\n".into(), "line 3"),
            ("no colon", "justauser\n".into(), "line 1"),
            ("twice", format!("a:{hash}\na:{hash}\n"), "line 2"),
        ];
        for (name, text, want) in cases {
            let err = Htpasswd::parse(text).expect_err(name);
            assert!(err.to_string().contains(want), "{name}: {err}");
        }
        assert!(matches!(
            Htpasswd::parse("# only\n"),
            Err(HtpasswdError::Empty)
        ));
    }

    #[test]
    fn credentials_decode() {
        let v = HeaderValue::from_static("Basic YWRtaW46c2VjcmV0OndpdGg6Y29sb25z");
        assert_eq!(
            basic_credentials(&v),
            Some(("admin".into(), "secret:with:colons".into()))
        );
        assert_eq!(
            basic_credentials(&HeaderValue::from_static("Bearer x")),
            None
        );
        assert_eq!(
            basic_credentials(&HeaderValue::from_static("Basic !!!")),
            None
        );
    }
}
