//! The agent's `agent_ilo` mode end to end, through the binary (`vmdeploy-agent run`): a floppy
//! on a loop device, the install disk on another loop device, the image from a local HTTP
//! server, and [`IpaStandin`] checking every lookup and heartbeat field (the `https://` callback
//! and its certificate in `agent_verify_ca`, Ironic's auto-TLS) while [`AgentDriver`] drives
//! `/v1/commands` as Ironic does, over HTTPS pinned to that certificate; and the conductor's own
//! [`AgentClient`] against the same agent.

use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use md5::Md5;
use serde_json::{json, Value};
use sha2::{Digest, Sha256, Sha512};
use vmdeploy_conductor::deploy::agent_session::client::{
    AgentClient, AgentClientError, AgentEndpoint,
};
use vmdeploy_integration_tests::conductor_env::{make_image_seeded, AgentProcess};
use vmdeploy_integration_tests::http::{ServerConfig, TestHttpServer};
use vmdeploy_integration_tests::ipa_standin::{
    assert_raw_command_result, call, cert_valid_for, AgentDriver, IpaStandin, StandinConfig,
};
use vmdeploy_integration_tests::loopdev::{LoopDevice, LoopIo};
use vmdeploy_integration_tests::{bin, free_port};
use vmdeploy_shared::api::ipa::{ApiVersion, CommandStatus};

const MIB: usize = 1024 * 1024;
const DISK_LEN: u64 = 48 * MIB as u64;
const FILL: u8 = 0xAA;
const NODE: &str = "1be26c0b-03f2-4d2e-ae87-c02d7f33c123";
const MAC: &str = "52:54:00:12:34:56";
/// A FAT label of these tests' own, so floppy searches of other tests never find ours.
const LABEL: &str = "ir-vfd-amt";
/// What a current Ironic claims in `GET /`.
const NEWEST: ApiVersion = ApiVersion::new(1, 92);

/// Everything one test needs: disk, floppy, stand-in, agent.
struct Rig {
    disk: LoopDevice,
    _floppy: LoopDevice,
    standin: IpaStandin,
    agent: AgentProcess,
    driver: AgentDriver,
    /// The agent's cmdline file and log; removed after the agent is killed.
    _agent_dir: tempfile::TempDir,
}

/// Starts the stand-in and the agent; `floppy_hints` puts `root_device=name=<disk>` on the
/// floppy, else the lookup's node properties carry the hints; `pregenerated` puts the token on
/// the floppy (the lookup then masks it), else the lookup discloses it. The stand-in claims
/// `max_version` in `GET /`. `auto_tls` false puts `ipa-enable-auto-tls=0` on the floppy.
fn rig(
    floppy_hints: bool,
    pregenerated: bool,
    max_version: ApiVersion,
    heartbeat_conflicts: u32,
    auto_tls: bool,
) -> Rig {
    let disk = LoopDevice::attach(&vec![FILL; DISK_LEN as usize], DISK_LEN, LoopIo::Direct);
    let disk_name = disk.device().display().to_string();
    let token = "vmdeploy-test-token-0123456789abcdefghijklmnop".to_owned();
    let properties = if floppy_hints {
        json!({"cpus": 2})
    } else {
        json!({"root_device": {"name": disk_name}})
    };
    let standin = IpaStandin::start(StandinConfig {
        node_uuid: NODE.into(),
        macs: vec![MAC.into()],
        token: token.clone(),
        pregenerated,
        heartbeat_timeout: 2,
        max_version,
        properties,
        lookup_misses: 1,
        heartbeat_conflicts,
        auto_tls,
    });
    let mut params = format!("ipa-api-url={}\n", standin.url());
    if pregenerated {
        params.push_str(&format!("ipa-agent-token={token}\n"));
    }
    if floppy_hints {
        params.push_str(&format!("root_device=name={disk_name}\n"));
    }
    if !auto_tls {
        params.push_str("ipa-enable-auto-tls=0\n");
    }
    let image = vmdeploy_shared::fat::build_floppy(LABEL, &[("parameters.txt", params.as_bytes())])
        .expect("building the floppy");
    let floppy = LoopDevice::attach(&image, 0, LoopIo::Buffered);

    let dir = tempfile::tempdir().expect("temp dir");
    let (agent, listen) = AgentProcess::spawn(dir.path(), floppy.device(), LABEL);
    let first = standin.wait_for_heartbeat(Duration::from_secs(40));
    let Some(first) = first else {
        panic!(
            "no heartbeat within 40 s; violations {:?}\n--- agent log ---\n{}",
            standin.violations(),
            agent.log()
        );
    };
    let base = format!("{}://{listen}", if auto_tls { "https" } else { "http" });
    assert_eq!(first.body.callback_url, base);
    assert!(
        standin.lookups() >= 2,
        "the first lookup was answered 404 and retried"
    );
    let cert_pem = standin.pinned_cert();
    if auto_tls {
        let pem = cert_pem
            .as_deref()
            .expect("agent_verify_ca in the heartbeat");
        assert_eq!(first.body.agent_verify_ca.as_deref(), Some(pem));
        cert_valid_for(pem, std::net::Ipv4Addr::LOCALHOST.into()).expect("a cert for 127.0.0.1");
    } else {
        assert!(cert_pem.is_none() && first.body.agent_verify_ca.is_none());
    }
    Rig {
        disk,
        _floppy: floppy,
        standin,
        agent,
        driver: AgentDriver {
            base,
            token,
            cert_pem,
        },
        _agent_dir: dir,
    }
}

