//! `vmdeploy-image-build test-image`: the bootable test OS the end-to-end deploys install.
//!
//! # What goes in DIR
//! ```text
//! disk.raw       whole disk, GPT + protective MBR (sparse):
//!                  p1 BIOS boot (EF02) 1 MiB   GRUB i386-pc core.img (boot.img in the MBR)
//!                  p2 EFI system      8 MiB    FAT, \EFI\BOOT\BOOTX64.EFI (GRUB x86_64-efi; or
//!                                              shim, signed GRUB and \EFI\debian\grub.cfg)
//!                  p3 Linux root     24 MiB    ext4: /boot/vmlinuz, /boot/initrd.img,
//!                                              /etc/vmdeploy-test-os
//! disk.qcow2     the same disk as qcow2 (qemu-img convert)
//! root.img       a partition image: ext4 (its own UUID) with /boot/vmlinuz, /boot/initrd.img
//!                (the same kernel and ramdisk as the disk's root) and /etc/vmdeploy-test-os
//!                (with a Secure Boot chain, also Debian's signed shim and GRUB at the paths
//!                the shim-signed and grub-efi-amd64-signed packages install them):
//!                boots locally once the agent's image.install_bootloader put GRUB in an ESP
//!                (vmdeploy_shared::partition::local_boot), or by the kernel and ramdisk below
//! kernel         the Debian kernel of the deploy ISO (same .deb)
//! ramdisk        the test OS initramfs: busybox and a shell /init (see ramdisk.rs)
//! manifest.json  names, UUIDs, sizes and SHA-256s (format in [`Manifest`])
//! stamp          hash of every input; DIR holding a matching stamp is not rebuilt
//! ```
//! Both GRUBs carry their whole configuration (`grub-mkimage -c`): find the root by its UUID,
//! `linux /boot/vmlinuz root=UUID=<uuid> console=ttyS0,115200 quiet`, `initrd`, `boot`: no menu,
//! no timeout, no grub.cfg on the disk.
//!
//! # Reproducible
//! Fixed UUIDs, GPT GUIDs and FAT volume id; every time stamp is `SOURCE_DATE_EPOCH` (default
//! [`vmdeploy_shared::iso::DEFAULT_EPOCH`]): mke2fs through `E2FSPROGS_FAKE_TIME` and the staged files' times,
//! inode change times fixed afterwards with debugfs (mke2fs -d copies them from the staging tree,
//! where they cannot be set), mtools through `SOURCE_DATE_EPOCH` and `mcopy -m`; gzip with
//! mtime 0. Two builds with the same inputs and tool versions give the same bytes for every
//! file (the test `tests/integration/tests/test_image.rs` checks it).
//!
//! # Why no root and no loop device
//! The file systems are made in image files (`mkfs.ext4 -d`, `mkfs.vfat -C` + mtools), the
//! partition table and GRUB's BIOS boot code are written by [`disk`] on the image in memory,
//! doing what `grub-install`'s setup step would do (see `grub.rs`).

mod disk;
mod ext4;
mod grub;
mod ramdisk;

use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use sha2::{Digest as _, Sha256};
use vmdeploy_shared::exit::UsageError;

use crate::kernel_deb::KernelPackage;

/// The text of `/etc/vmdeploy-test-os` (one line; /init checks it).
pub const MARKER_TEXT: &str = "vmdeploy test OS";
/// What /init prints before the UUID of the root it mounted.
pub const MARKER_PREFIX: &str = "VMDEPLOY-TEST-OS booted root=";

/// The root file system UUID of the whole-disk image.
pub const DISK_ROOT_UUID: &str = "7e57d15c-0000-4000-8000-000000000003";
/// The file system UUID of the partition image.
pub const PART_ROOT_UUID: &str = "7e57da7a-0000-4000-8000-000000000001";

/// Size of the partition image (the root partition of an `iscsi_ilo` or agent deploy must hold
/// it): the disk's root size, for the same files.
const PART_IMAGE_BYTES: u64 = disk::ROOT_BYTES;

/// Bumped whenever what a build writes changes for the same inputs: part of the stamp.
const RECIPE: &str = "test-image 4";

/// The manifest and the other files, relative to DIR.
pub const MANIFEST: &str = "manifest.json";
const STAMP: &str = "stamp";
const DISK_RAW: &str = "disk.raw";
const DISK_QCOW2: &str = "disk.qcow2";
const PART_IMAGE: &str = "root.img";
const KERNEL: &str = "kernel";
const RAMDISK: &str = "ramdisk";

