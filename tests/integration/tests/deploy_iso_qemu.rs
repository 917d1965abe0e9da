//! The deploy ISO built by `vmdeploy-image-build deploy-iso` (tests/integration/src/deploy_iso.rs)
//! as an iLO uses it (docs/qemu-and-boot.md §6, §8):
//!
//! - Contents, without QEMU: at most 64 MiB, of which the kernel and the initramfs every boot
//!   reads at most 12 MiB; BIOS and UEFI El Torito entries, the UEFI one holding Debian's shim
//!   and signed GRUB (read back with mtools) and every initramfs module still signed; xorriso extracts the kernel of the
//!   .deb, and the `--kernel-out` copy is that kernel; the `--initramfs-out` copy is the ISO's
//!   initramfs followed by the driver pack (pxe_ilo boots the two copies); the initramfs holds
//!   the agent as /init, the module list with the default modules, those modules and nothing
//!   else; the driver pack's index (read through xorriso, parsed by our reader) names igb,
//!   megaraid_sas, bnx2x and the virtio drivers, whose files decompress (`xz -dc`) to the
//!   kernel package's modules byte for byte, signature and all, and bnx2x's firmware to
//!   Debian's firmware file; a second build from the same inputs, without the kernel copy, is
//!   byte-identical and reports the same parts.
//! - Boots, under QEMU TCG, one at a time: SeaBIOS (`-machine pc`, 256 MiB: the agent must work
//!   there; an e1000 NIC) and OVMF (a virtio NIC): neither NIC's driver nor the virtio disk's is
//!   in the initramfs, so the agent reaches the stand-in only through the drivers it loads from
//!   the CD's pack. OVMF (q35, OVMF_CODE_4M.fd and a copy of OVMF_VARS_4M.fd). The ISO is a USB CD
//!   and the parameter floppy a USB key on an xHCI controller, as an iLO presents them; the
//!   floppy is made by `mkfs.vfat` + `mcopy`, not by our FAT writer. The agent finds it, gets a
//!   DHCP lease from slirp and calls `pass_deploy_info` on the conductor stand-in, reached only
//!   through a `guestfwd` of a `restrict=on` slirp network.
//!
//! Needs the static agent (scripts/test builds it), the debug `vmdeploy-image-build`, QEMU, OVMF,
//! xorriso, dosfstools, mtools, socat, xz, cpio and the kernel .deb (scripts/setup).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use vmdeploy_integration_tests::deploy_iso::{self, DeployIso};
use vmdeploy_integration_tests::iscsi_standin::{IscsiStandin, StandinConfig};
use vmdeploy_integration_tests::qemu::{self, Qemu};

const NODE: &str = "0d7c1f7e-6a53-4f1e-a7f4-1d2c3b4a5e6f";
const KEY: &str = "DEPLOYISO0123456789ABCDEFGHIJKLM";
const MAC: &str = "52:54:00:12:34:57";
/// The ISO's budget (image-build's MAX_ISO_BYTES).
const MAX_ISO_BYTES: u64 = 64 << 20;
/// The budget of what every boot reads whole (image-build's MAX_BOOT_BYTES): the kernel and the
/// initramfs here.
const MAX_BOOT_BYTES: u64 = 12 << 20;
/// TCG on two busy cores: generous (docs/qemu-and-boot.md §9 item 7).
const BOOT_LIMIT: Duration = Duration::from_secs(180);
/// The slirp address the guest reaches the stand-in at (a `guestfwd`, nothing else is reachable).
const API_ADDR: &str = "10.0.2.100:8080";

/// Modules the default ISO's initramfs must carry (image-build's DEFAULT_MODULES), with their
/// parameters: the virtual media's and nothing else.
const EXPECTED_MODULES: &[&str] = &[
    "xhci-pci",
    "ehci-pci",
    "usb-storage delay_use=0",
    "sd_mod",
    "sr_mod",
    "ahci",
    "configfs",
];

