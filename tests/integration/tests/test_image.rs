//! The end-to-end test OS from `vmdeploy-image-build test-image` (image-build/src/test_image/),
//! through `vmdeploy_integration_tests::test_image::ensure`.
//!
//! Without QEMU: the GPT's three partitions and their types, GRUB's boot code in the protective
//! MBR, both file systems clean (`e2fsck -n`, `fsck.vfat -n`) with the manifest's UUIDs
//! (`blkid`), the files on the root, BOOTX64.EFI a PE32+ x86-64 binary, the qcow2 the same disk
//! (`qemu-img compare`), the manifest's checksums, and a second build giving the same bytes.
//!
//! With QEMU (TCG, one boot at a time under the `test-image-qemu` lock): the kernel and ramdisk
//! with the partition image attached print the marker with the partition's UUID and power off
//! (`vmdeploy_test_os.poweroff=1`); a wrong UUID prints the `failed:` line. Disks are attached
//! with `snapshot=on`, so the cached images stay as built. The whole disks are booted where they
//! are deployed, not here: e2e_agent_ilo.rs writes the raw disk and boots it under SeaBIOS and
//! the qcow2 under OVMF (with Secure Boot), and checks the same marker with the disk's root
//! UUID, so a second boot of each here would only repeat it.
//!
//! Needs scripts/setup's tools (QEMU, OVMF, e2fsprogs, dosfstools, mtools, gdisk, GRUB's
//! Debian packages, busybox-static), the kernel .deb in .cache/kernel and the debug
//! `vmdeploy-image-build`.

use std::io::Read as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use vmdeploy_integration_tests::lock::ResourceLock;
use vmdeploy_integration_tests::qemu::Qemu;
use vmdeploy_integration_tests::test_image::{self, TestImage};

/// TCG on two busy cores: generous (docs/architecture.md §11 says 120–180 s).
const BOOT_LIMIT: Duration = Duration::from_secs(180);
const FAILED_PREFIX: &str = "VMDEPLOY-TEST-OS failed: ";

fn sha256(path: &Path) -> String {
    let mut f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    hex::encode(h.finalize())
}

/// Runs a tool; returns stdout, panics with both outputs when it fails.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("starting {cmd:?}: {e} (scripts/setup installs it)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A GPT partition as `sgdisk -p` lists it.
#[derive(Debug)]
struct Part {
    number: u32,
    first: u64,
    last: u64,
    code: String,
}

fn partitions(disk: &Path) -> Vec<Part> {
    let text = run(Command::new("sgdisk").arg("-p").arg(disk));
    text.lines()
        .skip_while(|l| !l.starts_with("Number"))
        .skip(1)
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some(Part {
                number: w.first()?.parse().ok()?,
                first: w.get(1)?.parse().ok()?,
                last: w.get(2)?.parse().ok()?,
                code: w.get(5)?.to_string(),
            })
        })
        .collect()
}

/// Copies a partition out of the disk into `out`.
fn extract(disk: &[u8], p: &Part, out: &Path) {
    let range = (p.first * 512) as usize..((p.last + 1) * 512) as usize;
    std::fs::write(out, &disk[range]).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
}

fn blkid_uuid(path: &Path) -> String {
    run(Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "UUID"])
        .arg(path))
    .trim()
    .to_owned()
}

