//! The virtual floppy: find the block device labelled `ir-vfd-dev` and read `parameters.txt`
//! straight from its FAT, without mounting (the ramdisk has no vfat module loaded, and no mount
//! means no cleanup).
//!
//! # Design
//! Every device in `/sys/class/block` with a non-zero size has its first sector read and checked
//! by [`vmdeploy_shared::fat::fat_label`], which validates the BIOS parameter block first, so the
//! MBR of a hybrid ISO (the deploy ISO itself) is never taken for a floppy. iLO attaches virtual
//! media as USB devices that may appear a moment after boot: the search is retried a bounded
//! number of times (5 × 1 s, as the DIB ramdisk waits, docs/ironic-protocols.md
//! §1.4). Floppy values override kernel command line values, as IPA does (same section).
//!
//! Upstream Ironic builds its virtual-media ISO with every parameter on the kernel command line
//! and attaches a floppy only with `config_via_removable` (docs/ironic-protocols.md §3.2): when the
//! command line already names a deploy, the floppy is optional ([`load_params`]).
//!
//! # Limitations
//! Only the root directory of a FAT12/16/32 volume is read; that is where the conductor writes.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use vmdeploy_shared::fat::{self, FLOPPY_LABEL};
use vmdeploy_shared::params::{self, Params};

/// Name of the parameters file in the floppy's root directory.
pub const PARAMS_FILE: &str = "parameters.txt";

/// Where to look for block devices, and how long.
#[derive(Debug, Clone)]
pub struct FloppySearch {
    /// The sysfs block class directory (`/sys/class/block`).
    pub sys_class_block: PathBuf,
    /// Where device nodes live (`/dev`).
    pub dev_dir: PathBuf,
    /// The label to look for.
    pub label: String,
    /// Scans before giving up.
    pub attempts: u32,
    /// Pause between scans.
    pub interval: Duration,
}

impl Default for FloppySearch {
    fn default() -> Self {
        FloppySearch {
            sys_class_block: PathBuf::from("/sys/class/block"),
            dev_dir: PathBuf::from("/dev"),
            label: FLOPPY_LABEL.to_owned(),
            attempts: 5,
            interval: Duration::from_secs(1),
        }
    }
}

impl FloppySearch {
    /// One scan: the device node of the first (by name) device carrying the label.
    pub fn scan(&self) -> anyhow::Result<Option<PathBuf>> {
        let entries = std::fs::read_dir(&self.sys_class_block)
            .with_context(|| format!("listing {}", self.sys_class_block.display()))?;
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for name in names {
            // `size` is in 512-byte sectors; empty drives (a CD tray with no medium) are 0. A
            // floppy drive (fdN) reads 0 until it is first opened, so it is always probed
            // (docs/qemu-and-boot.md §9).
            let size = std::fs::read_to_string(self.sys_class_block.join(&name).join("size"))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(0);
            if size == 0 && !name.starts_with("fd") {
                continue;
            }
            let node = self.dev_dir.join(&name);
            match read_label(&node) {
                Ok(Some(label)) if label.eq_ignore_ascii_case(&self.label) => {
                    tracing::info!(device = %node.display(), "found the virtual floppy");
                    return Ok(Some(node));
                }
                Ok(_) => {}
                Err(err) => tracing::debug!(device = %node.display(), "not a floppy: {err:#}"),
            }
        }
        Ok(None)
    }

    /// Scans up to `attempts` times, `interval` apart.
    pub fn find(&self) -> anyhow::Result<PathBuf> {
        for attempt in 1..=self.attempts.max(1) {
            if let Some(dev) = self.scan()? {
                return Ok(dev);
            }
            if attempt < self.attempts {
                std::thread::sleep(self.interval);
            }
        }
        bail!(
            "no block device labelled {:?} after {} scans of {}",
            self.label,
            self.attempts,
            self.sys_class_block.display()
        )
    }
}

