//! The conductor stand-ins the agent's tests use (`iscsi_standin`, `ipa_standin`) refuse a
//! ramdisk as the conductor's real API router does: the same status and the same fault body
//! (Ironic's `error_message` shape, `faultcode`, the API's words), asked the same wrong deploy
//! key or wrong agent token. The stand-ins stay where a test must hold an answer back or check
//! the agent's side of the protocol; this keeps them from drifting away from the service.
//!
//! The real router serves a Manager on SQLite ([`conductor_env`]) whose node waits for its
//! ramdisk; no BMC is reached, as both refusals come before the flow runs.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use vmdeploy_conductor::states::ProvisionState;
use vmdeploy_conductor::store::{Node, Store};
use vmdeploy_integration_tests::conductor_env::{
    api_settings, enroll, obj, Api, Builtin, Conductor, Media,
};
use vmdeploy_integration_tests::fault::{self, Fault};
use vmdeploy_integration_tests::http::TestPki;
use vmdeploy_integration_tests::{ipa_standin, iscsi_standin};
use vmdeploy_shared::api::ipa::ApiVersion;

/// The microversion both are asked at (the agent's newest).
const VERSION: &str = "1.72";
/// The node's deploy key and agent token; the ramdisk sends others.
const KEY: &str = "0123456789ABCDEFGHIJKLMNOPQRSTUV";
const TOKEN: &str = "the-nodes-agent-token-0123456789";

/// One plain-HTTP call with Ironic's version header: the status and the JSON body.
async fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    let host = base.trim_start_matches("http://").to_owned();
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut sock = TcpStream::connect(&host).expect("connecting");
        sock.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("read timeout");
        let text = body.to_string();
        write!(
            sock,
            "POST {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\n\
             Content-Type: application/json\r\nX-OpenStack-Ironic-API-Version: {VERSION}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{text}",
            text.len()
        )
        .expect("sending");
        let mut raw = String::new();
        sock.read_to_string(&mut raw).expect("reading the answer");
        let (head, rest) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status line: {raw:?}"));
        let json = serde_json::from_str(rest).unwrap_or_else(|e| panic!("{e}: {rest:?}"));
        (status, json)
    })
    .await
    .expect("the call's thread")
}

/// The real router over a Manager whose one node (driver `driver`) waits for its ramdisk with
/// [`KEY`] and [`TOKEN`]; the caller keeps the returned parts alive.
struct RealApi {
    url: String,
    node: Node,
    _api: Api,
    _conductor: Conductor,
    _builtin: Builtin,
    _media: Media,
    _dir: tempfile::TempDir,
}

impl RealApi {
    async fn start(driver: &str) -> RealApi {
        let pki = TestPki::new();
        let builtin = Builtin::start(&pki).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let (listener, settings) =
            api_settings(Some(pki.ca_pem.clone()), Duration::from_secs(600)).await;
        let builder = Conductor::builder(
            &dir.path().join("vmdeploy.sqlite"),
            builtin.objects(),
            &settings,
        );
        let conductor = if driver == "iscsi_ilo" {
            let images = vmdeploy_conductor::image_cache::ImageCache::open_with(
                dir.path().join("images"),
                1 << 30,
                Default::default(),
            )
            .expect("image cache");
            builder.iscsi(images).start().await
        } else {
            builder.start().await
        };
        let api = Api::serve(listener, Arc::clone(&conductor.manager));
        let media = Media::new(&[1u8; 4096]);
        let driver_info = obj(json!({
            "ilo_address": "127.0.0.1:9",
            "ilo_username": "nobody",
            "ilo_password": "never-used",
        }));
        let mut node = enroll(
            &conductor.nodes,
            ProvisionState::WaitCallBack,
            driver_info,
            &media,
            &[1u8; 4096],
            json!({}),
        )
        .await;
        node.driver = driver.into();
        // Ironic's names of the two one-use secrets in driver_internal_info.
        node.driver_internal_info
            .insert("deployment_key".into(), json!(KEY));
        node.driver_internal_info
            .insert("agent_secret_token".into(), json!(TOKEN));
        conductor
            .nodes
            .update_node(&node)
            .await
            .expect("the node waits for its ramdisk");
        RealApi {
            url: settings.api_url,
            node,
            _api: api,
            _conductor: conductor,
            _builtin: builtin,
            _media: media,
            _dir: dir,
        }
    }
}

/// `body` as a fault, failing with `who` and the body when it is not one.
fn fault_of(who: &str, body: &Value) -> Fault {
    fault::parse(body).unwrap_or_else(|e| panic!("{who}'s refusal is not Ironic's fault: {e}"))
}

/// Posts `wrong` (a call-back with the wrong `secret_name`) to `path` on the real API and on
/// `standin` (named `who`): both must answer 403 with the same fault, and neither may show
/// `secret`, the node's real one.
async fn assert_same_refusal(
    real: &RealApi,
    (who, standin): (&str, &str),
    path: &str,
    wrong: Value,
    (secret_name, secret): (&str, &str),
) {
    let (api_status, api_body) = post(&real.url, path, wrong.clone()).await;
    let (standin_status, standin_body) = post(standin, path, wrong).await;

    assert_eq!(
        api_status, 403,
        "the API refuses a wrong {secret_name}: {api_body}"
    );
    assert_eq!(standin_status, api_status, "{who}: {standin_body}");
    let (api, standin) = (fault_of("the API", &api_body), fault_of(who, &standin_body));
    assert_eq!(standin, api, "{who}'s fault is the API's");
    assert!(
        !api_body.to_string().contains(secret) && !standin_body.to_string().contains(secret),
        "no answer shows the node's {secret_name}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_iscsi_standin_refuses_a_wrong_deploy_key_as_the_api_does() {
    let real = RealApi::start("iscsi_ilo").await;
    let uuid = real.node.uuid.to_string();
    let iqn = format!("iqn.2008-10.org.openstack:{uuid}");
    let standin = iscsi_standin::IscsiStandin::start(iscsi_standin::StandinConfig {
        node: uuid.clone(),
        key: KEY.into(),
        iqn: iqn.clone(),
        fail_first: 0,
        tls: None,
    });
    let path = format!("/v1/nodes/{uuid}/vendor_passthru/pass_deploy_info");
    let wrong = json!({"address": "127.0.0.1", "key": "ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ",
                       "iqn": iqn, "error": ""});

    let standin_url = standin.api_url();
    let asked = ("the iSCSI stand-in", standin_url.as_str());
    assert_same_refusal(&real, asked, &path, wrong, ("key", KEY)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ipa_standin_refuses_a_wrong_token_as_the_api_does() {
    let real = RealApi::start("agent_ilo").await;
    let uuid = real.node.uuid.to_string();
    let standin = ipa_standin::IpaStandin::start(ipa_standin::StandinConfig {
        node_uuid: uuid.clone(),
        macs: vec![vmdeploy_integration_tests::conductor_env::MAC.into()],
        token: TOKEN.into(),
        pregenerated: true,
        heartbeat_timeout: 300,
        max_version: ApiVersion::new(1, 72),
        properties: json!({}),
        lookup_misses: 0,
        heartbeat_conflicts: 0,
        auto_tls: false,
    });
    let path = format!("/v1/heartbeat/{uuid}");
    let wrong = json!({"callback_url": "http://127.0.0.1:9999", "agent_version": "10.0.0",
                       "agent_token": "not-the-nodes-token"});

    let standin_url = standin.url();
    let asked = ("the IPA stand-in", standin_url.as_str());
    assert_same_refusal(&real, asked, &path, wrong, ("token", TOKEN)).await;
}
