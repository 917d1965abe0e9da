//! The agent's `run` flow in iSCSI mode, end to end through the binary: the floppy (built by
//! `shared::fat`, attached with `losetup`) is found by its label `ir-vfd-dev` among the real
//! block devices, the disk is another loop device, and a protocol-checking stand-in plays the
//! conductor (pass_deploy_info, then `vmdeploy-conductor iscsi write` and `done`).
//! Failure cases: no floppy, malformed or incomplete parameters, no disk matching the hints (the
//! conductor hears why), and a refused pass_deploy_info.
//!
//! The agent finds the floppy by scanning every block device, so each test holds the lock on the
//! label (another test process could attach a floppy with it), and first checks that no device
//! left over by a crashed run carries it.
//!
//! "The target was stopped" is checked while the agent still runs: the agent is stopped
//! (SIGSTOP) at a point where it waits, then run in short steps until its iSCSI port stops
//! listening ([`freeze`]); a port found closed after the agent exited would prove nothing.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use vmdeploy_agent::floppy::{FloppySearch, PARAMS_FILE};
use vmdeploy_integration_tests::child::ChildGuard;
use vmdeploy_integration_tests::freeze;
use vmdeploy_integration_tests::iscsi_standin::{self, IscsiStandin, StandinConfig};
use vmdeploy_integration_tests::lock::ResourceLock;
use vmdeploy_integration_tests::loopdev::{LoopDevice, LoopIo};
use vmdeploy_integration_tests::{bin, free_port, tcp_listening};

const NODE: &str = "1be26c0b-03f2-4d2e-ae87-c02d7f33c123";
const KEY: &str = "0123456789ABCDEFGHIJKLMNOPQRSTUV";
const LABEL: &str = "ir-vfd-dev";
const DISK_LEN: u64 = 64 << 20;
const IMAGE_LEN: usize = 24 << 20;

fn iqn() -> String {
    format!("iqn-{NODE}")
}

/// A stand-in over plain http for this test's node that answers at once and expects `key`.
fn plain_standin(key: &str) -> IscsiStandin {
    IscsiStandin::start(StandinConfig {
        node: NODE.into(),
        key: key.into(),
        iqn: iqn(),
        fail_first: 0,
        tls: None,
    })
}

/// An empty (sparse) disk of `DISK_LEN` bytes on a loop device.
fn new_disk() -> LoopDevice {
    LoopDevice::attach(&[], DISK_LEN, LoopIo::Buffered)
}

/// Takes the lock on the floppy label (held until the returned guard drops), then checks that no
/// device carries the label: the agent could read someone else's floppy.
#[must_use = "the label is only ours while the guard lives"]
fn claim_the_floppy_label() -> ResourceLock {
    let guard = ResourceLock::acquire(&format!("floppy-label-{LABEL}"));
    let search = FloppySearch {
        attempts: 1,
        ..Default::default()
    };
    if let Ok(Some(dev)) = search.scan() {
        panic!(
            "{} already carries the label {LABEL:?} (left over by another run?): detach it \
             with `losetup -d {}`",
            dev.display(),
            dev.display()
        );
    }
    guard
}

fn floppy(params: &str) -> LoopDevice {
    floppy_with(params, &[])
}

fn floppy_with(params: &str, extra: &[(&str, &[u8])]) -> LoopDevice {
    let mut files: Vec<(&str, &[u8])> = vec![(PARAMS_FILE, params.as_bytes())];
    files.extend_from_slice(extra);
    let image = vmdeploy_shared::fat::build_floppy(LABEL, &files).expect("building the floppy");
    LoopDevice::attach(&image, 0, LoopIo::Buffered)
}

fn iscsi_params(api_url: &str, extra: &str) -> String {
    format!(
        "deployment_id={NODE}\ndeployment_key={KEY}\niscsi_target_iqn={}\n\
         ironic_api_url={api_url}\nboot_option=netboot\nboot_mode=bios\ncoreos.configdrive=0\n{extra}",
        iqn()
    )
}

/// The agent process; killed on drop.
struct Agent {
    child: ChildGuard,
    stderr_path: PathBuf,
    _dir: tempfile::TempDir,
    iscsi: SocketAddr,
    done: SocketAddr,
}

