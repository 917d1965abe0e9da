//! Which HP and HPE network and storage adapters a deploy medium can drive, derived from facts
//! rather than from a hand list.
//!
//! ```text
//! pci.ids         every subsystem with subvendor 103c (HP) or 1590 (HPE)      (pci_ids)
//!   × modules.alias   the kernel's driver for those ids, class left open   (vmdeploy_shared::modalias)
//!   × modules.dep     the driver's path: drivers/net/ethernet is network, drivers/{scsi,ata,
//!                     nvme,block,message/fusion} storage; other drivers are out of scope
//!   × modinfo -F firmware   the firmware files the driver names
//!   = covered when the driver is on the medium (or built in) and every firmware file is there
//! ```
//! # Limits, said where they are printed
//! - `pci.ids` gives no class per subsystem, so a device driven only through a class pattern
//!   (an NVMe drive under `nvme`'s class alias, an AHCI controller under `ahci`'s) counts as not
//!   driven by ids; those drivers bind by class on any maker's board.
//! - Wireless (`drivers/net/wireless`: HP's laptops carry subvendor 103c) and InfiniBand are
//!   out of scope: a deploy runs over wired Ethernet.

pub mod pci_ids;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use vmdeploy_shared::modalias::AliasTable;

use crate::kmod::{module_name, ModuleIndex};

/// HP (Hewlett-Packard) and HPE (Hewlett Packard Enterprise) as PCI subsystem vendors.
pub const HP_SUBVENDORS: &[u16] = &[0x103c, 0x1590];

/// Debian's `pci.ids` package puts the file here.
pub const DEFAULT_PCI_IDS: &str = "/usr/share/misc/pci.ids";

/// What a driver is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A wired Ethernet driver.
    Network,
    /// A disk controller driver (SCSI, SAS, RAID, SATA, NVMe, FC).
    Storage,
}

impl Kind {
    /// The kind of the module at `path` (relative to the release directory), `None` for any
    /// other driver.
    pub fn of_module_path(path: &str) -> Option<Kind> {
        const NETWORK: &[&str] = &["kernel/drivers/net/ethernet/"];
        const STORAGE: &[&str] = &[
            "kernel/drivers/scsi/",
            "kernel/drivers/ata/",
            "kernel/drivers/nvme/",
            "kernel/drivers/block/",
            "kernel/drivers/message/fusion/",
        ];
        if NETWORK.iter().any(|p| path.starts_with(p)) {
            Some(Kind::Network)
        } else if STORAGE.iter().any(|p| path.starts_with(p)) {
            Some(Kind::Storage)
        } else {
            None
        }
    }

    fn label(self) -> &'static str {
        match self {
            Kind::Network => "network",
            Kind::Storage => "storage",
        }
    }
}

/// One HP/HPE adapter a network or storage driver of the kernel drives.
#[derive(Debug, Clone)]
pub struct Adapter {
    /// Its `pci.ids` entry.
    pub subsystem: pci_ids::Subsystem,
    /// The driver (the first matching alias in `modules.alias` order, as kmod loads it).
    pub driver: String,
    /// Network or storage.
    pub kind: Kind,
    /// Whether the driver is built into the kernel.
    pub builtin: bool,
    /// Firmware files the driver names (`modinfo -F firmware`).
    pub firmware: Vec<String>,
}

/// The kernel's side: its drivers, their paths and firmware.
pub struct KernelDrivers {
    /// The kernel release.
    pub release: String,
    aliases: AliasTable,
    index: ModuleIndex,
    builtin_paths: BTreeMap<String, String>,
    modules_dir: PathBuf,
}

