//! Getting a token and a storage URL from Swift's tempauth (v1) or from Keystone (v3 password
//! auth with a project scope).
//!
//! # Design
//! Both end in one [`Session`]: the token for `X-Auth-Token` and the storage URL
//! (`…/v1/AUTH_<account>`) every object URL starts with. The wire types of Keystone's token
//! request and reply are in [`wire`], apart from the HTTP calls.
//!
//! - tempauth: `GET <url>` with `X-Auth-User`/`X-Auth-Key`; the answer's `X-Auth-Token` and
//!   `X-Storage-Url` (docs/iscsi-and-swift-peers.md §5).
//! - Keystone v3: `POST <auth_url>/auth/tokens` with the password method and a project scope;
//!   the token is the `X-Subject-Token` header, the storage URL the `object-store` endpoint of
//!   the catalog in the body, chosen by interface (`public` by default) and, when configured,
//!   region (Keystone's API reference, "Password authentication with scoped authorization").
//!
//! # Limitations
//! Names only (user, project and domains by name, not by id); no application credentials.

use std::time::Duration;

use vmdeploy_shared::secret::Secret;

use super::client::{describe, Failure};
use crate::objects::ObjectError;

/// How the store authenticates.
#[derive(Debug, Clone)]
pub enum SwiftAuth {
    /// Swift's own tempauth (`/auth/v1.0`).
    TempAuth {
        /// The auth URL, e.g. `http://swift:8080/auth/v1.0`.
        url: String,
        /// `account:user`.
        user: String,
        /// The user's key.
        key: Secret,
    },
    /// Keystone v3 password auth, scoped to a project.
    Keystone {
        /// Keystone's URL, with or without the `/v3` suffix (`http://keystone:5000/v3`).
        auth_url: String,
        /// User name.
        username: String,
        /// Password.
        password: Secret,
        /// Project the token is scoped to.
        project_name: String,
        /// Domain of the user (`Default`).
        user_domain_name: String,
        /// Domain of the project (`Default`).
        project_domain_name: String,
        /// Catalog region to take the endpoint from; `None` takes the first that matches.
        region: Option<String>,
        /// Endpoint interface: `public` (the default), `internal` or `admin`.
        interface: String,
    },
}

impl SwiftAuth {
    /// The URL authentication goes to (for messages).
    pub fn url(&self) -> String {
        match self {
            SwiftAuth::TempAuth { url, .. } => url.clone(),
            SwiftAuth::Keystone { auth_url, .. } => keystone_tokens_url(auth_url),
        }
    }
}

/// A token and where to use it.
#[derive(Debug, Clone)]
pub struct Session {
    /// `X-Auth-Token`.
    pub token: Secret,
    /// `…/v1/AUTH_<account>`, without a trailing slash.
    pub storage_url: String,
}

/// `<auth_url>/auth/tokens`, adding `/v3` when the URL stops at the host.
pub fn keystone_tokens_url(auth_url: &str) -> String {
    let base = auth_url.trim_end_matches('/');
    if base.ends_with("/v3") {
        format!("{base}/auth/tokens")
    } else {
        format!("{base}/v3/auth/tokens")
    }
}

/// Keystone v3 token request and reply.
pub mod wire {
    use serde::{Deserialize, Serialize};

