//! The `baremetal` CLI (python-ironicclient from the setup's venv, unchanged) against
//! `vmdeploy-conductor serve`, with the in-memory iLO emulator as the node's BMC: the issue's
//! acceptance sequence (node create with driver_info, list, show with secrets masked, set
//! instance_info, validate, power on/off, manage/provide, deploy, port create/list,
//! maintenance, undeploy, delete), each step checked in the CLI's own output and, where the BMC
//! is touched, in the emulator's state.
//!
//! `serve` runs with no configuration, as an operator would first start it: it listens on
//! 127.0.0.1:6385 with `noauth` and keeps its state in the directory given. The port is fixed,
//! so the test holds the `port-6385` lock while it runs (the same lock file conductor/tests/serve.rs takes for the default port).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use vmdeploy_integration_tests::child::ChildGuard;
use vmdeploy_integration_tests::emulator;
use vmdeploy_integration_tests::http::{ServerConfig, TestHttpServer};
use vmdeploy_integration_tests::lock::ResourceLock;
use vmdeploy_integration_tests::{bin, tcp_listening, venv_bin};

/// Where `serve` listens with no configuration (the issue keeps this port).
const API_PORT: u16 = 6385;
const ILO_USER: &str = "admin";
const ILO_PASSWORD: &str = "emu-pass-Secret1";
const MAC: &str = "52:54:00:12:34:56";
/// The microversion the conductor serves up to (conductor/src/api/version.rs).
const MAX_VERSION: &str = "1.73";

/// The in-memory iLO emulator: its `host:port` and the certificate it made.
struct Emulator {
    _proc: ChildGuard,
    address: String,
    cert: PathBuf,
}

impl Emulator {
    fn start(dir: &Path) -> Emulator {
        let cert = dir.join("ilo-cert.pem");
        let (child, address) = emulator::spawn(ILO_USER, ILO_PASSWORD, &cert, &[]);
        Emulator {
            _proc: child,
            address,
            cert,
        }
    }

    fn port(&self) -> &str {
        self.address
            .rsplit_once(':')
            .map(|(_, p)| p)
            .expect("the emulator's address is host:port")
    }

