//! The fake-ramdisk harness (`src/fake_ramdisk.rs`) against the real conductor: ten `agent_ilo`
//! nodes of the in-memory iLO emulator, enrolled through `vmdeploy-conductor serve`'s API,
//! cleaned on `provide`, deployed all at once, undeployed (cleaned again) all at once: three
//! boots of the deploy media per node, each played by the harness, with no error counted.
//!
//! The conductor runs as an operator runs it: SQLite and the built-in object store in its state
//! directory, its API plain HTTP on loopback, `deploy.automated_clean` on, plain HTTP to agents
//! allowed (the harness runs half its nodes with auto-TLS, half without: both of the
//! conductor's agent clients), and a 1 s `deploy.agent_power_off_wait` (the in-memory host
//! never powers itself off). The image is a 1 MiB raw image served over HTTP with its sha256;
//! the harness downloads and checks it, so the conductor's `partition_uuids` carry the image's
//! own MBR signature.
//!
//! A second test deploys one node per firmware profile of the emulator (`--profile`), the
//! protocol chosen by the conductor's `auto` probe.
//!
//! Needs the built `ilo-emulator` and `vmdeploy-conductor` (`cargo build --workspace --bins`);
//! fails with that hint when either is missing.
//!
//! The same run at another scale, for a benchmark (release binaries through
//! `VMDEPLOY_BIN_DIR`): `FAKE_RAMDISK_NODES` (default 10), `FAKE_RAMDISK_PHASE_SECS` (each
//! phase's limit, default 45), `FAKE_RAMDISK_HEARTBEAT_SCALE` (default 0.02);
//! `FAKE_RAMDISK_VERBOSE=1` prints each node's events, `FAKE_RAMDISK_KEEP_DIR=1` keeps the
//! conductor's and the emulator's logs.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use sha2::{Digest, Sha256};
use vmdeploy_integration_tests::child::ChildGuard;
use vmdeploy_integration_tests::conductor_env::make_image;
use vmdeploy_integration_tests::emulator::MediaServer;
use vmdeploy_integration_tests::fake_ramdisk::{mac_plus, Config, Harness, TlsMode};
use vmdeploy_integration_tests::fleet::{
    from_env, harness_config, start_emulator, start_emulator_with, Api, VERSION,
};
use vmdeploy_integration_tests::free_port;

/// Node i's port MAC is this + i.
const MAC_BASE: &str = "52:54:00:fa:00:00";

