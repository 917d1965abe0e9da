//! Checks of a node's disk that more than one end-to-end test makes.

use super::Lab;
use crate::test_image::TestImage;

fn read(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Whether `bytes` are all zero.
fn zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

/// The node's disk has nothing a firmware or `blkid -p` would find at its start: no partition
/// table, no file-system signature, the first MiB zero. `what` says after what, for the
/// failure message. Returns the disk's bytes.
pub fn assert_nothing_bootable(lab: &Lab, what: &str) -> Vec<u8> {
    let state = lab.emulator_state();
    let disk = std::path::PathBuf::from(
        state["machine"]["disk"]
            .as_str()
            .expect("the emulator names the node's disk file"),
    );
    let probe = std::process::Command::new("blkid")
        .arg("-p")
        .arg(&disk)
        .output()
        .expect("running blkid (apt install util-linux)");
    assert_eq!(
        probe.status.code(),
        Some(2),
        "blkid -p still finds something on the disk after {what}: {}",
        String::from_utf8_lossy(&probe.stdout)
    );
    let bytes = read(&disk);
    assert!(
        zero(&bytes[..1 << 20]),
        "the disk's first MiB is not zero after {what}"
    );
    bytes
}

/// After automated cleaning, with the node off: `erase_devices_metadata` left no partition
/// table and no file-system signature on the node's disk ([`assert_nothing_bootable`]), and the
/// root file system's ext4 magic is gone from where the image put it.
pub fn assert_metadata_erased(lab: &Lab, image: &TestImage) {
    let state = lab.emulator_state();
    assert_eq!(
        state["power"], "OFF",
        "cleaning ends with the node off: {state}"
    );
    let bytes = assert_nothing_bootable(lab, "cleaning");
    // The test image's root partition (ext4) and where its superblock magic was.
    let image_bytes = read(&image.disk_raw);
    let magic_at = (0..4)
        .map(|i| {
            // GPT entries from LBA 2, 128 bytes each; the first LBA at +32.
            let entry = 1024 + 128 * i;
            let lba = u64::from_le_bytes(
                image_bytes[entry + 32..entry + 40]
                    .try_into()
                    .expect("8 bytes"),
            );
            usize::try_from(lba * 512).expect("fits")
        })
        .find(|&start| {
            start > 0 && image_bytes.get(start + 0x438..start + 0x43a) == Some(&[0x53, 0xef][..])
        })
        .expect("the test image's GPT names an ext4 root partition");
    assert_ne!(
        bytes[magic_at + 0x438..magic_at + 0x43a],
        [0x53, 0xef],
        "the root file system's superblock survived cleaning"
    );
}