fn hex_digest(algo: &str, data: &[u8]) -> String {
    match algo {
        "md5" => hex::encode(Md5::digest(data)),
        "sha256" => hex::encode(Sha256::digest(data)),
        "sha512" => hex::encode(Sha512::digest(data)),
        other => panic!("no such algorithm {other}"),
    }
}

fn serve(body: Vec<u8>) -> TestHttpServer {
    TestHttpServer::start(ServerConfig {
        body: Arc::new(body),
        ..Default::default()
    })
}

fn assert_disk_holds(disk: &LoopDevice, image: &[u8]) {
    let got = disk.contents();
    assert_eq!(got.len() as u64, DISK_LEN);
    if got[..image.len()] != image[..] {
        let at = got.iter().zip(image).position(|(a, b)| a != b).unwrap_or(0);
        panic!("the disk differs from the image at byte {at}");
    }
}

fn power_off_and_exit(rig: &mut Rig) {
    let (status, body) = rig.driver.post("standby.power_off", json!({}), true);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["command_status"], "SUCCEEDED", "{body}");
    let code = rig.agent.wait_exit(Duration::from_secs(30));
    assert_eq!(code, Some(0), "the agent exits 0 after power_off");
    assert!(
        rig.standin.violations().is_empty(),
        "protocol violations: {:?}",
        rig.standin.violations()
    );
}