#[test]
fn the_images_are_what_the_manifest_says() {
    let img = test_image::ensure();
    let scratch = tempfile::tempdir().expect("scratch dir");
    let dir = scratch.path();

    // Checksums and sizes.
    for (path, want) in [
        (&img.disk_raw, &img.disk_sha256),
        (&img.disk_qcow2, &img.disk_qcow2_sha256),
        (&img.part_image, &img.part_sha256),
        (&img.kernel, &img.kernel_sha256),
        (&img.ramdisk, &img.ramdisk_sha256),
    ] {
        assert_eq!(&sha256(path), want, "{}", path.display());
    }
    let disk = std::fs::read(&img.disk_raw).expect("reading disk.raw");
    assert_eq!(disk.len() as u64, img.disk_size);
    assert_eq!(
        std::fs::metadata(&img.part_image).expect("root.img").len(),
        img.part_size
    );
    assert!(
        img.disk_size < 64 << 20 && img.part_size <= 32 << 20,
        "tens of MiB: disk {} B, partition image {} B",
        img.disk_size,
        img.part_size
    );

    // The GPT: BIOS boot, EFI system, Linux root.
    let parts = partitions(&img.disk_raw);
    let codes: Vec<(u32, &str)> = parts.iter().map(|p| (p.number, p.code.as_str())).collect();
    assert_eq!(codes, [(1, "EF02"), (2, "EF00"), (3, "8300")], "{parts:?}");
    run(Command::new("sgdisk").arg("-v").arg(&img.disk_raw));

    // The protective MBR with GRUB's boot code pointing at core.img in the BIOS boot partition.
    let boot_img = std::fs::read("/usr/lib/grub/i386-pc/boot.img")
        .expect("GRUB's boot.img (apt-get install grub-pc-bin)");
    assert_eq!(disk[450], 0xEE, "protective MBR partition type");
    assert_eq!(&disk[510..512], &[0x55, 0xAA]);
    assert_eq!(&disk[..0x5c], &boot_img[..0x5c], "boot.img code in the MBR");
    assert_eq!(
        &disk[0x5c..0x64],
        &parts[0].first.to_le_bytes(),
        "core.img LBA"
    );
    let core = &disk[(parts[0].first * 512) as usize..];
    assert_eq!(
        &core[0x1f4..0x1fc],
        &(parts[0].first + 1).to_le_bytes(),
        "core.img's block list starts after its first sector"
    );

    // The file systems: clean, with the manifest's UUIDs.
    let esp = dir.join("esp.img");
    let root = dir.join("root.ext4");
    extract(&disk, &parts[1], &esp);
    extract(&disk, &parts[2], &root);
    run(Command::new("fsck.vfat").arg("-n").arg(&esp));
    run(Command::new("e2fsck").arg("-fn").arg(&root));
    run(Command::new("e2fsck").arg("-fn").arg(&img.part_image));
    assert_eq!(blkid_uuid(&root), img.disk_root_uuid);
    assert_eq!(blkid_uuid(&img.part_image), img.part_root_uuid);
    assert_ne!(img.disk_root_uuid, img.part_root_uuid);

    // Both roots' files: the kernel and ramdisk that were shipped beside (the partition image
    // boots locally from them too), and the marker file.
    for fs in [&root, &img.part_image] {
        for (inside, want) in [
            ("/boot/vmlinuz", img.kernel_sha256.clone()),
            ("/boot/initrd.img", img.ramdisk_sha256.clone()),
        ] {
            let out = dir.join("dumped");
            run(Command::new("debugfs")
                .arg("-R")
                .arg(format!("dump {inside} {}", out.display()))
                .arg(fs));
            assert_eq!(sha256(&out), want, "{inside} in {}", fs.display());
        }
    }
    for fs in [&root, &img.part_image] {
        let text = run(Command::new("debugfs")
            .arg("-R")
            .arg("cat /etc/vmdeploy-test-os")
            .arg(fs));
        assert_eq!(text, "vmdeploy test OS\n", "{}", fs.display());
    }

    // BOOTX64.EFI: a PE32+ image for x86-64.
    let efi = dir.join("BOOTX64.EFI");
    run(Command::new("mcopy")
        .env("MTOOLS_SKIP_CHECK", "1")
        .arg("-i")
        .arg(&esp)
        .arg("::/EFI/BOOT/BOOTX64.EFI")
        .arg(&efi));
    let pe = std::fs::read(&efi).expect("reading BOOTX64.EFI");
    assert_eq!(&pe[..2], b"MZ");
    let at = u32::from_le_bytes(pe[0x3c..0x40].try_into().expect("4 bytes")) as usize;
    assert_eq!(&pe[at..at + 4], b"PE\0\0");
    assert_eq!(
        &pe[at + 4..at + 6],
        &0x8664u16.to_le_bytes(),
        "machine x86-64"
    );

    // The qcow2 is the same disk.
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "qcow2"])
        .arg(&img.disk_raw)
        .arg(&img.disk_qcow2));
}

#[test]
fn a_second_build_gives_the_same_bytes() {
    let img = test_image::ensure();
    let other = tempfile::tempdir().expect("scratch dir");
    let said = test_image::build(
        &vmdeploy_integration_tests::bin("vmdeploy-image-build"),
        &vmdeploy_integration_tests::deploy_iso::kernel_deb(),
        other.path(),
    );
    eprintln!("{said}");
    let mut names: Vec<String> = std::fs::read_dir(&img.dir)
        .expect("listing the cache")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 7, "{names:?}");
    for name in &names {
        assert_eq!(
            sha256(&img.dir.join(name)),
            sha256(&other.path().join(name)),
            "{name} differs between two builds"
        );
    }
    // The same inputs again: nothing is rebuilt.
    let again = test_image::build(
        &vmdeploy_integration_tests::bin("vmdeploy-image-build"),
        &vmdeploy_integration_tests::deploy_iso::kernel_deb(),
        other.path(),
    );
    assert!(again.contains("up to date"), "{again}");
}

