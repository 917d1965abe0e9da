//! The agent's iSCSI target (`vmdeploy-agent iscsi-target`) against real initiators: the libiscsi
//! conformance suite, the libiscsi tools, qemu-img (libiscsi) with and without CHAP, and raw
//! sockets sending bad input while another session keeps working.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use vmdeploy_integration_tests::{bin, free_port};
use vmdeploy_shared::iscsi::pdu::{padded_len, segment_lengths};
use vmdeploy_shared::iscsi::scsi::{self, asc, Sense};
use vmdeploy_shared::iscsi::{
    Bhs, Digests, LoginRequest, LoginStage, Lun, Pdu, ScsiCommand, TextKeys, BHS_LEN,
};

/// Ironic's literal target name form (reference ironic-protocols.md §2.6).
const IQN: &str = "iqn-0b2d7f9e-5c3a-4e1f-9a6b-2c8d4e6f8a10";
/// Passing tests of `iscsi-test-cu --test=ALL` against tgtd on this machine
/// (reference iscsi-and-swift-peers.md §2).
const TGTD_PASSED: u32 = 222;

/// A running `vmdeploy-agent iscsi-target`, killed on drop.
struct Target {
    child: Option<Child>,
    port: u16,
    done_port: u16,
    _dir: tempfile::TempDir,
    disk: PathBuf,
}

impl Target {
    fn start(size: u64, chap: Option<&str>) -> Target {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = dir.path().join("lun.img");
        let file = std::fs::File::create(&disk).expect("create backing file");
        file.set_len(size).expect("size backing file");
        let port = free_port();
        let done_port = free_port();
        let mut cmd = Command::new(bin("vmdeploy-agent"));
        cmd.arg("iscsi-target")
            .arg("--disk")
            .arg(&disk)
            .args(["--iqn", IQN])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--done-listen", &format!("127.0.0.1:{done_port}")])
            .arg("--buffered")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        if let Some(c) = chap {
            cmd.args(["--chap", c]);
        }
        let child = cmd.spawn().expect("starting vmdeploy-agent iscsi-target");
        let mut target = Target {
            child: Some(child),
            port,
            done_port,
            _dir: dir,
            disk,
        };
        target.wait_ready();
        target
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("target exited early: {status}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("target did not listen on port {}", self.port);
    }

    fn url(&self, credentials: Option<&str>) -> String {
        let auth = credentials.map(|c| format!("{c}@")).unwrap_or_default();
        format!("iscsi://{auth}127.0.0.1:{}/{IQN}/1", self.port)
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Sends the conductor's `done` and waits for a clean exit.
    fn send_done_and_wait(&mut self) -> std::process::ExitStatus {
        let mut s = TcpStream::connect(("127.0.0.1", self.done_port)).expect("connect done port");
        s.write_all(b"done").expect("send done");
        drop(s);
        self.wait_exit(Duration::from_secs(20))
    }

    fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().expect("target still owned");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().expect("polling target") {
                self.child = None;
                return status;
            }
            assert!(Instant::now() < deadline, "target did not exit in time");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().expect("polling target").is_none())
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Parses CUnit's `tests TOTAL RAN PASSED FAILED INACTIVE` summary line.
fn cunit_summary(out: &str) -> Option<(u32, u32, u32)> {
    out.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.first() != Some(&"tests") || f.len() < 5 {
            return None;
        }
        Some((f[2].parse().ok()?, f[3].parse().ok()?, f[4].parse().ok()?))
    })
}

