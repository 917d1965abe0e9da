//! Drivers loaded on demand: the modules (and their firmware) that the devices present need,
//! from the driver pack (`vmdeploy_shared::driver_pack`) on the deploy CD, or in the ramdisk of
//! a network boot. The initramfs itself carries only what finding the CD and the floppy takes.
//!
//! # Flow ([`load_for_devices`])
//! 1. Every device's modalias (`/sys/bus/*/devices/*/modalias`) is matched against the pack's
//!    aliases, as udev's `modprobe $MODALIAS` would: every matching module is loaded.
//! 2. Each module's dependencies go first, each module once; before a module loads, the
//!    firmware files it needs are copied to `/lib/firmware`, where the kernel's loader looks.
//! 3. A module binds its devices as it loads, and some of those are buses with devices of their
//!    own (virtio's PCI transport brings virtio devices), so the scan repeats until a round
//!    loads nothing new, at most [`MAX_ROUNDS`] times.
//! 4. A NIC or disk controller still without a driver is named on the console, and kept for the
//!    deploy's error ([`undriven_note`]): "PCI 0000:00:03.0 [14e4:168e] network controller".
//!
//! A module that fails to load is logged and the others still load, as for the initramfs list.

pub mod devices;
pub mod source;

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context;
use serde::Serialize;
use vmdeploy_shared::driver_pack::{DriverPack, PackModule};

use crate::init::modules::{self, LoadResult};
use devices::PciFunction;
use source::PackSource;

/// Scans of the devices at most: PCI, then the buses PCI drivers bring (virtio), then spare.
pub const MAX_ROUNDS: usize = 4;

/// Where the kernel's firmware loader looks first.
pub const FIRMWARE_DIR: &str = "/lib/firmware";

/// The NICs and disk controllers left without a driver, for the deploy's error.
static UNDRIVEN: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// What was loaded and read.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadReport {
    /// Where the pack was read from.
    pub source: String,
    /// (module, outcome) in load order: `loaded`, `already loaded` or `failed: ...`.
    pub modules: Vec<(String, String)>,
    /// Firmware files copied to the firmware directory.
    pub firmware: Vec<String>,
    /// Bytes read from the pack's medium (index included).
    pub bytes_read: u64,
    /// NICs and disk controllers no driver is bound to afterwards.
    pub undriven: Vec<String>,
}

/// The paths the flow reads and writes (the real ones at boot; a scratch tree in tests).
#[derive(Debug, Clone)]
pub struct Paths {
    /// `/sys/bus`.
    pub sys_bus: PathBuf,
    /// Where firmware files go.
    pub firmware_dir: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            sys_bus: PathBuf::from("/sys/bus"),
            firmware_dir: PathBuf::from(FIRMWARE_DIR),
        }
    }
}

/// How a module image reaches the kernel (init_module(2) at boot; a recorder in tests).
pub type Loader<'a> = dyn FnMut(&PackModule, &[u8]) -> anyhow::Result<LoadResult> + 'a;

/// At boot: finds the pack (in the ramdisk, else on the CD when the node booted from virtual
/// media), loads what the devices need and names what stays undriven. Never fails: without a
/// pack the agent goes on with the initramfs's drivers, and the next step says what is missing.
pub fn load_at_boot(vmedia: bool) -> LoadReport {
    let paths = Paths::default();
    let in_ramdisk = Path::new("/").join(vmdeploy_shared::driver_pack::INITRAMFS_DIR);
    let mut found: Option<Box<dyn PackSource>> = match source::DirSource::open(&in_ramdisk) {
        Some(dir) => Some(Box::new(dir)),
        None if vmedia => source::CdSearch::default()
            .find()
            .map(|cd| Box::new(cd) as Box<dyn PackSource>),
        None => None,
    };
    let report = match found.as_deref_mut() {
        Some(src) => match source::read_index(src) {
            Ok(pack) => {
                tracing::info!(
                    source = %src.describe(),
                    modules = pack.modules().count(),
                    firmware = pack.firmware_files().count(),
                    kernel = %pack.kernel,
                    "driver pack found"
                );
                check_kernel(&pack);
                let mut load = |_: &PackModule, image: &[u8]| modules::load_image(image, "");
                load_for_devices(src, &pack, &paths, &mut load)
            }
            Err(e) => {
                tracing::warn!("driver pack unusable, going on without it: {e:#}");
                without_pack(&paths, src.describe())
            }
        },
        None => {
            tracing::warn!(
                vmedia,
                "no driver pack (no CD with one, none in the ramdisk): only the initramfs's \
                 drivers are loaded"
            );
            without_pack(&paths, "none".into())
        }
    };
    for device in &report.undriven {
        // Plain words on the console as well: this is the line an operator looks for.
        eprintln!("vmdeploy-agent: {device}: no driver on the deploy media drives it");
    }
    tracing::info!(
        source = %report.source,
        loaded = report.modules.iter().filter(|(_, o)| o == "loaded").count(),
        firmware = report.firmware.len(),
        bytes_read = report.bytes_read,
        undriven = report.undriven.len(),
        "on-demand drivers done"
    );
    report
}

