//! qcow2 images as the agent converts them: the header check (`Qcow2Header::parse`, with its
//! `to_bytes` round trip and `spool_offset`), then the agent's conversion to raw
//! (`stream::qcow2::convert`, imago reading L1/L2 tables and clusters) from a file holding the
//! input.
#![no_main]

use std::io::Write as _;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use vmdeploy_agent::stream::qcow2::{convert, open, spool_offset, DiskRegion};
use vmdeploy_shared::qcow2::Qcow2Header;

/// Guest sizes converted in full; a larger image is only opened, since writing gigabytes of
/// zeros per input would make every run a timeout and find nothing new.
const MAX_CONVERTED: u64 = 8 << 20;

fn scratch() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a scratch directory"))
}

/// Counts what `convert` writes without keeping it.
struct Counter(u64);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let header = match Qcow2Header::parse(data) {
        Ok(h) => h,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    assert_eq!(Qcow2Header::parse(&header.to_bytes()).ok(), Some(header));
    if let Ok(offset) = spool_offset(&header) {
        assert!(offset >= header.virtual_size);
    }

    let path = scratch().path().join("image.qcow2");
    let mut file = std::fs::File::create(&path).expect("scratch file");
    file.write_all(data).expect("scratch write");
    drop(file);
    let region = DiskRegion::open(path, 0, data.len() as u64).expect("scratch open");
    if header.virtual_size > MAX_CONVERTED {
        let _ = imago_open_only(region);
        return;
    }
    let mut out = Counter(0);
    match convert(region, &mut out) {
        Ok(size) => assert_eq!(
            out.0, size,
            "convert wrote a different length than it reports"
        ),
        Err(e) => assert!(!format!("{e:#}").is_empty()),
    }
});

/// Opens the image as `convert` does and reads one block at its end (the L1/L2 walk for the
/// last cluster), without converting the whole guest.
fn imago_open_only(region: DiskRegion) -> Option<()> {
    let access = open(region).ok()?;
    let size = access.size();
    let mut buf = vec![0u8; 4096];
    let at = size.saturating_sub(4096);
    let n = (size - at) as usize;
    let _ = access.read(&mut buf[..n], at);
    Some(())
}