#[test]
fn conformance_suite_passes_at_least_as_many_tests_as_tgtd() {
    let target = Target::start(1 << 30, None);
    let out = run(Command::new("iscsi-test-cu")
        .args(["-d", "-n", "--test=ALL"])
        .arg(target.url(None)));
    let all = text(&out);
    // Exit code 1 means "some test failed" (reference §2); 255 means no login at all.
    assert_ne!(
        out.status.code(),
        Some(255),
        "iscsi-test-cu could not log in:\n{all}"
    );
    let (ran, passed, failed) =
        cunit_summary(&all).unwrap_or_else(|| panic!("no CUnit summary line in:\n{all}"));
    eprintln!("iscsi-test-cu --test=ALL: ran {ran}, passed {passed}, failed {failed}");
    assert!(ran >= 230, "the suite ran only {ran} tests:\n{all}");
    assert!(
        passed >= TGTD_PASSED,
        "{passed} of {ran} passed, tgtd passes {TGTD_PASSED}:\n{all}"
    );
}

#[test]
fn libiscsi_tools_see_lun_1_of_the_ironic_named_target() {
    let target = Target::start(64 << 20, None);
    let portal = format!("iscsi://127.0.0.1:{}", target.port);
    let ls = run(Command::new("iscsi-ls").arg("-s").arg(&portal));
    let ls_out = text(&ls);
    assert!(ls.status.success(), "iscsi-ls failed: {ls_out}");
    assert!(
        ls_out.contains(&format!("Target:{IQN} Portal:127.0.0.1:{},1", target.port)),
        "SendTargets does not list the target: {ls_out}"
    );
    assert!(
        ls_out.contains("Lun:1") && ls_out.contains("DIRECT_ACCESS"),
        "REPORT LUNS does not list LUN 1: {ls_out}"
    );
    assert!(!ls_out.contains("Lun:0"), "LUN 0 is listed: {ls_out}");

    let inq = run(Command::new("iscsi-inq").arg(target.url(None)));
    let inq_out = text(&inq);
    assert!(inq.status.success(), "iscsi-inq failed: {inq_out}");
    assert!(inq_out.contains("Vendor:VMDEPLOY"), "{inq_out}");
    assert!(
        inq_out.contains("Peripheral Device Type:DIRECT_ACCESS"),
        "{inq_out}"
    );
    for page in ["0x80", "0x83", "0xb0", "0xb2"] {
        let vpd = run(Command::new("iscsi-inq")
            .args(["-e", "1", "-c", page])
            .arg(target.url(None)));
        assert!(vpd.status.success(), "VPD page {page}: {}", text(&vpd));
    }

    let rc = run(Command::new("iscsi-readcapacity16").arg(target.url(None)));
    let rc_out = text(&rc);
    assert!(rc.status.success(), "iscsi-readcapacity16 failed: {rc_out}");
    assert!(
        rc_out.contains(&format!(
            "RETURNED LOGICAL BLOCK ADDRESS:{}",
            (64 << 20) / 512 - 1
        )),
        "{rc_out}"
    );
    assert!(
        rc_out.contains(&format!("Total size:{}", 64u64 << 20)),
        "{rc_out}"
    );
}

fn random_image(dir: &Path, len: usize) -> PathBuf {
    // A cheap deterministic pseudo-random pattern (xorshift), so a shifted or dropped block shows.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut data = vec![0u8; len];
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let path = dir.join("image.raw");
    std::fs::write(&path, &data).expect("write image");
    path
}

fn assert_prefix_equal(image: &Path, disk: &Path) {
    let img = std::fs::read(image).expect("read image");
    let mut lun = vec![0u8; img.len()];
    std::fs::File::open(disk)
        .and_then(|mut f| f.read_exact(&mut lun))
        .expect("read backing file");
    let first_diff = img.iter().zip(&lun).position(|(a, b)| a != b);
    assert_eq!(first_diff, None, "backing file differs from the image");
}

#[test]
fn qemu_img_writes_an_image_and_done_flushes_and_exits_0() {
    let mut target = Target::start(128 << 20, None);
    let scratch = tempfile::tempdir().expect("tempdir");
    let image = random_image(scratch.path(), 48 << 20);
    let out = run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&image)
        .arg(target.url(None)));
    assert!(
        out.status.success(),
        "qemu-img convert failed: {}",
        text(&out)
    );
    let status = target.send_done_and_wait();
    assert!(status.success(), "target exited with {status} after done");
    assert_prefix_equal(&image, &target.disk);
}

