//! Partition tables as the agent reads them back from the disk it wrote
//! (`api::partitions::read_partition_uuids` for `get_partition_uuids`, `esp_extents` for the
//! ESP's bootloader install): MBR through mbrman, GPT (512 and 4096-byte sectors) through gpt,
//! on a file holding the input. Every ESP extent must lie inside the disk.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use vmdeploy_agent::api::partitions::{esp_extents, read_partition_uuids};

fn scratch() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a scratch directory"))
}

fuzz_target!(|data: &[u8]| {
    let path = scratch().path().join("disk.img");
    std::fs::write(&path, data).expect("scratch write");
    match read_partition_uuids(&path) {
        Ok(uuids) => {
            let table = uuids.get("vmdeploy_table").and_then(|t| t.as_str());
            assert!(matches!(table, Some("gpt" | "mbr" | "none")), "{uuids}");
            if data.len() < 512 || data[510..512] != [0x55, 0xaa] {
                assert_eq!(table, Some("none"));
            }
        }
        Err(e) => assert!(!format!("{e:#}").is_empty()),
    }
    if let Ok(extents) = esp_extents(&path) {
        for (start, len) in extents {
            assert!(
                start.checked_add(len).is_some(),
                "extent {start}+{len} overflows"
            );
        }
    }
});
