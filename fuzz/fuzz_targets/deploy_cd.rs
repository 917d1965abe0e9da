//! What the agent reads off the deploy CD: the ISO 9660 volume itself
//! (`vmdeploy_shared::iso::read`: descriptors, directories, files) and the kernel's
//! `modules.alias` it matches the devices' modaliases against (`vmdeploy_shared::modalias`).
//! The first byte picks which: even, an ISO image; odd, a modules.alias text whose first lines
//! are also tried as modaliases.
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use vmdeploy_shared::iso::read::IsoVolume;
use vmdeploy_shared::modalias::{AliasTable, PciId};

/// Walks the tree to a small depth and reads the small files, as the agent would.
fn walk(volume: &mut IsoVolume<Cursor<&[u8]>>) {
    let mut pending = vec![(volume.root().clone(), 0)];
    let mut visited = 0;
    while let Some((dir, depth)) = pending.pop() {
        visited += 1;
        if visited > 64 {
            return;
        }
        let Ok(entries) = volume.list(&dir) else {
            continue;
        };
        for entry in entries {
            if entry.is_dir && depth < 4 {
                pending.push((entry, depth + 1));
            } else if !entry.is_dir {
                let _ = volume.read_range(&entry, 0, u64::from(entry.len).min(65_536));
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        if let Ok(mut volume) = IsoVolume::open(Cursor::new(rest)) {
            walk(&mut volume);
            let _ = volume.read_file("/boot/modules.alias", 1 << 20);
        }
        return;
    }
    let text = String::from_utf8_lossy(rest);
    match AliasTable::parse(&text) {
        Ok(mut table) => {
            table.add_builtin_modinfo(rest);
            for line in text.lines().take(4) {
                let _ = table.matching(line).count();
            }
            let id = PciId {
                vendor: 0x14e4,
                device: 0x168e,
                subvendor: 0x103c,
                subdevice: 0x1930,
            };
            let _ = table.matching_pci_ids(id).count();
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