#[test]
fn sigterm_stops_the_target_cleanly() {
    let mut target = Target::start(16 << 20, None);
    let pid = target.child.as_ref().expect("running").id();
    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let status = target.wait_exit(Duration::from_secs(20));
    assert!(status.success(), "exit status after SIGTERM: {status}");
}

#[test]
fn chap_right_secret_writes_and_wrong_secret_fails_login() {
    let target = Target::start(64 << 20, Some("alice:secretpass12"));
    let scratch = tempfile::tempdir().expect("tempdir");
    let image = random_image(scratch.path(), 8 << 20);
    let good = run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&image)
        .arg(target.url(Some("alice%secretpass12"))));
    assert!(
        good.status.success(),
        "CHAP login with the right secret: {}",
        text(&good)
    );
    assert_prefix_equal(&image, &target.disk);

    let wrong = run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&image)
        .arg(target.url(Some("alice%wrongsecret99"))));
    assert!(!wrong.status.success(), "a wrong CHAP secret logged in");
    let none = run(Command::new("iscsi-inq").arg(target.url(None)));
    assert!(!none.status.success(), "login without CHAP succeeded");
    let inq = run(Command::new("iscsi-inq").arg(target.url(Some("alice%secretpass12"))));
    assert!(
        inq.status.success(),
        "target unusable after failed logins: {}",
        text(&inq)
    );
}

/// A minimal raw initiator: logs in with the shared codec and exchanges single PDUs.
struct RawSession {
    s: TcpStream,
    cmd_sn: u32,
    itt: u32,
}

impl RawSession {
    fn login(addr: SocketAddr) -> RawSession {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut keys = TextKeys::new();
        keys.push("InitiatorName", "iqn.2026-11.test.vmdeploy:raw");
        keys.push("TargetName", IQN);
        keys.push("SessionType", "Normal");
        keys.push("AuthMethod", "None");
        let req = LoginRequest {
            transit: true,
            continue_: false,
            current_stage: LoginStage::Security,
            next_stage: LoginStage::FullFeature,
            version_max: 0,
            version_min: 0,
            isid: [0x80, 0, 0, 0, 0, 1],
            tsih: 0,
            itt: 1,
            cid: 0,
            cmd_sn: 1,
            exp_stat_sn: 0,
        };
        let mut session = RawSession {
            s,
            cmd_sn: 1,
            itt: 2,
        };
        session.send(&Pdu::with_data(req, keys.encode()));
        let reply = session.recv().expect("login response");
        match reply.bhs {
            Bhs::LoginResponse(r) => {
                assert!(r.status.is_success(), "login refused: {:?}", r.status);
                assert!(r.transit && r.next_stage == LoginStage::FullFeature);
            }
            other => panic!("expected a login response, got {other:?}"),
        }
        session
    }

    fn send(&mut self, pdu: &Pdu) {
        let wire = pdu.encode(Digests::NONE).expect("encode");
        self.s.write_all(&wire).expect("send");
    }

    fn recv(&mut self) -> Option<Pdu> {
        let mut head = [0u8; BHS_LEN];
        self.s.read_exact(&mut head).ok()?;
        let (ahs, data) = segment_lengths(&head);
        let mut rest = vec![0u8; ahs + padded_len(data)];
        self.s.read_exact(&mut rest).ok()?;
        let mut all = head.to_vec();
        all.extend_from_slice(&rest);
        Pdu::decode(&all, Digests::NONE, 1 << 24)
            .ok()
            .map(|(p, _)| p)
    }

    fn command(&mut self, cdb: [u8; 16], read_len: u32) -> Pdu {
        let itt = self.itt;
        self.itt += 1;
        let cmd = ScsiCommand {
            final_: true,
            read: read_len > 0,
            lun: Lun::from_number(1),
            itt,
            expected_data_len: read_len,
            cmd_sn: self.cmd_sn,
            cdb,
            ..Default::default()
        };
        self.cmd_sn += 1;
        self.send(&Pdu::new(cmd));
        loop {
            let pdu = self.recv().expect("answer to a SCSI command");
            match &pdu.bhs {
                Bhs::ScsiResponse(_) => return pdu,
                Bhs::DataIn(d) if d.has_status => return pdu,
                _ => {}
            }
        }
    }
}

