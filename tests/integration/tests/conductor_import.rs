//! `vmdeploy-conductor import` against a real `vmdeploy-conductor serve`, from both sources:
//!
//! 1. JSON exports of an Ironic that had the `ilo` hardware types
//!    (`fixtures/ironic-ilo-nodes.json`, `fixtures/ironic-ilo-ports.json`: what `baremetal node
//!    list --long -f json` and `baremetal port list --long -f json` print with python-ironicclient
//!    5.x, whose keys are the column titles; the nodes' `driver_info` uses the keys the removed
//!    `ilo` driver documented). Seven nodes: `iscsi` and `direct` deploys over
//!    `ilo-virtual-media`, an `ilo-pxe` node in `clean failed` (maintenance, the deprecated
//!    `ca_file`), an `active` one, an `ipmi` one, one whose password the API masked, and a
//!    `redfish` one. The dry run's report is checked line by line; then the exports, pointed at
//!    the in-memory iLO emulator (one emulated iLO per node), are applied, and vmdeploy must hold
//!    every node taken over with the mapped driver and `driver_info`, `manageable` (the masked
//!    one `enroll`), with its ports. A second run imports nothing; a BMC that does not answer
//!    fails the run (exit 1); bad usage exits 64.
//! 2. A real Ironic 39 from the setup's venv (standalone, noauth), holding `redfish` nodes on the
//!    emulator (one `available`, one `enroll`) and `fake-hardware` ones (one `manageable`, one
//!    `active`): `--from-ironic` dry run and `--apply`; the same decisions from the venv's own
//!    `baremetal` CLI exports (python-ironicclient 6.x: snake_case keys); the imported nodes
//!    lack the password Ironic masked, stay `enroll`, and become `manageable` once it is set.
//!
//! Both APIs serve short list pages (vmdeploy two records, Ironic one), so every list the import
//! reads runs over several pages and their `next` links.
//!
//! Needs the built `vmdeploy-conductor` and `ilo-emulator` (`cargo build --workspace --bins`) and,
//! for the second test, Ironic in the venv (`scripts/setup`); each fails with that hint when
//! missing.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};
use vmdeploy_integration_tests::baremetal;
use vmdeploy_integration_tests::child::ChildGuard;
use vmdeploy_integration_tests::e2e::ironic::ILO5_PRODUCT;
use vmdeploy_integration_tests::fleet::{
    start_emulator, start_emulator_with, Api, ILO_PASSWORD, ILO_USER,
};
use vmdeploy_integration_tests::ironic_standalone::{Ironic, REDFISH_AND_FAKE};
use vmdeploy_integration_tests::{bin, free_port, workspace_root};

/// What vmdeploy must hold for one fixture node after `--apply`.
struct Enrolled<'a> {
    /// The fixture node (see [`fixture_uuid`]).
    n: u8,
    name: &'a str,
    driver: &'a str,
    /// `boot_interface/deploy_interface`.
    interfaces: &'a str,
    /// The `driver_info` keys, sorted.
    driver_info: &'a [&'a str],
    state: &'a str,
    /// (address, pxe_enabled), sorted.
    ports: &'a [(&'a str, bool)],
}

/// The fixtures' node UUIDs: `...5c0N` is node N of the export.
fn fixture_uuid(n: u8) -> String {
    format!("7a3e5c10-2b4d-4f6a-8c9e-1d2f3a4b5c0{n}")
}

fn fixture(name: &str) -> PathBuf {
    workspace_root()
        .join("tests/integration/fixtures")
        .join(name)
}

/// `vmdeploy-conductor serve` with its API on a free loopback port, state in `dir`, list pages
/// of two records.
struct Serve {
    _child: ChildGuard,
    url: String,
}

