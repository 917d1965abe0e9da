//! The conductor's iSCSI initiator against real targets: Debian's tgtd and our own agent target.
//!
//! The 1 GiB tests drive the operator CLI exactly as docs/architecture.md names it
//! (`vmdeploy-conductor iscsi write|read|capacity --portal --iqn --lun --chap`), and compare the
//! data byte for byte: the image, the LUN's backing file, and what the initiator reads back.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use vmdeploy_conductor::initiator::{BlockingLun, InitiatorError, Session, SessionConfig};
use vmdeploy_integration_tests::agent_target::AgentTarget;
use vmdeploy_integration_tests::child::ChildGuard;
use vmdeploy_integration_tests::tgt::{TgtOptions, Tgtd};
use vmdeploy_integration_tests::{bin, free_port};

const GIB: u64 = 1 << 30;
const IQN: &str = "iqn.2024-01.org.vmdeploy:initiator-test";

fn conductor() -> Command {
    let mut cmd = Command::new(bin("vmdeploy-conductor"));
    cmd.env("RUST_LOG", "info");
    cmd
}

/// Runs the CLI with a time limit; the child is killed if it runs over.
fn run_cli(args: &[&str], limit: Duration) -> Output {
    let mut child = ChildGuard::new(
        conductor()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting vmdeploy-conductor"),
    );
    let started = Instant::now();
    loop {
        if child.try_wait().expect("polling the CLI").is_some() {
            return child.wait_with_output().expect("collecting the CLI output");
        }
        if started.elapsed() > limit {
            child.kill();
            let out = child.wait_with_output().expect("collecting the CLI output");
            panic!(
                "vmdeploy-conductor {args:?} ran over {limit:?} (it hung); stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn expect_ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn expect_err(out: &Output, what: &str) -> String {
    assert!(
        !out.status.success(),
        "{what} should have failed; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A file of `len` random bytes (from the kernel's generator).
fn random_image(dir: &Path, len: u64) -> PathBuf {
    let path = dir.join("image.raw");
    let mut src = std::fs::File::open("/dev/urandom").expect("opening /dev/urandom");
    let mut dst = std::fs::File::create(&path).expect("creating the image");
    let copied = std::io::copy(&mut (&mut src).take(len), &mut dst).expect("filling the image");
    assert_eq!(copied, len);
    path
}

/// Asserts two files are identical over the first `len` bytes, naming the first difference.
fn assert_same(a: &Path, b: &Path, len: u64) {
    let mut fa = std::fs::File::open(a).expect("opening the first file");
    let mut fb = std::fs::File::open(b).expect("opening the second file");
    let mut ba = vec![0u8; 4 << 20];
    let mut bb = vec![0u8; 4 << 20];
    let mut at = 0u64;
    while at < len {
        let n = ((len - at) as usize).min(ba.len());
        fa.read_exact(&mut ba[..n]).expect("reading the first file");
        fb.read_exact(&mut bb[..n])
            .expect("reading the second file");
        if ba[..n] != bb[..n] {
            let i = ba[..n]
                .iter()
                .zip(&bb[..n])
                .position(|(x, y)| x != y)
                .expect("a difference exists");
            panic!(
                "{} and {} differ at byte {}",
                a.display(),
                b.display(),
                at + i as u64
            );
        }
        at += n as u64;
    }
}

/// Writes a 1 GiB random image through the CLI, checks the target's backing file, reads the LUN
/// back through the CLI and compares again.
fn write_read_back(portal: &str, iqn: &str, chap: Option<&str>, backing: Option<&Path>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let image = random_image(dir.path(), GIB);
    let mut common = vec!["--portal", portal, "--iqn", iqn, "--lun", "1"];
    if let Some(chap) = chap {
        common.extend(["--chap", chap]);
    }
    let capacity = run_cli(
        &[&["iscsi", "capacity"][..], &common].concat(),
        Duration::from_secs(60),
    );
    assert_eq!(expect_ok(&capacity, "capacity").trim(), GIB.to_string());

    let image_arg = image.to_string_lossy().into_owned();
    let write = run_cli(
        &[&["iscsi", "write", &image_arg][..], &common].concat(),
        Duration::from_secs(300),
    );
    let said = expect_ok(&write, "write");
    assert!(said.contains(&format!("wrote {GIB} bytes")), "{said}");
    eprintln!("write: {}", said.trim());
    if let Some(backing) = backing {
        assert_same(&image, backing, GIB);
    }

    let back = dir.path().join("readback.raw");
    let back_arg = back.to_string_lossy().into_owned();
    let read = run_cli(
        &[&["iscsi", "read", &back_arg][..], &common].concat(),
        Duration::from_secs(300),
    );
    let said = expect_ok(&read, "read");
    eprintln!("read: {}", said.trim());
    assert_eq!(
        std::fs::metadata(&back).expect("readback exists").len(),
        GIB
    );
    assert_same(&image, &back, GIB);
}

#[test]
fn tgtd_write_and_read_back_1gib() {
    let tgtd = Tgtd::start(TgtOptions::new(IQN, GIB)).expect("starting tgtd");
    write_read_back(&tgtd.portal(), tgtd.iqn(), None, Some(tgtd.backing_file()));
}

#[test]
fn tgtd_write_and_read_back_1gib_with_chap() {
    let mut options = TgtOptions::new(IQN, GIB);
    options.chap = Some(("alice".into(), "secretpass12".into()));
    options.tuned = true;
    let tgtd = Tgtd::start(options).expect("starting tgtd");
    write_read_back(
        &tgtd.portal(),
        tgtd.iqn(),
        Some("alice:secretpass12"),
        Some(tgtd.backing_file()),
    );
}

#[test]
fn tgtd_login_errors_are_clear_and_quick() {
    let mut options = TgtOptions::new(IQN, 64 << 20);
    options.chap = Some(("alice".into(), "secretpass12".into()));
    let tgtd = Tgtd::start(options).expect("starting tgtd");
    let portal = tgtd.portal();
    let limit = Duration::from_secs(30);

    let started = Instant::now();
    let wrong = run_cli(
        &[
            "iscsi",
            "capacity",
            "--portal",
            &portal,
            "--iqn",
            IQN,
            "--chap",
            "alice:wrongsecret1",
        ],
        limit,
    );
    let err = expect_err(&wrong, "login with a wrong CHAP secret");
    assert!(err.contains("authentication failure"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );

    let none = run_cli(
        &["iscsi", "capacity", "--portal", &portal, "--iqn", IQN],
        limit,
    );
    let err = expect_err(&none, "login without CHAP to a CHAP target");
    assert!(
        err.contains("authentication failure") || err.contains("AuthMethod"),
        "{err}"
    );

    let unknown = run_cli(
        &[
            "iscsi",
            "capacity",
            "--portal",
            &portal,
            "--iqn",
            "iqn.2024-01.org.vmdeploy:no-such-target",
            "--chap",
            "alice:secretpass12",
        ],
        limit,
    );
    let err = expect_err(&unknown, "login to an unknown target");
    assert!(err.contains("target not found"), "{err}");

    let ok = run_cli(
        &[
            "iscsi",
            "capacity",
            "--portal",
            &portal,
            "--iqn",
            IQN,
            "--chap",
            "alice:secretpass12",
        ],
        limit,
    );
    assert_eq!(
        expect_ok(&ok, "right secret").trim(),
        (64u64 << 20).to_string()
    );

    // Nothing listens on a fresh port: refused, said so.
    let closed = format!("127.0.0.1:{}", free_port());
    let refused = run_cli(
        &["iscsi", "capacity", "--portal", &closed, "--iqn", IQN],
        limit,
    );
    let err = expect_err(&refused, "login to a closed port");
    assert!(err.contains("connecting to iSCSI portal"), "{err}");
    assert!(err.to_lowercase().contains("refused"), "{err}");

    let bad_name = run_cli(
        &[
            "iscsi",
            "capacity",
            "--portal",
            &portal,
            "--iqn",
            "not a name",
        ],
        limit,
    );
    let err = expect_err(&bad_name, "an invalid target name");
    assert!(err.contains("invalid target name"), "{err}");
}

#[test]
fn tgtd_ironic_style_name_and_discovery() {
    // Ironic's conductor names targets `iqn-<node uuid>` (docs/architecture.md §4).
    let iqn = "iqn-1be26c0b-03f2-4d2e-ae87-c02d7f33c123";
    let tgtd = Tgtd::start(TgtOptions::new(iqn, 32 << 20)).expect("starting tgtd");
    let portal = tgtd.portal();
    let capacity = run_cli(
        &["iscsi", "capacity", "--portal", &portal, "--iqn", iqn],
        Duration::from_secs(30),
    );
    assert_eq!(
        expect_ok(&capacity, "capacity").trim(),
        (32u64 << 20).to_string()
    );
    let discover = run_cli(
        &["iscsi", "discover", "--portal", &portal],
        Duration::from_secs(30),
    );
    let listed = expect_ok(&discover, "discover");
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(iqn) && l.contains(&portal)),
        "{listed}"
    );
}

#[test]
fn tgtd_target_killed_mid_write_fails_fast() {
    let dir = tempfile::tempdir().expect("temp dir");
    let image = random_image(dir.path(), 512 << 20);
    let mut tgtd = Tgtd::start(TgtOptions::new(IQN, GIB)).expect("starting tgtd");
    let portal = tgtd.portal();
    let image_arg = image.to_string_lossy().into_owned();
    let mut child = ChildGuard::new(
        conductor()
            .args([
                "iscsi", "write", &image_arg, "--portal", &portal, "--iqn", IQN,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the write"),
    );
    // Let the write get going, then take the target away.
    std::thread::sleep(Duration::from_millis(700));
    tgtd.kill();
    let killed_at = Instant::now();
    let out = loop {
        if child.try_wait().expect("polling").is_some() {
            break child.wait_with_output().expect("output");
        }
        if killed_at.elapsed() > Duration::from_secs(30) {
            panic!("the write did not notice the target was gone within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = expect_err(&out, "a write to a killed target");
    assert!(
        err.contains("connection to the target lost") || err.contains("connecting to iSCSI portal"),
        "{err}"
    );
}

#[test]
fn blocking_adapter_matches_a_local_model() {
    let size = 8u64 << 20;
    let tgtd = Tgtd::start(TgtOptions::new(IQN, size)).expect("starting tgtd");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let config = SessionConfig::new(tgtd.portal(), IQN, 1);
    let session = runtime
        .block_on(Session::open(&config))
        .expect("logging in");
    assert_eq!(session.size_bytes(), size);
    let mut lun = BlockingLun::new(session.clone(), runtime.handle().clone());
    let mut model = vec![0u8; size as usize];

    // Unaligned writes of odd sizes, some crossing block and io_size boundaries.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..40 {
        let len = (next() % 300_000) as usize + 1;
        let at = next() % (size - len as u64);
        let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        lun.seek(SeekFrom::Start(at)).expect("seek");
        lun.write_all(&data).expect("write");
        model[at as usize..at as usize + len].copy_from_slice(&data);
    }
    lun.flush().expect("SYNCHRONIZE CACHE");
    for _ in 0..20 {
        let len = (next() % 200_000) as usize + 1;
        let at = next() % (size - len as u64);
        let mut got = vec![0u8; len];
        lun.seek(SeekFrom::Start(at)).expect("seek");
        lun.read_exact(&mut got).expect("read");
        assert!(
            got == model[at as usize..at as usize + len],
            "bytes {at}+{len} differ"
        );
    }
    // End of the LUN: reads stop, writes refuse.
    assert_eq!(lun.seek(SeekFrom::End(-3)).expect("seek"), size - 3);
    let mut tail = [0u8; 10];
    assert_eq!(lun.read(&mut tail).expect("read"), 3);
    assert_eq!(lun.read(&mut tail).expect("read at end"), 0);
    assert!(lun.write(&[1]).is_err(), "writing past the end must fail");
    assert!(lun.seek(SeekFrom::Current(-(size as i64) - 1)).is_err());

    // The whole LUN equals the model, and so does the backing file.
    lun.seek(SeekFrom::Start(0)).expect("seek");
    let mut all = Vec::new();
    lun.read_to_end(&mut all).expect("read all");
    assert!(all == model, "LUN differs from the model");
    let backing = std::fs::read(tgtd.backing_file()).expect("reading the backing file");
    assert!(backing == model, "backing file differs from the model");

    // Out-of-range requests are typed errors, not panics.
    let past = runtime.block_on(session.read(size / 512, 1));
    assert!(matches!(past, Err(InitiatorError::Range(_))), "{past:?}");
    runtime.block_on(session.logout()).expect("logout");
    let after = runtime.block_on(session.test_unit_ready());
    assert!(
        matches!(after, Err(InitiatorError::ConnectionLost(_))),
        "{after:?}"
    );
}

#[test]
fn agent_target_write_and_read_back_1gib() {
    let dir = tempfile::tempdir().expect("temp dir");
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(GIB))
        .expect("creating the disk file");
    let target = AgentTarget::start(&disk, IQN);
    write_read_back(&target.portal, IQN, None, Some(&disk));
}

#[test]
fn agent_target_with_chap() {
    let dir = tempfile::tempdir().expect("temp dir");
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(64 << 20))
        .expect("creating the disk file");
    let iqn = "iqn-1be26c0b-03f2-4d2e-ae87-c02d7f33c123";
    let target = AgentTarget::start_on(
        &disk,
        iqn,
        free_port(),
        free_port(),
        Some("alice:secretpass12"),
    );
    let ok = run_cli(
        &[
            "iscsi",
            "capacity",
            "--portal",
            &target.portal,
            "--iqn",
            iqn,
            "--chap",
            "alice:secretpass12",
        ],
        Duration::from_secs(30),
    );
    assert_eq!(
        expect_ok(&ok, "capacity with CHAP").trim(),
        (64u64 << 20).to_string()
    );
    let wrong = run_cli(
        &[
            "iscsi",
            "capacity",
            "--portal",
            &target.portal,
            "--iqn",
            iqn,
            "--chap",
            "alice:wrongsecret1",
        ],
        Duration::from_secs(30),
    );
    let err = expect_err(&wrong, "wrong CHAP secret against the agent target");
    assert!(err.contains("authentication failure"), "{err}");
}

#[test]
fn tgtd_digests_and_mutual_chap() {
    let size = 64u64 << 20;
    let mut options = TgtOptions::new(IQN, size);
    options.chap = Some(("alice".into(), "secretpass12".into()));
    options.outgoing_chap = Some(("target1".into(), "targetsecret34".into()));
    options.tuned = true;
    options.digests = true;
    let tgtd = Tgtd::start(options).expect("starting tgtd");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut config = SessionConfig::new(tgtd.portal(), IQN, 1);
    config.chap = Some("alice:secretpass12".parse().expect("credentials"));
    config.mutual_chap = Some("target1:targetsecret34".parse().expect("credentials"));
    config.params.header_digest = true;
    config.params.data_digest = true;
    let session = runtime
        .block_on(Session::open(&config))
        .expect("mutual CHAP login");
    assert!(
        session.params().header_digest && session.params().data_digest,
        "tgtd supports CRC32C: both digests must be on"
    );
    let image: Vec<u8> = {
        let mut f = std::fs::File::open("/dev/urandom").expect("urandom");
        let mut v = vec![0u8; size as usize - 1000]; // not a whole number of blocks
        f.read_exact(&mut v).expect("random bytes");
        v
    };
    let written = runtime
        .block_on(vmdeploy_conductor::initiator::write_image(
            &session,
            &image[..],
            image.len() as u64,
            8,
        ))
        .expect("write with digests");
    assert_eq!(written, image.len() as u64);
    let mut back = Vec::new();
    runtime
        .block_on(vmdeploy_conductor::initiator::read_image(
            &session, &mut back, 8,
        ))
        .expect("read with digests");
    assert_eq!(back.len() as u64, size);
    assert!(back[..image.len()] == image[..], "read-back differs");
    assert!(
        back[image.len()..image.len().div_ceil(512) * 512]
            .iter()
            .all(|&b| b == 0),
        "the last partial block is padded with zeroes"
    );
    runtime.block_on(session.logout()).expect("logout");

    // The target proving the wrong secret is refused by us, as an authentication error.
    config.mutual_chap = Some("target1:notthesecret9".parse().expect("credentials"));
    let err = runtime
        .block_on(Session::open(&config))
        .expect_err("a target with the wrong outgoing secret must be refused");
    assert!(matches!(err, InitiatorError::Authentication(_)), "{err}");
    assert!(err.to_string().contains("mutual CHAP"), "{err}");
}
