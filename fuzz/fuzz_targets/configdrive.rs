//! Config drives as the conductor and the agent receive them (`partition::configdrive::decode`:
//! base64 of gzip of an ISO 9660 or vfat image), then what is read of the image: the file
//! system probe (`fs_id::probe`), the vfat label and a root file through `shared::fat`.
//!
//! The first byte chooses how the rest is presented: 0 as is (the text Ironic sends), 1 base64
//! of it, 2 base64 of its gzip (so the fuzzer controls the decoded image directly), and with
//! bit 2 set raw (non-base64) images are allowed, as for a fetched URL.
#![no_main]

use std::io::{Cursor, Write as _};

use base64::Engine as _;
use libfuzzer_sys::fuzz_target;
use vmdeploy_shared::partition::configdrive::{self, MAX_CONFIGDRIVE_BYTES};
use vmdeploy_shared::{fat, fs_id};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    let text: Vec<u8> = match mode & 3 {
        1 => b64.encode(rest).into_bytes(),
        2 => {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(rest).expect("gzip to memory");
            b64.encode(gz.finish().expect("gzip to memory"))
                .into_bytes()
        }
        _ => rest.to_vec(),
    };
    let raw_allowed = mode & 4 != 0;
    let image = match configdrive::decode(&text, raw_allowed) {
        Ok(image) => image,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    assert!(image.len() as u64 <= MAX_CONFIGDRIVE_BYTES);
    if let Some(id) = fs_id::probe(&image) {
        let _ = id.kind.as_str();
        if id.kind == fs_id::FsKind::Vfat {
            let _ = fat::fat_label(&image[..image.len().min(512)]);
            if let Ok(file) = fat::read_root_file(Cursor::new(&image), "meta_data.json", 1 << 20) {
                assert!(file.len() <= image.len());
            }
        }
    }
});
