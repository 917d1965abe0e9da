//! The agent's network bring-up against a real DHCP server: a network namespace holds one end of
//! a veth pair (the "node's NIC", with a known MAC), dnsmasq serves DHCP on the other end, and
//! `vmdeploy-agent net-up` runs inside the namespace (`ip netns exec`). The lease is checked in
//! the agent's JSON output and in the kernel's own view (`ip -n NS addr`/`route`).
//! Also: static configuration, a BOOTIF matching no NIC, and no DHCP server (bounded timeout).
//!
//! The veth subnet is 10.231.N.0/24 with N from the test's pid: it exists only between the host
//! end and the namespace, and everything is deleted in Drop.

use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use vmdeploy_integration_tests::bin;
use vmdeploy_integration_tests::child::ChildGuard;

static NEXT: AtomicU32 = AtomicU32::new(0);

const NODE_MAC: &str = "02:5e:00:c0:ff:ee";

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A network namespace with `eth0` (MAC [`NODE_MAC`]) wired by veth to a host end with
/// `10.231.N.1/24`; optionally dnsmasq on the host end. Everything goes away on Drop.
struct Testbed {
    ns: String,
    host_if: String,
    subnet: String,
    dir: tempfile::TempDir,
    dnsmasq: Option<ChildGuard>,
}

