//! The on-demand flow against a scratch sysfs and a pack in a directory, with a loader that
//! records what it is handed and plays the kernel's part (binding, new bus devices).

use std::io::Write as _;
use std::path::Path;

use vmdeploy_shared::driver_pack::{DriverPack, PackFirmware, PackModule, INDEX_NAME};

use super::source::{DirSource, PackSource};
use super::*;

fn xz(data: &[u8]) -> Vec<u8> {
    let mut w = lzma_rust2::XzWriter::new(Vec::new(), lzma_rust2::XzOptions::with_preset(1))
        .expect("xz writer");
    w.write_all(data).expect("compress");
    w.finish().expect("finish")
}

/// A pack of five modules: igb (needs dca), bnx2x (needs firmware), virtio_pci and
/// virtio_net (the latter bound to a virtio device only virtio_pci brings), and unused.
fn write_pack(dir: &Path) -> DriverPack {
    let mut pack = DriverPack::new("6.1.0-57-amd64");
    let file = |name: &str, data: &[u8]| {
        std::fs::write(dir.join(name), xz(data)).expect("pack file");
        data.len() as u64
    };
    let fw_bytes = file("F0001.XZ", b"bnx2x firmware bytes");
    pack.add_firmware(PackFirmware {
        name: "bnx2x/bnx2x-e2-7.13.21.0.fw".into(),
        file: "F0001.XZ".into(),
        bytes: fw_bytes,
    })
    .expect("firmware");
    for (i, (name, deps, fw)) in [
        ("dca", vec![], vec![]),
        ("igb", vec!["dca"], vec![]),
        ("bnx2x", vec![], vec!["bnx2x/bnx2x-e2-7.13.21.0.fw"]),
        ("virtio_pci", vec![], vec![]),
        ("virtio_net", vec![], vec![]),
        ("unused", vec![], vec![]),
    ]
    .into_iter()
    .enumerate()
    {
        let f = format!("M{:04}.XZ", i + 1);
        let bytes = file(&f, format!("\x7fELF module {name}").as_bytes());
        pack.add_module(PackModule {
            name: name.into(),
            file: f,
            bytes,
            deps: deps.into_iter().map(String::from).collect(),
            firmware: fw.into_iter().map(String::from).collect(),
        })
        .expect("module");
    }
    pack.add_alias("pci:v00008086d000010C9sv*sd*bc*sc*i*", "igb")
        .expect("alias");
    pack.add_alias("pci:v000014E4d0000168Esv*sd*bc*sc*i*", "bnx2x")
        .expect("alias");
    pack.add_alias("pci:v00001AF4d*sv*sd*bc*sc*i*", "virtio_pci")
        .expect("alias");
    pack.add_alias("virtio:d00000001v*", "virtio_net")
        .expect("alias");
    pack.add_alias("pci:v0000DEADd*sv*sd*bc*sc*i*", "unused")
        .expect("alias");
    std::fs::write(dir.join(INDEX_NAME), pack.render().expect("render")).expect("index");
    pack
}

/// A PCI function in a scratch `/sys/bus`: ids, class and its modalias.
pub(crate) fn pci(sys: &Path, addr: &str, vendor: u16, device: u16, class: u32) {
    let dir = sys.join("pci/devices").join(addr);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("vendor"), format!("0x{vendor:04x}\n")).expect("vendor");
    std::fs::write(dir.join("device"), format!("0x{device:04x}\n")).expect("device");
    std::fs::write(dir.join("class"), format!("0x{class:06x}\n")).expect("class");
    std::fs::write(
        dir.join("modalias"),
        format!(
            "pci:v{vendor:08X}d{device:08X}sv00001AF4sd00001100bc{:02X}sc{:02X}i00\n",
            class >> 16,
            (class >> 8) & 0xff
        ),
    )
    .expect("modalias");
}

/// `driver` bound to the function at `addr` (its `driver` link).
pub(crate) fn bind(sys: &Path, addr: &str, driver: &str) {
    let target = sys.join("pci/drivers").join(driver);
    std::fs::create_dir_all(&target).expect("driver dir");
    std::os::unix::fs::symlink(&target, sys.join("pci/devices").join(addr).join("driver"))
        .expect("bind");
}

/// A scratch directory with the pack of [`write_pack`] in `pack/` and an empty `sys/`.
fn scratch_with_pack() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let scratch = tempfile::tempdir().expect("tempdir");
    let pack_dir = scratch.path().join("pack");
    std::fs::create_dir_all(&pack_dir).expect("mkdir");
    write_pack(&pack_dir);
    let sys = scratch.path().join("sys");
    (scratch, pack_dir, sys)
}

