//! The agent's `run` flow in iSCSI mode, end to end through the binary: the floppy (built by
//! `shared::fat`, attached with `losetup`) is found by its label `ir-vfd-dev` among the real
//! block devices, the disk is another loop device, and a protocol-checking stand-in plays the
//! conductor (pass_deploy_info, then `vmdeploy-conductor iscsi write` and `done`).
//! Failure cases: no floppy, malformed or incomplete parameters, no disk matching the hints (the
//! conductor hears why), and a refused pass_deploy_info.
//!
//! Integration tests run one at a time (nextest "heavy" group), but a loop device left over by a
//! crashed run could carry the label too: each test first checks that none does.

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use vmdeploy_agent::floppy::{FloppySearch, PARAMS_FILE};
use vmdeploy_integration_tests::iscsi_standin::{self, IscsiStandin, StandinConfig};
use vmdeploy_integration_tests::{bin, free_port};

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

/// A file attached as a loop device; detached (and the file removed) on drop.
struct Loop {
    _dir: tempfile::TempDir,
    device: PathBuf,
}

impl Loop {
    fn attach(contents: &[u8], len: u64) -> Loop {
        let dir = tempfile::tempdir_in("/var/tmp").expect("scratch dir");
        let file = dir.path().join("img");
        std::fs::write(&file, contents).expect("image file");
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .expect("reopening the image");
        f.set_len(len.max(contents.len() as u64))
            .expect("sizing the image");
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&file)
            .output()
            .expect("running losetup (needs root)");
        assert!(
            out.status.success(),
            "losetup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Loop {
            _dir: dir,
            device: PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
        }
    }

    fn name(&self) -> String {
        self.device
            .file_name()
            .expect("a device path has a name")
            .to_string_lossy()
            .into_owned()
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

/// No other device may carry the floppy label, or the agent could read someone else's floppy.
fn assert_no_stray_floppy() {
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
}

fn floppy(params: &str) -> Loop {
    floppy_with(params, &[])
}

fn floppy_with(params: &str, extra: &[(&str, &[u8])]) -> Loop {
    let mut files: Vec<(&str, &[u8])> = vec![(PARAMS_FILE, params.as_bytes())];
    files.extend_from_slice(extra);
    let image = vmdeploy_shared::fat::build_floppy(LABEL, &files).expect("building the floppy");
    let len = image.len() as u64;
    Loop::attach(&image, len)
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
    child: Child,
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
            child,
            stderr_path,
            _dir: dir,
            iscsi,
            done,
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
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
                let _ = self.child.kill();
                panic!("the agent ran over {limit:?}; stderr:\n{}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Deterministic pseudo-random bytes (xorshift), so a misplaced block cannot go unseen.
fn pattern(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn read_device(dev: &Path, len: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(dev).expect("opening the disk");
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf).expect("reading the disk");
    buf
}

#[test]
fn iscsi_deploy_end_to_end_through_the_floppy_found_by_label() {
    assert_no_stray_floppy();
    let disk = Loop::attach(&[], DISK_LEN);
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
    if let Err(e) = iscsi_standin::write_and_notify(
        &agent.iscsi.to_string(),
        &iqn(),
        &image,
        agent.done,
        Duration::from_secs(120),
    ) {
        panic!("{e}\nagent: {}", agent.stderr());
    }

    let (status, said) = agent.wait(Duration::from_secs(60));
    assert!(status.success(), "agent exit {status}");
    assert!(said.contains("found the virtual floppy"), "{said}");
    assert!(said.contains("done notification received"), "{said}");
    assert!(
        read_device(&disk.device, IMAGE_LEN) == data,
        "the disk does not hold the image byte for byte"
    );
}

#[test]
fn no_floppy_is_a_clear_error_after_the_bounded_wait() {
    assert_no_stray_floppy();
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
    assert_no_stray_floppy();
    let _floppy = floppy("deployment_id=x\nthis line has no equals sign\n");
    let mut agent = Agent::start("boot_method=vmedia\n", &["--floppy-wait-secs", "10"]);
    let (status, said) = agent.wait(Duration::from_secs(30));
    assert!(!status.success());
    assert!(said.contains("parameters.txt"), "{said}");
    assert!(said.contains("line 2: expected key=value"), "{said}");
}

#[test]
fn parameters_without_a_deploy_are_refused() {
    assert_no_stray_floppy();
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
    assert_no_stray_floppy();
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
    assert_no_stray_floppy();
    let disk = Loop::attach(&[], DISK_LEN);
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
    assert_no_stray_floppy();
    let disk = Loop::attach(&[], DISK_LEN);
    // The conductor expects another key: 403, which no retry can fix.
    let standin = plain_standin("ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ");
    let _floppy = floppy(&iscsi_params(
        &standin.api_url(),
        &format!("disk={}\n", disk.name()),
    ));
    let mut agent = Agent::start("boot_method=vmedia\n", &["--floppy-wait-secs", "10"]);
    let (status, said) = agent.wait(Duration::from_secs(60));
    assert!(!status.success());
    assert!(
        said.contains("refused pass_deploy_info with 403 Forbidden"),
        "{said}"
    );
    assert!(
        said.contains("Deploy key does not match"),
        "body logged: {said}"
    );
    let calls = standin.received();
    assert_eq!(calls.len(), 1, "a 403 is not retried: {calls:?}");
    assert_eq!(calls[0].status, 403);
    // The target was stopped: nothing listens any more.
    assert!(std::net::TcpStream::connect(agent.iscsi).is_err());
}

#[test]
fn no_done_within_the_timeout_fails_and_stops_the_target() {
    assert_no_stray_floppy();
    let disk = Loop::attach(&[], DISK_LEN);
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
    let (status, said) = agent.wait(Duration::from_secs(30));
    assert!(!status.success());
    assert!(
        said.contains("no done notification from the conductor within 2 s"),
        "{said}"
    );
    assert!(said.contains("target stopped"), "{said}");
    assert!(std::net::TcpStream::connect(agent.iscsi).is_err());
}

#[test]
fn an_https_conductor_is_trusted_only_with_the_floppys_ca() {
    use base64::Engine as _;
    assert_no_stray_floppy();
    let disk = Loop::attach(&[], DISK_LEN);
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
