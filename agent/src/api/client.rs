//! Calls from the agent to the conductor: `GET /` (API version), `GET /v1/lookup` and
//! `POST /v1/heartbeat/{node}` (docs/ironic-protocols.md §3.2).
//!
//! # Design
//! The microversion is negotiated as IPA does (`ironic_api_client.py`): read the server's newest
//! version from `GET /` (`default_version.version`) and send `min(server, ours)` in
//! `X-OpenStack-Ironic-API-Version`. Heartbeat fields are then sent only at the versions that know
//! them, because Ironic answers 400 to a field its negotiated version does not have.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use reqwest::StatusCode;
use vmdeploy_shared::api::ipa::{ApiRoot, ApiVersion, Heartbeat, LookupResponse};

/// The newest microversion the agent speaks: 1.72 lets heartbeats carry `agent_status_message`
/// (write progress).
pub const MAX_API_VERSION: ApiVersion = ApiVersion::AGENT_STATUS;

/// Version assumed when `GET /` cannot be read: agent tokens in heartbeats, no progress fields.
pub const FALLBACK_API_VERSION: ApiVersion = ApiVersion::AGENT_TOKEN;

/// The header carrying the microversion.
pub const VERSION_HEADER: &str = "X-OpenStack-Ironic-API-Version";

/// A client of the conductor's ramdisk API.
#[derive(Debug, Clone)]
pub struct ConductorClient {
    http: reqwest::Client,
    api_url: String,
    version: ApiVersion,
}

impl ConductorClient {
    /// A client for `api_url` (without `/v1`). An `https` URL needs `ca_pem` and trusts only it
    /// (docs/architecture.md §7); an `http` URL is used as it says.
    pub fn new(api_url: &str, ca_pem: Option<Vec<u8>>) -> anyhow::Result<ConductorClient> {
        let lower = api_url.to_ascii_lowercase();
        if lower.starts_with("https://") && ca_pem.is_none() {
            bail!(
                "ipa-api-url {api_url} is https but no CA came with the parameters (ipa-agent-ca): \
                 the agent trusts only the conductor's CA"
            );
        }
        if !lower.starts_with("https://") && !lower.starts_with("http://") {
            bail!("ipa-api-url {api_url} is neither http:// nor https://");
        }
        let opts = crate::http::HttpOptions {
            ca_pem,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            ..Default::default()
        };
        Ok(ConductorClient {
            http: crate::http::build_client(&opts)?,
            api_url: api_url.trim_end_matches('/').to_owned(),
            version: FALLBACK_API_VERSION,
        })
    }

    /// The microversion in use.
    pub fn version(&self) -> ApiVersion {
        self.version
    }

    /// Reads the server's newest microversion from `GET /` and uses `min(server, ours)`; keeps
    /// [`FALLBACK_API_VERSION`] (logged) when the root cannot be read.
    pub async fn negotiate_version(&mut self) {
        match self.server_version().await {
            Ok(server) => {
                self.version = server.min(MAX_API_VERSION);
                tracing::info!(%server, using = %self.version, "conductor API version");
            }
            Err(e) => {
                self.version = FALLBACK_API_VERSION;
                tracing::warn!(
                    using = %self.version,
                    "could not read the conductor's API version, assuming the oldest with agent tokens: {e:#}"
                );
            }
        }
    }

    async fn server_version(&self) -> anyhow::Result<ApiVersion> {
        let resp = tokio::time::timeout(
            Duration::from_secs(30),
            self.http.get(format!("{}/", self.api_url)).send(),
        )
        .await
        .context("GET / timed out")?
        .context("sending GET /")?;
        if !resp.status().is_success() {
            bail!("GET / answered {}", resp.status());
        }
        let body = resp.bytes().await.context("reading the answer of GET /")?;
        Ok(ApiRoot::from_json(&body)?.max_version()?)
    }

    /// One lookup by MAC addresses (and node UUID when known); `None` when the conductor does
    /// not (yet) know this node.
    pub async fn lookup_once(
        &self,
        addresses: &[String],
        node_uuid: Option<&str>,
    ) -> anyhow::Result<Option<LookupResponse>> {
        let mut url = reqwest::Url::parse(&format!("{}/v1/lookup", self.api_url))
            .context("building the lookup URL")?;
        url.query_pairs_mut()
            .append_pair("addresses", &addresses.join(","));
        if let Some(u) = node_uuid {
            url.query_pairs_mut().append_pair("node_uuid", u);
        }
        let resp = self
            .http
            .get(url)
            .header(VERSION_HEADER, self.version.to_string())
            .header("accept", "application/json")
            .send()
            .await
            .context("sending the lookup")?;
        match resp.status() {
            StatusCode::OK => {
                let body = resp.bytes().await.context("reading the lookup answer")?;
                Ok(Some(
                    LookupResponse::from_json(&body).context("parsing the lookup answer")?,
                ))
            }
            // Not (yet) in a state that allows lookup, or locked: try again later.
            StatusCode::NOT_FOUND | StatusCode::CONFLICT => Ok(None),
            s => bail!("lookup answered {s}"),
        }
    }