impl Agent {
    fn start(cmdline: &str, extra: &[&str]) -> Agent {
        let dir = tempfile::tempdir().expect("temp dir");
        let cmdline_file = dir.path().join("cmdline");
        std::fs::write(&cmdline_file, cmdline).expect("cmdline file");
        let stderr_path = dir.path().join("stderr");
        let iscsi: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let done: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let child = Command::new(bin("vmdeploy-agent"))
            .arg("run")
            .arg("--cmdline-file")
            .arg(&cmdline_file)
            .args(["--address", "127.0.0.1"])
            .args(["--iscsi-listen", &iscsi.to_string()])
            .args(["--done-listen", &done.to_string()])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
            .spawn()
            .expect("starting vmdeploy-agent run");
        Agent {
            child: ChildGuard::new(child),
            stderr_path,
            _dir: dir,
            iscsi,
            done,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// With the agent stopped ([`freeze::stop`]) at a point where its target still listens: lets
    /// it run to its exit and requires its iSCSI port to be closed at the instant it enters
    /// exit, before the kernel would close it for it.
    fn assert_target_stops_before_exit(&self) {
        let port = self.iscsi.port();
        assert!(
            tcp_listening(port),
            "the target does not listen on {port} before the stop; agent:\n{}",
            self.stderr()
        );
        let closed =
            freeze::check_at_exit(self.pid(), Duration::from_secs(60), || !tcp_listening(port));
        assert!(
            closed,
            "the agent entered exit with its iSCSI port {port} still listening; agent:\n{}",
            self.stderr()
        );
    }

    /// Waits for the exit; panics (after a kill) if it takes longer than `limit`.
    fn wait(&mut self, limit: Duration) -> (ExitStatus, String) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("polling the agent") {
                let said = self.stderr();
                eprintln!("--- agent stderr ---\n{said}--- end ---");
                return (status, said);
            }
            if start.elapsed() > limit {
                self.child.kill();
                panic!("the agent ran over {limit:?}; stderr:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Deterministic pseudo-random bytes, so a misplaced block cannot go unseen.
fn pattern(len: usize) -> Vec<u8> {
    vmdeploy_integration_tests::tools::xorshift_bytes(len, 0x9E37_79B9_7F4A_7C15)
}

/// Each of `lines` appears in `said`, in this order.
fn assert_logged_in_order(said: &str, lines: &[&str]) {
    let mut from = 0;
    for line in lines {
        match said[from..].find(line) {
            Some(at) => from += at + line.len(),
            None => panic!("{line:?} is missing or out of order in {lines:?}:\n{said}"),
        }
    }
}

fn read_device(dev: &Path, len: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(dev).expect("opening the disk");
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf).expect("reading the disk");
    buf
}

#[test]
fn iscsi_deploy_end_to_end_through_the_floppy_found_by_label() {
    let _label = claim_the_floppy_label();
    let disk = new_disk();
    // Two 503s first: the agent must retry (with backoff) until the 202.
    let standin = IscsiStandin::start(StandinConfig {
        node: NODE.into(),
        key: KEY.into(),
        iqn: iqn(),
        fail_first: 2,
        tls: None,
    });
    // With Keystone auth the conductor adds a `token` file; it goes out as X-Auth-Token.
    let _floppy = floppy_with(
        &iscsi_params(
            &standin.api_url(),
            &format!("disk=nosuchdisk,{}\n", disk.name()),
        ),
        &[("token", b"gAAAAAB-keystone-token".as_slice())],
    );
    let mut agent = Agent::start(
        "boot_method=vmedia console=ttyS0,115200n8 --\n",
        &["--floppy-wait-secs", "20"],
    );

    let calls = standin.wait_for(3, Duration::from_secs(60));
    assert_eq!(
        calls.iter().map(|c| c.status).collect::<Vec<_>>(),
        [503, 503, 202],
        "calls: {calls:?}\nagent: {}",
        agent.stderr()
    );
    let ok = &calls[2];
    assert!(ok.problems.is_empty(), "{:?}", ok.problems);
    assert_eq!(ok.body["address"], "127.0.0.1");
    assert_eq!(ok.body["key"], KEY);
    assert_eq!(ok.body["iqn"], iqn().as_str());
    assert!(ok.error().is_none(), "{:?}", ok.body);
    assert_eq!(ok.auth_token.as_deref(), Some("gAAAAAB-keystone-token"));

    let dir = tempfile::tempdir().expect("temp dir");
    let image = dir.path().join("image.raw");
    let data = pattern(IMAGE_LEN);
    std::fs::write(&image, &data).expect("image");
    let out = iscsi_standin::write_image(
        &agent.iscsi.to_string(),
        &iqn(),
        &image,
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "iscsi write failed ({}): {}\nagent: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        agent.stderr()
    );
    // The agent waits for done: stop it there, send done, and watch it stop the target.
    freeze::stop(agent.pid());
    iscsi_standin::send_done(agent.done).expect("sending done");
    agent.assert_target_stops_before_exit();

    let (status, said) = agent.wait(Duration::from_secs(60));
    assert!(status.success(), "agent exit {status}");
    assert!(said.contains("found the virtual floppy"), "{said}");
    assert_logged_in_order(
        &said,
        &[
            "done notification received",
            "stopping the iSCSI target",
            "target stopped",
        ],
    );
    assert!(
        read_device(disk.device(), IMAGE_LEN) == data,
        "the disk does not hold the image byte for byte"
    );
}

#[test]
fn no_floppy_is_a_clear_error_after_the_bounded_wait() {
    let _label = claim_the_floppy_label();
    let start = Instant::now();
    let mut agent = Agent::start("boot_method=vmedia\n", &["--floppy-wait-secs", "2"]);
    let (status, said) = agent.wait(Duration::from_secs(30));
    assert!(!status.success());
    assert!(start.elapsed() >= Duration::from_secs(2), "it did not wait");
    assert!(
        said.contains("no block device labelled \"ir-vfd-dev\""),
        "{said}"
    );
    assert!(said.contains("nobody to report to"), "{said}");
}

#[test]
fn malformed_parameters_are_named_on_the_console() {
    let _label = claim_the_floppy_label();
    let _floppy = floppy("deployment_id=x\nthis line has no equals sign\n");
    let mut agent = Agent::start("boot_method=vmedia\n", &["--floppy-wait-secs", "10"]);
    let (status, said) = agent.wait(Duration::from_secs(30));
    assert!(!status.success());
    assert!(said.contains("parameters.txt"), "{said}");
    assert!(said.contains("line 2: expected key=value"), "{said}");
}

#[test]
fn parameters_without_a_deploy_are_refused() {
    let _label = claim_the_floppy_label();
    let _floppy = floppy("deployment_id=x\nironic_api_url=http://127.0.0.1:1\ndisk=sda\n");
    let mut agent = Agent::start("boot_method=vmedia\n", &["--floppy-wait-secs", "10"]);
    let (status, said) = agent.wait(Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        said.contains("neither \"deployment_key\"") && said.contains("\"ipa-api-url\""),
        "{said}"
    );
}

#[test]
fn a_missing_iscsi_key_is_named_and_reported() {
    let _label = claim_the_floppy_label();
    let standin = plain_standin(KEY);
    let params =
        iscsi_params(&standin.api_url(), "").replace(&format!("iscsi_target_iqn={}\n", iqn()), "");
    let _floppy = floppy(&params);
    let mut agent = Agent::start("boot_method=vmedia\n", &["--floppy-wait-secs", "10"]);
    let (status, said) = agent.wait(Duration::from_secs(60));
    assert!(!status.success());
    assert!(
        said.contains("required parameter \"iscsi_target_iqn\" is missing"),
        "{said}"
    );
    let calls = standin.received();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].status, 202);
    let error = calls[0].error().expect("the error is reported");
    assert!(error.contains("iscsi_target_iqn"), "{error}");
}

#[test]
fn no_disk_matching_the_hints_is_reported_to_the_conductor() {
    let _label = claim_the_floppy_label();
    let disk = new_disk();
    let standin = plain_standin(KEY);
    let _floppy = floppy(&iscsi_params(
        &standin.api_url(),
        &format!(
            "disk={}\nroot_device=serial=NOSUCHSERIAL,size=64\n",
            disk.name()
        ),
    ));
    let mut agent = Agent::start("boot_method=vmedia\n", &["--floppy-wait-secs", "10"]);
    let (status, said) = agent.wait(Duration::from_secs(60));
    assert!(!status.success());
    assert!(
        said.contains("no disk matches the root device hints"),
        "{said}"
    );
    let calls = standin.received();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].status, 202, "{:?}", calls[0].problems);
    assert_eq!(calls[0].body["key"], KEY);
    let error = calls[0].error().expect("the error is reported");
    assert!(
        error.contains("no disk matches the root device hints"),
        "{error}"
    );
    assert!(error.contains("nosuchserial"), "{error}");
}