    /// `GET /_emulator/state` (curl is the plain HTTPS client the emulator tests use too).
    fn state(&self) -> Value {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", "--cacert"])
            .arg(&self.cert)
            .arg(format!("https://{}/_emulator/state", self.address))
            .output()
            .expect("running curl (apt-get install curl)");
        assert!(
            out.status.success(),
            "curl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("the emulator's state is JSON")
    }
}

/// `vmdeploy-conductor serve` with no configuration, its state in `state_dir`.
fn start_serve(state_dir: &Path) -> ChildGuard {
    assert!(
        !tcp_listening(API_PORT),
        "something already listens on 127.0.0.1:{API_PORT}: stop it (a `serve` left running?)"
    );
    let log = std::fs::File::create(state_dir.join("serve.log")).expect("creating serve.log");
    let child = Command::new(bin("vmdeploy-conductor"))
        .arg("serve")
        .arg("--state-dir")
        .arg(state_dir)
        .env_remove("STATE_DIRECTORY")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting vmdeploy-conductor serve");
    let mut proc = ChildGuard::new(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !tcp_listening(API_PORT) {
        if let Ok(Some(status)) = proc.try_wait() {
            panic!(
                "serve exited ({status}) before listening; its log:\n{}",
                std::fs::read_to_string(state_dir.join("serve.log")).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "serve did not listen on {API_PORT} within 30 s; its log:\n{}",
            std::fs::read_to_string(state_dir.join("serve.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    proc
}

/// The `baremetal` CLI, as an operator runs it against a standalone conductor.
fn baremetal(args: &[&str]) -> Output {
    let home = tempfile::tempdir().expect("temp HOME for the CLI's caches");
    Command::new(venv_bin("baremetal"))
        .args(["--os-auth-type", "none", "--os-endpoint"])
        .arg(format!("http://127.0.0.1:{API_PORT}"))
        .args(args)
        // A clean environment: no cloud from the caller's clouds.yaml or OS_* variables, and
        // no version cached by an earlier run.
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .output()
        .expect("running the baremetal CLI")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs the CLI and asserts it succeeded; returns stdout.
fn ok(args: &[&str]) -> String {
    let out = baremetal(args);
    assert!(
        out.status.success(),
        "baremetal {}: exit {:?}\nstdout: {}\nstderr: {}",
        args.join(" "),
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Runs the CLI with `-f json` and parses what it printed.
fn json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-f", "json"]);
    let out = ok(&all);
    serde_json::from_str(&out).unwrap_or_else(|e| {
        panic!(
            "baremetal {}: output is not JSON ({e}): {out}",
            args.join(" ")
        )
    })
}

fn show(node: &str) -> Value {
    json(&["node", "show", node])
}

/// Waits until `node show` reports `field` = `want`; fails with the node's last state.
fn wait_for(node: &str, field: &str, want: &str, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let shown = show(node);
        if shown[field] == want {
            return shown;
        }
        assert!(
            Instant::now() < deadline,
            "node {node}: {field} is {} after {timeout:?}, expected {want:?}; last_error {}",
            shown[field],
            shown["last_error"]
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn baremetal_cli_drives_the_conductor() {
    let _lock = ResourceLock::acquire("port-6385");
    let dir = tempfile::tempdir().expect("temp dir");
    let emulator = Emulator::start(dir.path());
    // The deploy ISO and the image, served over plain HTTP (the iLO fetches the ISO by URL).
    let media = TestHttpServer::start(ServerConfig {
        body: Arc::new(vec![0x5a; 64 * 1024]),
        ..ServerConfig::default()
    });
    let state_dir = dir.path().join("state");
    std::fs::create_dir_all(&state_dir).expect("creating the state dir");
    let _serve = start_serve(&state_dir);

    // The CLI negotiates down from its own newest version to ours.
    let out = baremetal(&["--debug", "node", "list"]);
    assert!(out.status.success(), "node list: {}", text(&out.stderr));
    let debug = text(&out.stderr);
    assert!(
        debug.contains(&format!("Negotiated API version is {MAX_VERSION}")),
        "the CLI did not negotiate {MAX_VERSION}: {}",
        debug
            .lines()
            .filter(|l| l.contains("ersion"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(json(&["node", "list"]), Value::Array(vec![]));

    // Drivers.
    let drivers = json(&["driver", "list"]);
    let names: Vec<&str> = drivers
        .as_array()
        .expect("driver list")
        .iter()
        .filter_map(|d| d["name"].as_str())
        .collect();
    assert!(names.contains(&"agent_ilo"), "{drivers}");
    // A driver is a composition of interfaces; the hardware types offer a choice.
    let agent_ilo = json(&["driver", "show", "agent_ilo"]);
    assert_eq!(
        agent_ilo["default_boot_interface"], "ilo-virtual-media",
        "{agent_ilo}"
    );
    assert_eq!(
        agent_ilo["default_deploy_interface"], "direct",
        "{agent_ilo}"
    );
    // The CLI prints a list of interfaces as one comma-separated string.
    assert_eq!(
        agent_ilo["enabled_deploy_interfaces"], "direct",
        "{agent_ilo}"
    );
    let ilo = json(&["driver", "show", "ilo"]);
    assert_eq!(ilo["enabled_deploy_interfaces"], "direct, iscsi", "{ilo}");
    assert_eq!(
        ilo["enabled_boot_interfaces"], "ilo-virtual-media, ilo-pxe",
        "{ilo}"
    );

    // Node create with driver_info; the password never comes back.
    let deploy_iso = media.url("/deploy.iso");
    let cert = emulator.cert.display().to_string();
    let created = json(&[
        "node",
        "create",
        "--driver",
        "agent_ilo",
        "--name",
        "cli-node",
        "--driver-info",
        "ilo_address=127.0.0.1",
        "--driver-info",
        &format!("client_port={}", emulator.port()),
        "--driver-info",
        &format!("ilo_username={ILO_USER}"),
        "--driver-info",
        &format!("ilo_password={ILO_PASSWORD}"),
        "--driver-info",
        &format!("ilo_verify_ca={cert}"),
        "--driver-info",
        &format!("ilo_deploy_iso={deploy_iso}"),
    ]);
    let uuid = created["uuid"]
        .as_str()
        .expect("created node has a uuid")
        .to_string();
    assert_eq!(created["provision_state"], "enroll");
    assert_eq!(created["driver"], "agent_ilo");
    assert_eq!(created["driver_info"]["ilo_password"], "******");
    assert!(!created.to_string().contains(ILO_PASSWORD), "{created}");

    // List and show.
    let listed = json(&["node", "list"]);
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed[0]["uuid"], uuid.as_str());
    assert_eq!(listed[0]["name"], "cli-node");
    assert_eq!(listed[0]["provision_state"], "enroll");
    let long = ok(&["node", "list", "--long"]);
    assert!(
        !long.contains(ILO_PASSWORD),
        "node list --long shows the password"
    );
    for ident in [uuid.as_str(), "cli-node"] {
        let shown = show(ident);
        assert_eq!(shown["uuid"], uuid.as_str());
        assert_eq!(shown["driver_info"]["ilo_password"], "******");
        assert_eq!(shown["driver_info"]["ilo_address"], "127.0.0.1");
        assert!(!shown.to_string().contains(ILO_PASSWORD), "{shown}");
    }
    let shown = show("cli-node");
    for (field, want) in [
        ("boot_interface", "ilo-virtual-media"),
        ("deploy_interface", "direct"),
        ("management_interface", "ilo"),
        ("power_interface", "ilo"),
    ] {
        assert_eq!(shown[field], want, "{field}: {shown}");
    }
    // An interface the driver lacks is refused with Ironic's words, and nothing changes.
    let out = baremetal(&["node", "set", "cli-node", "--deploy-interface", "iscsi"]);
    assert!(
        !out.status.success(),
        "agent_ilo took the iscsi deploy interface"
    );
    assert!(
        text(&out.stderr).contains(
            "deploy interface implementation 'iscsi' is not supported by hardware type agent_ilo"
        ),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(show("cli-node")["deploy_interface"], "direct");
    let out = baremetal(&["node", "show", "no-such-node"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no-such-node"),
        "{}",
        text(&out.stderr)
    );

    // instance_info.
    let image = media.url("/image.raw");
    ok(&[
        "node",
        "set",
        "cli-node",
        "--instance-info",
        &format!("image_source={image}"),
        "--instance-info",
        "image_checksum=0123456789abcdef0123456789abcdef",
        "--instance-info",
        "root_gb=1",
    ]);
    let shown = show("cli-node");
    assert_eq!(shown["instance_info"]["image_source"], image.as_str());
    // The CLI sends `key=value` values JSON-decoded: root_gb arrives as the number 1.
    assert_eq!(shown["instance_info"]["root_gb"], 1);
    // An unknown driver is refused, naming the field.
    let out = baremetal(&[
        "node",
        "set",
        "cli-node",
        "--property",
        "x=1",
        "--driver",
        "ipmi",
    ]);
    assert!(!out.status.success(), "setting an unknown driver succeeded");
    assert!(
        text(&out.stderr).contains("driver"),
        "{}",
        text(&out.stderr)
    );

    // Validate: the BMC answers, the deploy has what it needs.
    let validated = json(&["node", "validate", "cli-node"]);
    let line = |iface: &str| -> Value {
        validated
            .as_array()
            .expect("validate prints a list")
            .iter()
            .find(|l| l["Interface"] == iface)
            .cloned()
            .unwrap_or_else(|| panic!("no {iface} line in {validated}"))
    };
    for iface in ["power", "management", "deploy", "boot"] {
        assert_eq!(line(iface)["Result"], true, "{iface}: {}", line(iface));
    }

    // Power on and off, seen by the BMC.
    ok(&["node", "power", "on", "cli-node"]);
    wait_for(
        "cli-node",
        "power_state",
        "power on",
        Duration::from_secs(30),
    );
    assert_eq!(emulator.state()["power"], "ON");
    ok(&["node", "power", "off", "cli-node"]);
    wait_for(
        "cli-node",
        "power_state",
        "power off",
        Duration::from_secs(30),
    );
    assert_eq!(emulator.state()["power"], "OFF");

    // Boot device.
    ok(&["node", "boot", "device", "set", "cli-node", "pxe"]);
    let boot = json(&["node", "boot", "device", "show", "cli-node"]);
    assert_eq!(boot["boot_device"], "pxe", "{boot}");

    // enroll → manageable → available.
    ok(&["node", "manage", "cli-node", "--wait", "60"]);
    assert_eq!(show("cli-node")["provision_state"], "manageable");
    ok(&["node", "provide", "cli-node", "--wait", "60"]);
    assert_eq!(show("cli-node")["provision_state"], "available");

    // Ports.
    let port = json(&["port", "create", &MAC.to_uppercase(), "--node", &uuid]);
    assert_eq!(port["address"], MAC);
    assert_eq!(port["node_uuid"], uuid.as_str());
    let ports = json(&["port", "list"]);
    assert_eq!(ports[0]["address"], MAC, "{ports}");
    let node_ports = json(&["port", "list", "--node", "cli-node"]);
    assert_eq!(node_ports.as_array().map(Vec::len), Some(1), "{node_ports}");
    let out = baremetal(&["port", "create", "not-a-mac", "--node", &uuid]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("MAC"), "{}", text(&out.stderr));

    // Deploy: the ramdisk is booted from virtual media and the node waits for its agent (none
    // runs in this test).
    ok(&["node", "deploy", "cli-node"]);
    let waiting = wait_for(
        "cli-node",
        "provision_state",
        "wait call-back",
        Duration::from_secs(60),
    );
    assert_eq!(waiting["target_provision_state"], "active");
    assert!(waiting["last_error"].is_null(), "{}", waiting["last_error"]);
    let state = emulator.state();
    assert_eq!(state["power"], "ON", "{state}");
    assert_eq!(state["vmedia"]["CDROM"]["inserted"], true, "{state}");
    assert_eq!(state["vmedia"]["FLOPPY"]["inserted"], true, "{state}");
    // Secrets the deploy made (agent token, floppy temp URL) stay masked.
    let shown = show("cli-node");
    for (key, value) in shown["driver_internal_info"]
        .as_object()
        .into_iter()
        .flatten()
    {
        if key.contains("token") || value.as_str().is_some_and(|v| v.contains("temp_url_sig")) {
            assert_eq!(value, "******", "driver_internal_info.{key} is not masked");
        }
    }

    // Maintenance on and off.
    ok(&[
        "node",
        "maintenance",
        "set",
        "cli-node",
        "--reason",
        "cli test",
    ]);
    let shown = show("cli-node");
    assert_eq!(shown["maintenance"], true);
    assert_eq!(shown["maintenance_reason"], "cli test");
    ok(&["node", "maintenance", "unset", "cli-node"]);
    let shown = show("cli-node");
    assert_eq!(shown["maintenance"], false);
    assert!(shown["maintenance_reason"].is_null());

    // Undeploy: back to available, media ejected, powered off.
    ok(&["node", "undeploy", "cli-node", "--wait", "120"]);
    let shown = show("cli-node");
    assert_eq!(shown["provision_state"], "available");
    assert!(shown["last_error"].is_null(), "{}", shown["last_error"]);
    let state = emulator.state();
    assert_eq!(state["power"], "OFF", "{state}");
    assert_eq!(state["vmedia"]["CDROM"]["inserted"], false, "{state}");
    assert_eq!(state["vmedia"]["FLOPPY"]["inserted"], false, "{state}");

    // Delete: the node and its ports are gone.
    ok(&["node", "delete", "cli-node"]);
    assert_eq!(json(&["node", "list"]), Value::Array(vec![]));
    assert_eq!(json(&["port", "list"]), Value::Array(vec![]));
}