/// Drivers the pack must carry: ProLiant NICs and controllers, and QEMU's.
const PACK_MODULES: &[&str] = &[
    "igb",
    "tg3",
    "bnx2x",
    "bnxt_en",
    "qede",
    "mlx5_core",
    "ice",
    "megaraid_sas",
    "hpsa",
    "smartpqi",
    "nvme",
    "e1000",
    "floppy",
    "virtio_pci",
    "virtio_net",
    "virtio_blk",
];

fn iqn() -> String {
    format!("iqn-{NODE}")
}

/// Runs a tool; a missing one fails with the package to install.
fn run(cmd: &mut Command, package: &str) -> Vec<u8> {
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) => panic!(
            "{:?}: cannot start ({e}); fix: apt-get install {package}",
            cmd.get_program()
        ),
    };
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn xorriso_extract(iso: &Path, inside: &str, to: &Path) -> Vec<u8> {
    run(
        Command::new("xorriso")
            .args(["-osirrox", "on", "-indev"])
            .arg(iso)
            .args(["-extract", inside])
            .arg(to),
        "xorriso",
    );
    std::fs::read(to).unwrap_or_else(|e| panic!("reading {}: {e}", to.display()))
}

/// The initramfs, decompressed (`xz -dc` reads concatenated streams, as the kernel does).
fn unxz(path: &Path) -> Vec<u8> {
    run(Command::new("xz").arg("-dc").arg(path), "xz-utils")
}

/// Runs `cpio -H newc ARGS` on each archive of `raw` (the ramdisk is several archives one after
/// the other, and cpio stops at the first trailer); returns the outputs joined.
fn cpio(raw: &[u8], dir: &Path, args: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = raw;
    let mut n = 0;
    while let Some(start) = rest.iter().position(|&b| b != 0) {
        rest = &rest[start..];
        let end =
            archive_len(rest).unwrap_or_else(|| panic!("archive {n} is not a whole newc archive"));
        let part = dir.join(format!("archive-{n}.cpio"));
        std::fs::write(&part, &rest[..end]).expect("writing an archive");
        let stdin = std::fs::File::open(&part).expect("opening an archive");
        out.extend(run(
            Command::new("cpio")
                .args(["--quiet", "-H", "newc"])
                .args(args)
                .stdin(stdin),
            "cpio",
        ));
        rest = &rest[end..];
        n += 1;
    }
    out
}

/// The length of the newc archive at the start of `a`, up to and with its `TRAILER!!!` entry,
/// found by walking the entries' headers (a file may hold the trailer's name itself: GRUB's
/// `linux` module does, and the ramdisk carries a GRUB).
fn archive_len(a: &[u8]) -> Option<usize> {
    let field = |at: usize, i: usize| -> Option<usize> {
        let hex = a.get(at + 6 + 8 * i..at + 14 + 8 * i)?;
        usize::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
    };
    let mut at = 0;
    loop {
        if a.get(at..at + 6)? != b"070701" {
            return None;
        }
        let (file_size, name_size) = (field(at, 6)?, field(at, 11)?);
        let name = a.get(at + 110..at + 110 + name_size.checked_sub(1)?)?;
        let data = (at + 110 + name_size).div_ceil(4) * 4;
        at = (data + file_size).div_ceil(4) * 4;
        if name == b"TRAILER!!!" {
            return Some(at.min(a.len()));
        }
    }
}

