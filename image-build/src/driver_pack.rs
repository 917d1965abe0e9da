//! The deploy ISO's driver pack (format: `vmdeploy_shared::driver_pack`): every network and
//! storage module of the kernel, with the modules they depend on and the firmware files they
//! name, minus what the initramfs already loads. The agent loads from it only what the node's
//! devices match (agent/src/drivers), so the pack may be large while a boot reads little.
//!
//! # What goes in
//! - Modules: those whose path [`in_pack`] takes (the coverage report's network and storage
//!   trees, plus virtio's PCI transport and its NIC, for QEMU), then their dependency closure
//!   from `modules.dep`. Each is the kernel package's file, untouched (its appended signature
//!   kept, for Secure Boot), xz-compressed on its own.
//! - Firmware: for each module, the files `modinfo -F firmware` names that the firmware tree
//!   (`--firmware-dir`, a `lib/firmware`) has; the others are reported, not fatal: a driver
//!   loads without firmware its hardware does not ask for.
//! - Aliases: the kernel's `modules.alias` lines of the pack's modules, in the file's order.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context;
use vmdeploy_shared::driver_pack::{DriverPack, PackFirmware, PackModule};

use crate::coverage::{KernelDrivers, Kind};
use crate::kmod::module_name;

/// Whether a module (by its path under the release directory) is one the pack is built from.
pub fn in_pack(path: &str) -> bool {
    Kind::of_module_path(path).is_some()
        || path.starts_with("kernel/drivers/virtio/")
        || path == "kernel/drivers/net/virtio_net.ko"
}

/// A built pack: the index and each file to put beside it.
#[derive(Debug)]
pub struct BuiltPack {
    /// The index text.
    pub index: String,
    /// (file name in the pack's directory, xz bytes).
    pub files: Vec<PackFile>,
    /// Module count.
    pub modules: usize,
    /// Firmware file count.
    pub firmware: usize,
    /// Uncompressed bytes of every file.
    pub raw_bytes: u64,
    /// (module, firmware file) the module names that the firmware tree lacks.
    pub missing_firmware: Vec<(String, String)>,
}

impl BuiltPack {
    /// Compressed bytes of every file and the index.
    pub fn bytes(&self) -> u64 {
        self.index.len() as u64 + self.files.iter().map(|(_, d)| d.len() as u64).sum::<u64>()
    }
}

/// Builds the pack of `kernel` without the modules of `in_initramfs` (names, `_` form).
pub fn build(
    kernel: &KernelDrivers,
    in_initramfs: &BTreeSet<String>,
    firmware_dir: Option<&Path>,
) -> anyhow::Result<BuiltPack> {
    let index = kernel.index();
    let roots: Vec<String> = index
        .paths()
        .filter(|p| in_pack(p))
        .filter_map(module_name)
        .collect();
    let root_refs: Vec<&str> = roots.iter().map(String::as_str).collect();
    let order: Vec<String> = index
        .load_order(&root_refs)
        .context("resolving the pack's dependencies")?
        .into_iter()
        .filter(|p| module_name(p).is_some_and(|n| !in_initramfs.contains(&n)))
        .collect();
    let names: BTreeSet<String> = order.iter().filter_map(|p| module_name(p)).collect();

    let available = match firmware_dir {
        Some(dir) => crate::coverage::firmware_in(dir)?,
        None => BTreeSet::new(),
    };
    // Sizes come from the compression pass, which reads every file anyway.
    let mut modules: Vec<PackModule> = Vec::new();
    let mut raw: Vec<(String, std::path::PathBuf)> = Vec::new();
    let mut firmware_files: BTreeMap<String, String> = BTreeMap::new();
    let mut missing_firmware = Vec::new();
    for (i, path) in order.iter().enumerate() {
        let name = module_name(path).with_context(|| format!("{path} is not a module"))?;
        let deps: Vec<String> = index
            .load_order(&[name.as_str()])?
            .iter()
            .filter_map(|p| module_name(p))
            .filter(|d| *d != name && names.contains(d))
            .collect();
        let mut firmware = Vec::new();
        for fw in kernel.firmware_of(path)? {
            if !available.contains(&fw) {
                missing_firmware.push((name.clone(), fw));
                continue;
            }
            if !firmware_files.contains_key(&fw) {
                let file = format!("F{:04}.XZ", firmware_files.len() + 1);
                raw.push((file.clone(), firmware_host_path(firmware_dir, &fw)?));
                firmware_files.insert(fw.clone(), file);
            }
            firmware.push(fw);
        }
        let file = format!("M{:04}.XZ", i + 1);
        raw.push((file.clone(), kernel.modules_dir().join(path)));
        modules.push(PackModule {
            name,
            file,
            bytes: 0,
            deps,
            firmware,
        });
    }
    let (files, sizes) = compress_all(&raw)?;
    let size_of = |file: &str| {
        sizes
            .get(file)
            .copied()
            .with_context(|| format!("{file} was not compressed"))
    };
    let mut pack = DriverPack::new(&kernel.release);
    for module in modules {
        let bytes = size_of(&module.file)?;
        pack.add_module(PackModule { bytes, ..module })?;
    }
    for (name, file) in &firmware_files {
        pack.add_firmware(PackFirmware {
            name: name.clone(),
            file: file.clone(),
            bytes: size_of(file)?,
        })?;
    }
    for alias in kernel.aliases().aliases() {
        if !alias.builtin && names.contains(&alias.module) {
            pack.add_alias(&alias.pattern, &alias.module)?;
        }
    }
    Ok(BuiltPack {
        index: pack.render()?,
        files,
        modules: names.len(),
        firmware: firmware_files.len(),
        raw_bytes: sizes.values().sum(),
        missing_firmware,
    })
}