#[test]
fn a_refused_pass_deploy_info_stops_the_agent() {
    let _label = claim_the_floppy_label();
    let disk = new_disk();
    // The conductor expects another key: 403, which no retry can fix. The answer is held back
    // until the agent, waiting for it, has been stopped.
    let standin = IscsiStandin::start_holding(StandinConfig {
        node: NODE.into(),
        key: "ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ".into(),
        iqn: iqn(),
        fail_first: 0,
        tls: None,
    });
    let _floppy = floppy(&iscsi_params(
        &standin.api_url(),
        &format!("disk={}\n", disk.name()),
    ));
    let mut agent = Agent::start("boot_method=vmedia\n", &["--floppy-wait-secs", "10"]);
    assert!(
        standin.wait_held(Duration::from_secs(30)),
        "no pass_deploy_info within 30 s; agent:\n{}",
        agent.stderr()
    );
    freeze::stop(agent.pid());
    standin.release();
    agent.assert_target_stops_before_exit();
    let (status, said) = agent.wait(Duration::from_secs(60));
    assert!(!status.success());
    assert!(
        said.contains("refused pass_deploy_info with 403 Forbidden"),
        "{said}"
    );
    assert!(
        said.contains("is not valid (wrong, or already used)"),
        "body logged: {said}"
    );
    let calls = standin.received();
    assert_eq!(calls.len(), 1, "a 403 is not retried: {calls:?}");
    assert_eq!(calls[0].status, 403);
    assert_logged_in_order(
        &said,
        &[
            "stopping the iSCSI target",
            "target stopped",
            "deploy failed",
        ],
    );
}