#[test]
fn full_flow_writes_the_disk_reports_progress_and_powers_off() {
    let mut rig = rig(false, true, NEWEST, 0, true);
    let image = make_image_seeded(40 * MIB, 7);
    let server = serve(image.clone());

    // Every call needs the token.
    let (status, _) = rig
        .driver
        .call("GET", "/v1/commands/?agent_token=wrong", None);
    assert_eq!(status, 401, "a wrong token is refused");
    let (status, _) = rig.driver.call("GET", "/v1/commands/", None);
    assert_eq!(status, 401, "a missing token is refused");
    // Only TLS is spoken on the command port.
    let plain = rig.driver.base.replace("https://", "http://");
    let q = format!("/v1/commands/?agent_token={}", rig.driver.token);
    assert!(
        !matches!(call(&plain, None, "GET", &q, None), Ok((200, _))),
        "plain HTTP answered on the TLS port"
    );

    let info = json!({"image_info": {
        "id": "test-image", "urls": [server.url("/image.raw")],
        "disk_format": "raw", "container_format": "bare",
        "os_hash_algo": "sha256", "os_hash_value": hex_digest("sha256", &image),
    }});
    let (status, body) = rig.driver.post("standby.prepare_image", info, false);
    assert_eq!(status, 200, "{body}");
    let id = body["id"].as_str().expect("command id").to_owned();
    // One command at a time: a second one while prepare_image runs is 409.
    let (status, second) = rig.driver.post("standby.sync", json!({}), false);
    assert_eq!(
        status, 409,
        "a second command while one runs is refused: {second}"
    );
    let started = Instant::now();
    let result = loop {
        let list = rig.driver.list();
        let last = list.commands.last().expect("listed").clone();
        assert_eq!(last.id, id);
        if last.command_status != CommandStatus::Running {
            break last;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "prepare_image hung"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        result.command_status,
        CommandStatus::Succeeded,
        "{:?}",
        result.command_error
    );
    assert_disk_holds(&rig.disk, &image);
    assert!(
        rig.disk.contents()[image.len()..]
            .iter()
            .all(|&b| b == FILL),
        "nothing written past the image"
    );

    // The conductor learns progress from heartbeats: wait for one sent after the write ended.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let done = rig
            .standin
            .heartbeats()
            .iter()
            .filter_map(|h| h.progress)
            .any(|p| p.written == image.len() as u64);
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no heartbeat reported the finished write"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let beats = rig.standin.heartbeats();
    let reports: Vec<_> = beats.iter().filter_map(|h| h.progress).collect();
    for p in &reports {
        // Before the response headers arrive the size is not known yet.
        assert!(
            p.total.is_none() || p.total == Some(image.len() as u64),
            "total is the download size: {p:?}"
        );
        assert!(p.written <= image.len() as u64, "{p:?}");
    }
    let last = reports.last().expect("progress reported");
    assert_eq!(last.total, Some(image.len() as u64));
    assert!(last.rate > 0, "{last:?}");
    assert!(beats.len() >= 2, "heartbeats keep coming: {}", beats.len());
    // heartbeat_timeout 2 s: IPA's rule spaces them 0.6..1.2 s apart (5..10 s after an error).
    for pair in beats.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(gap <= Duration::from_millis(1500), "heartbeat gap {gap:?}");
    }

    let uuids = rig.driver.run(
        "standby.get_partition_uuids",
        json!({}),
        Duration::from_secs(30),
    );
    assert_eq!(uuids.command_status, CommandStatus::Succeeded);
    let r: &Value = uuids.command_result.as_ref().expect("result");
    assert_eq!(r["root uuid"], "0x12345678", "{r}");
    assert_eq!(r["vmdeploy_table"], "mbr", "{r}");
    assert_eq!(r["vmdeploy_partitions"][0]["first_lba"], 2048, "{r}");

    let sync = rig
        .driver
        .run("standby.sync", json!({}), Duration::from_secs(30));
    assert_eq!(sync.command_status, CommandStatus::Succeeded);
    power_off_and_exit(&mut rig);
}

/// The node as Ironic 39's agent client sends it with every step command
/// (`node.as_dict(secure=True)`): a few of its fields are enough for the agent.
fn ironic_node() -> Value {
    json!({"uuid": NODE, "driver": "redfish", "provision_state": "deploying",
           "properties": {}, "instance_info": {"image_source": "http://x/img.raw"},
           "driver_internal_info": {}})
}

/// The files of a `.tar.gz` as tar(1) reads them: name → text.
fn untar_with_tar(gz: &[u8]) -> std::collections::BTreeMap<String, String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let archive = dir.path().join("logs.tar.gz");
    std::fs::write(&archive, gz).expect("write the archive");
    let out = Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(dir.path())
        .output()
        .expect("running tar");
    assert!(
        out.status.success(),
        "tar -xzf: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let root = dir.path().join("vmdeploy-logs");
    std::fs::read_dir(&root)
        .expect("the bundle's folder")
        .map(|e| {
            let e = e.expect("entry");
            let text = std::fs::read(e.path()).expect("read");
            (
                e.file_name().to_string_lossy().into_owned(),
                String::from_utf8_lossy(&text).into_owned(),
            )
        })
        .collect()
}