/// Arguments of `test-image`.
#[derive(Debug, clap::Args)]
pub struct TestImageArgs {
    /// A Debian linux-image-*.deb (the deploy ISO's). Default: the newest
    /// `.cache/kernel/linux-image-*.deb` of the repository around the current directory or this
    /// program (scripts/setup downloads it).
    #[arg(long)]
    pub kernel_deb: Option<PathBuf>,
    /// An extra module for the test OS ramdisk (with optional parameters); repeat for more.
    #[arg(long = "module")]
    pub modules: Vec<String>,
    /// The static busybox the ramdisk's /init runs on (Debian's busybox-static).
    #[arg(long, default_value = "/bin/busybox")]
    pub busybox: PathBuf,
    /// Rebuild even when DIR holds a complete build of the same inputs.
    #[arg(long, conflicts_with = "check")]
    pub force: bool,
    /// Build nothing: succeed when DIR holds a complete build of the same inputs, fail (exit 1)
    /// otherwise (tests/integration's `test_image::ensure` asks before it builds elsewhere).
    #[arg(long)]
    pub check: bool,
    /// Give the disk a Secure Boot chain: a root holding Debian's signed shim and GRUB at their
    /// installed paths (as `deploy-iso --signed-loaders`). The ESP then holds shim as
    /// `BOOTX64.EFI`, Debian's signed GRUB beside it and the configuration in
    /// `\EFI\debian\grub.cfg`, and the ramdisk's modules keep their signatures.
    #[arg(long)]
    pub signed_loaders: Option<PathBuf>,
    /// Output directory (created when missing).
    #[arg(long, short)]
    pub out: PathBuf,
}

/// `manifest.json`.
#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Manifest {
    /// [`MARKER_PREFIX`].
    pub marker_prefix: String,
    /// The whole-disk image.
    pub disk: DiskEntry,
    /// The partition image and the kernel and ramdisk that boot it.
    pub partition: PartitionEntry,
}

/// `manifest.json` `disk`.
#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct DiskEntry {
    /// File name of the raw image.
    pub raw: String,
    /// File name of the qcow2 image.
    pub qcow2: String,
    /// UUID of the root file system (p3).
    pub root_uuid: String,
    /// Size of the raw image in bytes.
    pub size: u64,
    /// SHA-256 of the raw image.
    pub sha256: String,
    /// SHA-256 of the qcow2 image.
    pub qcow2_sha256: String,
}

/// `manifest.json` `partition`.
#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct PartitionEntry {
    /// File name of the ext4 image.
    pub image: String,
    /// Its UUID.
    pub root_uuid: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256.
    pub sha256: String,
    /// File name of the kernel.
    pub kernel: String,
    /// File name of the ramdisk.
    pub ramdisk: String,
    /// SHA-256 of the kernel.
    pub kernel_sha256: String,
    /// SHA-256 of the ramdisk.
    pub ramdisk_sha256: String,
}

