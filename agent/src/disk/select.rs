//! Picking the target disk: from `root_device` hints (size in GiB, model, vendor, serial, wwn,
//! name), else from the iSCSI deploy's `disk` list, else the first disk of at least 4 GiB, as IPA
//! does. Removable and read-only devices are never chosen (virtual media and USB sticks are
//! removable; writing an image to the deploy ISO's own device would be a disaster).
//!
//! # Design
//! [`list_disks`] reads sysfs only (`/sys/class/block/<name>/{size,removable,ro,device/*}`), so
//! tests run against a fake tree in a tempdir; [`select_disk`] is pure.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use vmdeploy_shared::params::RootDeviceHints;

/// Disks smaller than this are not chosen without hints (IPA's `get_os_install_device` minimum).
pub const MIN_DEFAULT_DISK: u64 = 4 * 1024 * 1024 * 1024;

/// A whole disk as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDevice {
    /// Kernel name (`sda`, `nvme0n1`, `cciss!c0d0`).
    pub name: String,
    /// Device node (`/dev/sda`, `/dev/cciss/c0d0`).
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// Model, trimmed (empty if unknown).
    pub model: String,
    /// Vendor, trimmed.
    pub vendor: String,
    /// Serial number, trimmed.
    pub serial: String,
    /// World wide name (`device/wwid`, e.g. `naa.5000c500a1b2c3d4`), trimmed.
    pub wwn: String,
    /// The kernel marks it removable.
    pub removable: bool,
    /// The kernel marks it read-only.
    pub read_only: bool,
}

fn read_attr(dir: &Path, rel: &str) -> String {
    std::fs::read_to_string(dir.join(rel))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Kernel names that are never install targets.
fn is_virtual(name: &str) -> bool {
    ["loop", "ram", "zram", "sr", "fd", "dm-", "md", "nbd"]
        .iter()
        .any(|p| name.starts_with(p))
}

/// Whole disks under `sys_class_block` (partitions and virtual devices skipped), sorted by name.
/// With `include_loop`, loop devices count as disks (tests on loop devices).
pub fn list_disks(
    sys_class_block: &Path,
    dev_dir: &Path,
    include_loop: bool,
) -> anyhow::Result<Vec<BlockDevice>> {
    let entries = std::fs::read_dir(sys_class_block)
        .with_context(|| format!("listing {}", sys_class_block.display()))?;
    let mut disks = Vec::new();
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let dir = sys_class_block.join(&name);
        if dir.join("partition").exists() {
            continue;
        }
        if is_virtual(&name) && !(include_loop && name.starts_with("loop")) {
            continue;
        }
        // `size` is always in 512-byte units, whatever the logical block size.
        let size = read_attr(&dir, "size").parse::<u64>().unwrap_or(0) * 512;
        if size == 0 {
            continue;
        }
        let serial = match read_attr(&dir, "device/serial") {
            s if s.is_empty() => read_attr(&dir, "serial"),
            s => s,
        };
        let wwn = match read_attr(&dir, "device/wwid") {
            s if s.is_empty() => read_attr(&dir, "wwid"),
            s => s,
        };
        disks.push(BlockDevice {
            path: dev_dir.join(name.replace('!', "/")),
            size,
            model: read_attr(&dir, "device/model"),
            vendor: read_attr(&dir, "device/vendor"),
            serial,
            wwn,
            removable: read_attr(&dir, "removable") == "1",
            read_only: read_attr(&dir, "ro") == "1",
            name,
        });
    }
    disks.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(disks)
}

/// A WWN without its `naa.`/`eui.`/`0x` prefix, lowercased: sysfs says `naa.5000…`, Ironic
/// inventories say `0x5000…`.
fn normalize_wwn(s: &str) -> String {
    let s = s.trim().to_lowercase();
    for p in ["naa.", "eui.", "t10.", "0x"] {
        if let Some(rest) = s.strip_prefix(p) {
            return rest.to_owned();
        }
    }
    s
}