fn connection_closed(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

#[test]
fn bad_input_is_answered_or_dropped_while_another_session_keeps_working() {
    let mut target = Target::start(16 << 20, None);
    let mut healthy = RawSession::login(target.addr());
    let tur = healthy.command(scsi::build::test_unit_ready(), 0);
    assert!(
        matches!(tur.bhs, Bhs::ScsiResponse(ref r) if r.status == 0),
        "{tur:?}"
    );

    // Unknown opcode on a logged-in connection: a Reject carrying the header back.
    let mut bad = RawSession::login(target.addr());
    let mut header = [0u8; BHS_LEN];
    header[0] = 0x1c; // not an initiator opcode in RFC 7143
    header[16..20].copy_from_slice(&77u32.to_be_bytes());
    bad.s.write_all(&header).expect("send");
    let reject = bad.recv().expect("a reject");
    assert_eq!(reject.bhs.opcode(), vmdeploy_shared::iscsi::Opcode::Reject);
    assert_eq!(
        &reject.data[..],
        &header[..],
        "the reject carries the bad header"
    );

    // An out-of-range READ gets CHECK CONDITION / LBA OUT OF RANGE on the same connection.
    let blocks = (16u64 << 20) / 512;
    let resp = bad.command(scsi::build::read_16(blocks, 1), 512);
    let Bhs::ScsiResponse(r) = &resp.bhs else {
        panic!("expected a SCSI response, got {resp:?}");
    };
    assert_eq!(r.status, scsi::status::CHECK_CONDITION);
    let sense = Sense::parse(vmdeploy_shared::iscsi::pdu::sense_from_segment(&resp.data))
        .expect("sense data");
    assert_eq!((sense.asc, sense.ascq), asc::LBA_OUT_OF_RANGE);

    // A data segment length beyond what was negotiated: the connection is dropped.
    let mut huge = header;
    huge[0] = 0x01;
    huge[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
    bad.s.write_all(&huge).expect("send");
    assert!(
        connection_closed(&mut bad.s),
        "oversized PDU did not drop the connection"
    );

    // A truncated PDU followed by a hang-up, before login.
    let mut trunc = TcpStream::connect(target.addr()).expect("connect");
    trunc.write_all(&[0x43, 0x87, 0, 0, 0, 0]).expect("send");
    drop(trunc);

    // A client vanishing in the middle of a WRITE's data.
    let mut vanish = RawSession::login(target.addr());
    let cmd = ScsiCommand {
        final_: false,
        write: true,
        lun: Lun::from_number(1),
        itt: 9,
        expected_data_len: 1 << 20,
        cmd_sn: vanish.cmd_sn,
        cdb: scsi::build::write_16(0, 2048, false),
        ..Default::default()
    };
    vanish.send(&Pdu::with_data(cmd, vec![0xaa; 4096]));
    drop(vanish);

    // Garbage instead of a login.
    let mut garbage = TcpStream::connect(target.addr()).expect("connect");
    garbage.write_all(&[0xff; 200]).expect("send");
    assert!(
        connection_closed(&mut garbage),
        "garbage login was not dropped"
    );

    std::thread::sleep(Duration::from_millis(300));
    assert!(target.is_running(), "the target died on bad input");
    let tur = healthy.command(scsi::build::test_unit_ready(), 0);
    assert!(
        matches!(tur.bhs, Bhs::ScsiResponse(ref r) if r.status == 0),
        "healthy session broken: {tur:?}"
    );
    let inq = run(Command::new("iscsi-inq").arg(target.url(None)));
    assert!(
        inq.status.success(),
        "new sessions fail after bad input: {}",
        text(&inq)
    );
}
