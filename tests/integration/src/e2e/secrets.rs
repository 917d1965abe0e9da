//! The secrets a deploy issues, collected from where they really are while it runs, for
//! [`super::checks::assert_no_secret_leaked`] to search for afterwards.
//!
//! A [`SecretWatch`] polls, once a second, until [`SecretWatch::finish`]:
//! - the emulator's state: every virtual media URL the iLO was given (their `temp_url_sig`
//!   values), and the floppy behind a new floppy URL, fetched as the iLO fetches it, whose
//!   `parameters.txt` holds the agent token or the deploy key (and any CHAP secret);
//! - the conductor's state DB (`driver_internal_info`: the token and the deploy key as stored);
//! - the API's node and port bodies, kept as the API responses to search.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;
use vmdeploy_shared::params::{keys, Params};
use vmdeploy_shared::redact;

use super::Lab;

/// What a deploy issued, and what the API answered meanwhile.
#[derive(Debug, Default, Clone)]
pub struct Issued {
    /// Agent tokens (`ipa-agent-token` on the floppy, `agent_secret_token` in the DB).
    pub agent_tokens: BTreeSet<String>,
    /// Deploy keys (`deployment_key` on the floppy and in the DB).
    pub deploy_keys: BTreeSet<String>,
    /// Other secret values found on a floppy or in `driver_internal_info` (`key`, value).
    pub other: BTreeSet<(String, String)>,
    /// Every `temp_url_sig` value of a URL the iLO was given (or the test issued).
    pub signatures: BTreeSet<String>,
    /// Every virtual media URL the iLO was given.
    pub media_urls: BTreeSet<String>,
    /// How many floppies were fetched and read.
    pub floppies_read: usize,
    /// Bodies the API answered while the deploy ran (`GET /v1/nodes/{node}`, node and port
    /// lists), each with the request that got it.
    pub api_responses: Vec<(String, String)>,
}

impl Issued {
    /// Adds the signature of every temp URL in `text`.
    pub fn add_signatures_of(&mut self, text: &str) {
        let lower = text.to_ascii_lowercase();
        let mark = format!("{}=", redact::TEMP_URL_SIG);
        for (at, _) in lower.match_indices(&mark) {
            let value: String = text[at + mark.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=' | ':'))
                .collect();
            if !value.is_empty() && value != redact::MASK {
                self.signatures.insert(value);
            }
        }
    }

    /// Adds a secret found under `key` (a floppy parameter or a `driver_internal_info` key).
    fn add(&mut self, key: &str, value: &str) {
        if value.is_empty() || value == redact::MASK {
            return;
        }
        match key {
            keys::IPA_AGENT_TOKEN | "agent_secret_token" => {
                self.agent_tokens.insert(value.to_owned());
            }
            keys::DEPLOYMENT_KEY => {
                self.deploy_keys.insert(value.to_owned());
            }
            // A digest of a secret, kept on purpose: `agent_token_retired_sha256`, by which the
            // conductor recognises the finished deploy's agent calling late. Its preimage is the
            // token, which is tracked above and must be gone.
            _ if key.ends_with("_sha256") => {}
            _ if redact::is_secret_key(key) => {
                self.other.insert((key.to_owned(), value.to_owned()));
            }
            _ => {}
        }
    }
}

/// Polls a lab for the secrets it issues; [`SecretWatch::finish`] stops it.
pub struct SecretWatch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Issued>>,
}

/// Where the watch looks, copied out of the lab for its thread.
struct Places {
    ilo: String,
    ilo_cert: PathBuf,
    api: String,
    db: PathBuf,
    node: String,
}

