//! Calls from the agent to the conductor: `GET /v1/lookup` and `POST /v1/heartbeat/{node}`.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use reqwest::StatusCode;

use super::wire::{Heartbeat, LookupResponse};

/// API microversion the agent speaks: 1.68 carries `agent_token` and `agent_verify_ca` in
/// heartbeats (reference §3.2).
pub const API_VERSION: &str = "1.68";

/// A client of the conductor's ramdisk API.
#[derive(Debug, Clone)]
pub struct ConductorClient {
    http: reqwest::Client,
    api_url: String,
}

impl ConductorClient {
    /// A client for `api_url` (without `/v1`), trusting `ca_pem` only when given.
    pub fn new(api_url: &str, ca_pem: Option<Vec<u8>>) -> anyhow::Result<ConductorClient> {
        let opts = crate::stream::http::HttpOptions {
            ca_pem,
            read_timeout: Duration::from_secs(30),
            ..Default::default()
        };
        Ok(ConductorClient {
            http: crate::stream::http::build_client(&opts)?,
            api_url: api_url.trim_end_matches('/').to_owned(),
        })
    }

    /// One lookup by MAC addresses (and node UUID when known).
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
            .header("X-OpenStack-Ironic-API-Version", API_VERSION)
            .send()
            .await
            .context("sending the lookup")?;
        match resp.status() {
            StatusCode::OK => Ok(Some(
                resp.json().await.context("parsing the lookup answer")?,
            )),
            // Not (yet) in a state that allows lookup, or locked: try again later.
            StatusCode::NOT_FOUND | StatusCode::CONFLICT => Ok(None),
            s => bail!("lookup answered {s}"),
        }
    }

    /// Looks up until found or `timeout` passes, backing off 5, 10, then 30 s as IPA does.
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
                Ok(None) => tracing::info!("lookup: node not ready yet"),
                Err(e) => tracing::warn!("lookup failed: {e:#}"),
            }
            if Instant::now() + pause > deadline {
                bail!("lookup did not find this node within {timeout:?}");
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(30));
        }
    }

    /// One heartbeat; the conductor answers 202.
    pub async fn heartbeat(&self, node: &str, body: &Heartbeat) -> anyhow::Result<()> {
        let url = format!("{}/v1/heartbeat/{node}", self.api_url);
        let resp = self
            .http
            .post(url)
            .header("X-OpenStack-Ironic-API-Version", API_VERSION)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).context("encoding the heartbeat")?)
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