impl KernelDrivers {
    /// Reads `modules.alias`, `modules.dep`, `modules.builtin` and
    /// `modules.builtin.modinfo` of an unpacked, depmod-indexed `lib/modules/<release>`.
    pub fn read(modules_dir: &Path, release: &str) -> anyhow::Result<KernelDrivers> {
        let read = |name: &str| -> anyhow::Result<Vec<u8>> {
            let path = modules_dir.join(name);
            std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
        };
        let text = |name: &str| -> anyhow::Result<String> {
            String::from_utf8(read(name)?).with_context(|| format!("{name} is not UTF-8"))
        };
        let mut aliases = AliasTable::parse(&text("modules.alias")?)?;
        // Older kernels have no builtin modinfo: then no built-in driver is matched.
        if let Ok(modinfo) = read("modules.builtin.modinfo") {
            aliases.add_builtin_modinfo(&modinfo);
        }
        let index = ModuleIndex::parse(&text("modules.dep")?)?;
        let builtin_paths = text("modules.builtin")
            .unwrap_or_default()
            .lines()
            .filter_map(|path| Some((module_name(path.trim())?, path.trim().to_owned())))
            .collect();
        Ok(KernelDrivers {
            release: release.to_owned(),
            aliases,
            index,
            builtin_paths,
            modules_dir: modules_dir.to_owned(),
        })
    }

    fn path_of(&self, module: &str, builtin: bool) -> Option<&str> {
        if builtin {
            self.builtin_paths.get(module).map(String::as_str)
        } else {
            self.index.path_of(module)
        }
    }

    /// The module index (for the medium's module closure).
    pub fn index(&self) -> &ModuleIndex {
        &self.index
    }

    /// `modules.alias` with the built-in drivers' aliases, in file order.
    pub fn aliases(&self) -> &AliasTable {
        &self.aliases
    }

    /// The unpacked `lib/modules/<release>`.
    pub fn modules_dir(&self) -> &Path {
        &self.modules_dir
    }

    /// `modinfo -F firmware` of a module file.
    pub fn firmware_of(&self, path: &str) -> anyhow::Result<Vec<String>> {
        let file = self.modules_dir.join(path);
        let out = crate::tool::output(
            Command::new("modinfo").arg("-F").arg("firmware").arg(&file),
            "apt-get install kmod",
        )
        .with_context(|| format!("reading the firmware list of {}", file.display()))?;
        Ok(String::from_utf8_lossy(&out)
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect())
    }
}

/// The adapters of `subsystems` that a network or storage driver of `kernel` drives, and how
/// many subsystems were left out (no driver by ids, or another kind of driver).
pub fn driven_adapters(
    subsystems: &[pci_ids::Subsystem],
    kernel: &KernelDrivers,
) -> anyhow::Result<(Vec<Adapter>, usize, usize)> {
    let mut adapters = Vec::new();
    let (mut undriven, mut other_kind) = (0, 0);
    let mut firmware: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for sub in subsystems {
        let Some(alias) = kernel.aliases.matching_pci_ids(sub.id).next() else {
            undriven += 1;
            continue;
        };
        let kind = kernel
            .path_of(&alias.module, alias.builtin)
            .and_then(Kind::of_module_path);
        let Some(kind) = kind else {
            other_kind += 1;
            continue;
        };
        let files = if alias.builtin {
            Vec::new()
        } else if let Some(files) = firmware.get(&alias.module) {
            files.clone()
        } else {
            let path = kernel.index.path_of(&alias.module).with_context(|| {
                format!("{} has an alias but no modules.dep line", alias.module)
            })?;
            let files = kernel.firmware_of(path)?;
            firmware.insert(alias.module.clone(), files.clone());
            files
        };
        adapters.push(Adapter {
            subsystem: sub.clone(),
            driver: alias.module.clone(),
            kind,
            builtin: alias.builtin,
            firmware: files,
        });
    }
    Ok((adapters, undriven, other_kind))
}

/// What a medium carries: module names and firmware files (paths under `lib/firmware`).
#[derive(Debug, Default, Clone)]
pub struct MediumContents {
    /// Module names, `_` for `-`.
    pub modules: BTreeSet<String>,
    /// Firmware file names as modules name them (`bnx2x/bnx2x-e2-7.13.21.0.fw`).
    pub firmware: BTreeSet<String>,
}