#[test]
fn deploy_iso_fits_the_budget_holds_the_modules_and_the_initramfs_it_reports() {
    let built = deploy_iso::deploy_iso_build();
    eprintln!("{}", built.report);
    let dir = tempfile::tempdir_in("/var/tmp").expect("scratch dir");
    let iso_len = std::fs::metadata(&built.iso).expect("the ISO").len();
    assert!(
        iso_len <= MAX_ISO_BYTES,
        "{iso_len} bytes > {MAX_ISO_BYTES}"
    );
    for part in ["kernel", "agent", "modules", "initramfs", "loaders", "ISO"] {
        assert!(
            built.report.contains(&format!("\n  {part} ")),
            "the report lacks {part}:\n{}",
            built.report
        );
    }

    // Both El Torito entries, and the files both loaders read.
    let torito = String::from_utf8_lossy(&run(
        Command::new("xorriso")
            .args(["-indev"])
            .arg(&built.iso)
            .args(["-report_el_torito", "plain"]),
        "xorriso",
    ))
    .into_owned();
    assert!(
        torito.contains(" BIOS ") && torito.contains(" UEFI "),
        "{torito}"
    );
    let initrd_path = dir.path().join("initrd");
    let initrd = xorriso_extract(&built.iso, "/BOOT/INITRD", &initrd_path);
    let written = std::fs::read(&built.initramfs).expect("the --initramfs-out file");
    assert!(
        written.len() > initrd.len() && written[..initrd.len()] == initrd[..],
        "--initramfs-out does not start with the ISO's /boot/initrd"
    );
    let kernel = xorriso_extract(&built.iso, "/BOOT/VMLINUZ", &dir.path().join("vmlinuz"));
    let boot_bytes = (kernel.len() + initrd.len()) as u64;
    assert!(
        boot_bytes <= MAX_BOOT_BYTES,
        "kernel and initramfs are {boot_bytes} bytes > {MAX_BOOT_BYTES}"
    );
    let deb_kernel = std::fs::read(qemu::kernel().vmlinuz).expect("the .deb's kernel");
    assert!(kernel == deb_kernel, "the ISO's kernel is not the .deb's");
    let kernel_out = std::fs::read(&built.kernel).expect("the --kernel-out file");
    assert!(
        !kernel_out.is_empty() && kernel_out == kernel,
        "the --kernel-out file ({} bytes) differs from the ISO's /boot/vmlinuz ({} bytes)",
        kernel_out.len(),
        kernel.len()
    );

    // The initramfs: /init is the agent, the module list names the defaults, and every file is
    // the agent, the list or a listed module.
    let raw = unxz(&initrd_path);
    let listing = String::from_utf8_lossy(&cpio(&raw, dir.path(), &["-t"])).into_owned();
    let entries: BTreeSet<&str> = listing.lines().collect();
    let agent = std::fs::read(qemu::musl_agent()).expect("the agent");
    let init = cpio(&raw, dir.path(), &["-i", "--to-stdout", "init"]);
    assert!(init == agent, "/init is not the agent");
    let list = String::from_utf8(cpio(
        &raw,
        dir.path(),
        &["-i", "--to-stdout", "etc/vmdeploy/modules"],
    ))
    .expect("the module list is UTF-8");
    let listed: Vec<(&str, &str)> = list
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_once(' ').unwrap_or((l, "")))
        .collect();
    for want in EXPECTED_MODULES {
        let (name, params) = want.split_once(' ').unwrap_or((want, ""));
        let file = format!("/{name}.ko");
        let Some((_, got_params)) = listed.iter().find(|(p, _)| p.ends_with(&file)) else {
            panic!("{name} is not in the module list:\n{list}");
        };
        assert_eq!(*got_params, params, "parameters of {name}");
    }
    let release = qemu::kernel().release;
    // The agent, its console, the module list, and the GRUB image.install_bootloader installs.
    let grub =
        vmdeploy_shared::partition::local_boot::GRUB_EFI_INITRAMFS_PATH.trim_start_matches('/');
    let mut expected: BTreeSet<String> = ["init", "dev/console", "etc/vmdeploy/modules", grub]
        .iter()
        .map(|s| s.to_string())
        .collect();
    expected.extend(
        listed
            .iter()
            .map(|(p, _)| format!("lib/modules/{release}/{p}")),
    );
    let files: BTreeSet<String> = entries
        .iter()
        .filter(|e| {
            // Directories are the parents of files or the mount points.
            !entries.iter().any(|other| {
                other.len() > e.len() && other.starts_with(*e) && other[e.len()..].starts_with('/')
            }) && !["proc", "sys", "run", "tmp"].contains(e)
        })
        .map(|e| e.to_string())
        .collect();
    assert_eq!(
        files, expected,
        "the initramfs holds exactly the agent, the list and the listed modules"
    );

    // Secure Boot: every initramfs module as the kernel package signed it (lockdown refuses
    // one without), and the EFI image holding Debian's shim and signed GRUB byte for byte.
    for (path, _) in &listed {
        let inside = format!("lib/modules/{release}/{path}");
        let module = cpio(&raw, dir.path(), &["-i", "--to-stdout", inside.as_str()]);
        assert!(
            module.ends_with(b"~Module signature appended~\n"),
            "{inside} in the initramfs lost its signature"
        );
    }
    check_efi_image(&built.iso, dir.path());

    check_driver_pack(&built, &written[initrd.len()..], dir.path());

    // Same inputs, same bytes: the cached build wrote `--kernel-out`, this one does not, and
    // the ISO and the report of its parts are the same.
    let again = dir.path().join("again.iso");
    let again_report = deploy_iso::build(
        &vmdeploy_integration_tests::bin("vmdeploy-image-build"),
        &qemu::musl_agent(),
        &deploy_iso::kernel_deb(),
        &again,
        &dir.path().join("again-initrd"),
        &[
            "--firmware-dir",
            deploy_iso::firmware_dir()
                .to_str()
                .expect("a UTF-8 checkout path"),
            "--signed-loaders",
            deploy_iso::signed_loaders()
                .to_str()
                .expect("a UTF-8 checkout path"),
        ],
    );
    let first = std::fs::read(&built.iso).expect("the ISO");
    let second = std::fs::read(&again).expect("the second ISO");
    assert!(first == second, "two builds from the same inputs differ");
    let parts = |report: &str| {
        report
            .split("\nwrote ")
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(
        parts(&built.report),
        parts(&again_report),
        "the reports of the two builds differ"
    );
    assert!(
        built.report.contains(&format!(
            "wrote {} ({} bytes)",
            built.kernel.display(),
            kernel.len()
        )),
        "the report names the kernel copy:\n{}",
        built.report
    );
}