/// Builds the test image into `args.out`, unless it holds a complete build of the same inputs.
pub fn run(args: TestImageArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let deb = match &args.kernel_deb {
        Some(deb) => deb.clone(),
        None => default_kernel_deb().map_err(UsageError::wrap)?,
    };
    for (what, path, fix) in [
        ("kernel package", &deb, "scripts/setup downloads one"),
        ("busybox", &args.busybox, "apt-get install busybox-static"),
    ] {
        if !path.is_file() {
            return Err(UsageError::wrap(format!(
                "the {what} {} does not exist ({fix})",
                path.display()
            ))
            .into());
        }
    }
    let requests = ramdisk::module_requests(&args.modules).map_err(UsageError::wrap)?;
    let epoch = crate::boot_iso::source_date_epoch().map_err(UsageError::wrap)?;

    let signed = crate::secure_boot::SignedLoaders::read_if_given(args.signed_loaders.as_deref())?;
    let mut stamp = input_stamp(&deb, &args.busybox, &args.modules, epoch)?;
    if let Some(signed) = &signed {
        // The loaders are inputs too: a newer shim is a new disk.
        let mut hasher = Sha256::new();
        for part in [&signed.shim, &signed.grub_disk] {
            hasher.update(Sha256::digest(part));
        }
        stamp = format!("{stamp} secure-boot {}", hex(&hasher.finalize()));
    }
    if !args.check {
        std::fs::create_dir_all(&args.out)
            .with_context(|| format!("creating {}", args.out.display()))?;
    }
    let stamp_path = args.out.join(STAMP);
    if args.check {
        anyhow::ensure!(
            is_complete(&args.out, &stamp),
            "{} holds no complete build of these inputs",
            args.out.display()
        );
        eprintln!("{} is up to date", args.out.display());
        return Ok(());
    }
    if !args.force && is_complete(&args.out, &stamp) {
        eprintln!(
            "{} is up to date (same inputs: {})",
            args.out.display(),
            deb.display()
        );
        return Ok(());
    }
    // Gone first, written last: a build that stops half-way is never taken for complete.
    match std::fs::remove_file(&stamp_path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", stamp_path.display())),
    }

    let kernel_pkg = KernelPackage::unpack(&deb)?;
    let marker_line = format!("{MARKER_TEXT}\n");
    let scratch = tempfile::Builder::new()
        .prefix("vmdeploy-test-image-")
        .tempdir()
        .context("creating a scratch directory")?;
    let scratch = scratch.path();

    if signed.is_some() {
        crate::secure_boot::require_signed_kernel(&kernel_pkg.vmlinuz)?;
    }
    let ramdisk = ramdisk::build(
        &kernel_pkg,
        &requests,
        &args.busybox,
        scratch,
        signed.is_some(),
    )
    .context("building the test OS ramdisk")?;
    let kernel_path = args.out.join(KERNEL);
    let ramdisk_path = args.out.join(RAMDISK);
    std::fs::copy(&kernel_pkg.vmlinuz, &kernel_path)
        .with_context(|| format!("copying the kernel to {}", kernel_path.display()))?;
    std::fs::write(&ramdisk_path, &ramdisk.bytes)
        .with_context(|| format!("writing {}", ramdisk_path.display()))?;

    // The whole disk's root file system.
    let root_tree = scratch.join("disk-root");
    ext4::stage(
        &root_tree,
        &[
            ("boot/vmlinuz", ext4::Source::File(&kernel_pkg.vmlinuz)),
            ("boot/initrd.img", ext4::Source::Bytes(&ramdisk.bytes)),
            (
                "etc/vmdeploy-test-os",
                ext4::Source::Bytes(format!("{MARKER_TEXT}\n").as_bytes()),
            ),
        ],
        epoch,
    )?;
    let root_fs = scratch.join("disk-root.ext4");
    ext4::make(
        &root_fs,
        disk::ROOT_BYTES,
        DISK_ROOT_UUID,
        "vmdtest-root",
        &root_tree,
        epoch,
    )
    .context("making the disk's root file system")?;

    // The partition image; with a Secure Boot chain, shim and the signed GRUB where Debian's
    // packages install them, for the agent's install_bootloader to take under Secure Boot.
    let part_tree = scratch.join("part-root");
    let mut part_files = vec![
        ("boot/vmlinuz", ext4::Source::File(&kernel_pkg.vmlinuz)),
        ("boot/initrd.img", ext4::Source::Bytes(&ramdisk.bytes)),
        (
            "etc/vmdeploy-test-os",
            ext4::Source::Bytes(marker_line.as_bytes()),
        ),
    ];
    if let Some(signed) = &signed {
        part_files.push((crate::secure_boot::SHIM, ext4::Source::Bytes(&signed.shim)));
        part_files.push((
            crate::secure_boot::GRUB_DISK,
            ext4::Source::Bytes(&signed.grub_disk),
        ));
    }
    ext4::stage(&part_tree, &part_files, epoch)?;
    let part_path = args.out.join(PART_IMAGE);
    ext4::make(
        &part_path,
        PART_IMAGE_BYTES,
        PART_ROOT_UUID,
        "vmdtest-part",
        &part_tree,
        epoch,
    )
    .context("making the partition image")?;

    // Boot loaders, the ESP and the disk.
    let config = grub::config(DISK_ROOT_UUID);
    let bios = grub::bios(&config, scratch).context("building GRUB for BIOS")?;
    let efi = grub::efi(&config, scratch).context("building GRUB for UEFI")?;
    // Signed: shim loads grubx64.efi beside itself; Debian's GRUB (prefix /EFI/debian on its
    // own partition) reads grub.cfg from there, since its signature covers its embedded config.
    let esp_files: Vec<disk::EspFile<'_>> = match &signed {
        Some(signed) => vec![
            ("EFI/BOOT/BOOTX64.EFI", &signed.shim),
            ("EFI/BOOT/GRUBX64.EFI", &signed.grub_disk),
            ("EFI/debian/grub.cfg", config.as_bytes()),
        ],
        None => vec![("EFI/BOOT/BOOTX64.EFI", &efi)],
    };
    let esp =
        disk::make_esp(&esp_files, scratch, epoch).context("making the EFI system partition")?;
    let raw_path = args.out.join(DISK_RAW);
    disk::assemble(&bios, &esp, &root_fs, &raw_path).context("assembling the disk image")?;
    let qcow2_path = args.out.join(DISK_QCOW2);
    disk::to_qcow2(&raw_path, &qcow2_path).context("converting the disk to qcow2")?;

    let manifest = Manifest {
        marker_prefix: MARKER_PREFIX.to_owned(),
        disk: DiskEntry {
            raw: DISK_RAW.to_owned(),
            qcow2: DISK_QCOW2.to_owned(),
            root_uuid: DISK_ROOT_UUID.to_owned(),
            size: file_len(&raw_path)?,
            sha256: sha256_file(&raw_path)?,
            qcow2_sha256: sha256_file(&qcow2_path)?,
        },
        partition: PartitionEntry {
            image: PART_IMAGE.to_owned(),
            root_uuid: PART_ROOT_UUID.to_owned(),
            size: file_len(&part_path)?,
            sha256: sha256_file(&part_path)?,
            kernel: KERNEL.to_owned(),
            ramdisk: RAMDISK.to_owned(),
            kernel_sha256: sha256_file(&kernel_path)?,
            ramdisk_sha256: sha256_file(&ramdisk_path)?,
        },
    };
    let json = serde_json::to_string_pretty(&manifest).context("encoding the manifest")?;
    let manifest_path = args.out.join(MANIFEST);
    std::fs::write(&manifest_path, format!("{json}\n"))
        .with_context(|| format!("writing {}", manifest_path.display()))?;
    std::fs::write(&stamp_path, &stamp)
        .with_context(|| format!("writing {}", stamp_path.display()))?;

    eprintln!(
        "wrote {} in {:.1} s:\n\
         \x20 disk.raw    {:>10} bytes ({} KiB allocated), root UUID {DISK_ROOT_UUID}\n\
         \x20 disk.qcow2  {:>10} bytes\n\
         \x20 root.img    {:>10} bytes ({} KiB allocated), UUID {PART_ROOT_UUID}\n\
         \x20 kernel      {:>10} bytes  vmlinuz-{}\n\
         \x20 ramdisk     {:>10} bytes  {} modules\n\
         \x20 BOOTX64.EFI {:>10} bytes, core.img {} bytes",
        args.out.display(),
        started.elapsed().as_secs_f64(),
        manifest.disk.size,
        allocated_kib(&raw_path),
        file_len(&qcow2_path)?,
        manifest.partition.size,
        allocated_kib(&part_path),
        file_len(&kernel_path)?,
        kernel_pkg.release,
        ramdisk.bytes.len(),
        ramdisk.module_count,
        efi.len(),
        bios.core_img.len(),
    );
    Ok(())
}

