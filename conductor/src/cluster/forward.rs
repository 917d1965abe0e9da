//! Carrying an API request to the conductor that owns its node (Ironic's conductor RPC, done as
//! the same HTTP request replayed at the owner's internal URL).
//!
//! # Design
//! The request goes on unchanged: same method, path, query, headers (the client's credentials
//! and microversion among them) and body, so the owner checks it exactly as if the client had
//! called it, and its answer is passed back unchanged. One header is added: the
//! [`FORWARDED_HEADER`] *stamp*, naming the forwarding conductor, the client's address and the
//! time, signed with HMAC-SHA256 under the key all conductors of one database share
//! (`Store::cluster_key`). The stamp does two things at the owner: a stamped request is never
//! forwarded again (no loop while two views of the ring differ), and the ramdisk call-backs'
//! failure counting sees the real client address instead of the forwarding conductor's (so one
//! flooding client cannot get every call-back relayed by that conductor refused). A stamp that
//! does not verify is refused (403): it was forged or made with another database's key.
//!
//! # Limitations
//! Bodies are buffered (they are capped at `api.max_body` before this runs); no streaming.

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, KeyInit, Mac};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use sha2::Sha256;

use crate::net::https::{ClientSpec, HttpsClientError, Trust};

/// The stamp's header.
pub const FORWARDED_HEADER: &str = "x-vmdeploy-forwarded";

/// How far a stamp's time may be from the owner's clock (conductors run NTP; a stamp older than
/// this is a replay).
pub const STAMP_SKEW: Duration = Duration::from_secs(120);

/// Longest wait for the owner's answer: node actions answer at once (202) and the work runs
/// after, so this only bounds a stuck owner.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(60);

/// Hop-by-hop headers (RFC 9110 §7.6.1), the length the client library sets itself, and an
/// earlier stamp. `Host` is kept: the owner renders links with the name the client called.
const NOT_FORWARDED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    FORWARDED_HEADER,
];

/// A verified stamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// The conductor that forwarded the request.
    pub by: String,
    /// The address of the client that sent it to that conductor.
    pub client: Option<IpAddr>,
    /// Unix seconds when it was forwarded.
    pub at: i64,
}

/// Why a stamp was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StampError {
    /// Not `by;client;at;signature`.
    #[error("malformed {FORWARDED_HEADER} header")]
    Malformed,
    /// The signature does not match.
    #[error("the {FORWARDED_HEADER} header's signature does not verify (another database's conductor, or forged)")]
    BadSignature,
    /// Too old or from the future.
    #[error("the {FORWARDED_HEADER} header is {0} s away from this conductor's clock (check NTP)")]
    Stale(i64),
}

/// Why forwarding failed: the API answers 503, the client retries.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The owner did not answer.
    #[error("conductor {owner}, which owns the node, did not answer at {url}: {reason}")]
    Unreachable {
        /// Its name.
        owner: String,
        /// Where it was called.
        url: String,
        /// reqwest's words.
        reason: String,
    },
}

/// The signed text: every field of the stamp, then what it stamps.
fn signed_text(stamp: &Stamp, method: &Method, path_and_query: &str) -> String {
    let client = stamp.client.map(|a| a.to_string()).unwrap_or_default();
    format!(
        "{}\n{client}\n{}\n{method}\n{path_and_query}",
        stamp.by, stamp.at
    )
}

fn mac(key: &[u8], text: &str) -> Hmac<Sha256> {
    // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    mac.update(text.as_bytes());
    mac
}

impl Stamp {
    /// The header value for this stamp on `method path_and_query`, signed with `key`.
    pub fn sign(&self, key: &[u8], method: &Method, path_and_query: &str) -> String {
        let signature = mac(key, &signed_text(self, method, path_and_query))
            .finalize()
            .into_bytes();
        let client = self.client.map(|a| a.to_string()).unwrap_or_default();
        format!(
            "{};{client};{};{}",
            self.by,
            self.at,
            hex::encode(signature)
        )
    }

    /// Reads and verifies a header value against `key` and the clock `now` (unix seconds).
    pub fn verify(
        value: &str,
        key: &[u8],
        method: &Method,
        path_and_query: &str,
        now: i64,
    ) -> Result<Stamp, StampError> {
        let mut fields = value.split(';');
        let (Some(by), Some(client), Some(at), Some(signature), None) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            return Err(StampError::Malformed);
        };
        let client = match client {
            "" => None,
            text => Some(text.parse().map_err(|_| StampError::Malformed)?),
        };
        let at: i64 = at.parse().map_err(|_| StampError::Malformed)?;
        let signature = hex::decode(signature).map_err(|_| StampError::Malformed)?;
        let stamp = Stamp {
            by: by.to_string(),
            client,
            at,
        };
        mac(key, &signed_text(&stamp, method, path_and_query))
            .verify_slice(&signature)
            .map_err(|_| StampError::BadSignature)?;
        let skew = now.saturating_sub(at);
        if skew.unsigned_abs() > STAMP_SKEW.as_secs() {
            return Err(StampError::Stale(skew));
        }
        Ok(stamp)
    }
}