impl MediumContents {
    /// What the medium lacks for `adapter`: the driver (when not built in), and firmware files.
    pub fn lacks<'a>(&self, adapter: &'a Adapter) -> (bool, Vec<&'a str>) {
        let driver = !adapter.builtin && !self.modules.contains(&adapter.driver);
        let firmware = adapter
            .firmware
            .iter()
            .filter(|f| !self.firmware.contains(f.as_str()))
            .map(String::as_str)
            .collect();
        (driver, firmware)
    }
}

/// An adapter a medium does not fully serve, and what it lacks for it.
#[derive(Debug)]
pub struct Missing<'a> {
    /// The adapter.
    pub adapter: &'a Adapter,
    /// Whether the driver module is not on the medium.
    pub lacks_driver: bool,
    /// The firmware files the driver names that are not on the medium.
    pub lacks_firmware: Vec<&'a str>,
}

/// The coverage of a medium over the driven adapters.
#[derive(Debug)]
pub struct Coverage<'a> {
    /// Adapters the medium fully serves.
    pub covered: Vec<&'a Adapter>,
    /// Adapters it does not.
    pub missing: Vec<Missing<'a>>,
}

impl<'a> Coverage<'a> {
    /// Splits `adapters` by whether `medium` has their driver and every firmware file.
    pub fn of(adapters: &'a [Adapter], medium: &'a MediumContents) -> Coverage<'a> {
        let mut coverage = Coverage {
            covered: Vec::new(),
            missing: Vec::new(),
        };
        for adapter in adapters {
            let (lacks_driver, lacks_firmware) = medium.lacks(adapter);
            if lacks_driver || !lacks_firmware.is_empty() {
                coverage.missing.push(Missing {
                    adapter,
                    lacks_driver,
                    lacks_firmware,
                });
            } else {
                coverage.covered.push(adapter);
            }
        }
        coverage
    }

    /// Covered adapters per 100 (100 when there is nothing to cover).
    pub fn percent(&self) -> f64 {
        let total = self.covered.len() + self.missing.len();
        if total == 0 {
            100.0
        } else {
            100.0 * self.covered.len() as f64 / total as f64
        }
    }

    /// The report: totals, then the missing adapters grouped by driver.
    pub fn render(&self, header: &str, list_all: bool) -> String {
        use std::fmt::Write as _;
        let total = self.covered.len() + self.missing.len();
        let mut out = String::new();
        let _ = writeln!(out, "{header}");
        let _ = writeln!(
            out,
            "  on the medium (driver and every firmware file it names): {} of {total} ({:.1}%)",
            self.covered.len(),
            self.percent()
        );
        let mut by_driver: BTreeMap<(&str, Kind), Vec<&Missing>> = BTreeMap::new();
        for entry in &self.missing {
            by_driver
                .entry((entry.adapter.driver.as_str(), entry.adapter.kind))
                .or_default()
                .push(entry);
        }
        if !by_driver.is_empty() {
            let _ = writeln!(out, "  missing, by driver:");
        }
        for ((driver, kind), entries) in &by_driver {
            let lacks_driver = entries.iter().any(|e| e.lacks_driver);
            let firmware: BTreeSet<&str> = entries
                .iter()
                .flat_map(|e| e.lacks_firmware.iter().copied())
                .collect();
            let mut what = Vec::new();
            if lacks_driver {
                what.push("the module".to_owned());
            }
            if !firmware.is_empty() {
                what.push(format!("{} firmware files", firmware.len()));
            }
            let _ = writeln!(
                out,
                "    {driver} ({}, {} adapters; lacks {}):",
                kind.label(),
                entries.len(),
                what.join(" and ")
            );
            let shown = if list_all { entries.len() } else { 3 };
            for entry in entries.iter().take(shown) {
                let s = &entry.adapter.subsystem;
                let _ = writeln!(out, "      {}  {}", s.id, s.name);
            }
            if entries.len() > shown {
                let _ = writeln!(out, "      ... {} more (--list)", entries.len() - shown);
            }
            if list_all {
                for file in &firmware {
                    let _ = writeln!(out, "      firmware {file}");
                }
            }
        }
        out
    }
}