#[test]
fn loads_what_the_devices_match_with_deps_firmware_and_the_buses_they_bring() {
    let (scratch, pack_dir, sys) = scratch_with_pack();
    pci(&sys, "0000:00:02.0", 0x8086, 0x10c9, 0x020000); // igb
    pci(&sys, "0000:00:03.0", 0x14e4, 0x168e, 0x020000); // bnx2x
    pci(&sys, "0000:00:04.0", 0x1af4, 0x1000, 0x020000); // virtio NIC
    pci(&sys, "0000:00:05.0", 0x1000, 0x0060, 0x010400); // a RAID controller nobody drives

    let paths = Paths {
        sys_bus: sys.clone(),
        firmware_dir: scratch.path().join("firmware"),
    };
    let mut source = DirSource::open(&pack_dir).expect("the pack is there");
    let pack = super::source::read_index(&mut source).expect("index");
    let mut loaded: Vec<(String, Vec<u8>)> = Vec::new();
    let firmware_dir = paths.firmware_dir.clone();
    let mut load = |m: &PackModule, image: &[u8]| {
        loaded.push((m.name.clone(), image.to_vec()));
        match m.name.as_str() {
            "igb" => bind(&sys, "0000:00:02.0", "igb"),
            "bnx2x" => {
                // The kernel would ask for it now: it must be there already.
                let fw = firmware_dir.join("bnx2x/bnx2x-e2-7.13.21.0.fw");
                assert_eq!(
                    std::fs::read(&fw).expect("firmware copied before the module"),
                    b"bnx2x firmware bytes"
                );
                bind(&sys, "0000:00:03.0", "bnx2x");
            }
            "virtio_pci" => {
                bind(&sys, "0000:00:04.0", "virtio-pci");
                let dev = sys.join("virtio/devices/virtio0");
                std::fs::create_dir_all(&dev).expect("mkdir");
                std::fs::write(dev.join("modalias"), "virtio:d00000001v00001AF4\n")
                    .expect("modalias");
            }
            _ => {}
        }
        Ok(LoadResult::Loaded)
    };
    let report = load_for_devices(&mut source, &pack, &paths, &mut load);

    let names: Vec<&str> = loaded.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        vec!["dca", "igb", "bnx2x", "virtio_pci", "virtio_net"]
    );
    assert_eq!(
        loaded[1].1, b"\x7fELF module igb",
        "the module's bytes, decompressed"
    );
    assert!(
        report.modules.iter().all(|(_, o)| o == "loaded"),
        "{report:?}"
    );
    assert_eq!(report.firmware, vec!["bnx2x/bnx2x-e2-7.13.21.0.fw"]);
    assert!(report.bytes_read > 0);
    assert_eq!(
        report.undriven,
        vec!["PCI 0000:00:05.0 [1000:0060] storage controller"]
    );
}

#[test]
fn a_broken_pack_file_fails_its_module_and_the_others_still_load() {
    let (scratch, pack_dir, sys) = scratch_with_pack();
    // dca's file is not xz any more: dca fails, igb is still tried (the kernel would refuse
    // it for the missing symbols, and say so), bnx2x loads.
    std::fs::write(pack_dir.join("M0001.XZ"), b"not xz").expect("corrupt");
    // bnx2x's firmware is gone from the medium.
    std::fs::remove_file(pack_dir.join("F0001.XZ")).expect("remove");
    pci(&sys, "0000:00:02.0", 0x8086, 0x10c9, 0x020000);
    pci(&sys, "0000:00:03.0", 0x14e4, 0x168e, 0x020000);
    let paths = Paths {
        sys_bus: sys,
        firmware_dir: scratch.path().join("firmware"),
    };
    let mut source = DirSource::open(&pack_dir).expect("pack");
    let pack = super::source::read_index(&mut source).expect("index");
    let mut calls = Vec::new();
    let mut load = |m: &PackModule, _: &[u8]| {
        calls.push(m.name.clone());
        Ok(LoadResult::Loaded)
    };
    let report = load_for_devices(&mut source, &pack, &paths, &mut load);
    assert_eq!(calls, vec!["igb"]);
    let outcome = |name: &str| {
        report
            .modules
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, o)| o.clone())
            .unwrap_or_default()
    };
    assert!(
        outcome("dca").starts_with("failed: module dca (M0001.XZ): decompressing"),
        "{report:?}"
    );
    assert_eq!(outcome("igb"), "loaded");
    assert!(
        outcome("bnx2x").contains("firmware bnx2x/bnx2x-e2-7.13.21.0.fw"),
        "{report:?}"
    );
    assert_eq!(report.undriven.len(), 2, "nothing was bound: {report:?}");
}

#[test]
fn a_file_that_decompresses_to_another_size_than_the_index_says_is_refused() {
    let scratch = tempfile::tempdir().expect("tempdir");
    std::fs::write(scratch.path().join("M0001.XZ"), xz(b"twelve bytes")).expect("file");
    std::fs::write(scratch.path().join(INDEX_NAME), "x").expect("index");
    let mut source = DirSource::open(scratch.path()).expect("pack");
    let err = unpack(&mut source, "M0001.XZ", 11).expect_err("wrong size");
    assert!(
        format!("{err:#}").contains("12 bytes where the index says 11"),
        "{err:#}"
    );
    assert!(
        source.read("../etc", 10).is_err(),
        "no path out of the pack's directory"
    );
}