/// True when `dir` holds `stamp` and every file a build writes.
fn is_complete(dir: &Path, stamp: &str) -> bool {
    std::fs::read_to_string(dir.join(STAMP)).is_ok_and(|s| s == stamp)
        && [MANIFEST, DISK_RAW, DISK_QCOW2, PART_IMAGE, KERNEL, RAMDISK]
            .iter()
            .all(|f| dir.join(f).is_file())
}

/// The stamp: a SHA-256 over the recipe, this program's version, the init script, the
/// arguments, the epoch and the contents of every input file (the kernel package, busybox,
/// GRUB's module directories, and this program itself: a changed build recipe is a new program).
fn input_stamp(
    deb: &Path,
    busybox: &Path,
    modules: &[String],
    epoch: u64,
) -> anyhow::Result<String> {
    let mut hasher = Sha256::new();
    let mut line = |s: &str| {
        hasher.update(s.as_bytes());
        hasher.update(b"\n");
    };
    line(RECIPE);
    line(env!("CARGO_PKG_VERSION"));
    line(ramdisk::INIT_SCRIPT);
    line(&modules.join("\x1f"));
    line(&epoch.to_string());
    let exe = std::env::current_exe().context("finding this program's path")?;
    let mut files = vec![deb.to_owned(), busybox.to_owned(), exe];
    for dir in [grub::BIOS_MODULE_DIR, crate::loaders::GRUB_EFI_MODULE_DIR] {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| {
                format!("listing {dir} (apt-get install grub-pc-bin grub-efi-amd64-bin)")
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        entries.sort();
        files.extend(entries);
    }
    let mut out = format!("{RECIPE}\n");
    for path in files {
        out.push_str(&format!("{} {}\n", sha256_file(&path)?, path.display()));
    }
    let mut hasher = Sha256::new();
    hasher.update(out.as_bytes());
    Ok(hex(&hasher.finalize()))
}

/// The newest `.cache/kernel/linux-image-*.deb` above the current directory or this program.
fn default_kernel_deb() -> anyhow::Result<PathBuf> {
    let mut starts = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        starts.push(cwd);
    }
    if let Ok(exe) = std::env::current_exe() {
        starts.push(exe);
    }
    for start in &starts {
        for dir in start.ancestors() {
            let cache = dir.join(".cache/kernel");
            let Ok(entries) = std::fs::read_dir(&cache) else {
                continue;
            };
            let newest = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("linux-image-") && n.ends_with(".deb"))
                })
                .max();
            if let Some(deb) = newest {
                return Ok(deb);
            }
        }
    }
    bail!(
        "no --kernel-deb given and no .cache/kernel/linux-image-*.deb found above the current \
         directory or this program: run scripts/setup (it downloads the kernel) or pass \
         --kernel-deb"
    )
}