/// The ISO's UEFI El Torito image, read with xorriso and mtools (not our FAT code): shim as
/// `\EFI\BOOT\BOOTX64.EFI` and Debian's signed CD GRUB as `grubx64.efi` beside it, each
/// byte for byte the package's file.
fn check_efi_image(iso: &Path, scratch: &Path) {
    let image = scratch.join("efi.img");
    xorriso_extract(iso, "/BOOT/EFI.IMG", &image);
    let signed = deploy_iso::signed_loaders();
    for (inside, package_file) in [
        ("::/EFI/BOOT/BOOTX64.EFI", "usr/lib/shim/shimx64.efi.signed"),
        (
            "::/EFI/BOOT/grubx64.efi",
            "usr/lib/grub/x86_64-efi-signed/gcdx64.efi.signed",
        ),
    ] {
        let got = run(
            Command::new("mcopy")
                .env("MTOOLS_SKIP_CHECK", "1")
                .arg("-i")
                .arg(&image)
                .args([inside, "-"]),
            "mtools",
        );
        let want = std::fs::read(signed.join(package_file))
            .unwrap_or_else(|e| panic!("reading {package_file}: {e}"));
        assert!(
            got == want,
            "{inside} in the EFI image ({} bytes) is not Debian's {package_file} ({} bytes)",
            got.len(),
            want.len()
        );
    }
}