    /// `{"auth": {...}}`.
    #[derive(Debug, Serialize)]
    pub struct TokenRequest<'a> {
        /// The auth object.
        pub auth: Auth<'a>,
    }

    /// `identity` and `scope`.
    #[derive(Debug, Serialize)]
    pub struct Auth<'a> {
        /// How the caller proves who it is.
        pub identity: Identity<'a>,
        /// What the token is for.
        pub scope: Scope<'a>,
    }

    /// `{"methods": ["password"], "password": {...}}`.
    #[derive(Debug, Serialize)]
    pub struct Identity<'a> {
        /// `["password"]`.
        pub methods: [&'a str; 1],
        /// The password method's data.
        pub password: Password<'a>,
    }

    /// `{"user": {...}}`.
    #[derive(Debug, Serialize)]
    pub struct Password<'a> {
        /// The user.
        pub user: User<'a>,
    }

    /// A user by name in a domain, with the password.
    #[derive(Debug, Serialize)]
    pub struct User<'a> {
        /// User name.
        pub name: &'a str,
        /// The user's domain.
        pub domain: Named<'a>,
        /// The password (this body exists to carry it).
        pub password: &'a str,
    }

    /// `{"name": ...}`.
    #[derive(Debug, Serialize)]
    pub struct Named<'a> {
        /// Name.
        pub name: &'a str,
    }

    /// `{"project": {...}}`.
    #[derive(Debug, Serialize)]
    pub struct Scope<'a> {
        /// The project.
        pub project: Project<'a>,
    }

    /// A project by name in a domain.
    #[derive(Debug, Serialize)]
    pub struct Project<'a> {
        /// Project name.
        pub name: &'a str,
        /// The project's domain.
        pub domain: Named<'a>,
    }

    /// `{"token": {...}}` (the token itself is in `X-Subject-Token`).
    #[derive(Debug, Deserialize)]
    pub struct TokenReply {
        /// The token's description.
        pub token: Token,
    }

    /// What the reply says about the token; only the catalog matters here.
    #[derive(Debug, Deserialize)]
    pub struct Token {
        /// Services and their endpoints (absent for an unscoped token).
        #[serde(default)]
        pub catalog: Vec<Service>,
    }

    /// A catalog entry.
    #[derive(Debug, Deserialize)]
    pub struct Service {
        /// Service type (`object-store`).
        #[serde(rename = "type")]
        pub kind: String,
        /// Its endpoints.
        #[serde(default)]
        pub endpoints: Vec<Endpoint>,
    }

    /// An endpoint of a service.
    #[derive(Debug, Deserialize)]
    pub struct Endpoint {
        /// `public`, `internal` or `admin`.
        pub interface: String,
        /// Region id (v3).
        #[serde(default)]
        pub region_id: Option<String>,
        /// Region (the older field, same value).
        #[serde(default)]
        pub region: Option<String>,
        /// URL.
        pub url: String,
    }
}

/// The object-store URL in `catalog` for `interface` and, when given, `region`.
pub fn find_endpoint(
    catalog: &[wire::Service],
    interface: &str,
    region: Option<&str>,
) -> Option<String> {
    catalog
        .iter()
        .filter(|s| s.kind == "object-store")
        .flat_map(|s| s.endpoints.iter())
        .find(|e| {
            e.interface.eq_ignore_ascii_case(interface)
                && region.is_none_or(|r| {
                    e.region_id.as_deref() == Some(r) || e.region.as_deref() == Some(r)
                })
        })
        .map(|e| e.url.trim_end_matches('/').to_string())
}

