//! Writes the iSCSI seeds in `fuzz/seeds/` with our own encoders and target:
//! `iscsi_target/login-and-io` is what the conductor's initiator sends for a login, READ
//! CAPACITY, a read, a write and a logout; `iscsi_initiator/login-and-io` is what the agent's
//! target answers to it (captured from `serve_io`). Both give the fuzzer a whole conversation
//! to mutate instead of hunting for a valid login.
//!
//! `cargo run --manifest-path fuzz/Cargo.toml --example seeds` (from the repository root).

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use vmdeploy_agent::target::backend::BlockBackend;
use vmdeploy_agent::target::commands::{Identity, Lun as TargetLun};
use vmdeploy_agent::target::connection::serve_io;
use vmdeploy_agent::target::server::TargetShared;
use vmdeploy_conductor::initiator::SessionConfig;
use vmdeploy_shared::iscsi::keys::{key, value};
use vmdeploy_shared::iscsi::scsi::build;
use vmdeploy_shared::iscsi::{
    Digests, LoginRequest, LoginStage, LogoutRequest, Lun, Negotiation, Pdu, Role, ScsiCommand,
    TextKeys,
};

const IQN: &str = "iqn.2008-10.org.openstack:fuzz";
const ISID: [u8; 6] = [0x80, 1, 2, 3, 4, 5];

fn login(
    stage: LoginStage,
    next: LoginStage,
    cmd_sn: u32,
    exp_stat_sn: u32,
    keys: &TextKeys,
) -> Pdu {
    let request = LoginRequest {
        transit: true,
        continue_: false,
        current_stage: stage,
        next_stage: next,
        version_max: 0,
        version_min: 0,
        isid: ISID,
        tsih: 0,
        itt: 0,
        cid: 0,
        cmd_sn,
        exp_stat_sn,
    };
    Pdu::with_data(request, keys.encode())
}

fn command(itt: u32, cmd_sn: u32, cdb: [u8; 16], read: bool, len: u32, data: Vec<u8>) -> Pdu {
    let header = ScsiCommand {
        immediate: false,
        final_: true,
        read,
        write: !read && len > 0,
        task_attr: 1,
        lun: Lun::from_number(1),
        itt,
        expected_data_len: len,
        cmd_sn,
        exp_stat_sn: 0,
        cdb,
    };
    Pdu::with_data(header, data)
}

/// The initiator's side of a session, as `initiator::Session::open` and a read, write, logout.
fn initiator_stream() -> Vec<u8> {
    let mut out = Vec::new();
    let mut push = |pdu: Pdu| out.extend(pdu.encode(Digests::NONE).expect("seed PDU encodes"));
    let mut first = TextKeys::new();
    first.push(key::INITIATOR_NAME, "iqn.2004-10.org.vmdeploy:conductor");
    first.push(key::SESSION_TYPE, "Normal");
    first.push(key::TARGET_NAME, IQN);
    first.push(key::AUTH_METHOD, value::NONE);
    push(login(
        LoginStage::Security,
        LoginStage::Operational,
        1,
        0,
        &first,
    ));
    let params = SessionConfig::new("127.0.0.1:3260", IQN, 1).params;
    let mut negotiation = Negotiation::new(Role::Initiator, params);
    push(login(
        LoginStage::Operational,
        LoginStage::FullFeature,
        1,
        1,
        &negotiation.offer(),
    ));
    push(command(
        0x10,
        1,
        build::read_capacity_16(32),
        true,
        32,
        Vec::new(),
    ));
    push(command(
        0x11,
        2,
        build::read_16(0, 1),
        true,
        512,
        Vec::new(),
    ));
    push(command(
        0x12,
        3,
        build::write_16(0, 1, false),
        false,
        512,
        vec![0xa5; 512],
    ));
    push(command(
        0x13,
        4,
        build::synchronize_cache_16(),
        false,
        0,
        Vec::new(),
    ));
    let logout = LogoutRequest {
        immediate: true,
        reason: 0,
        itt: 0x14,
        cid: 0,
        cmd_sn: 5,
        exp_stat_sn: 0,
    };
    push(Pdu::new(logout));
    out
}

/// Collects what the target writes.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl tokio::io::AsyncWrite for Capture {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.0.lock().expect("capture lock").extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn main() {
    let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let requests = initiator_stream();
    let dir = tempfile::tempdir().expect("scratch directory");
    let disk = dir.path().join("lun.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(1 << 20))
        .expect("backing file");
    let backend = Arc::new(BlockBackend::open(&disk, true).expect("backing store"));
    let lun = TargetLun::new(backend, Identity::derive(IQN, &disk));
    let shared = Arc::new(TargetShared::new(IQN.to_owned(), None, lun));
    let capture = Capture::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime
        .block_on(serve_io(
            std::io::Cursor::new(requests.clone()),
            capture.clone(),
            None,
            shared,
        ))
        .expect("the target serves the seed session");
    let replies = capture.0.lock().expect("capture lock").clone();
    for (target, bytes) in [("iscsi_target", &requests), ("iscsi_initiator", &replies)] {
        let dir = seeds.join(target);
        std::fs::create_dir_all(&dir).expect("seed directory");
        std::fs::write(dir.join("login-and-io"), bytes).expect("seed file");
        println!("{target}: {} bytes", bytes.len());
    }
    // The PDU decoder's seeds: the first request PDU and the whole reply stream (mode byte 0:
    // no digests, negotiated limit).
    let dir = seeds.join("iscsi_pdu");
    std::fs::create_dir_all(&dir).expect("seed directory");
    for (name, bytes) in [("requests", &requests), ("replies", &replies)] {
        let mut seed = vec![0u8];
        seed.extend_from_slice(bytes);
        std::fs::write(dir.join(name), seed).expect("seed file");
    }
}