/// Where firmware `name` is in the tree: the plain file (compressed ones are listed by
/// `firmware_in` under their plain names but are not taken: the kernel's direct loader reads the
/// agent's copy plain).
fn firmware_host_path(dir: Option<&Path>, name: &str) -> anyhow::Result<std::path::PathBuf> {
    let dir = dir.context("firmware without a firmware tree")?;
    let path = dir.join(name);
    anyhow::ensure!(
        path.is_file(),
        "{} is not a plain file (compressed firmware is not supported in the pack)",
        path.display()
    );
    Ok(path)
}

/// A pack file's name and its xz bytes.
type PackFile = (String, Vec<u8>);

/// A compressed pack file and its size before.
type Compressed = (String, Vec<u8>, u64);

/// Reads and xz-compresses each file, on every core (~80 MB of modules at xz's preset 6 takes
/// about a minute on one); returns the files and each one's size before compression.
fn compress_all(
    raw: &[(String, std::path::PathBuf)],
) -> anyhow::Result<(Vec<PackFile>, BTreeMap<String, u64>)> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 8);
    let chunk = raw.len().div_ceil(threads).max(1);
    let results: Vec<anyhow::Result<Vec<Compressed>>> = std::thread::scope(|s| {
        let handles: Vec<_> = raw
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|(file, host)| {
                            let data = std::fs::read(host)
                                .with_context(|| format!("reading {}", host.display()))?;
                            let xz = crate::initramfs::compress_xz_fast(&data)
                                .with_context(|| format!("compressing {}", host.display()))?;
                            Ok((file.clone(), xz, data.len() as u64))
                        })
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a compression thread panicked")))
            })
            .collect()
    });
    let mut files = Vec::with_capacity(raw.len());
    let mut sizes = BTreeMap::new();
    for part in results {
        for (file, xz, len) in part? {
            sizes.insert(file.clone(), len);
            files.push((file, xz));
        }
    }
    Ok((files, sizes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pack_takes_network_storage_and_virtio_modules() {
        for path in [
            "kernel/drivers/net/ethernet/intel/igb/igb.ko",
            "kernel/drivers/scsi/megaraid/megaraid_sas.ko",
            "kernel/drivers/nvme/host/nvme.ko",
            "kernel/drivers/virtio/virtio_pci.ko",
            "kernel/drivers/net/virtio_net.ko",
        ] {
            assert!(in_pack(path), "{path}");
        }
        for path in [
            "kernel/drivers/usb/storage/usb-storage.ko",
            "kernel/drivers/net/wireless/intel/iwlwifi/iwlwifi.ko",
            "kernel/drivers/gpu/drm/i915/i915.ko",
            "kernel/fs/configfs/configfs.ko",
        ] {
            assert!(!in_pack(path), "{path}");
        }
    }
}