/// The FAT label of the device at `node`, if its first sector is a valid FAT boot sector.
pub fn read_label(node: &Path) -> anyhow::Result<Option<String>> {
    let mut f = File::open(node).with_context(|| format!("opening {}", node.display()))?;
    let mut sector = [0u8; 512];
    f.read_exact(&mut sector)
        .with_context(|| format!("reading the first sector of {}", node.display()))?;
    Ok(fat::fat_label(&sector)?)
}

/// Reads and parses `parameters.txt` from the FAT on `node`.
pub fn read_params(node: &Path) -> anyhow::Result<Params> {
    let f = File::open(node).with_context(|| format!("opening {}", node.display()))?;
    let bytes = fat::read_root_file(f, PARAMS_FILE, params::MAX_FILE_LEN as u64)
        .with_context(|| format!("reading {PARAMS_FILE} from {}", node.display()))?;
    Params::parse(&bytes).with_context(|| format!("parsing {PARAMS_FILE}"))
}

/// How many scans a floppy gets when the command line already carries the deploy parameters
/// (upstream Ironic puts them there and attaches no floppy unless `config_via_removable`): a
/// short look, one scan a second, then on without it.
pub const OPTIONAL_ATTEMPTS: u32 = 5;

/// The agent's parameters: the kernel command line, and when it says `boot_method=vmedia`, the
/// floppy's `parameters.txt` on top (floppy values win); with the floppy's device, which is never
/// an install disk.
///
/// The floppy is required when the command line names no deploy (neither `ipa-api-url` nor
/// `deployment_key`): it is then the only source. When the command line names one, the floppy
/// is looked for [`OPTIONAL_ATTEMPTS`] times at most and the boot goes on without it.
pub fn load_params(
    cmdline: &str,
    search: &FloppySearch,
) -> anyhow::Result<(Params, Option<PathBuf>)> {
    let cmd = Params::parse_cmdline(cmdline);
    if cmd.get(params::keys::BOOT_METHOD) != Some("vmedia") {
        return Ok((cmd, None));
    }
    let cmdline_names_a_deploy = cmd.get(params::keys::IPA_API_URL).is_some()
        || cmd.get(params::keys::DEPLOYMENT_KEY).is_some();
    let search = FloppySearch {
        attempts: if cmdline_names_a_deploy {
            search.attempts.clamp(1, OPTIONAL_ATTEMPTS)
        } else {
            search.attempts
        },
        ..search.clone()
    };
    tracing::info!(
        label = %search.label,
        wait_secs = u64::from(search.attempts.saturating_sub(1)) * search.interval.as_secs(),
        optional = cmdline_names_a_deploy,
        "boot_method=vmedia: looking for the virtual floppy"
    );
    let dev = if cmdline_names_a_deploy {
        match search.find() {
            Ok(dev) => dev,
            Err(err) => {
                tracing::info!(
                    "no virtual floppy ({err:#}); the kernel command line carries the deploy \
                     parameters: going on without it"
                );
                return Ok((cmd, None));
            }
        }
    } else {
        search.find().context("finding the virtual floppy")?
    };
    let floppy =
        read_params(&dev).with_context(|| format!("reading the floppy on {}", dev.display()))?;
    tracing::info!(device = %dev.display(), keys = floppy.len(), "floppy parameters read");
    Ok((cmd.merged_with(&floppy), Some(dev)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake sysfs + /dev: `devices` are (name, size in sectors, contents).
    fn fake_tree(devices: &[(&str, u64, Vec<u8>)]) -> (tempfile::TempDir, FloppySearch) {
        let dir = tempfile::tempdir().expect("tempdir");
        let sys = dir.path().join("sys/class/block");
        let dev = dir.path().join("dev");
        std::fs::create_dir_all(&sys).expect("sys");
        std::fs::create_dir_all(&dev).expect("dev");
        for (name, size, contents) in devices {
            std::fs::create_dir_all(sys.join(name)).expect("device dir");
            std::fs::write(sys.join(name).join("size"), format!("{size}\n")).expect("size");
            std::fs::write(dev.join(name), contents).expect("node");
        }
        let search = FloppySearch {
            sys_class_block: sys,
            dev_dir: dev,
            attempts: 2,
            interval: Duration::from_millis(10),
            ..Default::default()
        };
        (dir, search)
    }

    fn floppy(label: &str, params: &str) -> Vec<u8> {
        fat::build_floppy(label, &[(PARAMS_FILE, params.as_bytes())]).expect("building a floppy")
    }

    #[test]
    fn finds_the_labelled_device_among_others_and_reads_params() {
        let mut mbr = vec![0u8; 4096];
        mbr[510] = 0x55;
        mbr[511] = 0xAA;
        let (_dir, search) = fake_tree(&[
            ("loop0", 0, floppy(FLOPPY_LABEL, "a=1")), // no medium: skipped
            ("sda", 8, mbr),
            ("sdb", 2880, floppy("other", "a=2")),
            (
                "sdc",
                2880,
                floppy(
                    FLOPPY_LABEL,
                    "ipa-api-url=http://10.0.0.1:6385\nBOOTIF=aa:bb:cc:dd:ee:ff",
                ),
            ),
            ("sdd", 1, b"short".to_vec()),
        ]);
        let dev = search.find().expect("found");
        assert!(dev.ends_with("sdc"), "{}", dev.display());
        let params = read_params(&dev).expect("params");
        assert_eq!(params.get("ipa-api-url"), Some("http://10.0.0.1:6385"));
        let (merged, from) = load_params(
            "console=ttyS0 boot_method=vmedia ipa-api-url=http://wrong BOOTIF=01-11-22",
            &search,
        )
        .expect("merged");
        assert_eq!(from.as_deref(), Some(dev.as_path()));
        assert_eq!(
            merged.get("ipa-api-url"),
            Some("http://10.0.0.1:6385"),
            "floppy wins"
        );
        assert_eq!(merged.get("BOOTIF"), Some("aa:bb:cc:dd:ee:ff"));
        assert_eq!(merged.get("console"), Some("ttyS0"), "command line kept");
    }

    #[test]
    fn without_vmedia_the_floppy_is_not_needed() {
        let (_dir, search) = fake_tree(&[]);
        let (p, from) = load_params("ipa-api-url=http://x", &search).expect("cmdline only");
        assert_eq!(p.get("ipa-api-url"), Some("http://x"));
        assert!(from.is_none());
    }

    #[test]
    fn vmedia_without_deploy_parameters_needs_the_floppy() {
        let (_dir, search) = fake_tree(&[]);
        let err = load_params("boot_method=vmedia console=ttyS0", &search).expect_err("no floppy");
        assert!(
            format!("{err:#}").contains("no block device labelled"),
            "{err:#}"
        );
    }

    #[test]
    fn vmedia_with_deploy_parameters_goes_on_without_a_floppy() {
        // Upstream Ironic's ISO: everything on the command line, no floppy attached.
        let (_dir, search) = fake_tree(&[("sda", 8, vec![0u8; 512])]);
        let search = FloppySearch {
            attempts: 100,
            interval: Duration::from_millis(1),
            ..search
        };
        let cmdline = "ir_pub_id=1be26c0b-03f2-4d2e-ae87-c02d7f33c123 \
                       ipa-api-url=http://10.0.2.100:6385 ipa-agent-token=-abc boot_method=vmedia";
        let (p, from) = load_params(cmdline, &search).expect("command line only");
        assert!(from.is_none());
        assert_eq!(p.get("ipa-api-url"), Some("http://10.0.2.100:6385"));
        assert_eq!(p.get("ipa-agent-token"), Some("-abc"));
        // The iSCSI form too.
        let (p, from) = load_params("deployment_key=K boot_method=vmedia", &search).expect("iscsi");
        assert!(from.is_none());
        assert_eq!(p.get("deployment_key"), Some("K"));
    }
}