/// Starts `vmdeploy-conductor serve` with its API on `port`; returns once it listens. Every
/// iLO's certificate is checked against `ilo_cert`, or, without it, against each node's
/// `ilo_verify_ca`.
fn start_conductor(dir: &Path, port: u16, ilo_cert: Option<&Path>) -> ChildGuard {
    let ilo = ilo_cert
        .map(|cert| format!("[ilo]\nverify_ca = \"{}\"\n\n", cert.display()))
        .unwrap_or_default();
    let config = format!(
        "[api]\nlisten = [\"127.0.0.1:{port}\"]\n\n\
         [deploy]\napi_url = \"http://127.0.0.1:{port}\"\nagent_allow_plain_http = true\n\
         agent_power_off_wait = 1\nautomated_clean = true\ndeploy_callback_timeout = 120\n\n\
         {ilo}[log]\nlevel = \"info\"\n"
    );
    vmdeploy_integration_tests::fleet::start_conductor(dir, port, &config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_agent_ilo_nodes_deploy_and_undeploy_through_fake_ramdisks() {
    let n: usize = from_env("FAKE_RAMDISK_NODES", 10);
    let started = Instant::now();
    let mut dir = tempfile::tempdir().expect("temp dir");
    if from_env("FAKE_RAMDISK_KEEP_DIR", 0) == 1 {
        dir.disable_cleanup(true);
        eprintln!("fake-ramdisk: logs kept in {}", dir.path().display());
    }
    let (_emulator, ilos) = start_emulator(dir.path(), n);
    let ilo_cert = dir.path().join("ilo-cert.pem");
    let image = make_image(1 << 20);
    let image_sha256 = hex::encode(Sha256::digest(&image));
    let media = MediaServer::start(vec![("/image.raw", image)]);
    let iso = dir.path().join("deploy.iso");
    std::fs::write(&iso, vec![0x5a; 64 * 1024]).expect("the deploy ISO stand-in");

    let macs: Vec<String> = (0..n)
        .map(|i| mac_plus(MAC_BASE, i).expect("a MAC"))
        .collect();
    let harness = Harness::start(Config {
        tls: TlsMode::Mixed,
        // At most ten reads a second per server, and 500 a second in all.
        poll_interval: Duration::from_millis((2 * n as u64).clamp(100, 5000)),
        heartbeat_scale: from_env("FAKE_RAMDISK_HEARTBEAT_SCALE", 0.02),
        write_delay: Duration::from_millis(300),
        verify_image: true,
        verbose: std::env::var_os("FAKE_RAMDISK_VERBOSE").is_some(),
        ..harness_config(&ilos, &macs, &ilo_cert)
    })
    .await
    .expect("the harness starts");

    let port = free_port();
    let _conductor = start_conductor(dir.path(), port, Some(&ilo_cert));
    let api = api_on(
        port,
        Duration::from_secs(from_env("FAKE_RAMDISK_PHASE_SECS", 45)),
    );

    let nodes = api.enroll("fake", &ilos, &macs, &iso, json!({})).await;

    api.provision_all(&nodes, "manage", "manageable", &harness)
        .await;
    // provide cleans first (automated_clean): the ramdisk's first boot.
    let cleaned = api
        .provision_all(&nodes, "provide", "available", &harness)
        .await;

    let image_url = media.url("/image.raw");
    for uuid in &nodes {
        api.call(
            reqwest::Method::PATCH,
            &format!("/v1/nodes/{uuid}"),
            Some(json!([
                {"op": "add", "path": "/instance_info/image_source", "value": image_url},
                {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
                {"op": "add", "path": "/instance_info/image_os_hash_value", "value": image_sha256},
                {"op": "add", "path": "/instance_info/image_disk_format", "value": "raw"},
            ])),
        )
        .await;
    }
    let deployed = api
        .provision_all(&nodes, "active", "active", &harness)
        .await;
    for uuid in &nodes {
        let node = api.node(uuid).await;
        // Recorded by the deploy that powered it on, not left for the power sync to find.
        assert_eq!(node["power_state"], "power on", "{node}");
        assert_eq!(
            node["driver_internal_info"]["partition_uuids"]["root uuid"], "0x12345678",
            "the image's own MBR signature, read by the harness: {node}"
        );
    }

    // Undeploy cleans again: the ramdisk's third boot.
    let undeployed = api
        .provision_all(&nodes, "deleted", "available", &harness)
        .await;

    let stats = harness.stats().to_json();
    eprintln!(
        "fake-ramdisk: {n} nodes: cleaned in {cleaned:.1?}, deployed in {deployed:.1?}, \
         undeployed in {undeployed:.1?}, {:.1?} in all\n{stats:#}",
        started.elapsed()
    );
    assert_eq!(harness.errors(), Vec::<String>::new(), "{stats:#}");
    let boots = 3 * n as u64;
    assert_eq!(stats["ramdisks_started"], boots, "{stats:#}");
    assert_eq!(stats["ramdisks_powered_off"], boots, "{stats:#}");
    assert_eq!(stats["ramdisks_stopped_by_bmc"], 0, "{stats:#}");
    assert_eq!(stats["lookups"], boots, "{stats:#}");
    let commands = &stats["commands_by_name"];
    for (command, count) in [
        ("standby.prepare_image", n),
        ("standby.get_partition_uuids", n),
        ("standby.power_off", 3 * n),
        ("clean.get_clean_steps", 2 * n),
        ("clean.execute_clean_step", 2 * n),
    ] {
        assert_eq!(commands[command], count as u64, "{command}: {stats:#}");
    }
    assert!(
        stats["heartbeats"].as_u64() >= Some(boots),
        "a heartbeat per boot at least: {stats:#}"
    );
    // Half the nodes spoke HTTPS (the conductor pinned their certificates), half plain HTTP.
    assert!(
        stats["api_tls_connections"].as_u64() > Some(0)
            && stats["api_tls_connections"].as_u64() < stats["api_requests"].as_u64(),
        "{stats:#}"
    );
    assert_eq!(harness.running(), 0, "every ramdisk ended: {stats:#}");
    harness.shutdown().await;
}

/// A client of the conductor's API on `port`, each provision phase within `phase_limit`.
fn api_on(port: u16, phase_limit: Duration) -> Api {
    Api {
        http: reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("an HTTP client"),
        url: format!("http://127.0.0.1:{port}"),
        phase_limit,
    }
}

/// `PUT …/states/power {"target": "power on"}` `times` times on `uuid`, each awaited (the
/// node's `target_power_state` cleared) before the next; a 409 (the node busy) is tried again.
async fn power_on_repeatedly(api: &Api, uuid: &str, times: usize) {
    for _ in 0..times {
        loop {
            let response = api
                .http
                .put(format!("{}/v1/nodes/{uuid}/states/power", api.url))
                .header(VERSION.0, VERSION.1)
                .json(&json!({"target": "power on"}))
                .send()
                .await
                .expect("the API answers");
            let status = response.status();
            if status == reqwest::StatusCode::CONFLICT {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            assert!(status.is_success(), "power on {uuid}: {status}");
            break;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let node = api.node(uuid).await;
            if node["target_power_state"].is_null() {
                assert_eq!(node["power_state"], "power on", "{node}");
                break;
            }
            assert!(Instant::now() < deadline, "power on never ended: {node}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// `GET /_emulator/state` of the server at `address` (its certificate not checked: test only).
fn emulator_state(address: &SocketAddr) -> serde_json::Value {
    let out = Command::new("curl")
        .args(["-sS", "-k", "--max-time", "10"])
        .arg(format!("https://{address}/_emulator/state"))
        .output()
        .expect("running curl");
    serde_json::from_slice(&out.stdout).expect("the emulator's state as JSON")
}

/// SIGTERM, then the exit within 30 s (the conductor closes its BMC sessions on the way out).
fn stop_gracefully(mut child: ChildGuard) {
    let pid = libc::pid_t::try_from(child.id()).expect("a pid");
    // SAFETY: kill takes plain integers and touches no memory of ours.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            assert!(status.success(), "the conductor exited with {status}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the conductor did not stop within 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The firmware profiles of the emulator (`ilo-emulator --list-profiles`) besides the default
/// `lab`, with the protocol the conductor's `auto` probe must choose for each.
const PROFILES: [(&str, &str); 6] = [
    ("ilo4-gen8-ribcl", "ribcl"),
    ("ilo4-gen9-2.7x", "ribcl"),
    ("ilo5-1.1x", "redfish"),
    ("ilo5-2.7x", "redfish"),
    ("ilo5-3.x", "redfish"),
    ("ilo6-1.6x", "redfish"),
];

/// One `agent_ilo` node per firmware profile, `ilo_protocol = auto`, cleaned, deployed and
/// undeployed at once: the conductor must choose the protocol by asking each iLO and get
/// through every quirk a deploy meets there (RIBCL disabled, no Redfish, 308 slash redirects,
/// OEM-only virtual media, read-only override mode, strict Boot PATCH, resets refused soon after
/// a power change, boot changes refused during POST, the boot-once flag on the CD only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_ilo_deploys_through_every_firmware_profile() {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut emulators = Vec::new();
    let mut ilos = Vec::new();
    let mut certs = Vec::new();
    for (profile, _) in PROFILES {
        let sub = dir.path().join(profile);
        std::fs::create_dir_all(&sub).expect("a directory per profile");
        let (guard, addresses) = start_emulator_with(&sub, 1, &["--profile", profile]);
        emulators.push(guard);
        ilos.extend(addresses);
        certs.push(sub.join("ilo-cert.pem"));
    }
    let image = make_image(1 << 20);
    let image_sha256 = hex::encode(Sha256::digest(&image));
    let media = MediaServer::start(vec![("/image.raw", image)]);
    let iso = dir.path().join("deploy.iso");
    std::fs::write(&iso, vec![0x5a; 64 * 1024]).expect("the deploy ISO stand-in");
    let macs: Vec<String> = (0..PROFILES.len())
        .map(|i| mac_plus(MAC_BASE, 0x40 + i).expect("a MAC"))
        .collect();
    let harness = Harness::start(Config {
        tls: TlsMode::Mixed,
        poll_interval: Duration::from_millis(200),
        heartbeat_scale: 0.02,
        write_delay: Duration::from_millis(300),
        verify_image: true,
        // Six emulators, six certificates: the harness reads their state without pinning.
        emulator_ca_pem: None,
        ..harness_config(&ilos, &macs, &certs[0])
    })
    .await
    .expect("the harness starts");

    let port = free_port();
    let conductor = start_conductor(dir.path(), port, None);
    let api = api_on(port, Duration::from_secs(120));
    let nodes = api.enroll("profile", &ilos, &macs, &iso, json!({})).await;
    for (uuid, cert) in nodes.iter().zip(&certs) {
        api.call(
            reqwest::Method::PATCH,
            &format!("/v1/nodes/{uuid}"),
            Some(json!([
                {"op": "replace", "path": "/driver_info/ilo_protocol", "value": "auto"},
                {"op": "add", "path": "/driver_info/ilo_verify_ca", "value": cert},
            ])),
        )
        .await;
    }
    api.provision_all(&nodes, "manage", "manageable", &harness)
        .await;
    for (uuid, (profile, protocol)) in nodes.iter().zip(PROFILES) {
        let node = api.node(uuid).await;
        assert_eq!(
            node["driver_internal_info"]["bmc_protocol"]["protocol"], protocol,
            "{profile}: the probe's choice: {node}"
        );
    }
    api.provision_all(&nodes, "provide", "available", &harness)
        .await;
    let image_url = media.url("/image.raw");
    for uuid in &nodes {
        api.call(
            reqwest::Method::PATCH,
            &format!("/v1/nodes/{uuid}"),
            Some(json!([
                {"op": "add", "path": "/instance_info/image_source", "value": image_url},
                {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
                {"op": "add", "path": "/instance_info/image_os_hash_value", "value": image_sha256},
                {"op": "add", "path": "/instance_info/image_disk_format", "value": "raw"},
            ])),
        )
        .await;
    }
    // Secure Boot, asked the way a flavor asks (instance capabilities): the Redfish nodes turn
    // it on through the iLO before the deploy boots and off again at undeploy. RIBCL has no
    // Secure Boot command, so validate refuses it on an iLO 4 with that reason; the iLO 4
    // nodes then deploy without it.
    let secure_boot = |on: bool| {
        json!([{"op": "add", "path": "/instance_info/capabilities",
                "value": {"secure_boot": if on { "true" } else { "false" }}}])
    };
    for (uuid, (profile, protocol)) in nodes.iter().zip(PROFILES) {
        let path = format!("/v1/nodes/{uuid}");
        api.call(reqwest::Method::PATCH, &path, Some(secure_boot(true)))
            .await;
        let validation = api
            .call(reqwest::Method::GET, &format!("{path}/validate"), None)
            .await;
        let deploy = &validation["deploy"];
        if protocol == "ribcl" {
            assert_eq!(deploy["result"], false, "{profile}: {validation}");
            let reason = deploy["reason"].as_str().unwrap_or_default();
            assert!(
                reason.contains("RIBCL has no Secure Boot command") && reason.contains("RBSU"),
                "{profile}: {reason}"
            );
            api.call(reqwest::Method::PATCH, &path, Some(secure_boot(false)))
                .await;
        } else {
            assert_eq!(deploy["result"], true, "{profile}: {validation}");
        }
    }
    let secure_boot_of = |ilo: &SocketAddr| emulator_state(ilo)["secure_boot"]["enable"].clone();
    for (ilo, (profile, _)) in ilos.iter().zip(PROFILES) {
        assert_eq!(
            secure_boot_of(ilo),
            false,
            "{profile}: off before the deploy"
        );
    }
    api.provision_all(&nodes, "active", "active", &harness)
        .await;
    for ((uuid, ilo), (profile, protocol)) in nodes.iter().zip(&ilos).zip(PROFILES) {
        let on = protocol == "redfish";
        assert_eq!(
            secure_boot_of(ilo),
            on,
            "{profile}: Secure Boot once active"
        );
        let node = api.node(uuid).await;
        assert_eq!(
            node["driver_internal_info"]["secure_boot_enabled_by_vmdeploy"].as_bool(),
            on.then_some(true),
            "{profile}: {node}"
        );
    }
    api.provision_all(&nodes, "deleted", "available", &harness)
        .await;
    for ((uuid, ilo), (profile, _)) in nodes.iter().zip(&ilos).zip(PROFILES) {
        assert_eq!(
            secure_boot_of(ilo),
            false,
            "{profile}: off again after undeploy"
        );
        let node = api.node(uuid).await;
        assert!(
            node["driver_internal_info"]
                .get("secure_boot_enabled_by_vmdeploy")
                .is_none(),
            "{profile}: {node}"
        );
    }

    // 100 power actions on each node: the conductor keeps one Redfish session per iLO, and
    // closes every session it opened when it stops.
    for uuid in &nodes {
        power_on_repeatedly(&api, uuid, 100).await;
    }
    let sessions = |emulator: &SocketAddr| {
        let state = emulator_state(emulator);
        (
            state["sessions"]["live"].as_u64().unwrap_or(u64::MAX),
            state["sessions"]["opened"].as_u64().unwrap_or(0),
        )
    };
    for (ilo, (profile, protocol)) in ilos.iter().zip(PROFILES) {
        let (live, opened) = sessions(ilo);
        if protocol == "redfish" {
            assert!(opened >= 1, "{profile}: the conductor used sessions");
            assert!(live <= 1, "{profile}: {live} sessions open at once");
        }
    }
    stop_gracefully(conductor);
    for (ilo, (profile, _)) in ilos.iter().zip(PROFILES) {
        let (live, opened) = sessions(ilo);
        assert_eq!(live, 0, "{profile}: sessions left open ({opened} opened)");
    }

    let stats = harness.stats().to_json();
    eprintln!(
        "firmware profiles: {} nodes in {:.1?}\n{stats:#}",
        nodes.len(),
        started.elapsed()
    );
    assert_eq!(harness.errors(), Vec::<String>::new(), "{stats:#}");
    let boots = 3 * PROFILES.len() as u64;
    assert_eq!(stats["ramdisks_started"], boots, "{stats:#}");
    assert_eq!(stats["ramdisks_powered_off"], boots, "{stats:#}");
    assert_eq!(harness.running(), 0, "every ramdisk ended: {stats:#}");
    harness.shutdown().await;
}

/// An iLO 5 whose BIOS refuses the UEFI mode the node asks for: the deploy ramdisk boots in
/// legacy BIOS anyway, and the deploy fails at the ramdisk's first heartbeat, before any image
/// is written, with the BIOS's own settings message in `last_error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_mode_the_bios_refused_fails_the_deploy_with_its_message() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_emulator, ilos) = start_emulator_with(dir.path(), 1, &["--profile", "ilo5-2.7x"]);
    let ilo_cert = dir.path().join("ilo-cert.pem");
    let image = make_image(1 << 20);
    let image_sha256 = hex::encode(Sha256::digest(&image));
    let media = MediaServer::start(vec![("/image.raw", image)]);
    let iso = dir.path().join("deploy.iso");
    std::fs::write(&iso, vec![0x5a; 64 * 1024]).expect("the deploy ISO stand-in");
    let macs = vec![mac_plus(MAC_BASE, 0x60).expect("a MAC")];
    let harness = Harness::start(Config {
        tls: TlsMode::Mixed,
        poll_interval: Duration::from_millis(200),
        heartbeat_scale: 0.02,
        write_delay: Duration::from_millis(300),
        ..harness_config(&ilos, &macs, &ilo_cert)
    })
    .await
    .expect("the harness starts");
    let port = free_port();
    let _conductor = start_conductor(dir.path(), port, Some(&ilo_cert));
    let api = api_on(port, Duration::from_secs(60));
    let nodes = api
        .enroll(
            "refused",
            &ilos,
            &macs,
            &iso,
            json!({"properties": {"capabilities": "boot_mode:uefi"}}),
        )
        .await;
    let uuid = &nodes[0];
    api.call(
        reqwest::Method::PATCH,
        &format!("/v1/nodes/{uuid}"),
        Some(json!([
            {"op": "replace", "path": "/driver_info/ilo_protocol", "value": "auto"},
            {"op": "add", "path": "/instance_info/image_source", "value": media.url("/image.raw")},
            {"op": "add", "path": "/instance_info/image_os_hash_algo", "value": "sha256"},
            {"op": "add", "path": "/instance_info/image_os_hash_value", "value": image_sha256},
            {"op": "add", "path": "/instance_info/image_disk_format", "value": "raw"},
        ])),
    )
    .await;
    api.provision_all(&nodes, "manage", "manageable", &harness)
        .await;
    // From now on the BIOS refuses every boot-mode change: cleaning's ramdisk boots in legacy
    // BIOS (erasing does not care), the deploy's must not write an image in the wrong mode.
    let refusal = "iLO.2.15.PropertyValueIncompatible";
    let out = Command::new("curl")
        .args(["-sS", "-k", "--max-time", "10", "-X", "PUT", "-d"])
        .arg(json!({"message_id": refusal}).to_string())
        .arg(format!("https://{}/_emulator/bios-reject", ilos[0]))
        .output()
        .expect("running curl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    api.provision_all(&nodes, "provide", "available", &harness)
        .await;
    api.call(
        reqwest::Method::PUT,
        &format!("/v1/nodes/{uuid}/states/provision"),
        Some(json!({"target": "active"})),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(90);
    let node = loop {
        let node = api.node(uuid).await;
        if node["provision_state"] == "deploy failed" {
            break node;
        }
        assert_ne!(
            node["provision_state"], "active",
            "deployed in the wrong mode: {node}"
        );
        assert!(Instant::now() < deadline, "no failure within 90 s: {node}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let error = node["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("boot mode uefi did not apply") && error.contains(refusal),
        "{error}"
    );
    let state = emulator_state(&ilos[0]);
    assert_eq!(state["boot_mode"]["current"], "LEGACY", "{state}");
    let stats = harness.stats().to_json();
    assert_eq!(
        stats["commands_by_name"]["standby.prepare_image"]
            .as_u64()
            .unwrap_or(0),
        0,
        "no image was written: {stats:#}"
    );
    harness.shutdown().await;
}