/// Ironic 39's `direct` deploy against the agent, call for call (agent_client.py,
/// agent_base.py, agent.py): `deploy.get_deploy_steps` with `wait=true`, then the in-band
/// `write_image` through `deploy.execute_deploy_step` (no wait) polled through
/// `GET /v1/commands/` until the last command is no longer RUNNING, `standby.get_partition_uuids`,
/// and `log.collect_system_logs` (Ironic stores the bundle); a stale `deploy_version` ends
/// `CLEAN_VERSION_MISMATCH`. Every answer is checked on its raw JSON with the field names
/// written out here.
#[test]
fn ironic39_deploy_steps_write_image_then_logs() {
    let mut rig = rig(false, true, NEWEST, 0, true);
    let image = make_image_seeded(24 * MIB, 5);
    let server = serve(image.clone());
    let node = ironic_node();
    let ports = json!([{"address": MAC, "uuid": "2c4e2a77-4f6a-4b4e-9c55-6f3d0b1f0a11"}]);

    // refresh_steps: get_deploy_steps, wait=true, reads deploy_steps and
    // hardware_manager_version from command_result; each step needs interface/step/priority.
    let (status, steps) = rig.driver.post(
        "deploy.get_deploy_steps",
        json!({"node": node, "ports": ports}),
        true,
    );
    assert_eq!(status, 200, "{steps}");
    assert_raw_command_result(&steps);
    assert_eq!(steps["command_status"], "SUCCEEDED", "{steps}");
    assert_eq!(steps["command_name"], "get_deploy_steps");
    let result = &steps["command_result"];
    let by_manager = result["deploy_steps"]
        .as_object()
        .expect("deploy_steps by manager");
    let listed: Vec<&Value> = by_manager
        .values()
        .flat_map(|l| l.as_array().expect("a list"))
        .collect();
    for step in &listed {
        for key in ["interface", "step", "priority"] {
            assert!(step.get(key).is_some(), "{key} missing from {step}");
        }
    }
    let write_step = listed
        .iter()
        .find(|s| s["step"] == "write_image")
        .expect("write_image offered");
    assert_eq!(write_step["interface"], "deploy");
    let version = result["hardware_manager_version"].clone();
    assert!(version.is_object() && !version.as_object().expect("object").is_empty());

    // AgentDeploy.write_image: the in-band step, no priority, the image in args.
    let step = json!({"interface": "deploy", "step": "write_image", "args": {
        "image_info": {
            "id": "img-39", "urls": [server.url("/image.raw")], "disk_format": "raw",
            "container_format": "bare", "stream_raw_images": true,
            "os_hash_algo": "sha256", "os_hash_value": hex_digest("sha256", &image),
            "node_uuid": NODE,
        },
        "configdrive": null,
    }});
    let params = json!({"step": step, "node": node, "ports": ports, "deploy_version": version});
    let (status, started) = rig.driver.post("deploy.execute_deploy_step", params, false);
    assert_eq!(status, 200, "{started}");
    assert_raw_command_result(&started);
    assert_eq!(started["command_name"], "execute_deploy_step");
    // process_next_step: get_commands_status, the last command, until it is not RUNNING.
    let deadline = Instant::now() + Duration::from_secs(120);
    let done = loop {
        let q = format!("/v1/commands/?agent_token={}", rig.driver.token);
        let (status, listed) = rig.driver.call("GET", &q, None);
        assert_eq!(status, 200, "{listed}");
        let commands = listed["commands"].as_array().expect("commands");
        commands.iter().for_each(assert_raw_command_result);
        let last = commands.last().expect("a command").clone();
        assert_eq!(last["id"], started["id"]);
        if last["command_status"] != "RUNNING" {
            break last;
        }
        assert!(Instant::now() < deadline, "write_image hung");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(done["command_status"], "SUCCEEDED", "{done}");
    // _get_completed_command compares deploy_step with the node's step (interface + step).
    assert_eq!(done["command_result"]["deploy_step"], step, "{done}");
    let text = done["command_result"]["deploy_result"]["result"]
        .as_str()
        .expect("prepare_image's result text");
    assert!(
        text.starts_with("prepare_image: image (img-39) written to device"),
        "{text}"
    );
    assert_disk_holds(&rig.disk, &image);

    // prepare_instance_boot: get_partition_uuids, wait=true, reads "root uuid".
    let (status, uuids) = rig
        .driver
        .post("standby.get_partition_uuids", json!({}), true);
    assert_eq!(status, 200, "{uuids}");
    assert_raw_command_result(&uuids);
    assert_eq!(
        uuids["command_result"]["root uuid"], "0x12345678",
        "{uuids}"
    );

    // A deploy_version from another agent: CLEAN_VERSION_MISMATCH with IPA's VersionMismatch.
    let stale = json!({"step": {"interface": "deploy", "step": "erase_devices_metadata",
                                "priority": 0},
                       "node": node, "ports": ports,
                       "deploy_version": {"generic_hardware_manager": "0.1"}});
    let (status, body) = rig.driver.post("deploy.execute_deploy_step", stale, true);
    assert_eq!(status, 200, "{body}");
    assert_raw_command_result(&body);
    assert_eq!(body["command_status"], "CLEAN_VERSION_MISMATCH", "{body}");
    assert_eq!(body["command_error"]["type"], "VersionMismatch", "{body}");
    assert_disk_holds(&rig.disk, &image);

    // collect_ramdisk_logs: log.collect_system_logs, wait=true; Ironic base64-decodes
    // command_result.system_logs and stores it as a .tar.gz.
    let (status, logs) = rig.driver.post("log.collect_system_logs", json!({}), true);
    assert_eq!(status, 200, "{logs}");
    assert_raw_command_result(&logs);
    assert_eq!(logs["command_status"], "SUCCEEDED", "{logs}");
    let b64 = logs["command_result"]["system_logs"]
        .as_str()
        .expect("system_logs");
    let gz =
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b64).expect("base64");
    let files = untar_with_tar(&gz);
    let agent_log = files
        .get("vmdeploy-agent.log")
        .expect("the agent's log in the bundle");
    assert!(agent_log.contains("deploy step completed"), "{agent_log}");
    assert!(files.contains_key("partitions"), "{:?}", files.keys());
    for (name, text) in &files {
        assert!(
            !text.contains(&rig.driver.token),
            "{name} holds the agent token"
        );
    }
    power_off_and_exit(&mut rig);
}