#[test]
fn no_done_within_the_timeout_fails_and_stops_the_target() {
    let _label = claim_the_floppy_label();
    let disk = new_disk();
    let standin = plain_standin(KEY);
    let _floppy = floppy(&iscsi_params(
        &standin.api_url(),
        &format!("root_device=name={}\n", disk.name()),
    ));
    let mut agent = Agent::start(
        "boot_method=vmedia\n",
        &["--floppy-wait-secs", "10", "--done-timeout-secs", "2"],
    );
    let calls = standin.wait_for(1, Duration::from_secs(30));
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].status, 202, "{:?}", calls[0].problems);
    // Stopped while it waits for done; its 2 s run out meanwhile (the clock goes on).
    freeze::stop(agent.pid());
    std::thread::sleep(Duration::from_millis(2500));
    agent.assert_target_stops_before_exit();
    let (status, said) = agent.wait(Duration::from_secs(30));
    assert!(!status.success());
    // The target stops first, then the agent names the failure and exits.
    assert_logged_in_order(
        &said,
        &[
            "stopping the iSCSI target",
            "target stopped",
            "deploy failed: no done notification from the conductor within 2 s",
        ],
    );
}

#[test]
fn an_https_conductor_is_trusted_only_with_the_floppys_ca() {
    use base64::Engine as _;
    let _label = claim_the_floppy_label();
    let disk = new_disk();
    let pki = vmdeploy_integration_tests::http::TestPki::new();
    let stranger = vmdeploy_integration_tests::http::TestPki::new();
    let standin = IscsiStandin::start(StandinConfig {
        node: NODE.into(),
        key: KEY.into(),
        iqn: iqn(),
        fail_first: 0,
        tls: Some(pki.server_config.clone()),
    });
    assert!(standin.api_url().starts_with("https://"));
    let with_ca = |pem: &str| {
        iscsi_params(
            &standin.api_url(),
            &format!(
                "disk={}\nipa-agent-ca={}\n",
                disk.name(),
                base64::engine::general_purpose::STANDARD.encode(pem)
            ),
        )
    };

    // Another CA on the floppy: the conductor's certificate is not trusted, nothing is sent.
    {
        let _floppy = floppy(&with_ca(&stranger.ca_pem));
        let mut agent = Agent::start(
            "boot_method=vmedia\n",
            &["--floppy-wait-secs", "10", "--report-timeout-secs", "2"],
        );
        let (status, said) = agent.wait(Duration::from_secs(30));
        assert!(!status.success());
        assert!(said.contains("invalid peer certificate"), "{said}");
        assert!(standin.received().is_empty(), "{:?}", standin.received());
    }

    // The conductor's CA: accepted over TLS.
    let _floppy = floppy(&with_ca(&pki.ca_pem));
    let mut agent = Agent::start("boot_method=vmedia\n", &["--floppy-wait-secs", "10"]);
    let calls = standin.wait_for(1, Duration::from_secs(30));
    assert_eq!(calls.len(), 1, "agent: {}", agent.stderr());
    assert_eq!(calls[0].status, 202, "{:?}", calls[0].problems);
    iscsi_standin::send_done(agent.done).expect("sending done");
    let (status, _) = agent.wait(Duration::from_secs(30));
    assert!(status.success(), "agent exit {status}");
}