fn matches(d: &BlockDevice, h: &RootDeviceHints) -> bool {
    let eq = |want: &Option<String>, have: &str| {
        want.as_deref()
            .is_none_or(|w| w.trim().eq_ignore_ascii_case(have.trim()))
    };
    h.size_gib.is_none_or(|g| d.size >> 30 == g)
        && eq(&h.model, &d.model)
        && eq(&h.vendor, &d.vendor)
        && eq(&h.serial, &d.serial)
        && h.wwn
            .as_deref()
            .is_none_or(|w| normalize_wwn(w) == normalize_wwn(&d.wwn))
        && h.name.as_deref().is_none_or(|n| {
            let n = n.strip_prefix("/dev/").unwrap_or(n);
            n == d.name || n == d.name.replace('!', "/")
        })
}

fn usable(d: &BlockDevice) -> anyhow::Result<()> {
    if d.removable {
        bail!("refusing {}: it is a removable device", d.path.display());
    }
    if d.read_only {
        bail!("refusing {}: it is read-only", d.path.display());
    }
    Ok(())
}

/// The install disk among `disks`: the first matching `hints`, else the first of `disk_list`
/// (comma-separated names, e.g. `cciss/c0d0,sda,hda,vda`) that exists, else the first usable disk
/// of at least [`MIN_DEFAULT_DISK`].
pub fn select_disk<'a>(
    disks: &'a [BlockDevice],
    hints: Option<&RootDeviceHints>,
    disk_list: Option<&str>,
) -> anyhow::Result<&'a BlockDevice> {
    if let Some(h) = hints {
        let Some(d) = disks.iter().find(|d| matches(d, h)) else {
            bail!("no disk matches the root device hints {}", h.render());
        };
        usable(d)?;
        return Ok(d);
    }
    if let Some(list) = disk_list.filter(|l| !l.trim().is_empty()) {
        // A preference order, as Ironic's `disk` list is: a candidate that exists but must not
        // be written (the virtual media the ramdisk booted from is a removable USB disk, often
        // `sda`) is passed over for the next one, and named if none is left.
        let mut refused = Vec::new();
        for want in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let want = want.strip_prefix("/dev/").unwrap_or(want);
            if let Some(d) = disks
                .iter()
                .find(|d| d.name == want || d.name.replace('!', "/") == want)
            {
                match usable(d) {
                    Ok(()) => return Ok(d),
                    Err(why) => refused.push(why.to_string()),
                }
            }
        }
        if refused.is_empty() {
            bail!("none of the disks {list:?} exists");
        }
        bail!("no disk of {list:?} can be written: {}", refused.join("; "));
    }
    disks
        .iter()
        .find(|d| !d.removable && !d.read_only && d.size >= MIN_DEFAULT_DISK)
        .context("no fixed, writable disk of at least 4 GiB found")
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    struct Fake<'a> {
        name: &'a str,
        size: u64,
        model: &'a str,
        serial: &'a str,
        wwid: &'a str,
        removable: bool,
        ro: bool,
    }

    fn tree(devs: &[Fake<'_>]) -> (tempfile::TempDir, Vec<BlockDevice>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let sys = dir.path().join("class/block");
        for d in devs {
            let p = sys.join(d.name);
            std::fs::create_dir_all(p.join("device")).expect("dirs");
            std::fs::write(p.join("size"), format!("{}\n", d.size / 512)).expect("size");
            std::fs::write(p.join("removable"), if d.removable { "1\n" } else { "0\n" })
                .expect("rm");
            std::fs::write(p.join("ro"), if d.ro { "1\n" } else { "0\n" }).expect("ro");
            std::fs::write(p.join("device/model"), format!("{}  \n", d.model)).expect("model");
            std::fs::write(p.join("device/vendor"), "HP      \n").expect("vendor");
            std::fs::write(p.join("device/serial"), d.serial).expect("serial");
            std::fs::write(p.join("device/wwid"), d.wwid).expect("wwid");
        }
        // A partition and a loop device: never listed.
        std::fs::create_dir_all(sys.join("sda1")).expect("part");
        std::fs::write(sys.join("sda1/partition"), "1\n").expect("part");
        std::fs::write(sys.join("sda1/size"), "100\n").expect("part");
        std::fs::create_dir_all(sys.join("loop0")).expect("loop");
        std::fs::write(sys.join("loop0/size"), "100000000\n").expect("loop");
        let disks = list_disks(&sys, Path::new("/dev"), false).expect("listing");
        (dir, disks)
    }

    fn sample() -> (tempfile::TempDir, Vec<BlockDevice>) {
        tree(&[
            Fake {
                name: "sda",
                size: 2 * GIB,
                model: "LOGICAL VOLUME",
                serial: "S1",
                wwid: "naa.600508b1001c",
                removable: false,
                ro: false,
            },
            Fake {
                name: "sdb",
                size: 300 * GIB,
                model: "LOGICAL VOLUME",
                serial: "S2",
                wwid: "naa.600508b1001d",
                removable: false,
                ro: false,
            },
            Fake {
                name: "sdc",
                size: 8 * GIB,
                model: "Virtual Media",
                serial: "S3",
                wwid: "",
                removable: true,
                ro: false,
            },
            Fake {
                name: "sdd",
                size: 100 * GIB,
                model: "RO DISK",
                serial: "S4",
                wwid: "",
                removable: false,
                ro: true,
            },
            Fake {
                name: "cciss!c0d0",
                size: 146 * GIB,
                model: "CCISS",
                serial: "S5",
                wwid: "",
                removable: false,
                ro: false,
            },
        ])
    }

    #[test]
    fn listing_skips_partitions_and_virtual_devices() {
        let (_d, disks) = sample();
        let names: Vec<_> = disks.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["cciss!c0d0", "sda", "sdb", "sdc", "sdd"]);
        assert_eq!(disks[0].path, Path::new("/dev/cciss/c0d0"));
        assert_eq!(disks[1].model, "LOGICAL VOLUME");
        assert_eq!(disks[1].vendor, "HP");
        assert!(disks[3].removable);
        assert!(disks[4].read_only);
    }

    #[test]
    fn hints_select_and_refuse() {
        let (_d, disks) = sample();
        let pick = |h: &str| {
            let hints = RootDeviceHints::parse(h).expect("valid hints");
            select_disk(&disks, Some(&hints), None).map(|d| d.name.clone())
        };
        assert_eq!(pick("size=300").expect("size"), "sdb");
        assert_eq!(
            pick("model=logical%20volume,size=2").expect("model+size"),
            "sda"
        );
        assert_eq!(pick("serial=s2").expect("serial"), "sdb");
        assert_eq!(pick("wwn=0x600508b1001d").expect("wwn"), "sdb");
        assert_eq!(pick("name=/dev/cciss/c0d0").expect("name"), "cciss!c0d0");
        assert_eq!(pick("vendor=hp,size=146").expect("vendor"), "cciss!c0d0");
        let err = pick("model=virtual%20media").expect_err("removable");
        assert!(err.to_string().contains("removable"), "{err}");
        let err = pick("serial=S4").expect_err("read-only");
        assert!(err.to_string().contains("read-only"), "{err}");
        let err = pick("size=999").expect_err("none");
        assert!(err.to_string().contains("no disk matches"), "{err}");
    }

    #[test]
    fn disk_list_and_default() {
        let (_d, disks) = sample();
        let d = select_disk(&disks, None, Some("cciss/c0d0,sda,hda,vda")).expect("list");
        assert_eq!(d.name, "cciss!c0d0");
        let d = select_disk(&disks, None, Some("vda,sdb")).expect("list");
        assert_eq!(d.name, "sdb");
        let err = select_disk(&disks, None, Some("sdc")).expect_err("removable refused");
        assert!(err.to_string().contains("removable"), "{err}");
        // A removable candidate is passed over for the next one in the list.
        let d = select_disk(&disks, None, Some("sdc,sdb")).expect("the next candidate");
        assert_eq!(d.name, "sdb");
        assert!(select_disk(&disks, None, Some("vda")).is_err(), "missing");
        // Default: first fixed writable disk of >= 4 GiB, by name.
        let d = select_disk(&disks, None, None).expect("default");
        assert_eq!(d.name, "cciss!c0d0");
    }
}