#[test]
fn wrong_checksum_fails_clearly_and_zeroes_the_first_mib() {
    let mut rig = rig(true, true, NEWEST, 0, true);
    let image = make_image_seeded(8 * MIB, 11);
    let server = serve(image.clone());
    let wrong = hex_digest("md5", b"not the image");
    let result = rig.driver.run(
        "standby.prepare_image",
        json!({"image_info": {"id": "bad", "urls": [server.url("/bad.raw")], "checksum": wrong}}),
        Duration::from_secs(120),
    );
    assert_eq!(result.command_status, CommandStatus::Failed);
    let err = result.command_error.expect("an error");
    assert_eq!(err.kind, "ImageChecksumError");
    assert!(
        err.message.contains(&wrong),
        "names the expected digest: {}",
        err.message
    );
    assert!(
        err.message.contains(&hex_digest("md5", &image)),
        "names the digest it got: {}",
        err.message
    );
    let disk = rig.disk.contents();
    assert!(disk[..MIB].iter().all(|&b| b == 0), "first MiB zeroed");
    power_off_and_exit(&mut rig);
}

#[test]
fn every_checksum_algorithm_and_the_legacy_field() {
    // Token disclosed by the lookup; hints from the floppy.
    let mut rig = rig(true, false, NEWEST, 0, true);
    let cases = [
        ("md5", true),
        ("sha256", true),
        ("sha512", true),
        ("sha512", false),
        ("md5", false),
    ];
    for (i, (algo, os_hash)) in cases.into_iter().enumerate() {
        let image = make_image_seeded(4 * MIB + i * 4096, 100 + i as u64);
        let server = serve(image.clone());
        let digest = hex_digest(algo, &image);
        let mut info = json!({"id": format!("img-{i}"), "urls": [server.url("/i.raw")]});
        if os_hash {
            info["os_hash_algo"] = json!(algo);
            info["os_hash_value"] = json!(digest);
        } else {
            info["checksum"] = json!(digest);
        }
        let result = rig.driver.run(
            "standby.prepare_image",
            json!({ "image_info": info }),
            Duration::from_secs(120),
        );
        assert_eq!(
            result.command_status,
            CommandStatus::Succeeded,
            "{algo} (os_hash {os_hash}): {:?}",
            result.command_error
        );
        assert_disk_holds(&rig.disk, &image);
    }
    power_off_and_exit(&mut rig);
}