/// A pack built for another kernel than the running one loads nothing: say so up front.
fn check_kernel(pack: &DriverPack) {
    if let Ok(running) = modules::kernel_release() {
        if running != pack.kernel {
            tracing::warn!(
                pack = %pack.kernel,
                %running,
                "the driver pack was built for another kernel: its modules will be refused"
            );
        }
    }
}

fn without_pack(paths: &Paths, source: String) -> LoadReport {
    let undriven = record_undriven(devices::undriven(&paths.sys_bus));
    LoadReport {
        source,
        undriven,
        ..LoadReport::default()
    }
}

/// Steps 1–4 of the module docs with `pack` read from `source`; `load` hands each module's
/// bytes to the kernel.
pub fn load_for_devices(
    source: &mut dyn PackSource,
    pack: &DriverPack,
    paths: &Paths,
    load: &mut Loader<'_>,
) -> LoadReport {
    let mut report = LoadReport {
        source: source.describe(),
        ..LoadReport::default()
    };
    let mut tried: BTreeSet<String> = BTreeSet::new();
    for round in 1..=MAX_ROUNDS {
        let mut wanted: Vec<&PackModule> = Vec::new();
        for device in devices::with_modalias(&paths.sys_bus) {
            for module in pack.modules_for(&device.modalias) {
                if !tried.contains(&module.name) && !wanted.iter().any(|w| w.name == module.name) {
                    tracing::info!(
                        device = %device.path.display(),
                        modalias = %device.modalias,
                        module = %module.name,
                        round,
                        "device matches a driver of the pack"
                    );
                    wanted.push(module);
                }
            }
        }
        if wanted.is_empty() {
            break;
        }
        for module in wanted {
            for step in pack.load_order(module) {
                if !tried.insert(step.name.clone()) {
                    continue;
                }
                let started = std::time::Instant::now();
                let outcome = match load_one(source, pack, step, paths, load, &mut report.firmware)
                {
                    Ok(LoadResult::Loaded) => "loaded".to_owned(),
                    Ok(LoadResult::AlreadyLoaded) => "already loaded".to_owned(),
                    Err(e) => format!("failed: {e:#}"),
                };
                let ms = started.elapsed().as_millis();
                if outcome.starts_with("failed") {
                    tracing::warn!(module = %step.name, %outcome, ms, "driver from the pack");
                } else {
                    tracing::info!(module = %step.name, %outcome, ms, "driver from the pack");
                }
                report.modules.push((step.name.clone(), outcome));
            }
        }
    }
    report.bytes_read = source.bytes_read();
    report.undriven = record_undriven(devices::undriven(&paths.sys_bus));
    report
}

/// Copies `module`'s firmware, reads and decompresses it, and loads it.
fn load_one(
    source: &mut dyn PackSource,
    pack: &DriverPack,
    module: &PackModule,
    paths: &Paths,
    load: &mut Loader<'_>,
    firmware_done: &mut Vec<String>,
) -> anyhow::Result<LoadResult> {
    for name in &module.firmware {
        if firmware_done.contains(name) {
            continue;
        }
        let fw = pack
            .firmware(name)
            .with_context(|| format!("firmware {name} is not in the pack"))?;
        let data = unpack(source, &fw.file, fw.bytes)
            .with_context(|| format!("firmware {name} ({})", fw.file))?;
        // The index's parser allows only plain relative names, so this stays under the dir.
        let target = paths.firmware_dir.join(name);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&target, &data).with_context(|| format!("writing {}", target.display()))?;
        firmware_done.push(name.clone());
    }
    let image = unpack(source, &module.file, module.bytes)
        .with_context(|| format!("module {} ({})", module.name, module.file))?;
    load(module, &image)
}

/// One pack file, decompressed: exactly `bytes` long, or an error.
fn unpack(source: &mut dyn PackSource, file: &str, bytes: u64) -> anyhow::Result<Vec<u8>> {
    // xz of incompressible data is a little larger than the data.
    let compressed = source.read(file, bytes + bytes / 8 + 4096)?;
    let mut data = Vec::new();
    lzma_rust2::XzReader::new(&compressed[..], true)
        .take(bytes + 1)
        .read_to_end(&mut data)
        .context("decompressing")?;
    anyhow::ensure!(
        data.len() as u64 == bytes,
        "decompressed to {} bytes where the index says {bytes}",
        data.len()
    );
    Ok(data)
}

fn record_undriven(functions: Vec<PciFunction>) -> Vec<String> {
    let lines: Vec<String> = functions.iter().map(ToString::to_string).collect();
    if let Ok(mut slot) = UNDRIVEN.lock() {
        slot.clone_from(&lines);
    }
    lines
}

/// "not driven by the deploy media: PCI ... network controller; ..." when a NIC or disk
/// controller was left without a driver, for errors about a missing NIC or disk.
pub fn undriven_note() -> Option<String> {
    let lines = UNDRIVEN.lock().ok()?.clone();
    (!lines.is_empty()).then(|| {
        format!(
            "devices no driver on the deploy media drives: {}",
            lines.join("; ")
        )
    })
}

/// `err` with [`undriven_note`] added, when there is one: for "no NIC" and "no disk" errors,
/// whose likely cause it is.
pub fn with_undriven_note(err: anyhow::Error) -> anyhow::Error {
    match undriven_note() {
        Some(note) => err.context(note),
        None => err,
    }
}

#[cfg(test)]
mod tests;