/// The ISO's driver pack, read with xorriso and parsed by our reader: the drivers of
/// [`PACK_MODULES`], each file decompressing to the kernel package's module (signature
/// included), bnx2x's firmware to Debian's file; and the network-boot ramdisk's tail, an
/// archive holding the same index and files.
fn check_driver_pack(built: &DeployIso, netboot_tail: &[u8], scratch: &Path) {
    use vmdeploy_shared::driver_pack::DriverPack;
    let index_path = scratch.join("pack-index");
    let index = xorriso_extract(&built.iso, "/DRIVERS/INDEX", &index_path);
    let pack = DriverPack::parse(&String::from_utf8(index.clone()).expect("a UTF-8 index"))
        .expect("the ISO's driver index parses");
    let tree = qemu::kernel();
    assert_eq!(pack.kernel, tree.release);
    let dep = std::fs::read_to_string(tree.modules_dir.join("modules.dep")).expect("modules.dep");
    for name in PACK_MODULES {
        let module = pack
            .module(name)
            .unwrap_or_else(|| panic!("{name} is not in the driver pack"));
        let packed = scratch.join(format!("{name}.xz"));
        xorriso_extract(&built.iso, &format!("/DRIVERS/{}", module.file), &packed);
        let unpacked = unxz(&packed);
        let rel = dep
            .lines()
            .filter_map(|l| l.split_once(':').map(|(path, _)| path))
            .find(|path| {
                path.rsplit('/')
                    .next()
                    .and_then(|f| f.strip_suffix(".ko"))
                    .is_some_and(|stem| stem.replace('-', "_") == *name)
            })
            .unwrap_or_else(|| panic!("{name} is not in modules.dep"));
        let original = std::fs::read(tree.modules_dir.join(rel)).expect("the kernel's module");
        assert!(
            unpacked == original,
            "{name}: the pack's file is not the kernel package's module"
        );
        assert_eq!(
            module.bytes,
            original.len() as u64,
            "{name}: the size in the index"
        );
    }
    // Debian signs its modules: the signature's trailer survived.
    let igb = unxz(&scratch.join("igb.xz"));
    assert!(
        igb.ends_with(b"~Module signature appended~\n"),
        "igb lost its signature"
    );
    let bnx2x = pack.module("bnx2x").expect("bnx2x");
    assert!(
        !bnx2x.firmware.is_empty(),
        "bnx2x carries no firmware: {bnx2x:?}"
    );
    for name in &bnx2x.firmware {
        let fw = pack.firmware(name).expect("declared firmware");
        let packed = scratch.join("fw.xz");
        xorriso_extract(&built.iso, &format!("/DRIVERS/{}", fw.file), &packed);
        let debian = std::fs::read(deploy_iso::firmware_dir().join(name))
            .unwrap_or_else(|e| panic!("Debian's {name}: {e}"));
        assert!(unxz(&packed) == debian, "{name} differs from Debian's file");
    }
    // igb's aliases match an 82576 (QEMU's igb) by its ids.
    let matched: Vec<&str> = pack
        .modules_for("pci:v00008086d000010C9sv00008086sd0000A01Cbc02sc00i00")
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(matched, vec!["igb"]);

    // The network-boot ramdisk's last archive: the same index and files.
    let listing = String::from_utf8_lossy(&cpio(netboot_tail, scratch, &["-t"])).into_owned();
    let dir = vmdeploy_shared::driver_pack::INITRAMFS_DIR;
    assert!(listing.contains(&format!("{dir}/INDEX.")), "{listing}");
    for m in pack.modules() {
        assert!(
            listing.contains(&format!("{dir}/{}", m.file)),
            "{} ({}) is not in the network-boot ramdisk",
            m.name,
            m.file
        );
    }
    let tail_index = cpio(
        netboot_tail,
        scratch,
        &["-i", "--to-stdout", &format!("{dir}/INDEX.")],
    );
    assert!(
        tail_index == index,
        "the network-boot ramdisk's index differs from the ISO's"
    );
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Firmware {
    /// SeaBIOS on i440fx (`-machine pc`).
    Bios,
    /// OVMF on q35.
    Uefi,
}

/// A parameter floppy as the conductor writes it, made with dosfstools and mtools.
fn floppy(dir: &Path, firmware: Firmware) -> PathBuf {
    let path = dir.join("floppy.img");
    let _ = std::fs::remove_file(&path);
    run(
        Command::new("mkfs.vfat")
            .args(["-C", "-n", "ir-vfd-dev"])
            .arg(&path)
            .arg("1440"),
        "dosfstools",
    );
    let bootif = format!("01-{}", MAC.replace(':', "-"));
    let mode = match firmware {
        Firmware::Bios => "bios",
        Firmware::Uefi => "uefi",
    };
    let params = format!(
        "deployment_id={NODE}\ndeployment_key={KEY}\niscsi_target_iqn={}\n\
         ironic_api_url=http://{API_ADDR}\ndisk=vda\nboot_option=netboot\nboot_mode={mode}\n\
         BOOTIF={bootif}\n",
        iqn()
    );
    let text = dir.join("parameters.txt");
    std::fs::write(&text, params).expect("writing parameters.txt");
    run(
        Command::new("mcopy")
            .arg("-i")
            .arg(&path)
            .arg(&text)
            .arg("::parameters.txt"),
        "mtools",
    );
    path
}

/// Boots `iso` as a USB CD with the floppy as a USB key; returns the time from QEMU's start to
/// `pass_deploy_info` at the stand-in, after checking the call.
fn boot_to_pass_deploy_info(iso: &Path, firmware: Firmware, memory_mib: u32) -> Duration {
    run(Command::new("socat").arg("-V"), "socat");
    let dir = tempfile::tempdir_in("/var/tmp").expect("scratch dir");
    let standin = IscsiStandin::start(StandinConfig {
        node: NODE.into(),
        key: KEY.into(),
        iqn: iqn(),
        fail_first: 0,
        tls: None,
    });
    let standin_addr = standin
        .api_url()
        .strip_prefix("http://")
        .expect("a plain HTTP stand-in")
        .to_owned();
    let floppy = floppy(dir.path(), firmware);
    let disk = dir.path().join("disk.raw");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(64 << 20))
        .expect("creating the disk file");

    let mut args: Vec<String> = vec!["-m".into(), memory_mib.to_string()];
    let nic = match firmware {
        Firmware::Bios => {
            args.extend(["-machine".into(), "pc".into()]);
            "e1000"
        }
        Firmware::Uefi => {
            args.extend(qemu::ovmf_q35_args(dir.path()));
            "virtio-net-pci"
        }
    };
    args.extend([
        // iLO's virtual media: a USB CD (bulk-only SCSI) and a USB key on xHCI.
        "-device".into(),
        "qemu-xhci,id=xhci".into(),
        "-drive".into(),
        format!(
            "if=none,id=vcd,media=cdrom,format=raw,readonly=on,file={}",
            iso.display()
        ),
        "-device".into(),
        "usb-bot,bus=xhci.0,id=vcdbot".into(),
        "-device".into(),
        "scsi-cd,bus=vcdbot.0,drive=vcd,bootindex=0".into(),
        "-drive".into(),
        format!("if=none,id=vfd,format=raw,file={}", floppy.display()),
        "-device".into(),
        "usb-storage,bus=xhci.0,drive=vfd,removable=on".into(),
        // The install disk.
        "-drive".into(),
        format!("if=virtio,format=raw,file={}", disk.display()),
        // Only the stand-in is reachable from the guest.
        "-netdev".into(),
        format!("user,id=n0,restrict=on,guestfwd=tcp:{API_ADDR}-cmd:socat - TCP:{standin_addr}"),
        "-device".into(),
        format!("{nic},netdev=n0,mac={MAC},romfile="),
    ]);
    let mut vm = Qemu::start(&args, &dir.path().join("serial.log"));
    let received = loop {
        let got = standin.received();
        if !got.is_empty() {
            break got;
        }
        let gave_up = vm
            .console()
            .iter()
            .any(|l| l.text.contains("deploy failed") || l.text.contains("Kernel panic"));
        if gave_up || vm.started().elapsed() > BOOT_LIMIT || vm.exited() {
            panic!(
                "{firmware:?}, {memory_mib} MiB: no pass_deploy_info within {BOOT_LIMIT:?} \
                 (agent gave up: {gave_up}, qemu exited: {}); console:\n{}",
                vm.exited(),
                vm.console_text()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let at = vm.started().elapsed();
    let call = &received[0];
    assert_eq!(call.status, 202, "stand-in refused: {:?}", call.problems);
    assert!(call.problems.is_empty(), "{:?}", call.problems);
    assert_eq!(call.body["address"], "10.0.2.15", "{}", call.body);
    assert_eq!(call.body["key"], KEY);
    assert_eq!(call.body["iqn"], iqn());
    assert!(call.error().is_none(), "agent reported {:?}", call.error());
    let console = vm.console();
    let floppy_found = console
        .iter()
        .find(|l| l.text.contains("found the virtual floppy"))
        .map(|l| l.text.clone())
        .unwrap_or_default();
    assert!(
        floppy_found.contains("device=/dev/sd"),
        "the floppy was not found as a USB disk: {floppy_found:?}; console:\n{}",
        vm.console_text()
    );
    // The memory asked for is what the kernel got (Qemu::start passes its own -m first).
    let memory = console
        .iter()
        .find(|l| l.text.contains("Memory: ") && l.text.contains("K available"))
        .map(|l| l.text.clone())
        .unwrap_or_default();
    let total_kib: u64 = memory
        .split('/')
        .nth(1)
        .and_then(|s| s.split('K').next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no kernel memory line: {memory:?}"));
    assert!(
        total_kib <= u64::from(memory_mib) * 1024,
        "{memory} for -m {memory_mib}"
    );
    vm.kill();
    eprintln!(
        "{firmware:?}, {memory_mib} MiB: pass_deploy_info {at:.1?} after QEMU started (target \
         15 s for BIOS)"
    );
    at
}

/// Both firmwares, one after the other: SeaBIOS in 256 MiB, OVMF in 512 MiB (Debian 12's GRUB
/// EFI runs out of memory below 384 MiB, docs/qemu-and-boot.md §6).
#[test]
fn deploy_iso_boots_bios_in_256_mib_and_uefi_to_pass_deploy_info() {
    let iso: DeployIso = deploy_iso::deploy_iso_build();
    let bios = boot_to_pass_deploy_info(&iso.iso, Firmware::Bios, 256);
    let uefi = boot_to_pass_deploy_info(&iso.iso, Firmware::Uefi, 512);
    eprintln!("deploy ISO to pass_deploy_info: BIOS {bios:.1?}, UEFI {uefi:.1?}");
}

/// Initramfs modules (`--module`) beyond what every boot may read: the build fails, says so,
/// and writes neither the ISO nor the initramfs. It fails as soon as the boot files are known,
/// before it spends a minute compressing the driver pack.
#[test]
fn an_iso_over_the_budget_is_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir_in("/var/tmp").expect("scratch dir");
    let iso = dir.path().join("big.iso");
    let out = Command::new(vmdeploy_integration_tests::bin("vmdeploy-image-build"))
        .arg("deploy-iso")
        .arg("--agent")
        .arg(qemu::musl_agent())
        .arg("--kernel-deb")
        .arg(deploy_iso::kernel_deb())
        .args([
            "--module",
            "mlx5_core",
            "--module",
            "ice",
            "--module",
            "bnx2x",
            "--module",
            "qede",
            "--module",
            "lpfc",
            "--module",
            "qla2xxx",
            "--initramfs-out",
        ])
        .arg(dir.path().join("big-initrd"))
        .arg("-o")
        .arg(&iso)
        .output()
        .expect("running vmdeploy-image-build");
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("over the 12582912-byte budget"), "{said}");
    assert!(
        said.contains("\n  boot files "),
        "the parts known are printed before the refusal: {said}"
    );
    assert!(
        !said.contains("\n  drivers ") && !said.contains("\n  ISO "),
        "the driver pack and the ISO were built before the refusal: {said}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("listing the scratch dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}