impl Serve {
    fn start(dir: &Path) -> Serve {
        let port = free_port();
        // Lists of several pages: the import follows `next` links.
        let child = vmdeploy_integration_tests::fleet::start_conductor(
            dir,
            port,
            &format!(
                "[api]\nlisten = [\"127.0.0.1:{port}\"]\nmax_limit = 2\n\n[log]\nlevel = \"info\"\n"
            ),
        );
        Serve {
            _child: child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }
}

/// A client of an Ironic-compatible API (vmdeploy's or Ironic's).
fn api(url: &str) -> Api {
    vmdeploy_conductor::net::https::install_crypto_provider();
    Api {
        http: reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("an HTTP client"),
        url: url.to_owned(),
        phase_limit: Duration::from_secs(120),
    }
}

/// `GET path`: the status and the body's JSON (`null` when none).
async fn get(api: &Api, path: &str) -> (reqwest::StatusCode, Value) {
    let response = api
        .http
        .get(format!("{}{path}", api.url))
        .header("X-OpenStack-Ironic-API-Version", "1.73")
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = response.status();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

/// Waits until the node is in `state` with no target; fails at once when it lands elsewhere
/// with an error.
async fn wait_state(api: &Api, uuid: &str, state: &str, limit: Duration) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let node = api.node(uuid).await;
        if node["provision_state"] == state && node["target_provision_state"].is_null() {
            return node;
        }
        assert!(
            Instant::now() < deadline,
            "node {uuid} not {state} within {limit:?}: {node:#}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn provision(api: &Api, uuid: &str, target: &str, state: &str) {
    api.call(
        Method::PUT,
        &format!("/v1/nodes/{uuid}/states/provision"),
        Some(json!({ "target": target })),
    )
    .await;
    wait_state(api, uuid, state, Duration::from_secs(120)).await;
}

/// `vmdeploy-conductor import ARGS`.
fn import(args: &[&str]) -> Output {
    Command::new(bin("vmdeploy-conductor"))
        .arg("import")
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("running vmdeploy-conductor import")
}

/// The standard output of a run that must have exited `code`.
fn exited(out: &Output, code: i32, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: exit {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The report line of node `uuid`.
fn line_of<'a>(report: &'a str, uuid: &str) -> &'a str {
    report
        .lines()
        .find(|l| l.starts_with(uuid))
        .unwrap_or_else(|| panic!("no line for {uuid} in:\n{report}"))
}

/// The `driver_info` keys of a node, sorted.
fn keys(driver_info: &Value) -> Vec<String> {
    driver_info
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// The node's ports in vmdeploy: (address, pxe_enabled), sorted.
async fn ports_of(api: &Api, uuid: &str) -> Vec<(String, bool)> {
    let listed = api
        .call(Method::GET, &format!("/v1/ports/detail?node={uuid}"), None)
        .await;
    let mut ports: Vec<(String, bool)> = listed["ports"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            (
                p["address"].as_str().unwrap_or_default().to_owned(),
                p["pxe_enabled"].as_bool().unwrap_or_default(),
            )
        })
        .collect();
    ports.sort();
    ports
}

/// The exported nodes pointed at the emulated iLOs (one each, in order), with the emulator's
/// credentials and certificate; masked passwords stay masked.
fn point_at_emulator(nodes: &mut Value, ilos: &[SocketAddr], cert: &Path) {
    let cert = cert.display().to_string();
    let mut next = ilos.iter();
    for node in nodes.as_array_mut().expect("an array of nodes") {
        let info = node["Driver Info"]
            .as_object_mut()
            .expect("every fixture node has a Driver Info object");
        let is_ilo = info.contains_key("ilo_address");
        let is_redfish = info.contains_key("redfish_address");
        if !is_ilo && !is_redfish {
            continue;
        }
        let ilo = next.next().expect("an emulated iLO per node");
        let password = if is_ilo {
            "ilo_password"
        } else {
            "redfish_password"
        };
        if info[password] != "******" {
            info.insert(password.into(), json!(ILO_PASSWORD));
        }
        assert_eq!(
            info[if is_ilo {
                "ilo_username"
            } else {
                "redfish_username"
            }],
            ILO_USER
        );
        if is_ilo {
            info.insert("ilo_address".into(), json!(ilo.ip().to_string()));
            info.insert("client_port".into(), json!(ilo.port()));
            // The deprecated key where the node has it: the import renames it.
            let ca = if info.contains_key("ca_file") {
                "ca_file"
            } else {
                "ilo_verify_ca"
            };
            info.insert(ca.into(), json!(cert));
        } else {
            info.insert("redfish_address".into(), json!(format!("https://{ilo}")));
            info.insert("redfish_verify_ca".into(), json!(cert));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ilo_fleet_from_json_exports_is_reported_then_enrolled_manageable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nodes_json = fixture("ironic-ilo-nodes.json");
    let ports_json = fixture("ironic-ilo-ports.json");
    let (_emulator, ilos) = start_emulator(dir.path(), 6);
    let cert = dir.path().join("ilo-cert.pem");
    let serve = Serve::start(dir.path());
    let vmdeploy = api(&serve.url);
    let to = serve.url.as_str();

    // The dry run: the report, and nothing changed.
    let from = nodes_json.to_str().expect("a UTF-8 path");
    let ports = ports_json.to_str().expect("a UTF-8 path");
    let report = exited(
        &import(&["--from-json", from, "--ports-json", ports, "--to", to]),
        0,
        "dry run",
    );
    assert!(report.starts_with(&format!("import from {from} into {to} (dry run)\n")));
    let expected = [
        (
            1,
            "dl380g9-iscsi-01: ilo/ilo-virtual-media/iscsi (manageable) -> iscsi_ilo | carries: \
             name, driver_info (client_port, client_timeout, console_port, ilo_address, \
             ilo_deploy_iso, ilo_password, ilo_username, ilo_verify_ca), properties \
             (capabilities, cpu_arch, cpus, local_gb, memory_mb, vendor), extra (asset_tag, \
             rack), ports (94:18:82:0a:00:01) | dropped: driver_info.snmp_auth_user, \
             resource_class, port 94:18:82:0a:00:01 local_link_connection, port \
             94:18:82:0a:00:01 physical_network | ends: manageable",
        ),
        (
            2,
            "dl360g10-direct-01: ilo5/ilo-virtual-media/direct (available) -> agent_ilo | \
             carries: name, driver_info (ilo_address, ilo_deploy_iso, ilo_password, \
             ilo_username, ilo_verify_ca, kernel_append_params), properties (capabilities, \
             cpu_arch, cpus, local_gb, memory_mb), extra (rack), ports (94:18:82:0a:00:02, \
             94:18:82:0a:00:12 no-pxe) | dropped: driver_info.deploy_kernel, \
             driver_info.deploy_ramdisk, instance_info (image_source, root_gb), resource_class, \
             conductor_group | ends: manageable",
        ),
        (
            3,
            "dl380g9-pxe-01: ilo/ilo-pxe/direct (clean failed) -> pxe_ilo | carries: name, \
             driver_info (ca_file as ilo_verify_ca, deploy_kernel as pxe_deploy_kernel, \
             deploy_ramdisk as pxe_deploy_ramdisk, ilo_address, ilo_password, ilo_username), \
             properties (capabilities, cpu_arch, cpus, local_gb, memory_mb), ports \
             (94:18:82:0a:00:03) | dropped: resource_class | ends: manageable",
        ),
        (
            4,
            "dl360g10-active-01: ilo5/ilo-virtual-media/direct (active) -> - | not taken over: \
             in use (active)",
        ),
        (
            5,
            "r640-ipmi-01: ipmi/ipxe/direct (available) -> - | not taken over: driver ipmi has \
             no vmdeploy counterpart (taken over: ilo, ilo5, redfish, agent_ilo, iscsi_ilo, \
             pxe_ilo)",
        ),
        (
            6,
            "dl380g9-masked-01: ilo/ilo-virtual-media/direct (enroll) -> agent_ilo | carries: \
             name, driver_info (ilo_address, ilo_deploy_iso, ilo_username), properties \
             (cpu_arch, cpus, local_gb, memory_mb), ports (94:18:82:0a:00:06) | dropped: \
             driver_info.ilo_password (masked) | ends: enroll",
        ),
        (
            7,
            "dl385g10-redfish-01: redfish/redfish-virtual-media/direct (manageable) -> redfish \
             (redfish-virtual-media/direct) | carries: name, driver_info (redfish_address, \
             redfish_password, redfish_system_id, redfish_username, redfish_verify_ca), \
             properties (capabilities, cpu_arch, cpus, local_gb, memory_mb), extra (rack), \
             ports (94:18:82:0a:00:07) | dropped: driver_info.deploy_kernel, \
             driver_info.deploy_ramdisk | ends: manageable",
        ),
    ];
    for (n, rest) in expected {
        let uuid = fixture_uuid(n);
        assert_eq!(line_of(&report, &uuid), format!("{uuid} {rest}"));
    }
    for note in [
        "    note: ilo_password is masked by the source API: set it after import",
        "    stays enroll: manage needs ilo_password (masked by the source): set it, then \
         manage the node",
        "    note: the deploy changes from direct to iscsi",
        "    note: resource_class baremetal-dl380 is not carried over",
        "    note: ilo_verify_ca names a file (/etc/ironic/ilo-ca.pem)",
        "    note: in maintenance in the source (cleaning failed: erase_devices timed out)",
        "    note: no deploy ISO: vmdeploy boots a prebuilt deploy ISO",
        "ports of no listed node, not imported: 94:18:82:0a:00:99 (node \
         7a3e5c10-2b4d-4f6a-8c9e-1d2f3a4b5c99)",
        "summary: 7 nodes: 5 taken over (4 to end manageable, 1 to stay enroll), 2 not taken \
         over; 6 ports; dry run: nothing changed, run again with --apply to enroll",
    ] {
        assert!(report.contains(note), "{note:?} missing from:\n{report}");
    }
    let json_report: Value = serde_json::from_str(&exited(
        &import(&[
            "--from-json",
            from,
            "--ports-json",
            ports,
            "--to",
            to,
            "--json",
        ]),
        0,
        "dry run --json",
    ))
    .expect("one JSON object");
    assert_eq!(
        json_report["summary"],
        json!({"nodes": 7, "taken_over": 5, "to_manageable": 4, "to_enroll": 1,
               "not_taken_over": 2, "ports": 6})
    );
    assert_eq!(json_report["applied"], false);
    assert_eq!(json_report["nodes"][3]["not_taken_over"], "in use (active)");
    assert_eq!(json_report["nodes"][6]["driver"], "redfish");
    assert!(
        !report.contains("fixture-ilo-pass")
            && !json_report.to_string().contains("fixture-ilo-pass"),
        "a password was printed"
    );
    let (_, listed) = get(&vmdeploy, "/v1/nodes").await;
    assert_eq!(listed["nodes"], json!([]), "the dry run changed nothing");

    // --apply, the exports pointed at the emulated iLOs.
    let mut nodes: Value =
        serde_json::from_str(&std::fs::read_to_string(&nodes_json).expect("the fixture"))
            .expect("the fixture is JSON");
    point_at_emulator(&mut nodes, &ilos, &cert);
    let applied_json = dir.path().join("nodes.json");
    std::fs::write(&applied_json, nodes.to_string()).expect("writing nodes.json");
    let applied = applied_json.to_str().expect("a UTF-8 path");
    let report = exited(
        &import(&[
            "--from-json",
            applied,
            "--ports-json",
            ports,
            "--to",
            to,
            "--apply",
        ]),
        0,
        "--apply",
    );
    assert!(
        report.contains("; applied: 5 enrolled, 4 manageable, 0 failed\n"),
        "{report}"
    );
    let masked = fixture_uuid(6);
    assert!(
        report.contains("    applied: enrolled, 1 of 1 ports, enroll\n"),
        "{report}"
    );
    let iscsi_keys = [
        "client_port",
        "client_timeout",
        "console_port",
        "ilo_address",
        "ilo_deploy_iso",
        "ilo_password",
        "ilo_username",
        "ilo_verify_ca",
    ];
    let direct_keys = [
        "client_port",
        "ilo_address",
        "ilo_deploy_iso",
        "ilo_password",
        "ilo_username",
        "ilo_verify_ca",
        "kernel_append_params",
    ];
    let pxe_keys = [
        "client_port",
        "ilo_address",
        "ilo_password",
        "ilo_username",
        "ilo_verify_ca",
        "pxe_deploy_kernel",
        "pxe_deploy_ramdisk",
    ];
    let masked_keys = [
        "client_port",
        "ilo_address",
        "ilo_deploy_iso",
        "ilo_username",
        "ilo_verify_ca",
    ];
    let redfish_keys = [
        "redfish_address",
        "redfish_password",
        "redfish_system_id",
        "redfish_username",
        "redfish_verify_ca",
    ];
    let want = [
        Enrolled {
            n: 1,
            name: "dl380g9-iscsi-01",
            driver: "iscsi_ilo",
            interfaces: "ilo-virtual-media/iscsi",
            driver_info: &iscsi_keys,
            state: "manageable",
            ports: &[("94:18:82:0a:00:01", true)],
        },
        Enrolled {
            n: 2,
            name: "dl360g10-direct-01",
            driver: "agent_ilo",
            interfaces: "ilo-virtual-media/direct",
            driver_info: &direct_keys,
            state: "manageable",
            ports: &[("94:18:82:0a:00:02", true), ("94:18:82:0a:00:12", false)],
        },
        Enrolled {
            n: 3,
            name: "dl380g9-pxe-01",
            driver: "pxe_ilo",
            interfaces: "pxe/iscsi",
            driver_info: &pxe_keys,
            state: "manageable",
            ports: &[("94:18:82:0a:00:03", true)],
        },
        Enrolled {
            n: 6,
            name: "dl380g9-masked-01",
            driver: "agent_ilo",
            interfaces: "ilo-virtual-media/direct",
            driver_info: &masked_keys,
            state: "enroll",
            ports: &[("94:18:82:0a:00:06", true)],
        },
        Enrolled {
            n: 7,
            name: "dl385g10-redfish-01",
            driver: "redfish",
            interfaces: "redfish-virtual-media/direct",
            driver_info: &redfish_keys,
            state: "manageable",
            ports: &[("94:18:82:0a:00:07", true)],
        },
    ];
    for Enrolled {
        n,
        name,
        driver,
        interfaces,
        driver_info: info_keys,
        state,
        ports: node_ports,
    } in want
    {
        let uuid = fixture_uuid(n);
        let node = vmdeploy.node(&uuid).await;
        assert_eq!(node["name"], name, "{node:#}");
        assert_eq!(node["driver"], driver, "{node:#}");
        assert_eq!(
            format!(
                "{}/{}",
                node["boot_interface"].as_str().unwrap_or_default(),
                node["deploy_interface"].as_str().unwrap_or_default()
            ),
            interfaces,
            "{node:#}"
        );
        assert_eq!(keys(&node["driver_info"]), info_keys, "{node:#}");
        assert_eq!(node["provision_state"], state, "{node:#}");
        assert_eq!(node["instance_info"], json!({}), "{node:#}");
        assert_eq!(node["maintenance"], false, "{node:#}");
        let want_ports: Vec<(String, bool)> = node_ports
            .iter()
            .map(|(a, p)| (a.to_string(), *p))
            .collect();
        assert_eq!(ports_of(&vmdeploy, &uuid).await, want_ports, "{name}");
    }
    let iscsi = vmdeploy.node(&fixture_uuid(1)).await;
    assert_eq!(iscsi["properties"]["cpus"], 24);
    assert_eq!(
        iscsi["properties"]["capabilities"],
        "boot_mode:bios,boot_option:local"
    );
    assert_eq!(
        iscsi["extra"],
        json!({"rack": "R12", "asset_tag": "HPE-0001"})
    );
    assert_eq!(iscsi["driver_info"]["console_port"], 5001);
    let pxe = vmdeploy.node(&fixture_uuid(3)).await;
    assert_eq!(
        pxe["driver_info"]["pxe_deploy_kernel"],
        "http://images.example/ipa.kernel"
    );
    for skipped in [4, 5] {
        let (status, _) = get(&vmdeploy, &format!("/v1/nodes/{}", fixture_uuid(skipped))).await;
        assert_eq!(status, 404, "node {skipped} was not to be imported");
    }
    let (_, orphan) = get(&vmdeploy, "/v1/ports/detail?address=94:18:82:0a:00:99").await;
    assert_eq!(
        orphan["ports"],
        json!([]),
        "a port of no listed node was created"
    );

    // Once the password is set, the masked node is managed like the others.
    vmdeploy
        .call(
            Method::PATCH,
            &format!("/v1/nodes/{masked}"),
            Some(
                json!([{"op": "add", "path": "/driver_info/ilo_password", "value": ILO_PASSWORD}]),
            ),
        )
        .await;
    provision(&vmdeploy, &masked, "manage", "manageable").await;

    // A second run finds them all there.
    let report = exited(
        &import(&[
            "--from-json",
            applied,
            "--ports-json",
            ports,
            "--to",
            to,
            "--apply",
        ]),
        0,
        "a second --apply",
    );
    for n in [1, 2, 3, 6, 7] {
        assert!(
            line_of(&report, &fixture_uuid(n))
                .ends_with("-> - | not taken over: already in vmdeploy (same UUID)"),
            "{report}"
        );
    }
    assert!(
        report.contains("summary: 7 nodes: 0 taken over"),
        "{report}"
    );

    // A node whose BMC does not answer: enrolled, its manage fails, the run exits 1.
    let unreachable = dir.path().join("unreachable.json");
    let lost = "5d2c1b0a-9f8e-4d7c-8b6a-5f4e3d2c1b0a";
    std::fs::write(
        &unreachable,
        json!([{
            "uuid": lost, "name": "dl380g9-lost-01", "driver": "ilo",
            "boot_interface": "ilo-virtual-media", "deploy_interface": "direct",
            "provision_state": "available",
            "driver_info": {
                "ilo_address": "127.0.0.1", "client_port": free_port(), "client_timeout": 5,
                "ilo_username": ILO_USER, "ilo_password": ILO_PASSWORD,
                "ilo_verify_ca": cert.display().to_string(),
            },
        }])
        .to_string(),
    )
    .expect("writing unreachable.json");
    let out = import(&[
        "--from-json",
        unreachable.to_str().expect("a UTF-8 path"),
        "--to",
        to,
        "--apply",
    ]);
    let report = exited(&out, 1, "a BMC that does not answer");
    assert!(report.contains("    FAILED: manage failed: "), "{report}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("1 of 1 node(s) taken over failed to import"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let node = vmdeploy.node(lost).await;
    assert_eq!(node["provision_state"], "enroll", "{node:#}");

    // vmdeploy out of reach: a run-time failure.
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let out = import(&["--from-json", from, "--to", &nowhere]);
    exited(&out, 1, "vmdeploy out of reach");
    assert!(String::from_utf8_lossy(&out.stderr).contains("connecting to vmdeploy at"));

    // Bad usage: 64.
    let not_json = dir.path().join("not.json");
    std::fs::write(&not_json, "node,driver\n").expect("writing not.json");
    let not_json = not_json.to_str().expect("a UTF-8 path");
    let missing = dir.path().join("missing.json");
    let missing = missing.to_str().expect("a UTF-8 path");
    for args in [
        vec!["--to", to],
        vec!["--from-json", from, "--from-ironic", to, "--to", to],
        vec!["--from-json", from],
        vec!["--from-ironic", to, "--ports-json", ports, "--to", to],
        vec!["--from-json", from, "--ironic-token-file", from, "--to", to],
        vec!["--from-json", from, "--to", to, "--to-username", "admin"],
        vec!["--from-json", missing, "--to", to],
        vec!["--from-json", not_json, "--to", to],
        vec!["--from-json", from, "--to", "localhost:6385"],
        vec!["--from-ironic", "ftp://ironic", "--to", to],
        vec!["--from-json", from, "--to", to, "--timeout", "0"],
        vec!["--from-json", from, "--to", to, "--cacert", missing],
    ] {
        exited(&import(&args), 64, &args.join(" "));
    }
}

/// Creates a node (and a port with `mac`, when given) in the API; returns its UUID.
async fn enroll(api: &Api, body: Value, mac: Option<&str>) -> String {
    let node = api.call(Method::POST, "/v1/nodes", Some(body)).await;
    let uuid = node["uuid"].as_str().expect("a node UUID").to_owned();
    if let Some(mac) = mac {
        api.call(
            Method::POST,
            "/v1/ports",
            Some(json!({"address": mac, "node_uuid": uuid})),
        )
        .await;
    }
    uuid
}

/// A `redfish` node of Ironic on the emulated iLO `bmc`.
fn redfish_node(name: &str, bmc: SocketAddr, cert: &Path) -> Value {
    json!({
        "name": name,
        "driver": "redfish",
        "boot_interface": "redfish-virtual-media",
        "deploy_interface": "direct",
        "driver_info": {
            "redfish_address": format!("https://{bmc}"),
            "redfish_system_id": "/redfish/v1/Systems/1",
            "redfish_username": ILO_USER,
            "redfish_password": ILO_PASSWORD,
            "redfish_verify_ca": cert.display().to_string(),
            "deploy_kernel": "http://images.example/ipa.kernel",
            "deploy_ramdisk": "http://images.example/ipa.initramfs",
        },
        "properties": {"cpus": 16, "memory_mb": 65536, "local_gb": 480, "cpu_arch": "x86_64",
                       "capabilities": "boot_mode:uefi"},
        "extra": {"imported_from": "ironic-39"},
    })
}

/// A `fake-hardware` node of Ironic.
fn fake_node(name: &str) -> Value {
    json!({
        "name": name,
        "driver": "fake-hardware",
        "boot_interface": "fake",
        "deploy_interface": "fake",
        "power_interface": "fake",
        "management_interface": "fake",
    })
}

/// Per node of a JSON report: what the import decided (for comparing two reports).
fn decisions(report: &Value) -> Vec<Value> {
    let mut out: Vec<Value> = report["nodes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|n| {
            json!([
                n["uuid"],
                n["taken_over"],
                n["driver"],
                n["not_taken_over"],
                n["carries"],
                n["dropped"],
                n["stays_enroll"],
                n["ports"]
            ])
        })
        .collect();
    out.sort_by_key(|v| v[0].as_str().unwrap_or_default().to_owned());
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redfish_nodes_of_a_running_ironic_are_imported() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_emulator, bmcs) = start_emulator_with(dir.path(), 2, &["--product", ILO5_PRODUCT]);
    let cert = dir.path().join("ilo-cert.pem");
    let ironic_dir = dir.path().join("ironic");
    std::fs::create_dir_all(&ironic_dir).expect("Ironic's directory");
    // Pages of one record: the import follows Ironic's own `next` links.
    let ironic = Ironic::start_paged(&ironic_dir, &REDFISH_AND_FAKE, Some(1));
    ironic
        .wait_drivers(&["redfish", "fake-hardware"], Duration::from_secs(120))
        .await;
    let source = api(&ironic.url);

    // Ironic's nodes: redfish ones on the emulator (Ironic checks their BMC on manage), one
    // available and one left in enroll; fake ones, one manageable and one deployed.
    let available = enroll(
        &source,
        redfish_node("rf-available", bmcs[0], &cert),
        Some("52:54:00:1e:00:01"),
    )
    .await;
    provision(&source, &available, "manage", "manageable").await;
    provision(&source, &available, "provide", "available").await;
    let enrolled = enroll(
        &source,
        redfish_node("rf-enroll", bmcs[1], &cert),
        Some("52:54:00:1e:00:02"),
    )
    .await;
    let fake_manageable = enroll(&source, fake_node("fake-manageable"), None).await;
    provision(&source, &fake_manageable, "manage", "manageable").await;
    let fake_active = enroll(&source, fake_node("fake-active"), Some("52:54:00:1e:00:04")).await;
    provision(&source, &fake_active, "manage", "manageable").await;
    provision(&source, &fake_active, "provide", "available").await;
    source
        .call(
            Method::PATCH,
            &format!("/v1/nodes/{fake_active}"),
            Some(json!([{"op": "add", "path": "/instance_info/image_source",
                         "value": "http://images.example/fake.qcow2"}])),
        )
        .await;
    provision(&source, &fake_active, "active", "active").await;

    let serve = Serve::start(dir.path());
    let vmdeploy = api(&serve.url);
    let to = serve.url.as_str();

    // The dry run from the API.
    let from_api: Value = serde_json::from_str(&exited(
        &import(&["--from-ironic", &ironic.url, "--to", to, "--json"]),
        0,
        "--from-ironic dry run",
    ))
    .expect("one JSON object");
    let node = |uuid: &str| -> Value {
        from_api["nodes"]
            .as_array()
            .and_then(|nodes| nodes.iter().find(|n| n["uuid"] == uuid).cloned())
            .unwrap_or_else(|| panic!("{uuid} missing from {from_api:#}"))
    };
    for (uuid, state) in [(&available, "available"), (&enrolled, "enroll")] {
        let n = node(uuid);
        assert_eq!(n["source"]["provision_state"], state, "{n:#}");
        assert_eq!(n["taken_over"], true, "{n:#}");
        assert_eq!(n["driver"], "redfish", "{n:#}");
        assert_eq!(n["ends"], "enroll", "{n:#}");
        assert_eq!(
            n["stays_enroll"],
            json!([
                "manage needs redfish_password (masked by the source): set it, then manage the \
                 node"
            ]),
            "{n:#}"
        );
        assert!(
            n["notes"]
                .as_array()
                .is_some_and(|notes| notes.iter().any(|note| note
                    .as_str()
                    .is_some_and(|s| s.starts_with(
                        "redfish_password is masked by the source API: set it after import"
                    )))),
            "{n:#}"
        );
        assert_eq!(n["ports"].as_array().map(Vec::len), Some(1), "{n:#}");
    }
    assert_eq!(node(&fake_active)["not_taken_over"], "in use (active)");
    assert!(node(&fake_manageable)["not_taken_over"]
        .as_str()
        .is_some_and(|s| s.starts_with("driver fake-hardware has no vmdeploy counterpart")));
    assert_eq!(from_api["summary"]["taken_over"], 2);

    // The same decisions from the venv's `baremetal` CLI exports (python-ironicclient 6.x).
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("a HOME for the CLI");
    let export = |args: &[&str], file: &str| -> PathBuf {
        let out = baremetal::run(&ironic.url, &home, args);
        let path = dir.path().join(file);
        std::fs::write(&path, baremetal::succeeded(args, &out)).expect("writing an export");
        path
    };
    let nodes_file = export(
        &["node", "list", "--long", "--limit", "0", "-f", "json"],
        "nodes.json",
    );
    let ports_file = export(
        &["port", "list", "--long", "--limit", "0", "-f", "json"],
        "ports.json",
    );
    let from_cli: Value = serde_json::from_str(&exited(
        &import(&[
            "--from-json",
            nodes_file.to_str().expect("a UTF-8 path"),
            "--ports-json",
            ports_file.to_str().expect("a UTF-8 path"),
            "--to",
            to,
            "--json",
        ]),
        0,
        "--from-json dry run of the CLI's exports",
    ))
    .expect("one JSON object");
    assert_eq!(decisions(&from_cli), decisions(&from_api));

    // --apply: both redfish nodes in vmdeploy, without the password Ironic masked.
    let report = exited(
        &import(&["--from-ironic", &ironic.url, "--to", to, "--apply"]),
        0,
        "--from-ironic --apply",
    );
    assert!(
        report.contains("; applied: 2 enrolled, 0 manageable, 0 failed\n"),
        "{report}"
    );
    for (uuid, name, bmc, mac) in [
        (&available, "rf-available", bmcs[0], "52:54:00:1e:00:01"),
        (&enrolled, "rf-enroll", bmcs[1], "52:54:00:1e:00:02"),
    ] {
        let n = vmdeploy.node(uuid).await;
        assert_eq!(n["name"], name, "{n:#}");
        assert_eq!(n["driver"], "redfish", "{n:#}");
        assert_eq!(n["boot_interface"], "redfish-virtual-media", "{n:#}");
        assert_eq!(n["deploy_interface"], "direct", "{n:#}");
        assert_eq!(n["provision_state"], "enroll", "{n:#}");
        assert_eq!(
            keys(&n["driver_info"]),
            [
                "redfish_address",
                "redfish_system_id",
                "redfish_username",
                "redfish_verify_ca"
            ],
            "{n:#}"
        );
        assert_eq!(
            n["driver_info"]["redfish_address"],
            format!("https://{bmc}")
        );
        assert_eq!(n["properties"]["capabilities"], "boot_mode:uefi", "{n:#}");
        assert_eq!(n["extra"]["imported_from"], "ironic-39", "{n:#}");
        assert_eq!(ports_of(&vmdeploy, uuid).await, [(mac.to_owned(), true)]);
    }
    for uuid in [&fake_manageable, &fake_active] {
        let (status, _) = get(&vmdeploy, &format!("/v1/nodes/{uuid}")).await;
        assert_eq!(status, 404, "{uuid} was not to be imported");
    }

    // With the password set, the imported driver_info reaches the BMC: manageable.
    for uuid in [&available, &enrolled] {
        vmdeploy
            .call(
                Method::PATCH,
                &format!("/v1/nodes/{uuid}"),
                Some(
                    json!([{"op": "add", "path": "/driver_info/redfish_password",
                             "value": ILO_PASSWORD}]),
                ),
            )
            .await;
        provision(&vmdeploy, uuid, "manage", "manageable").await;
    }
    drop(ironic);
}
