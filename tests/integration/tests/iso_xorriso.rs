//! Boot ISOs from `vmdeploy-image-build boot-iso` (the shared ISO writer, `vmdeploy_shared::iso`)
//! read back by independent tools: xorriso (El Torito entries, volume id, extraction), GRUB's own
//! ISO 9660 reader (`grub-fstest`), fsck.fat and mtools for the EFI system image. Also: the same
//! inputs give the same bytes, and bad input ends with exit 64.
//!
//! Needs the debug `vmdeploy-image-build`, the kernel .deb from scripts/setup, and the Debian
//! packages xorriso, grub-common, grub-efi-amd64-bin, isolinux, syslinux-common, dosfstools and
//! mtools.

use std::path::{Path, PathBuf};
use std::process::Command;

use vmdeploy_integration_tests::tools::{tool_ok, xorshift_bytes};
use vmdeploy_integration_tests::{bin, qemu};
use vmdeploy_shared::iso::GRUB_EARLY_CONFIG;

const CMDLINE: &str = "root=UUID=0f3c1e2d-7a4b-4c5d-8e9f-0a1b2c3d4e5f ro quiet -- marker";

struct Inputs {
    dir: tempfile::TempDir,
    kernel: PathBuf,
    ramdisk: PathBuf,
}

fn inputs() -> Inputs {
    let kernel = qemu::kernel().vmlinuz;
    let dir = tempfile::tempdir_in("/var/tmp").expect("scratch dir");
    let ramdisk = dir.path().join("ramdisk.img");
    std::fs::write(&ramdisk, xorshift_bytes(1_234_567, 0x9E37_79B9)).expect("writing the ramdisk");
    Inputs {
        dir,
        kernel,
        ramdisk,
    }
}

/// `boot-iso` with an optional SOURCE_DATE_EPOCH; returns its exit status and stderr.
fn boot_iso(i: &Inputs, cmdline: &str, out: &Path, epoch: Option<&str>) -> (Option<i32>, String) {
    let mut cmd = Command::new(bin("vmdeploy-image-build"));
    cmd.arg("boot-iso")
        .arg("--kernel")
        .arg(&i.kernel)
        .arg("--ramdisk")
        .arg(&i.ramdisk)
        .arg("--cmdline")
        .arg(cmdline)
        .arg("-o")
        .arg(out)
        .env_remove("SOURCE_DATE_EPOCH");
    if let Some(e) = epoch {
        cmd.env("SOURCE_DATE_EPOCH", e);
    }
    let res = cmd.output().expect("running vmdeploy-image-build boot-iso");
    (
        res.status.code(),
        String::from_utf8_lossy(&res.stderr).into_owned(),
    )
}

fn built(i: &Inputs, name: &str) -> (PathBuf, String) {
    let iso = i.dir.path().join(name);
    let (code, said) = boot_iso(i, CMDLINE, &iso, None);
    assert_eq!(code, Some(0), "boot-iso failed: {said}");
    (iso, said)
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("scratch paths are UTF-8")
}

