//! The BMC layer: settings per driver, the protocol memory, and messages that name the node's
//! own keys.

use serde_json::{json, Value};
use uuid::Uuid;

use super::*;
use crate::drivers::ilo::ribcl::codec::samples::reply_with;
use crate::drivers::ilo::test_server::{Reply, TestServer};
use crate::drivers::ilo::TlsVerify;
use crate::states::ProvisionState;

fn node(driver: &str, info: Value) -> Node {
    let mut node = Node::new(Uuid::new_v4(), driver, ProvisionState::Manageable);
    node.driver_info = info.as_object().expect("an object").clone();
    node
}

fn settings(driver: &str, info: Value) -> Result<BmcDriverInfo, BmcError> {
    Bmc::settings(&node(driver, info), &IloDefaults::default())
}

#[test]
fn a_redfish_node_is_read_from_ironics_redfish_keys() {
    let read = settings(
        "redfish",
        json!({"redfish_address": "https://10.0.0.9:8443/", "redfish_username": "u",
               "redfish_password": "p", "redfish_verify_ca": false,
               "redfish_system_id": "/redfish/v1/Systems/blade2"}),
    )
    .expect("readable");
    assert_eq!(read.keys, BmcKeys::REDFISH);
    let config = read.config;
    assert_eq!(config.base_url().expect("url"), "https://10.0.0.9:8443");
    assert_eq!(config.protocol, Protocol::Redfish);
    assert_eq!(config.username, "u");
    assert_eq!(config.tls, TlsVerify::Insecure);
    assert_eq!(
        config.redfish_system.as_deref(),
        Some("/redfish/v1/Systems/blade2")
    );

    // Ironic's defaults: https and its port when the URL has none; the system is optional;
    // redfish_verify_ca as a boolean in a string or a CA file.
    for (verify, want) in [
        (json!("True"), TlsVerify::System),
        (json!("false"), TlsVerify::Insecure),
        (
            json!("/etc/vmdeploy/bmc-ca.pem"),
            TlsVerify::CaFile("/etc/vmdeploy/bmc-ca.pem".into()),
        ),
    ] {
        let config = settings(
            "redfish",
            json!({"redfish_address": "bmc.example", "redfish_username": "u",
                   "redfish_password": "p", "redfish_verify_ca": verify}),
        )
        .expect("readable")
        .config;
        assert_eq!(config.base_url().expect("url"), "https://bmc.example:443");
        assert_eq!(config.redfish_system, None);
        assert_eq!(config.tls, want);
    }
}

#[test]
fn a_bad_redfish_driver_info_names_the_redfish_key() {
    let base = json!({"redfish_address": "https://10.0.0.9", "redfish_username": "u",
                      "redfish_password": "p"});
    let with = |key: &str, value: Value| {
        let mut info = base.clone();
        info[key] = value;
        info
    };
    let without = |key: &str| {
        let mut info = base.clone();
        info.as_object_mut().expect("object").remove(key);
        info
    };
    let cases = [
        (without("redfish_address"), "redfish_address"),
        (without("redfish_password"), "redfish_password"),
        (
            with("redfish_address", json!("http://10.0.0.9")),
            "redfish_address",
        ),
        (
            with("redfish_address", json!("https://")),
            "redfish_address",
        ),
        (with("redfish_verify_ca", json!(7)), "redfish_verify_ca"),
        (
            with("redfish_system_id", json!("Systems/1")),
            "redfish_system_id",
        ),
        (with("redfish_system_id", json!(1)), "redfish_system_id"),
    ];
    for (info, key) in cases {
        let err = settings("redfish", info.clone()).expect_err("refused");
        let text = err.to_string();
        assert!(
            text.contains(&format!("driver_info.{key}")),
            "{info}: {text}"
        );
        assert!(!text.contains("ilo_"), "{info}: {text}");
    }
}