    /// Looks up until found or `timeout` passes, pausing 5, 10, then 30 s between attempts as
    /// IPA does after a 409.
    pub async fn lookup(
        &self,
        addresses: &[String],
        node_uuid: Option<&str>,
        timeout: Duration,
    ) -> anyhow::Result<LookupResponse> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_secs(5);
        loop {
            match self.lookup_once(addresses, node_uuid).await {
                Ok(Some(found)) => return Ok(found),
                Ok(None) => tracing::info!("lookup: the conductor does not know this node yet"),
                Err(e) => tracing::warn!("lookup failed: {e:#}"),
            }
            if Instant::now() + pause > deadline {
                bail!(
                    "lookup by MAC addresses {} did not find this node within {timeout:?}",
                    addresses.join(",")
                );
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(30));
        }
    }

    /// Drops the heartbeat fields the negotiated version does not know.
    pub fn fit_to_version(&self, mut body: Heartbeat) -> Heartbeat {
        if self.version < ApiVersion::AGENT_VERSION {
            body.agent_version = None;
        }
        if self.version < ApiVersion::AGENT_TOKEN {
            body.agent_token = None;
        }
        if self.version < ApiVersion::AGENT_VERIFY_CA {
            body.agent_verify_ca = None;
        }
        if self.version < ApiVersion::AGENT_STATUS {
            body.agent_status = None;
            body.agent_status_message = None;
        }
        body
    }

    /// One heartbeat; the conductor answers 202.
    pub async fn heartbeat(&self, node: &str, body: &Heartbeat) -> anyhow::Result<()> {
        let url = format!("{}/v1/heartbeat/{node}", self.api_url);
        let body = self.fit_to_version(body.clone());
        let resp = self
            .http
            .post(url)
            .header(VERSION_HEADER, self.version.to_string())
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).context("encoding the heartbeat")?)
            .send()
            .await
            .context("sending the heartbeat")?;
        match resp.status() {
            StatusCode::ACCEPTED | StatusCode::OK => Ok(()),
            s => {
                let text = resp.text().await.unwrap_or_default();
                bail!(
                    "heartbeat answered {s}: {}",
                    text.chars().take(300).collect::<String>()
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmdeploy_shared::secret::Secret;

    #[test]
    fn heartbeat_fields_follow_the_version() {
        let mut c = ConductorClient::new("http://127.0.0.1:1", None).expect("client");
        let full = Heartbeat {
            callback_url: "http://a:9999".into(),
            agent_token: Some(Secret::new("t")),
            agent_version: Some("v".into()),
            agent_verify_ca: Some("-----BEGIN CERTIFICATE-----\n".into()),
            agent_status: None,
            agent_status_message: Some("image write: written=1 total=2 rate=3".into()),
        };
        c.version = ApiVersion::new(1, 72);
        assert_eq!(c.fit_to_version(full.clone()), full);
        c.version = ApiVersion::new(1, 71);
        let hb = c.fit_to_version(full.clone());
        assert!(hb.agent_status_message.is_none() && hb.agent_token.is_some());
        c.version = ApiVersion::new(1, 68);
        let hb = c.fit_to_version(full.clone());
        assert!(hb.agent_verify_ca.is_some() && hb.agent_status_message.is_none());
        c.version = ApiVersion::new(1, 67);
        let hb = c.fit_to_version(full.clone());
        assert!(hb.agent_verify_ca.is_none() && hb.agent_token.is_some());
        c.version = ApiVersion::new(1, 40);
        let hb = c.fit_to_version(full.clone());
        assert!(hb.agent_token.is_none() && hb.agent_version.is_some());
        c.version = ApiVersion::new(1, 22);
        let hb = c.fit_to_version(full);
        assert!(hb.agent_version.is_none());
    }

    #[test]
    fn https_needs_the_ca() {
        let err = ConductorClient::new("https://10.0.0.1:6385", None).expect_err("no CA");
        assert!(format!("{err:#}").contains("ipa-agent-ca"), "{err:#}");
        assert!(ConductorClient::new("ftp://x", None).is_err());
    }
}
