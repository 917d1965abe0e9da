//! The agent's iSCSI target, reading what an initiator sends: one connection
//! (`target::connection::serve_io`) fed the input as its byte stream, from the login (keys,
//! stages, CHAP-less negotiation) through the full feature phase (SCSI commands with immediate
//! and solicited data, task management, NOP-Out, text, logout) against a LUN backed by a small
//! file. The answers go nowhere; what is hunted is a panic, a hang or runaway memory.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use vmdeploy_agent::target::backend::BlockBackend;
use vmdeploy_agent::target::commands::{Identity, Lun};
use vmdeploy_agent::target::connection::serve_io;
use vmdeploy_agent::target::server::TargetShared;

/// The target name the seeds log in to.
const IQN: &str = "iqn.2008-10.org.openstack:fuzz";
/// 1 MiB: room for reads and writes past a few blocks, small enough to stay in the page cache.
const DISK_LEN: u64 = 1 << 20;

struct Fixture {
    runtime: tokio::runtime::Runtime,
    backend: Arc<BlockBackend>,
    disk: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a scratch directory");
        let disk = dir.path().join("lun.img");
        let file = std::fs::File::create(&disk).expect("backing file");
        file.set_len(DISK_LEN).expect("backing file size");
        let backend = Arc::new(BlockBackend::open(&disk, true).expect("backing store"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        Fixture {
            runtime,
            backend,
            disk,
            _dir: dir,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    // A fresh target each time (sessions, reservations, TSIHs), over the same disk.
    let lun = Lun::new(Arc::clone(&f.backend), Identity::derive(IQN, &f.disk));
    let shared = Arc::new(TargetShared::new(IQN.to_owned(), None, lun));
    let input = data.to_vec();
    let result = f.runtime.block_on(async move {
        serve_io(std::io::Cursor::new(input), tokio::io::sink(), None, shared).await
    });
    if let Err(e) = result {
        assert!(!format!("{e:#}").is_empty());
    }
});
