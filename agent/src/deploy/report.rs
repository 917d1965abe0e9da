//! `pass_deploy_info`: the iSCSI deploy's one call to the conductor
//! (docs/ironic-protocols.md §2.2 step 5, docs/architecture.md §4).
//!
//! # Design
//! `POST {ironic_api_url}/v1/nodes/{deployment_id}/vendor_passthru/pass_deploy_info` with
//! `{address, key, iqn, error}`. The conductor answers 202 at once. Connection errors, timeouts,
//! 429 and 5xx are retried with exponential backoff (1 s doubling to 30 s) within a bounded total
//! time, because a conductor restarting or a switch port still coming up must not fail a deploy.
//! 400 (bad fields), 403 (wrong key) and 409 (node not waiting) will not change by retrying: the
//! agent stops and logs the conductor's body. Only the floppy's CA (`ipa-agent-ca`) is trusted
//! for https.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use reqwest::StatusCode;
use vmdeploy_shared::api::{PassDeployInfo, MAX_AGENT_ERROR_LEN};
use vmdeploy_shared::params::{keys, IscsiDeployParams, Params};
use vmdeploy_shared::secret::Secret;

use super::RunArgs;

/// How `pass_deploy_info` is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Pause after the first failed attempt.
    pub first_backoff: Duration,
    /// Longest pause between attempts.
    pub max_backoff: Duration,
    /// No new attempt starts after this much time since the first.
    pub total: Duration,
    /// Longest wait for one answer.
    pub request_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            total: Duration::from_secs(300),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// The longest part of a refusal's body that is logged.
const MAX_LOGGED_BODY: usize = 1024;

/// What one attempt came to.
enum Attempt {
    Accepted(StatusCode),
    /// Worth another try.
    Transient(String),
    /// The conductor said no; retrying cannot help.
    Refused(StatusCode, String),
}

/// Characters escaped in the node path segment (a UUID has none of them).
const PATH_SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'?')
    .add(b'<')
    .add(b'>');

/// The `pass_deploy_info` URL: the API root without `/v1`, then `/v1/nodes/...`.
pub fn pass_deploy_info_url(api_url: &str, node: &str) -> String {
    let node = percent_encoding::utf8_percent_encode(node, PATH_SEGMENT);
    format!(
        "{}/v1/nodes/{node}/vendor_passthru/pass_deploy_info",
        api_url.trim_end_matches('/')
    )
}

/// Sends `body` to `url` until accepted, refused, or `policy.total` has passed.
pub async fn post_with_retries(
    client: &reqwest::Client,
    url: &str,
    auth_token: Option<&str>,
    body: &PassDeployInfo,
    policy: RetryPolicy,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut pause = policy.first_backoff;
    for attempt in 1u32.. {
        match post_once(client, url, auth_token, body, policy.request_timeout).await {
            Attempt::Accepted(status) => {
                tracing::info!(%status, attempt, "pass_deploy_info accepted");
                return Ok(());
            }
            Attempt::Refused(status, text) => {
                tracing::error!(%status, body = %text, "the conductor refused pass_deploy_info");
                bail!("the conductor refused pass_deploy_info with {status}: {text}");
            }
            Attempt::Transient(why) => {
                let elapsed = start.elapsed();
                if elapsed + pause > policy.total {
                    bail!(
                        "pass_deploy_info to {url} failed {attempt} times in {:.1} s; last: {why}",
                        elapsed.as_secs_f64()
                    );
                }
                tracing::warn!(
                    attempt,
                    retry_in_ms = pause.as_millis() as u64,
                    "pass_deploy_info failed: {why}"
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(policy.max_backoff);
            }
        }
    }
    unreachable!("the attempt counter does not run out before the time budget")
}

async fn post_once(
    client: &reqwest::Client,
    url: &str,
    auth_token: Option<&str>,
    body: &PassDeployInfo,
    timeout: Duration,
) -> Attempt {
    let mut request = client
        .post(url)
        .header("Accept", "application/json")
        .json(body)
        .timeout(timeout);
    if let Some(token) = auth_token {
        request = request.header("X-Auth-Token", token);
    }
    let sent = request.send().await;
    let resp = match sent {
        Ok(r) => r,
        Err(e) => return Attempt::Transient(format!("{:#}", anyhow::Error::new(e))),
    };
    let status = resp.status();
    if status.is_success() {
        return Attempt::Accepted(status);
    }
    let text: String = match resp.text().await {
        Ok(t) => t.chars().take(MAX_LOGGED_BODY).collect(),
        Err(e) => format!("(body unreadable: {e})"),
    };
    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        Attempt::Transient(format!("{status}: {text}"))
    } else {
        Attempt::Refused(status, text)
    }
}

/// Who to report to and how: the conductor of one iSCSI deploy.
#[derive(Debug, Clone)]
pub struct Reporter {
    url: String,
    key: Secret,
    iqn: String,
    /// The address given on the command line, used when the network never came up.
    known_address: Option<IpAddr>,
    /// Keystone token from the floppy's `token` file, sent as `X-Auth-Token` (§1.1 item 4).
    auth_token: Option<Secret>,
    client: reqwest::Client,
    /// The retry policy.
    pub policy: RetryPolicy,
}