fn file_len(path: &Path) -> anyhow::Result<u64> {
    Ok(std::fs::metadata(path)
        .with_context(|| format!("reading the size of {}", path.display()))?
        .len())
}

/// Disk space the file takes (sparse files take less than their size).
fn allocated_kib(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).map_or(0, |m| m.blocks() / 2)
}

/// SHA-256 of a file, lower-case hex.
pub fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_has_the_agreed_shape() {
        let m = Manifest {
            marker_prefix: MARKER_PREFIX.into(),
            disk: DiskEntry {
                raw: DISK_RAW.into(),
                qcow2: DISK_QCOW2.into(),
                root_uuid: DISK_ROOT_UUID.into(),
                size: 1,
                sha256: "a".into(),
                qcow2_sha256: "b".into(),
            },
            partition: PartitionEntry {
                image: PART_IMAGE.into(),
                root_uuid: PART_ROOT_UUID.into(),
                size: 2,
                sha256: "c".into(),
                kernel: KERNEL.into(),
                ramdisk: RAMDISK.into(),
                kernel_sha256: "d".into(),
                ramdisk_sha256: "e".into(),
            },
        };
        let v = serde_json::to_value(&m).expect("encodes");
        assert_eq!(v["marker_prefix"], "VMDEPLOY-TEST-OS booted root=");
        assert_eq!(v["disk"]["raw"], "disk.raw");
        assert_eq!(v["disk"]["qcow2_sha256"], "b");
        assert_eq!(v["partition"]["image"], "root.img");
        assert_eq!(v["partition"]["ramdisk_sha256"], "e");
        assert_eq!(
            uuid::Uuid::parse_str(DISK_ROOT_UUID).map(|u| u.to_string()),
            Ok(DISK_ROOT_UUID.to_owned())
        );
        assert_ne!(DISK_ROOT_UUID, PART_ROOT_UUID);
    }

    #[test]
    fn missing_inputs_are_usage_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let args = |deb: &str, busybox: &str| TestImageArgs {
            kernel_deb: Some(PathBuf::from(deb)),
            modules: Vec::new(),
            busybox: PathBuf::from(busybox),
            force: false,
            check: false,
            signed_loaders: None,
            out: dir.path().join("out"),
        };
        for (deb, busybox, says) in [
            ("/nonexistent/linux-image.deb", "/bin/sh", "scripts/setup"),
            ("/bin/sh", "/nonexistent/busybox", "busybox-static"),
        ] {
            let err = run(args(deb, busybox)).expect_err("missing input");
            assert!(format!("{err:#}").contains(says), "{err:#}");
            assert_eq!(
                vmdeploy_shared::exit::code_for(err.chain()),
                vmdeploy_shared::exit::USAGE
            );
        }
        assert!(!dir.path().join("out").exists(), "nothing is written");
    }

    #[test]
    fn a_missing_stamp_or_file_means_incomplete() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(!is_complete(dir.path(), "x"));
        for f in [
            STAMP, MANIFEST, DISK_RAW, DISK_QCOW2, PART_IMAGE, KERNEL, RAMDISK,
        ] {
            std::fs::write(dir.path().join(f), "x").expect("write");
        }
        assert!(is_complete(dir.path(), "x"));
        assert!(!is_complete(dir.path(), "y"));
        std::fs::remove_file(dir.path().join(RAMDISK)).expect("rm");
        assert!(!is_complete(dir.path(), "x"));
    }
}