#[test]
fn iscsi_target_started_through_the_api_takes_the_conductors_write() {
    let mut rig = rig(false, true, NEWEST, 0, true);
    let iqn = format!("iqn-{NODE}");
    let port = free_port();
    let started = rig.driver.run(
        "iscsi.start_iscsi_target",
        json!({"iqn": iqn, "portal_port": port, "wipe_disk_metadata": true}),
        Duration::from_secs(30),
    );
    assert_eq!(
        started.command_status,
        CommandStatus::Succeeded,
        "{:?}",
        started.command_error
    );
    assert_eq!(
        started.command_result.as_ref().expect("result")["iscsi_target_iqn"],
        iqn.as_str()
    );
    // wipe_disk_metadata zeroed both ends of the disk.
    let before = rig.disk.contents();
    assert!(before[..MIB].iter().all(|&b| b == 0));
    assert!(before[before.len() - MIB..].iter().all(|&b| b == 0));

    let dir = tempfile::tempdir().expect("temp dir");
    let image = make_image_seeded(16 * MIB, 23);
    let image_path = dir.path().join("image.raw");
    std::fs::File::create(&image_path)
        .and_then(|mut f| f.write_all(&image))
        .expect("image file");
    let out = Command::new(bin("vmdeploy-conductor"))
        .args(["iscsi", "write"])
        .arg(&image_path)
        .args([
            "--portal",
            &format!("127.0.0.1:{port}"),
            "--iqn",
            &iqn,
            "--lun",
            "1",
        ])
        .env("RUST_LOG", "info")
        .output()
        .expect("running vmdeploy-conductor iscsi write");
    assert!(
        out.status.success(),
        "iscsi write failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    power_off_and_exit(&mut rig);
    assert_disk_holds(&rig.disk, &image);
}

#[test]
fn an_older_conductor_gets_no_progress_fields() {
    // Ironic before API 1.72 answers 400 to agent_status_message: the stand-in claims 1.68 and
    // flags any field that version does not know; progress then goes to the console only.
    // The first heartbeat is answered 409 (node locked): the agent retries after IPA's error
    // interval (5 s x [1, 2]) and carries on.
    let mut rig = rig(false, true, ApiVersion::new(1, 68), 1, true);
    let image = make_image_seeded(8 * MIB, 31);
    let server = serve(image.clone());
    let result = rig.driver.run(
        "standby.prepare_image",
        json!({"image_info": {"id": "old", "urls": [server.url("/old.raw")],
                              "os_hash_algo": "sha512", "os_hash_value": hex_digest("sha512", &image)}}),
        Duration::from_secs(120),
    );
    assert_eq!(
        result.command_status,
        CommandStatus::Succeeded,
        "{:?}",
        result.command_error
    );
    assert_disk_holds(&rig.disk, &image);
    std::thread::sleep(Duration::from_millis(1500));
    let deadline = Instant::now() + Duration::from_secs(15);
    while rig.standin.heartbeats().len() < 3 {
        assert!(Instant::now() < deadline, "heartbeats stopped after a 409");
        std::thread::sleep(Duration::from_millis(100));
    }
    let beats = rig.standin.heartbeats();
    let retry_gap = beats[1].at - beats[0].at;
    assert!(
        retry_gap >= Duration::from_millis(4900) && retry_gap <= Duration::from_millis(10_500),
        "retry after a refused heartbeat came after {retry_gap:?}, expected 5..10 s"
    );
    assert!(
        beats.iter().all(|h| h.body.agent_status_message.is_none()),
        "no progress field at 1.68"
    );
    assert!(
        rig.agent.log().contains("image write progress"),
        "progress still logged on the console"
    );
    power_off_and_exit(&mut rig);
}

/// Another self-signed certificate for 127.0.0.1, as an impostor on the agent's address would
/// present.
fn other_cert_pem() -> String {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.subject_alt_names.push(rcgen::SanType::IpAddress(
        std::net::Ipv4Addr::LOCALHOST.into(),
    ));
    let key = rcgen::KeyPair::generate().expect("key");
    params.self_signed(&key).expect("certificate").pem()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn the_conductors_agent_client_pins_the_heartbeat_certificate() {
    let mut rig = rig(false, true, NEWEST, 0, true);
    let pem = rig.driver.cert_pem.clone().expect("pinned certificate");
    let endpoint = AgentEndpoint {
        callback_url: rig.driver.base.clone(),
        pinned_cert_pem: Some(pem.clone()),
        allow_plain_http: false,
        timeout: Duration::from_secs(30),
        agent_token: rig.driver.token.as_str().into(),
    };
    let rt = runtime();
    let client = AgentClient::new(&endpoint).expect("client");

    // The pinned certificate is accepted: a command runs and is listed.
    let sync = rt
        .block_on(client.execute("standby.sync", json!({}), true))
        .expect("standby.sync over pinned TLS");
    assert_eq!(
        sync.command_status,
        CommandStatus::Succeeded,
        "{:?}",
        sync.command_error
    );
    let listed = rt.block_on(client.commands()).expect("GET /v1/commands");
    assert_eq!(listed.last().map(|c| c.id.as_str()), Some(sync.id.as_str()));
    let one = rt
        .block_on(client.command_status(&sync.id))
        .expect("GET /v1/commands/{id}");
    assert_eq!(one.command_name, "sync");
    let uuids = rt
        .block_on(client.get_partition_uuids())
        .expect("get_partition_uuids on the blank disk");
    assert!(uuids.is_object(), "{uuids}");

    // Another certificate for the same address: refused in the handshake, naming the agent.
    let impostor = AgentEndpoint {
        pinned_cert_pem: Some(other_cert_pem()),
        ..endpoint.clone()
    };
    let err = rt
        .block_on(AgentClient::new(&impostor).expect("client").commands())
        .expect_err("another certificate is refused");
    assert!(
        matches!(
            err.downcast_ref::<AgentClientError>(),
            Some(AgentClientError::Tls { .. })
        ),
        "{err:#}"
    );
    assert!(format!("{err:#}").contains(&rig.driver.base), "{err:#}");
    // The stand-in's own client, pinned to the impostor, fails the same way.
    let q = format!("/v1/commands/?agent_token={}", rig.driver.token);
    assert!(call(&rig.driver.base, Some(&other_cert_pem()), "GET", &q, None).is_err());

    // http:// is refused unless allowed; allowed, it still cannot talk to the TLS port.
    let plain = AgentEndpoint {
        callback_url: rig.driver.base.replace("https://", "http://"),
        pinned_cert_pem: None,
        ..endpoint.clone()
    };
    let err = AgentClient::new(&plain).expect_err("plain http refused");
    assert!(format!("{err:#}").contains("plain http"), "{err:#}");
    let allowed = AgentEndpoint {
        allow_plain_http: true,
        timeout: Duration::from_secs(5),
        ..plain
    };
    assert!(rt
        .block_on(AgentClient::new(&allowed).expect("allowed").commands())
        .is_err());

    // A wrong token: the agent's 401 and its text come through.
    let wrong = AgentEndpoint {
        agent_token: "wrong-token".into(),
        ..endpoint.clone()
    };
    let err = rt
        .block_on(AgentClient::new(&wrong).expect("client").commands())
        .expect_err("wrong token");
    let typed = err.downcast_ref::<AgentClientError>().expect("typed error");
    assert!(typed.is_auth(), "{err:#}");
    let text = format!("{err:#}");
    assert!(
        text.contains("401") && text.contains("Token invalid."),
        "{text}"
    );
    assert!(
        !text.contains("wrong-token"),
        "the token stays out of errors: {text}"
    );

    // And the deploy flow's last call: power off through the agent.
    let off = rt.block_on(client.power_off()).expect("power_off");
    assert_eq!(off.command_status, CommandStatus::Succeeded);
    let code = rig.agent.wait_exit(Duration::from_secs(30));
    assert_eq!(code, Some(0), "the agent exits 0 after power_off");
    assert!(
        rig.standin.violations().is_empty(),
        "protocol violations: {:?}",
        rig.standin.violations()
    );
}

#[test]
fn auto_tls_off_serves_plain_http_and_sends_no_certificate() {
    let mut rig = rig(true, true, NEWEST, 0, false);
    assert!(rig.driver.base.starts_with("http://"));
    let image = make_image_seeded(4 * MIB, 41);
    let server = serve(image.clone());
    let result = rig.driver.run(
        "standby.prepare_image",
        json!({"image_info": {"id": "plain", "urls": [server.url("/p.raw")],
                              "os_hash_algo": "sha256", "os_hash_value": hex_digest("sha256", &image)}}),
        Duration::from_secs(120),
    );
    assert_eq!(
        result.command_status,
        CommandStatus::Succeeded,
        "{:?}",
        result.command_error
    );
    assert_disk_holds(&rig.disk, &image);
    assert!(rig
        .standin
        .heartbeats()
        .iter()
        .all(|h| h.body.agent_verify_ca.is_none() && h.body.callback_url.starts_with("http://")));
    assert!(rig.agent.log().contains("auto-TLS is off"));
    power_off_and_exit(&mut rig);
}