impl Reporter {
    /// For checked iSCSI parameters.
    pub fn new(params: &IscsiDeployParams, args: &RunArgs) -> anyhow::Result<Reporter> {
        Reporter::build(
            &params.ironic_api_url,
            &params.deployment_id,
            params.deployment_key.expose(),
            &params.iscsi_target_iqn,
            params.common.agent_ca_pem.clone(),
            args,
        )
    }

    /// When the typed parameters are unusable but the conductor, node and key are there, the
    /// conductor can still be told why (no CA then unless it parses: plain https then fails).
    pub fn from_raw(params: &Params, args: &RunArgs) -> Option<Reporter> {
        let url = params.get(keys::IRONIC_API_URL)?;
        let node = params.get(keys::DEPLOYMENT_ID)?;
        let key = params.get(keys::DEPLOYMENT_KEY)?;
        if !(url.starts_with("http://") || url.starts_with("https://")) || node.is_empty() {
            return None;
        }
        let ca = params.get(keys::IPA_AGENT_CA).and_then(|b64| {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.decode(b64).ok()
        });
        let iqn = params.get(keys::ISCSI_TARGET_IQN).unwrap_or("");
        Reporter::build(url, node, key, iqn, ca, args)
            .map_err(|e| tracing::warn!("cannot report the parameter error: {e:#}"))
            .ok()
    }

    fn build(
        api_url: &str,
        node: &str,
        key: &str,
        iqn: &str,
        ca_pem: Option<Vec<u8>>,
        args: &RunArgs,
    ) -> anyhow::Result<Reporter> {
        let policy = RetryPolicy {
            total: Duration::from_secs(args.report_timeout_secs),
            ..Default::default()
        };
        let opts = crate::http::HttpOptions {
            ca_pem,
            connect_timeout: Duration::from_secs(10),
            read_timeout: policy.request_timeout,
            ..Default::default()
        };
        Ok(Reporter {
            url: pass_deploy_info_url(api_url, node),
            key: Secret::new(key),
            iqn: iqn.to_owned(),
            known_address: args.address,
            auth_token: None,
            client: crate::http::build_client(&opts)
                .context("building the conductor client (ipa-agent-ca)")?,
            policy,
        })
    }

    /// Sends `token` as `X-Auth-Token` with every call.
    pub fn with_auth_token(mut self, token: Option<String>) -> Reporter {
        self.auth_token = token.map(Secret::new);
        self
    }

    /// The body for `address` (or the known one) and `error`.
    pub fn body(&self, address: Option<IpAddr>, error: Option<&str>) -> PassDeployInfo {
        PassDeployInfo {
            address: address
                .or(self.known_address)
                .map(|a| a.to_string())
                .unwrap_or_default(),
            key: self.key.clone(),
            iqn: self.iqn.clone(),
            error: error.map(|e| cut(e, MAX_AGENT_ERROR_LEN)),
        }
    }

    /// Tells the conductor the disk is ready at `address`.
    pub async fn report_ready(&self, address: IpAddr) -> anyhow::Result<()> {
        tracing::info!(url = %self.url, %address, iqn = %self.iqn, "sending pass_deploy_info");
        post_with_retries(
            &self.client,
            &self.url,
            self.auth_token.as_ref().map(|t| t.expose().as_str()),
            &self.body(Some(address), None),
            self.policy,
        )
        .await
    }

    /// Tells the conductor the deploy failed; the outcome is only logged (the agent fails anyway).
    pub async fn report_error(&self, address: Option<IpAddr>, error: &str) {
        tracing::info!(url = %self.url, "reporting the failure with pass_deploy_info");
        match post_with_retries(
            &self.client,
            &self.url,
            self.auth_token.as_ref().map(|t| t.expose().as_str()),
            &self.body(address, Some(error)),
            self.policy,
        )
        .await
        {
            Ok(()) => tracing::info!("the conductor has the error"),
            Err(e) => tracing::error!("could not report the error to the conductor: {e:#}"),
        }
    }

    /// [`Reporter::report_error`] outside any runtime.
    pub fn report_error_blocking(&self, error: &str) {
        match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(self.report_error(None, error)),
            Err(e) => tracing::error!("cannot start a runtime to report the error: {e}"),
        }
    }
}

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// The floppy's `token` file (present when the conductor runs with Keystone auth), if any and if
/// it is a usable header value.
pub fn read_auth_token(floppy: &std::path::Path) -> Option<String> {
    let file = match std::fs::File::open(floppy) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(device = %floppy.display(), "reopening the floppy for its token: {e}");
            return None;
        }
    };
    match vmdeploy_shared::fat::read_root_file(file, "token", 16 * 1024) {
        Ok(bytes) => {
            let token = String::from_utf8_lossy(&bytes).trim().to_owned();
            if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
                tracing::warn!("the floppy's token file is empty or not printable ASCII; ignored");
                return None;
            }
            tracing::info!("auth token read from the floppy");
            Some(token)
        }
        Err(vmdeploy_shared::fat::FatError::FileNotFound(_)) => None,
        Err(e) => {
            tracing::warn!("reading the floppy's token file: {e}");
            None
        }
    }
}