#[test]
fn xorriso_sees_both_boot_entries_and_extracts_the_files() {
    let i = inputs();
    let (iso, said) = built(&i, "boot.iso");
    assert!(said.contains("volume VMEDIA_BOOT_ISO"), "{said}");
    let isop = path_str(&iso);

    let report = tool_ok(
        "xorriso",
        "xorriso",
        &["-indev", isop, "-report_el_torito", "plain"],
    );
    let has = |re: &[&str]| {
        report
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>().ends_with(re))
    };
    assert!(
        report.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.starts_with(&["El", "Torito", "boot", "img", ":", "1", "BIOS", "y", "none"])
                && w.get(11) == Some(&"4")
        }),
        "no BIOS no-emulation entry loading 4 sectors:\n{report}"
    );
    assert!(
        report.lines().any(|l| l
            .split_whitespace()
            .collect::<Vec<_>>()
            .starts_with(&["El", "Torito", "boot", "img", ":", "2", "UEFI", "y", "none"])),
        "no UEFI entry:\n{report}"
    );
    assert!(has(&["1", "/ISOLINUX/ISOLINUX.BIN"]), "{report}");
    assert!(has(&["2", "/BOOT/EFI.IMG"]), "{report}");
    assert!(
        report
            .lines()
            .any(|l| l.contains("img opts :   1") && l.contains("boot-info-table")),
        "isolinux without boot-info-table:\n{report}"
    );

    let pvd = tool_ok("xorriso", "xorriso", &["-indev", isop, "-pvd_info"]);
    assert!(
        pvd.lines()
            .any(|l| l.starts_with("Volume Id") && l.trim_end().ends_with(": VMEDIA_BOOT_ISO")),
        "{pvd}"
    );
    assert!(
        pvd.lines()
            .any(|l| l.starts_with("Creation Time") && l.contains("2026010100000000")),
        "the fixed default date is not the creation time:\n{pvd}"
    );

    let out = i.dir.path().join("x");
    std::fs::create_dir(&out).expect("extract dir");
    let k = out.join("vmlinuz");
    let r = out.join("initrd");
    let c = out.join("isolinux.cfg");
    tool_ok(
        "xorriso",
        "xorriso",
        &[
            "-osirrox",
            "on",
            "-indev",
            isop,
            "-extract",
            "/BOOT/VMLINUZ",
            path_str(&k),
            "-extract",
            "/BOOT/INITRD",
            path_str(&r),
            "-extract",
            "/ISOLINUX/ISOLINUX.CFG",
            path_str(&c),
        ],
    );
    let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert!(
        read(&k) == read(&i.kernel),
        "the kernel came back different"
    );
    assert!(
        read(&r) == read(&i.ramdisk),
        "the ramdisk came back different"
    );
    let cfg = String::from_utf8(read(&c)).expect("isolinux.cfg is text");
    assert!(
        cfg.contains(&format!(
            "APPEND initrd=/boot/initrd console=tty0 console=ttyS0,115200 {CMDLINE}\n"
        )),
        "{cfg}"
    );
    assert!(
        cfg.contains("PROMPT 0") && cfg.contains("TIMEOUT 0"),
        "{cfg}"
    );

    // Stored once: the ISO is the kernel and ramdisk plus less than 1 MiB of loaders and tables.
    let len = |p: &Path| std::fs::metadata(p).expect("stat").len();
    let overhead = len(&iso) - len(&i.kernel) - len(&i.ramdisk);
    assert!(
        overhead < 1 << 20,
        "{overhead} bytes besides kernel and ramdisk"
    );
}

#[test]
fn grub_reads_the_tree_and_its_config() {
    let i = inputs();
    let (iso, _) = built(&i, "boot.iso");
    let isop = path_str(&iso);
    let ls = tool_ok("grub-fstest", "grub-common", &[isop, "ls", "/boot/"]);
    let names: Vec<&str> = ls.split_whitespace().collect();
    for want in ["vmlinuz", "initrd", "grub/", "efi.img"] {
        assert!(
            names.contains(&want),
            "GRUB does not see /boot/{want}: {ls}"
        );
    }
    // GRUB's own ISO 9660 reader gives back the kernel and ramdisk byte for byte.
    tool_ok(
        "grub-fstest",
        "grub-common",
        &[isop, "cmp", "/boot/vmlinuz", path_str(&i.kernel)],
    );
    tool_ok(
        "grub-fstest",
        "grub-common",
        &[isop, "cmp", "/boot/initrd", path_str(&i.ramdisk)],
    );
    let cfg = tool_ok(
        "grub-fstest",
        "grub-common",
        &[isop, "cat", "/boot/grub/grub.cfg"],
    );
    assert!(
        cfg.contains(&format!(
            "linux /boot/vmlinuz console=tty0 console=ttyS0,115200 {CMDLINE}\n"
        )),
        "{cfg}"
    );
    assert!(
        cfg.contains("initrd /boot/initrd\n") && cfg.contains("set timeout=0"),
        "{cfg}"
    );
    assert!(cfg.contains("serial --unit=0 --speed=115200"), "{cfg}");
}

