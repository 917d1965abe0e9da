//! The agent finds its virtual floppy by FAT label among the machine's real block devices and
//! reads `parameters.txt` from it without mounting. The floppy is built by `shared::fat` (the
//! conductor's writer) and attached as a loop device; a decoy device carrying the label bytes
//! without a valid BIOS parameter block must not be taken for it.

use std::path::Path;
use std::time::Duration;

use vmdeploy_agent::floppy::{self, FloppySearch, PARAMS_FILE};
use vmdeploy_integration_tests::loopdev::{LoopDevice, LoopIo};

#[test]
fn floppy_on_a_loop_device_is_found_by_label_and_read_without_mounting() {
    // A label of our own (11 bytes max), so parallel tests' floppies cannot interfere.
    let label = format!("vmdt{:07}", std::process::id() % 10_000_000);
    let params = "ipa-api-url=https://10.0.0.1:6385\nipa-agent-token=abcdefghijklmnopqrstuvwxyz0123456789ABCD\nBOOTIF=52:54:00:12:34:56\nroot_device=size=40\n";
    let image = vmdeploy_shared::fat::build_floppy(&label, &[(PARAMS_FILE, params.as_bytes())])
        .expect("building the floppy");

    // Decoy: an MBR-style sector with the label bytes where a FAT12 label would be.
    let mut decoy = vec![0u8; image.len()];
    decoy[0x2B..0x2B + label.len()].copy_from_slice(label.as_bytes());
    decoy[510] = 0x55;
    decoy[511] = 0xAA;

    let real = LoopDevice::attach(&image, 0, LoopIo::Buffered);
    let fake = LoopDevice::attach(&decoy, 0, LoopIo::Buffered);
    assert!(
        floppy::read_label(fake.device()).map_or(true, |l| l.is_none()),
        "the decoy has no valid BPB"
    );
    let search = FloppySearch {
        label: label.clone(),
        attempts: 3,
        interval: Duration::from_millis(200),
        ..Default::default()
    };
    let found = search.find().expect("finding the floppy");
    assert_eq!(found, real.device());
    let read = floppy::read_params(Path::new(&found)).expect("reading parameters.txt");
    assert_eq!(read.get("ipa-api-url"), Some("https://10.0.0.1:6385"));
    assert_eq!(read.get("BOOTIF"), Some("52:54:00:12:34:56"));
    assert_eq!(read.get("root_device"), Some("size=40"));
    assert_eq!(read.len(), 4);

    // Gone: bounded retries, then a clear error.
    drop(real);
    let err = search.find().expect_err("no floppy any more");
    assert!(
        err.to_string().contains("no block device labelled"),
        "{err}"
    );
}