/// Boots QEMU with `args` and waits for the test OS's line (marker or failure); returns QEMU
/// and that line. Panics with the serial log when neither shows.
fn boot(name: &str, args: &[String], dir: &Path) -> (Qemu, String) {
    let log = dir.join(format!("{name}.serial.log"));
    let mut qemu = Qemu::start(args, &log);
    let line = qemu.wait_for(BOOT_LIMIT, |l| {
        l.contains("VMDEPLOY-TEST-OS booted root=") || l.contains(FAILED_PREFIX)
    });
    let Some(line) = line else {
        panic!(
            "{name}: no VMDEPLOY-TEST-OS line within {BOOT_LIMIT:?}; serial log:\n{}",
            qemu.console_text()
        );
    };
    (qemu, line.text)
}

/// The line without the carriage return and trailing blanks of a serial console.
fn console_line(line: &str) -> &str {
    line.trim_end()
}

fn disk_arg(path: &Path, format: &str) -> [String; 2] {
    [
        "-drive".into(),
        format!(
            "if=virtio,file={},format={format},snapshot=on",
            path.display()
        ),
    ]
}

fn expect_marker(img: &TestImage, qemu: &Qemu, line: &str, uuid: &str) {
    assert_eq!(
        console_line(line),
        img.marker(uuid),
        "serial log:\n{}",
        qemu.console_text()
    );
    let count = qemu
        .console()
        .iter()
        .filter(|l| l.text.contains(&img.marker_prefix))
        .count();
    assert_eq!(
        count,
        1,
        "one marker line; serial log:\n{}",
        qemu.console_text()
    );
}

fn netboot_args(img: &TestImage, root_uuid: &str) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "-machine".into(),
        "q35".into(),
        "-nic".into(),
        "none".into(),
        "-kernel".into(),
        img.kernel.display().to_string(),
        "-initrd".into(),
        img.ramdisk.display().to_string(),
        "-append".into(),
        format!(
            "root=UUID={root_uuid} console=ttyS0 quiet vmdeploy_test_os.poweroff=1 \
             vmdeploy_test_os.wait=3"
        ),
    ];
    args.extend(disk_arg(&img.part_image, "raw"));
    args
}

#[test]
fn kernel_and_ramdisk_boot_the_partition_image_and_power_off() {
    let img = test_image::ensure();
    let _one = ResourceLock::acquire("test-image-qemu");
    let dir = tempfile::tempdir().expect("scratch dir");
    let (mut qemu, line) = boot(
        "netboot",
        &netboot_args(&img, &img.part_root_uuid),
        dir.path(),
    );
    expect_marker(&img, &qemu, &line, &img.part_root_uuid);
    assert!(
        qemu.wait_exit(Duration::from_secs(60)).is_some(),
        "vmdeploy_test_os.poweroff=1 did not power the machine off; serial log:\n{}",
        qemu.console_text()
    );
}

#[test]
fn a_wrong_root_uuid_prints_the_failure_line() {
    let img = test_image::ensure();
    let _one = ResourceLock::acquire("test-image-qemu");
    let dir = tempfile::tempdir().expect("scratch dir");
    let wrong = "0bad0bad-0000-4000-8000-000000000000";
    let (mut qemu, line) = boot("wrong-uuid", &netboot_args(&img, wrong), dir.path());
    let tail = console_line(&line);
    assert!(
        tail.starts_with(FAILED_PREFIX) && tail.contains(wrong),
        "expected the failure line naming {wrong}, got {tail:?}; serial log:\n{}",
        qemu.console_text()
    );
    assert!(
        !qemu
            .console()
            .iter()
            .any(|l| l.text.contains(&img.marker_prefix)),
        "a marker despite the wrong UUID; serial log:\n{}",
        qemu.console_text()
    );
    assert!(
        qemu.wait_exit(Duration::from_secs(60)).is_some(),
        "no power-off after the failure; serial log:\n{}",
        qemu.console_text()
    );
}