#[test]
fn efi_image_is_a_clean_fat_with_grub() {
    let i = inputs();
    let (iso, said) = built(&i, "boot.iso");
    let img = i.dir.path().join("efi.img");
    tool_ok(
        "xorriso",
        "xorriso",
        &[
            "-osirrox",
            "on",
            "-indev",
            path_str(&iso),
            "-extract",
            "/BOOT/EFI.IMG",
            path_str(&img),
        ],
    );
    let fsck = tool_ok("fsck.fat", "dosfstools", &["-n", path_str(&img)]);
    assert!(
        !fsck.contains("Free cluster summary wrong") && !fsck.contains("Error"),
        "{fsck}"
    );
    let efi = i.dir.path().join("bootx64.efi");
    tool_ok(
        "mcopy",
        "mtools",
        &[
            "-n",
            "-i",
            path_str(&img),
            "::/EFI/BOOT/BOOTX64.EFI",
            path_str(&efi),
        ],
    );
    let grub = std::fs::read(&efi).expect("reading BOOTX64.EFI");
    assert!(grub.starts_with(b"MZ"), "BOOTX64.EFI is not a PE image");
    // image-build said how large the GRUB it built was.
    let said_len = said
        .split("(GRUB ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or_else(|| panic!("no GRUB size in {said:?}"));
    assert_eq!(grub.len(), said_len);
    assert!(grub.len() < 1 << 20, "GRUB EFI is {} bytes", grub.len());
    let early = GRUB_EARLY_CONFIG.as_bytes();
    assert!(
        grub.windows(early.len()).any(|w| w == early),
        "the GRUB binary does not carry the embedded config"
    );
}

#[test]
fn same_inputs_same_bytes_and_dates_from_source_date_epoch() {
    let i = inputs();
    let (a, _) = built(&i, "a.iso");
    let (b, _) = built(&i, "b.iso");
    let a = std::fs::read(a).expect("a");
    assert!(a == std::fs::read(b).expect("b"), "two builds differ");

    let c = i.dir.path().join("c.iso");
    let (code, said) = boot_iso(&i, CMDLINE, &c, Some("1000000000"));
    assert_eq!(code, Some(0), "{said}");
    let pvd = tool_ok("xorriso", "xorriso", &["-indev", path_str(&c), "-pvd_info"]);
    assert!(
        pvd.lines()
            .any(|l| l.starts_with("Creation Time") && l.contains("2001090901464000")),
        "SOURCE_DATE_EPOCH=1000000000 is not the creation time:\n{pvd}"
    );
    let c = std::fs::read(&c).expect("c");
    assert_eq!(c.len(), a.len());
    assert!(c != a, "the date did not change the bytes");
}

#[test]
fn bad_input_is_a_usage_error() {
    let i = inputs();
    let out = i.dir.path().join("bad.iso");
    let (code, said) = boot_iso(&i, "root=/dev/sda1\ninit=/bin/sh", &out, None);
    assert_eq!(code, Some(64), "{said}");
    assert!(said.contains("command line"), "{said}");

    let not_kernel = Inputs {
        kernel: i.ramdisk.clone(),
        ramdisk: i.ramdisk.clone(),
        dir: tempfile::tempdir_in("/var/tmp").expect("scratch"),
    };
    let (code, said) = boot_iso(&not_kernel, "ro", &out, None);
    assert_eq!(code, Some(64), "{said}");
    assert!(said.contains("bzImage"), "{said}");

    let (code, said) = boot_iso(&i, "ro", &out, Some("yesterday"));
    assert_eq!(code, Some(64), "{said}");
    assert!(!out.exists(), "a failed build left {}", out.display());
}

/// Our ISO 9660 reader (`vmdeploy_shared::iso::read`, what the agent reads the deploy CD with)
/// on a volume xorriso wrote: a nested file, a file of many sectors and a directory of many
/// sectors (records never cross a sector: the reader must skip each sector's padding).
#[test]
fn our_reader_reads_a_volume_xorriso_wrote() {
    use vmdeploy_shared::iso::read::{IsoReadError, IsoVolume};
    let dir = tempfile::tempdir().expect("scratch dir");
    let tree = dir.path().join("tree");
    let mut files: Vec<(String, Vec<u8>)> = vec![
        ("boot/vmlinuz".into(), xorshift_bytes(300_001, 0x51ED_2701)),
        ("a/b/c/deep.txt".into(), b"four levels down".to_vec()),
    ];
    for i in 0..150 {
        files.push((
            format!("many/f{i:03}.bin"),
            xorshift_bytes(100 + i, i as u64 + 1),
        ));
    }
    for (name, bytes) in &files {
        let path = tree.join(name);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(&path, bytes).expect("writing a file");
    }
    let iso = dir.path().join("x.iso");
    tool_ok(
        "xorriso",
        "xorriso",
        &[
            "-as",
            "mkisofs",
            "-quiet",
            "-V",
            "READTEST",
            "-o",
            path_str(&iso),
            path_str(&tree),
        ],
    );

    let device = std::fs::File::open(&iso).expect("opening the ISO");
    let mut volume = IsoVolume::open(device).expect("our reader opens xorriso's volume");
    assert_eq!(volume.volume_id(), "READTEST");
    assert_eq!(
        volume.volume_bytes(),
        std::fs::metadata(&iso).expect("size").len(),
        "the descriptor's volume size is the file's"
    );
    for (name, bytes) in &files {
        let read = volume
            .read_file(name, 1 << 20)
            .unwrap_or_else(|e| panic!("reading {name}: {e}"));
        assert!(
            read == *bytes,
            "{name}: {} bytes read back differ",
            read.len()
        );
    }
    let many = volume.lookup("/many").expect("the big directory");
    assert!(many.len > 2048, "the directory fits one sector: {many:?}");
    assert_eq!(volume.list(&many).expect("listing").len(), 150);
    assert!(matches!(
        volume.read_file("/many/f999.bin", 1 << 20),
        Err(IsoReadError::NotFound(_))
    ));
}