/// The firmware files under a `lib/firmware` tree, as modules name them (compressed files under
/// their uncompressed names, as the kernel's loader finds them).
pub fn firmware_in(dir: &Path) -> anyhow::Result<BTreeSet<String>> {
    let mut found = BTreeSet::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(current) = stack.pop() {
        for entry in
            std::fs::read_dir(&current).with_context(|| format!("listing {}", current.display()))?
        {
            let entry = entry.with_context(|| format!("listing {}", current.display()))?;
            let path = entry.path();
            let kind = entry
                .file_type()
                .with_context(|| format!("reading {}", path.display()))?;
            if kind.is_dir() {
                stack.push(path);
                continue;
            }
            let Ok(relative) = path.strip_prefix(dir) else {
                continue;
            };
            let name = relative.to_string_lossy();
            let name = [".xz", ".zst"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(&name);
            found.insert(name.to_owned());
        }
    }
    Ok(found)
}

/// Arguments of `coverage`.
#[derive(Debug, clap::Args)]
pub struct CoverageArgs {
    /// A Debian linux-image-*.deb (scripts/setup downloads one into .cache/kernel).
    #[arg(long)]
    pub kernel_deb: PathBuf,
    /// The PCI ID repository's list (Debian's `pci.ids` package).
    #[arg(long, default_value = DEFAULT_PCI_IDS)]
    pub pci_ids: PathBuf,
    /// An extra initramfs module, as `deploy-iso --module` takes it; repeat for more (the
    /// driver pack carries every network and storage module anyway).
    #[arg(long = "module")]
    pub modules: Vec<String>,
    /// A `lib/firmware` tree whose files the medium carries (none without it).
    #[arg(long)]
    pub firmware_dir: Option<PathBuf>,
    /// List every missing adapter and firmware file, not the first three per driver.
    #[arg(long)]
    pub list: bool,
    /// Fail (exit 1) unless every driven adapter is covered.
    #[arg(long)]
    pub require_full: bool,
}

/// `vmdeploy-image-build coverage`: the report for the deploy ISO's module set.
pub fn run(args: CoverageArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.pci_ids).with_context(|| {
        format!(
            "reading {} (fix: apt-get install pci.ids)",
            args.pci_ids.display()
        )
    })?;
    let subsystems = pci_ids::subsystems_of(&text, HP_SUBVENDORS)
        .with_context(|| format!("reading {}", args.pci_ids.display()))?;
    let package = crate::kernel_deb::KernelPackage::unpack(&args.kernel_deb)?;
    let kernel = KernelDrivers::read(&package.modules_dir, &package.release)?;
    let (adapters, undriven, other_kind) = driven_adapters(&subsystems, &kernel)?;

    let requests = crate::deploy_iso::module_requests(&args.modules)
        .map_err(vmdeploy_shared::exit::UsageError::wrap)?;
    let names: Vec<&str> = requests.iter().map(|r| r.name.as_str()).collect();
    // The medium: the initramfs's modules and the driver pack's (crate::driver_pack), each
    // with its dependencies.
    let pack_roots: Vec<String> = kernel
        .index()
        .paths()
        .filter(|p| crate::driver_pack::in_pack(p))
        .filter_map(module_name)
        .collect();
    let mut medium = MediumContents::default();
    let wanted = names
        .iter()
        .copied()
        .chain(pack_roots.iter().map(String::as_str))
        .collect::<Vec<_>>();
    for path in kernel.index().load_order(&wanted)? {
        if let Some(name) = module_name(&path) {
            medium.modules.insert(name);
        }
    }
    if let Some(dir) = &args.firmware_dir {
        medium.firmware = firmware_in(dir)?;
    }
    let coverage = Coverage::of(&adapters, &medium);
    let (network, storage) = adapters.iter().fold((0, 0), |(n, s), a| match a.kind {
        Kind::Network => (n + 1, s),
        Kind::Storage => (n, s + 1),
    });
    let header = format!(
        "adapter coverage: pci.ids {}, kernel {}\n  \
         HP/HPE subsystems (subvendor 103c, 1590): {}; driven by a network or storage driver: \
         {} ({network} network, {storage} storage); by another driver: {other_kind}; by no \
         driver through their ids: {undriven} (class-only drivers such as nvme and ahci \
         cannot be told from pci.ids)",
        pci_ids::version(&text).unwrap_or("(no version line)"),
        kernel.release,
        subsystems.len(),
        adapters.len(),
    );
    print!("{}", coverage.render(&header, args.list));
    if args.require_full && !coverage.missing.is_empty() {
        anyhow::bail!(
            "{} of {} driven adapters are not covered by the medium",
            coverage.missing.len(),
            adapters.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmdeploy_shared::modalias::PciId;

    #[test]
    fn module_paths_name_the_kind() {
        for (path, kind) in [
            (
                "kernel/drivers/net/ethernet/intel/igb/igb.ko",
                Some(Kind::Network),
            ),
            (
                "kernel/drivers/scsi/megaraid/megaraid_sas.ko",
                Some(Kind::Storage),
            ),
            ("kernel/drivers/nvme/host/nvme.ko", Some(Kind::Storage)),
            ("kernel/drivers/net/wireless/intel/iwlwifi/iwlwifi.ko", None),
            ("kernel/drivers/infiniband/hw/mlx5/mlx5_ib.ko", None),
            ("kernel/drivers/gpu/drm/mgag200/mgag200.ko", None),
        ] {
            assert_eq!(Kind::of_module_path(path), kind, "{path}");
        }
    }

    fn adapter(driver: &str, firmware: &[&str], builtin: bool) -> Adapter {
        Adapter {
            subsystem: pci_ids::Subsystem {
                id: PciId {
                    vendor: 0x14e4,
                    device: 0x168e,
                    subvendor: 0x103c,
                    subdevice: 0x1930,
                },
                vendor_name: "Broadcom".into(),
                device_name: "BCM57810".into(),
                name: format!("{driver} board"),
            },
            driver: driver.into(),
            kind: Kind::Network,
            builtin,
            firmware: firmware.iter().map(|f| (*f).to_owned()).collect(),
        }
    }

    #[test]
    fn an_adapter_is_covered_only_with_its_driver_and_all_its_firmware() {
        let adapters = vec![
            adapter("igb", &[], false),
            adapter("bnx2x", &["bnx2x/a.fw", "bnx2x/b.fw"], false),
            adapter("ahci", &[], true),
        ];
        let mut medium = MediumContents::default();
        medium.modules.insert("igb".into());
        medium.modules.insert("bnx2x".into());
        medium.firmware.insert("bnx2x/a.fw".into());
        let coverage = Coverage::of(&adapters, &medium);
        let covered: Vec<_> = coverage.covered.iter().map(|a| a.driver.as_str()).collect();
        assert_eq!(covered, ["igb", "ahci"]);
        assert_eq!(coverage.missing.len(), 1);
        assert_eq!(coverage.missing[0].lacks_firmware, ["bnx2x/b.fw"]);
        let text = coverage.render("coverage", true);
        assert!(text.contains("2 of 3 (66.7%)"), "{text}");
        assert!(
            text.contains("bnx2x (network, 1 adapters; lacks 1 firmware files)"),
            "{text}"
        );
        assert!(text.contains("firmware bnx2x/b.fw"), "{text}");
        medium.firmware.insert("bnx2x/b.fw".into());
        assert_eq!(Coverage::of(&adapters, &medium).percent(), 100.0);
    }

    #[test]
    fn firmware_trees_list_files_under_their_load_names() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("bnx2x")).expect("dir");
        std::fs::write(dir.path().join("bnx2x/bnx2x-e2.fw.xz"), b"x").expect("write");
        std::fs::write(dir.path().join("top.bin"), b"x").expect("write");
        let found = firmware_in(dir.path()).expect("lists");
        let found: Vec<_> = found.iter().map(String::as_str).collect();
        assert_eq!(found, ["bnx2x/bnx2x-e2.fw", "top.bin"]);
        assert!(firmware_in(&dir.path().join("none")).is_err());
    }
}