impl Testbed {
    fn new() -> Testbed {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let ns = format!("vmdnet-{pid}-{n}");
        let host_if = format!("vmdn{}h{n}", pid % 100_000);
        let subnet = format!("10.231.{}", (pid + n) % 250 + 1);
        let bed = Testbed {
            ns: ns.clone(),
            host_if: host_if.clone(),
            subnet: subnet.clone(),
            dir: tempfile::tempdir().expect("scratch dir"),
            dnsmasq: None,
        };
        run(Command::new("ip").args(["netns", "add", &ns]));
        run(Command::new("ip").args([
            "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ]));
        run(Command::new("ip").args(["-n", &ns, "link", "set", "eth0", "address", NODE_MAC]));
        run(Command::new("ip").args(["addr", "add", &format!("{subnet}.1/24"), "dev", &host_if]));
        run(Command::new("ip").args(["link", "set", &host_if, "up"]));
        bed
    }

    fn start_dnsmasq(&mut self) {
        let s = &self.subnet;
        let child = Command::new("dnsmasq")
            .args([
                "--no-daemon",
                "--conf-file=/dev/null",
                "--port=0",
                "--bind-interfaces",
                "--leasefile-ro",
                "--log-dhcp",
                "--user=root",
            ])
            .arg(format!("--interface={}", self.host_if))
            .arg(format!("--dhcp-range={s}.50,{s}.99,255.255.255.0,1h"))
            .arg(format!("--dhcp-option=3,{s}.1"))
            .arg(format!("--dhcp-option=6,{s}.53,{s}.54"))
            .arg(format!(
                "--pid-file={}",
                self.dir.path().join("dnsmasq.pid").display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting dnsmasq (scripts/setup installs dnsmasq-base)");
        self.dnsmasq = Some(ChildGuard::new(child));
        // dnsmasq binds its DHCP socket at start-up; give it a moment (the agent retransmits
        // anyway, so this only saves a 4 s retransmission).
        std::thread::sleep(Duration::from_millis(300));
    }

    fn agent(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(bin("vmdeploy-agent"))
            .arg("net-up")
            .args(args)
            .output()
            .expect("running the agent in the namespace")
    }

    /// The agent started in the background; killed on drop if the test fails before waiting.
    fn spawn_agent(&self, args: &[&str]) -> ChildGuard {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(bin("vmdeploy-agent"))
            .arg("net-up")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the agent in the namespace");
        ChildGuard::new(child)
    }

    fn ip(&self, args: &[&str]) -> String {
        let out = run(Command::new("ip").args(["-n", &self.ns]).args(args));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        // dnsmasq goes before its namespace's link does.
        drop(self.dnsmasq.take());
        // Deleting the namespace deletes eth0 and with it the veth pair.
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .stderr(Stdio::null())
            .status();
    }
}

fn json_of(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "net-up failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("net-up JSON: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn dhcp_lease_from_dnsmasq_configures_address_route_and_dns() {
    let mut bed = Testbed::new();
    bed.start_dnsmasq();
    let resolv = bed.dir.path().join("resolv.conf");
    let started = Instant::now();
    let out = bed.agent(&[
        "--bootif",
        "01-02-5e-00-c0-ff-ee",
        "--timeout-secs",
        "30",
        "--json",
        "--resolv-conf",
        &resolv.to_string_lossy(),
    ]);
    let took = started.elapsed();
    let info = json_of(&out);
    let s = &bed.subnet;
    assert_eq!(info["interface"], "eth0");
    assert_eq!(info["mac"], NODE_MAC);
    let address = info["address"].as_str().expect("address");
    let host: u8 = address
        .strip_prefix(&format!("{s}."))
        .and_then(|h| h.parse().ok())
        .unwrap_or_else(|| panic!("{address} is not in {s}.0/24"));
    assert!(
        (50..=99).contains(&host),
        "{address} outside the dhcp-range"
    );
    assert_eq!(info["prefix_len"], 24);
    assert_eq!(info["gateway"], format!("{s}.1"));
    assert_eq!(
        info["dns"],
        serde_json::json!([format!("{s}.53"), format!("{s}.54")])
    );
    let resolv_text = std::fs::read_to_string(&resolv).expect("resolv.conf written");
    assert_eq!(
        resolv_text,
        format!("nameserver {s}.53\nnameserver {s}.54\n")
    );
    // The kernel's view inside the namespace.
    let addr = bed.ip(&["-4", "addr", "show", "dev", "eth0"]);
    assert!(addr.contains(&format!("inet {address}/24")), "{addr}");
    let route = bed.ip(&["-4", "route"]);
    assert!(
        route.contains(&format!("default via {s}.1 dev eth0")),
        "{route}"
    );
    eprintln!("DHCP bring-up took {took:?}");
}

#[test]
fn static_configuration_needs_no_dhcp_server() {
    let bed = Testbed::new();
    let s = bed.subnet.clone();
    let out = bed.agent(&[
        "--bootif",
        NODE_MAC,
        "--ip",
        &format!("{s}.7/24"),
        "--gateway",
        &format!("{s}.1"),
        "--dns",
        &format!("{s}.53"),
        "--timeout-secs",
        "10",
        "--json",
    ]);
    let info = json_of(&out);
    assert_eq!(info["address"], format!("{s}.7"));
    let addr = bed.ip(&["-4", "addr", "show", "dev", "eth0"]);
    assert!(addr.contains(&format!("inet {s}.7/24")), "{addr}");
    let route = bed.ip(&["-4", "route"]);
    assert!(
        route.contains(&format!("default via {s}.1 dev eth0")),
        "{route}"
    );
}

#[test]
fn static_ipv6_is_refused_clearly() {
    let bed = Testbed::new();
    let out = bed.agent(&["--ip", "fd00::7/64", "--timeout-secs", "5"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("static IPv6 configuration (fd00::7) is not supported yet"),
        "{stderr}"
    );
}

#[test]
fn bootif_matching_no_nic_is_a_clear_error() {
    let bed = Testbed::new();
    let out = bed.agent(&["--bootif", "02:00:00:00:00:99", "--timeout-secs", "5"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no interface has the BOOTIF MAC 02:00:00:00:00:99")
            && stderr.contains(&format!("eth0 {NODE_MAC}")),
        "{stderr}"
    );
}

#[test]
fn no_dhcp_server_times_out_within_the_timeout() {
    let bed = Testbed::new();
    let started = Instant::now();
    let out = bed.agent(&["--timeout-secs", "6"]);
    let took = started.elapsed();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("getting a DHCP lease on eth0"), "{stderr}");
    assert!(stderr.contains("no DHCP offer within"), "{stderr}");
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(9),
        "the 6 s timeout took {took:?}"
    );
}

#[test]
fn dhcp_retransmits_until_a_server_that_starts_late_answers() {
    let mut bed = Testbed::new();
    let started = Instant::now();
    let agent = bed.spawn_agent(&["--bootif", NODE_MAC, "--timeout-secs", "30", "--json"]);
    // The first DISCOVER goes unanswered; RFC 2131 §4.1 retransmits after 4 s (±1 s).
    std::thread::sleep(Duration::from_secs(2));
    bed.start_dnsmasq();
    let out = agent.wait_with_output().expect("waiting for the agent");
    let took = started.elapsed();
    let info = json_of(&out);
    assert!(info["address"]
        .as_str()
        .is_some_and(|a| a.starts_with(&format!("{}.", bed.subnet))));
    assert!(
        took >= Duration::from_secs(3),
        "a lease before the first retransmission ({took:?}) means the first DISCOVER was answered"
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");
}
