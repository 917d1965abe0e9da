//! What the agent reads off the deploy CD: the ISO 9660 volume itself
//! (`vmdeploy_shared::iso::read`: descriptors, directories, files), the kernel's
//! `modules.alias` it matches the devices' modaliases against (`vmdeploy_shared::modalias`) and
//! the driver pack's index (`vmdeploy_shared::driver_pack`). The first byte picks which: 2, a
//! driver pack index whose modules' load orders are walked and whose aliases are matched
//! against a few modaliases; other even values, an ISO image (its pack index parsed if there
//! is one); odd, a modules.alias text whose first lines are also tried as modaliases.
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use vmdeploy_shared::driver_pack::DriverPack;
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

/// Parses an index and uses it as the agent does: matches, load orders, renders it back.
fn driver_pack(text: &str) {
    match DriverPack::parse(text) {
        Ok(pack) => {
            for modalias in [
                "pci:v00008086d000010C9sv00008086sd0000A01Cbc02sc00i00",
                "virtio:d00000001v00001AF4",
                "acpi:PNP0700:",
            ] {
                for module in pack.modules_for(modalias) {
                    assert!(!pack.load_order(module).is_empty());
                }
            }
            let again = pack.render().expect("a parsed pack renders");
            let reparsed = DriverPack::parse(&again).expect("a rendered pack parses");
            assert_eq!(reparsed.render().expect("renders"), again);
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode == 2 {
        driver_pack(&String::from_utf8_lossy(rest));
        return;
    }
    if mode % 2 == 0 {
        if let Ok(mut volume) = IsoVolume::open(Cursor::new(rest)) {
            walk(&mut volume);
            let _ = volume.read_file("/boot/modules.alias", 1 << 20);
            if let Ok(index) = volume.read_file("/DRIVERS/INDEX.", 1 << 20) {
                driver_pack(&String::from_utf8_lossy(&index));
            }
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