#[test]
fn which_keys_a_node_is_read_from() {
    let ilo = json!({"ilo_address": "10.0.0.5", "ilo_username": "u", "ilo_password": "p"});
    // An iLO driver reads ilo_* keys and probes for the protocol.
    let read = settings("agent_ilo", ilo.clone()).expect("ilo keys");
    assert_eq!(read.keys, BmcKeys::ILO);
    assert_eq!(read.config.protocol, Protocol::Auto);
    // A redfish node enrolled with ilo_* keys keeps working, over Redfish.
    let read = settings("redfish", ilo.clone()).expect("ilo keys on redfish");
    assert_eq!(read.keys, BmcKeys::ILO);
    assert_eq!(read.config.protocol, Protocol::Redfish);
    // An iLO driver given only redfish_* keys is told about its own keys.
    let err = settings(
        "iscsi_ilo",
        json!({"redfish_address": "10.0.0.5", "redfish_username": "u", "redfish_password": "p"}),
    )
    .expect_err("no ilo_address");
    assert!(err.to_string().contains("driver_info.ilo_address"), "{err}");
    // A redfish node with neither is asked for Ironic's key.
    let err = settings("redfish", json!({})).expect_err("nothing");
    assert!(
        err.to_string().contains("driver_info.redfish_address"),
        "{err}"
    );
}

/// An iLO 4 without Redfish that answers the `auto` probe (`/xmldata`) and power reads.
async fn ilo4() -> TestServer {
    TestServer::start(|req| {
        if req.path.starts_with("/xmldata") {
            Reply::ok("<RIMP><HSI><SPN>ProLiant DL380p Gen8</SPN></HSI><MP><PN>Integrated Lights-Out 4 (iLO 4)</PN><FWRI>2.10</FWRI></MP></RIMP>")
        } else if req.path.starts_with("/redfish") {
            Reply::status(404, "<html>Not Found</html>")
        } else {
            Reply::ok(reply_with("<GET_HOST_POWER HOST_POWER=\"ON\"/>"))
        }
    })
    .await
}

fn probes(server: &TestServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.path.starts_with("/xmldata"))
        .count()
}

#[tokio::test]
async fn an_auto_probe_is_made_once_and_remembered_in_driver_internal_info() {
    let server = ilo4().await;
    let mut node = node(
        "agent_ilo",
        json!({"ilo_address": server.address, "ilo_username": "u", "ilo_password": "p",
               "ilo_verify_ca": server.cert_path, "client_timeout": 5}),
    );
    let defaults = IloDefaults::default();
    let bmc = Bmc::connect(&mut node, &defaults).await.expect("connects");
    assert_eq!(bmc.power_state().await.expect("power"), PowerState::On);
    assert_eq!(probes(&server), 1);
    let address = format!("https://{}", server.address);
    assert_eq!(
        node.driver_internal_info[PROTOCOL_KEY],
        json!({"address": address, "protocol": "ribcl"})
    );
    // Later tasks connect without asking again.
    for _ in 0..3 {
        let bmc = Bmc::connect(&mut node, &defaults).await.expect("connects");
        assert_eq!(bmc.power_state().await.expect("power"), PowerState::On);
    }
    let bmc = Bmc::connect_read_only(&node, &defaults)
        .await
        .expect("connects");
    assert_eq!(bmc.power_state().await.expect("power"), PowerState::On);
    assert_eq!(probes(&server), 1, "the remembered choice is used");

    // A choice remembered for another address is not used; an explicit protocol is not
    // remembered.
    assert_eq!(
        remembered(&node.driver_internal_info, "https://10.9.9.9:443"),
        None
    );
    assert_eq!(
        remembered(&node.driver_internal_info, &address),
        Some(Protocol::Ribcl)
    );
    let mut explicit = node.clone();
    explicit.driver_internal_info.clear();
    explicit
        .driver_info
        .insert("ilo_protocol".into(), json!("ribcl"));
    Bmc::connect(&mut explicit, &defaults)
        .await
        .expect("connects");
    assert!(!explicit.driver_internal_info.contains_key(PROTOCOL_KEY));
    assert_eq!(probes(&server), 1);
}

#[tokio::test]
async fn a_failed_step_names_the_bmc_the_step_and_the_nodes_keys() {
    let server = TestServer::start(|_| Reply::status(401, "")).await;
    let mut node = node(
        "redfish",
        json!({"redfish_address": format!("https://{}", server.address),
               "redfish_username": "u", "redfish_password": "s3cret",
               "redfish_verify_ca": server.cert_path, "client_timeout": 5}),
    );
    let bmc = Bmc::connect(&mut node, &IloDefaults::default())
        .await
        .expect("nothing is sent yet");
    let err = bmc.power_state().await.expect_err("refused");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "Redfish BMC https://{}: reading the power state: ",
            server.address
        )),
        "{text}"
    );
    assert!(err.driver_error().is_some(), "{err:?}");
    assert!(!text.contains("s3cret"), "{text}");
    assert!(!text.contains("ilo_"), "{text}");
    assert!(
        text.contains("check redfish_username and redfish_password"),
        "{text}"
    );
}