impl Lab {
    /// Starts watching the secrets issued for `node` (see [`SecretWatch`]).
    pub fn watch_secrets(&self, node: &str) -> SecretWatch {
        let places = Places {
            ilo: self.ilo.clone(),
            ilo_cert: self.ilo_cert.clone(),
            api: format!("http://127.0.0.1:{}", self.api_port),
            db: self.dir().join("conductor").join("vmdeploy.sqlite"),
            node: node.to_owned(),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut issued = Issued::default();
            loop {
                // One last look after the stop, so the final state is seen too.
                let last = stopped.load(Ordering::Relaxed);
                places.look(&mut issued);
                if last {
                    return issued;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        SecretWatch {
            stop,
            thread: Some(thread),
        }
    }
}

impl SecretWatch {
    /// Stops watching; what was issued.
    pub fn finish(mut self) -> Issued {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .expect("finished once")
            .join()
            .expect("the secret watch panicked")
    }
}

impl Drop for SecretWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Places {
    fn look(&self, issued: &mut Issued) {
        if let Some(state) = get(&self.ilo_url("/_emulator/state"), Some(&self.ilo_cert)) {
            let state: Value = serde_json::from_slice(&state).unwrap_or_default();
            let media = state["vmedia"].as_object().cloned().unwrap_or_default();
            for (device, status) in media {
                let Some(url) = status["url"].as_str().filter(|u| !u.is_empty()) else {
                    continue;
                };
                if !issued.media_urls.insert(url.to_owned()) {
                    continue;
                }
                issued.add_signatures_of(url);
                if device == "FLOPPY" {
                    read_floppy(url, issued);
                }
            }
        }
        self.read_db(issued);
        for path in [
            format!("/v1/nodes/{}", self.node),
            "/v1/nodes?detail=True".to_owned(),
            "/v1/ports?detail=True".to_owned(),
        ] {
            if let Some(body) = get(&format!("{}{path}", self.api), None) {
                let body = String::from_utf8_lossy(&body).into_owned();
                if !issued
                    .api_responses
                    .iter()
                    .any(|(p, b)| *p == path && *b == body)
                {
                    issued.api_responses.push((path, body));
                }
            }
        }
    }

    fn ilo_url(&self, path: &str) -> String {
        format!("https://{}{path}", self.ilo)
    }

    /// `driver_internal_info` of every node, read-only (the conductor keeps writing).
    fn read_db(&self, issued: &mut Issued) {
        if !self.db.exists() {
            return;
        }
        let out = Command::new("sqlite3")
            .arg("-readonly")
            .arg(&self.db)
            .arg("SELECT driver_internal_info FROM nodes")
            .output()
            .expect("running sqlite3 (apt install sqlite3)");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let info: Value = serde_json::from_str(line).unwrap_or_default();
            for (key, value) in info.as_object().into_iter().flatten() {
                if let Some(value) = value.as_str() {
                    issued.add(key, value);
                }
            }
        }
    }
}

/// The floppy behind `url` (the conductor's store, HTTPS with its own certificate, as the
/// iLO reads it), its `parameters.txt` read for secrets.
fn read_floppy(url: &str, issued: &mut Issued) {
    let Some(image) = get_insecure(url) else {
        return;
    };
    let text = vmdeploy_shared::fat::read_root_file(
        std::io::Cursor::new(image),
        "parameters.txt",
        1 << 16,
    )
    .unwrap_or_else(|e| {
        panic!(
            "the floppy at {} has no readable parameters.txt: {e}",
            redact::Url(url)
        )
    });
    let params = Params::parse(&text)
        .unwrap_or_else(|e| panic!("the floppy's parameters.txt does not parse: {e}"));
    for (key, value) in params.iter() {
        issued.add(key, value);
    }
    issued.floppies_read += 1;
}

/// GET `url` with curl (TLS checked against `ca` when given); `None` on any failure (the
/// watch looks again a second later).
fn get(url: &str, ca: Option<&Path>) -> Option<Vec<u8>> {
    let mut curl = Command::new("curl");
    curl.args(["-sS", "--fail", "--max-time", "20"]);
    curl.args(["-H", "X-OpenStack-Ironic-API-Version: latest"]);
    if let Some(ca) = ca {
        curl.arg("--cacert").arg(ca);
    }
    let out = curl
        .arg(url)
        .output()
        .expect("running curl (apt install curl)");
    out.status.success().then_some(out.stdout)
}

/// GET `url` without checking its certificate (the store's own, which the test does not hold).
fn get_insecure(url: &str) -> Option<Vec<u8>> {
    let out = Command::new("curl")
        .args(["-sS", "--fail", "--insecure", "--max-time", "60"])
        .arg(url)
        .output()
        .expect("running curl (apt install curl)");
    out.status.success().then_some(out.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_and_floppy_keys_are_sorted_by_kind() {
        let mut issued = Issued::default();
        issued.add_signatures_of(
            "https://127.0.0.1:1/v1/AUTH_x/c/o?temp_url_sig=ab12cd&temp_url_expires=9 and \
             http://h/x?TEMP_URL_SIG=sha512:Zz+/=&y=1 and http://h/m?temp_url_sig=******",
        );
        assert_eq!(
            issued.signatures.iter().collect::<Vec<_>>(),
            ["ab12cd", "sha512:Zz+/="]
        );
        for (key, value) in [
            ("ipa-agent-token", "tok"),
            ("agent_secret_token", "tok2"),
            ("deployment_key", "key"),
            ("vmdeploy-iscsi-chap-secret", "chap"),
            ("ipa-api-url", "http://10.0.2.100:6385"),
            ("agent_secret_token", "******"),
            // The retired token's digest is no secret (its preimage, the token, is).
            ("agent_token_retired_sha256", "5e2f"),
        ] {
            issued.add(key, value);
        }
        assert_eq!(issued.agent_tokens.len(), 2);
        assert_eq!(issued.deploy_keys.iter().collect::<Vec<_>>(), ["key"]);
        assert_eq!(
            issued.other.iter().collect::<Vec<_>>(),
            [&("vmdeploy-iscsi-chap-secret".to_owned(), "chap".to_owned())]
        );
    }
}