/// An answer from the owner, to pass back as it is.
#[derive(Debug)]
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// Its headers, hop-by-hop ones removed.
    pub headers: HeaderMap,
    /// Its body.
    pub body: Bytes,
}

/// The HTTP client that forwards requests.
#[derive(Debug, Clone)]
pub struct Forwarder {
    client: reqwest::Client,
    me: String,
}

impl Forwarder {
    /// A forwarder for conductor `me` that trusts owners' certificates as `trust` says.
    pub fn new(me: &str, trust: Trust) -> Result<Forwarder, HttpsClientError> {
        Ok(Forwarder {
            client: ClientSpec::management(trust, FORWARD_TIMEOUT).build()?,
            me: me.to_string(),
        })
    }

    /// Sends `method path_and_query` with `headers` and `body` to `owner` at `base_url`,
    /// stamped with `key`, and returns its answer.
    #[allow(clippy::too_many_arguments)]
    pub async fn forward(
        &self,
        owner: &str,
        base_url: &str,
        key: &[u8],
        client: Option<IpAddr>,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Answer, ForwardError> {
        let url = format!("{}{path_and_query}", base_url.trim_end_matches('/'));
        let stamp = Stamp {
            by: self.me.clone(),
            client,
            at: time::OffsetDateTime::now_utc().unix_timestamp(),
        };
        let mut out = without_hop_by_hop(headers);
        if let Ok(value) = HeaderValue::from_str(&stamp.sign(key, &method, path_and_query)) {
            out.insert(HeaderName::from_static(FORWARDED_HEADER), value);
        }
        let unreachable = |e: reqwest::Error| ForwardError::Unreachable {
            owner: owner.to_string(),
            url: base_url.to_string(),
            reason: vmdeploy_shared::error::Chain(&e.without_url()).to_string(),
        };
        let response = self
            .client
            .request(method, &url)
            .headers(out)
            .body(body)
            .send()
            .await
            .map_err(unreachable)?;
        let status = response.status();
        let headers = without_hop_by_hop(response.headers());
        let body = response.bytes().await.map_err(unreachable)?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }
}

fn without_hop_by_hop(headers: &HeaderMap) -> HeaderMap {
    let mut out = headers.clone();
    for name in NOT_FORWARDED {
        out.remove(*name);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn a_stamp_verifies_only_with_its_key_request_and_time() {
        let stamp = Stamp {
            by: "c1".into(),
            client: Some("192.0.2.7".parse().expect("ip")),
            at: 1_000_000,
        };
        let path = "/v1/heartbeat/abc?x=1";
        let value = stamp.sign(KEY, &Method::POST, path);
        assert!(value.starts_with("c1;192.0.2.7;1000000;"), "{value}");
        assert_eq!(
            Stamp::verify(&value, KEY, &Method::POST, path, 1_000_030),
            Ok(stamp.clone())
        );
        let other_key = b"another key";
        assert_eq!(
            Stamp::verify(&value, other_key, &Method::POST, path, 1_000_000),
            Err(StampError::BadSignature)
        );
        assert_eq!(
            Stamp::verify(&value, KEY, &Method::PUT, path, 1_000_000),
            Err(StampError::BadSignature),
            "another method"
        );
        assert_eq!(
            Stamp::verify(
                &value,
                KEY,
                &Method::POST,
                "/v1/heartbeat/abd?x=1",
                1_000_000
            ),
            Err(StampError::BadSignature),
            "another path"
        );
        let forged = value.replace("192.0.2.7", "192.0.2.8");
        assert_eq!(
            Stamp::verify(&forged, KEY, &Method::POST, path, 1_000_000),
            Err(StampError::BadSignature),
            "another client address"
        );
        assert_eq!(
            Stamp::verify(&value, KEY, &Method::POST, path, 1_000_121),
            Err(StampError::Stale(121))
        );
        for bad in [
            "",
            "c1",
            "c1;;1;zz",
            "c1;notanip;1;00",
            "c1;;x;00",
            "a;;1;00;extra",
        ] {
            assert_eq!(
                Stamp::verify(bad, KEY, &Method::POST, path, 1),
                Err(StampError::Malformed),
                "{bad:?}"
            );
        }
        let no_client = Stamp {
            client: None,
            ..stamp
        };
        let value = no_client.sign(KEY, &Method::GET, "/");
        assert_eq!(
            Stamp::verify(&value, KEY, &Method::GET, "/", 1_000_000),
            Ok(no_client)
        );
    }

    #[test]
    fn hop_by_hop_headers_and_old_stamps_are_not_passed_on() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "close"),
            ("content-length", "3"),
            (FORWARDED_HEADER, "x"),
            ("x-auth-token", "t"),
            ("x-openstack-ironic-api-version", "1.49"),
        ] {
            headers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let out = without_hop_by_hop(&headers);
        let names: Vec<&str> = out.keys().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(out.contains_key("x-auth-token"));
        assert!(out.contains_key("x-openstack-ironic-api-version"));
    }
}