/// Authenticates once (the caller retries [`Failure::Transient`]).
pub async fn authenticate(
    http: &reqwest::Client,
    auth: &SwiftAuth,
    timeout: Duration,
) -> Result<Session, Failure> {
    match auth {
        SwiftAuth::TempAuth { url, user, key } => {
            let reply = http
                .get(url)
                .header("X-Auth-User", user)
                .header("X-Auth-Key", key.expose())
                .timeout(timeout)
                .send()
                .await
                .map_err(|e| {
                    Failure::Transient(format!("authenticating at {url}: {}", describe(&e)))
                })?;
            let status = reply.status();
            check_auth_status(status, url, user)?;
            let header = |name: &str| {
                reply
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            match (header("x-auth-token"), header("x-storage-url")) {
                (Some(token), Some(storage_url)) => Ok(Session {
                    token: Secret::new(token),
                    storage_url: storage_url.trim_end_matches('/').to_string(),
                }),
                _ => Err(Failure::Final(ObjectError::Other(format!(
                    "tempauth at {url} answered {status} without X-Auth-Token and X-Storage-Url"
                )))),
            }
        }
        SwiftAuth::Keystone {
            auth_url,
            username,
            password,
            project_name,
            user_domain_name,
            project_domain_name,
            region,
            interface,
        } => {
            let url = keystone_tokens_url(auth_url);
            let body = wire::TokenRequest {
                auth: wire::Auth {
                    identity: wire::Identity {
                        methods: ["password"],
                        password: wire::Password {
                            user: wire::User {
                                name: username,
                                domain: wire::Named {
                                    name: user_domain_name,
                                },
                                password: password.expose(),
                            },
                        },
                    },
                    scope: wire::Scope {
                        project: wire::Project {
                            name: project_name,
                            domain: wire::Named {
                                name: project_domain_name,
                            },
                        },
                    },
                },
            };
            let reply = http
                .post(&url)
                .json(&body)
                .timeout(timeout)
                .send()
                .await
                .map_err(|e| {
                    Failure::Transient(format!("authenticating at {url}: {}", describe(&e)))
                })?;
            let status = reply.status();
            check_auth_status(status, &url, username)?;
            let token = reply
                .headers()
                .get("x-subject-token")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
                .ok_or_else(|| {
                    Failure::Final(ObjectError::Other(format!(
                        "Keystone at {url} answered {status} without X-Subject-Token"
                    )))
                })?;
            let body: wire::TokenReply = reply.json().await.map_err(|e| {
                Failure::Final(ObjectError::Other(format!(
                    "Keystone at {url}: reading the token reply: {}",
                    describe(&e)
                )))
            })?;
            let storage_url = find_endpoint(&body.token.catalog, interface, region.as_deref())
                .ok_or_else(|| {
                    Failure::Final(ObjectError::Other(format!(
                        "Keystone at {url}: the catalog has no object-store endpoint with \
                         interface {interface}{}",
                        region
                            .as_ref()
                            .map(|r| format!(" in region {r}"))
                            .unwrap_or_default()
                    )))
                })?;
            Ok(Session {
                token: Secret::new(token),
                storage_url,
            })
        }
    }
}

fn check_auth_status(status: reqwest::StatusCode, url: &str, user: &str) -> Result<(), Failure> {
    if status.is_success() {
        Ok(())
    } else if status == reqwest::StatusCode::UNAUTHORIZED
        || status == reqwest::StatusCode::FORBIDDEN
    {
        Err(Failure::Final(ObjectError::Auth(format!(
            "{url} answered {status} for user {user}"
        ))))
    } else if status.is_server_error() {
        Err(Failure::Transient(format!(
            "authenticating at {url}: answered {status}"
        )))
    } else {
        Err(Failure::Final(ObjectError::Other(format!(
            "authenticating at {url}: answered {status}"
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token reply in the shape of Keystone's API reference (fields as documented; ids
    /// shortened).
    const REPLY: &str = r#"{"token": {
        "methods": ["password"],
        "expires_at": "2026-12-01T18:00:00.000000Z",
        "project": {"domain": {"id": "default", "name": "Default"}, "id": "p1", "name": "vmdeploy"},
        "catalog": [
            {"type": "identity", "name": "keystone", "id": "s1", "endpoints": [
                {"id": "e1", "interface": "public", "region_id": "RegionOne", "region": "RegionOne",
                 "url": "http://keystone:5000/v3/"}]},
            {"type": "object-store", "name": "swift", "id": "s2", "endpoints": [
                {"id": "e2", "interface": "internal", "region_id": "RegionOne", "region": "RegionOne",
                 "url": "http://swift-int:8080/v1/AUTH_p1"},
                {"id": "e3", "interface": "public", "region_id": "RegionOne", "region": "RegionOne",
                 "url": "https://swift.example:443/v1/AUTH_p1/"},
                {"id": "e4", "interface": "public", "region_id": "RegionTwo", "region": "RegionTwo",
                 "url": "https://swift2.example/v1/AUTH_p1"}]}
        ]}}"#;

    #[test]
    fn catalog_endpoints_by_interface_and_region() {
        let reply: wire::TokenReply = serde_json::from_str(REPLY).expect("parses");
        let catalog = &reply.token.catalog;
        let cases = [
            ("public", None, Some("https://swift.example:443/v1/AUTH_p1")),
            ("internal", None, Some("http://swift-int:8080/v1/AUTH_p1")),
            (
                "public",
                Some("RegionTwo"),
                Some("https://swift2.example/v1/AUTH_p1"),
            ),
            ("internal", Some("RegionTwo"), None),
            ("admin", None, None),
        ];
        for (interface, region, want) in cases {
            assert_eq!(
                find_endpoint(catalog, interface, region).as_deref(),
                want,
                "{interface} {region:?}"
            );
        }
    }

    #[test]
    fn token_request_has_keystones_field_names() {
        let body = wire::TokenRequest {
            auth: wire::Auth {
                identity: wire::Identity {
                    methods: ["password"],
                    password: wire::Password {
                        user: wire::User {
                            name: "admin",
                            domain: wire::Named { name: "Default" },
                            password: "pw",
                        },
                    },
                },
                scope: wire::Scope {
                    project: wire::Project {
                        name: "vmdeploy",
                        domain: wire::Named { name: "Default" },
                    },
                },
            },
        };
        assert_eq!(
            serde_json::to_value(&body).expect("json"),
            serde_json::json!({"auth": {
                "identity": {"methods": ["password"], "password": {"user": {
                    "name": "admin", "domain": {"name": "Default"}, "password": "pw"}}},
                "scope": {"project": {"name": "vmdeploy", "domain": {"name": "Default"}}}
            }})
        );
    }

    #[test]
    fn tokens_url() {
        assert_eq!(
            keystone_tokens_url("http://k:5000/v3/"),
            "http://k:5000/v3/auth/tokens"
        );
        assert_eq!(
            keystone_tokens_url("http://k:5000"),
            "http://k:5000/v3/auth/tokens"
        );
    }
}