/// An emulated iLO 5 and a `redfish` node of it (Ironic's keys); the temp dir holds its
/// certificate.
async fn emulated_redfish_node() -> (
    vmdeploy_ilo_emulator::Emulator,
    Node,
    String,
    tempfile::TempDir,
) {
    let emulator =
        vmdeploy_ilo_emulator::Emulator::start(vmdeploy_ilo_emulator::EmulatorConfig::loopback())
            .await
            .expect("emulator starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let cert = dir.path().join("ilo-cert.pem");
    std::fs::write(&cert, emulator.cert_pem()).expect("writing the emulator's cert");
    let base = format!("https://{}", emulator.addresses()[0]);
    let node = node(
        "redfish",
        json!({"redfish_address": base, "redfish_username": "Administrator",
               "redfish_password": "password", "redfish_verify_ca": cert,
               "redfish_system_id": "/redfish/v1/Systems/1", "client_timeout": 10}),
    );
    (emulator, node, base, dir)
}

/// A task's `Bmc` against the emulated iLO with `sessions`: reads the power.
async fn read_power_with(node: &Node, sessions: &RedfishSessions) -> PowerState {
    let (bmc, _) = Bmc::open_with(node, &IloDefaults::default(), sessions)
        .await
        .expect("connects");
    bmc.power_state().await.expect("power state")
}

/// Ten tasks of one node, each with its own `Bmc`, make one Redfish login; the session stays
/// live on the iLO until the cache logs it out at shutdown.
#[tokio::test]
async fn the_bmcs_of_one_node_share_one_redfish_session() {
    let (emulator, node, base, _dir) = emulated_redfish_node().await;
    let ilo = emulator.server(0).expect("server 0").clone();
    let sessions = RedfishSessions::new(Duration::from_secs(300));
    for _ in 0..10 {
        assert_eq!(read_power_with(&node, &sessions).await, PowerState::Off);
    }
    assert_eq!(sessions.logins(), 1);
    let token = sessions
        .token(&base, "Administrator")
        .expect("a cached session");
    assert!(ilo.session_ok(&token));

    // The iLO ends the session (its idle timeout, a reset): the next task logs in once.
    assert!(ilo.end_session(&token));
    for _ in 0..3 {
        assert_eq!(read_power_with(&node, &sessions).await, PowerState::Off);
    }
    assert_eq!(sessions.logins(), 2);
    let renewed = sessions
        .token(&base, "Administrator")
        .expect("a cached session");
    assert_ne!(renewed, token);
    assert!(ilo.session_ok(&renewed));

    // Shutdown logs it out on the iLO.
    sessions.close_all().await;
    assert!(!ilo.session_ok(&renewed));
    assert_eq!(sessions.logouts(), 1);
    assert!(sessions.is_empty());
}

/// A session left idle is logged out on the iLO by the sweep.
#[tokio::test]
async fn an_idle_redfish_session_is_logged_out_on_the_ilo() {
    let (emulator, node, base, _dir) = emulated_redfish_node().await;
    let ilo = emulator.server(0).expect("server 0").clone();
    let sessions = RedfishSessions::new(Duration::from_millis(200));
    assert_eq!(read_power_with(&node, &sessions).await, PowerState::Off);
    let token = sessions
        .token(&base, "Administrator")
        .expect("a cached session");
    assert!(ilo.session_ok(&token));
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while ilo.session_ok(&token) {
        assert!(
            std::time::Instant::now() < until,
            "the idle session is still open after 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sessions.token(&base, "Administrator"), None);
}

/// `Bmc::connect` hands its Redfish client the conductor's cache, the one `serve` logs out
/// at shutdown.
#[tokio::test]
async fn bmc_connect_uses_the_conductors_session_cache() {
    let (emulator, mut node, base, _dir) = emulated_redfish_node().await;
    let ilo = emulator.server(0).expect("server 0").clone();
    for _ in 0..3 {
        let bmc = Bmc::connect(&mut node, &IloDefaults::default())
            .await
            .expect("connects");
        assert_eq!(bmc.power_state().await.expect("power"), PowerState::Off);
    }
    let token = RedfishSessions::conductor()
        .token(&base, "Administrator")
        .expect("the session is in the conductor's cache");
    assert!(ilo.session_ok(&token));
}
