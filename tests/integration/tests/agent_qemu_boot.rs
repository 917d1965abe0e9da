//! The agent as a real `/init` on a real kernel: Debian's kernel and a ramdisk built by
//! `vmdeploy-image-build initramfs` boot in QEMU (TCG), and the serial console, the conductor
//! stand-in and the disk image show that the PID-1 duties, module loading, DHCP, the floppy search
//! and the iSCSI deploy work there (docs/qemu-and-boot.md §4–5, §8).
//!
//! - Deploy: the parameter floppy is a virtio-blk disk found by its label; slirp's DHCP server is
//!   the DHCP peer (10.0.2.15, router 10.0.2.2); slirp maps 10.0.2.2 to the host's loopback where
//!   the stand-in (tests/integration/src/iscsi_standin.rs) takes `pass_deploy_info`; the image is
//!   written with `vmdeploy-conductor iscsi write` through a `hostfwd` to the agent's port 3260 and
//!   `done` goes through one to port 10000; the disk file then holds the image byte for byte.
//! - Real floppy drive: the same deploy with the floppy in `-drive if=floppy` (`/dev/fd0`, the
//!   `floppy` module), ending with the agent's own reboot (QEMU exits: `-no-reboot`).
//! - No floppy: the agent says so on the console and powers the VM off by itself.
//!
//! The agent reads its waits only from its own arguments, not from the kernel command line; the
//! kernel passes what follows `--` on its command line to init as arguments, so the short waits
//! arrive as `/init run --floppy-wait-secs 3 --fail-timeout-secs 3`.
//!
//! Needs the static agent (`cargo build --release -p vmdeploy-agent --target
//! x86_64-unknown-linux-musl`, scripts/test does it), the debug `vmdeploy-image-build` and
//! `vmdeploy-conductor`, QEMU and the kernel .deb from scripts/setup.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vmdeploy_integration_tests::free_port;
use vmdeploy_integration_tests::iscsi_standin::{self, IscsiStandin, StandinConfig};
use vmdeploy_integration_tests::qemu::{self, KernelTree, Qemu};

const NODE: &str = "5b8f6a52-2a0e-4c4e-9d42-8c1f0b7e9a31";
const KEY: &str = "QEMUSMOKE0123456789ABCDEFGHIJKLM";
const MAC: &str = "52:54:00:12:34:56";
const DISK_LEN: u64 = 64 << 20;
const IMAGE_LEN: usize = 8 << 20;
/// TCG on two busy cores: generous (docs/architecture.md §11 says 120–180 s).
const BOOT_LIMIT: Duration = Duration::from_secs(180);

/// Modules the ramdisk carries: NIC, disks, the floppy driver (tried on the `pc` machine's FDC)
/// and configfs (the agent mounts it). Their dependencies come from modules.dep.
const MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_net",
    "virtio_blk",
    "floppy",
    "configfs",
];

fn iqn() -> String {
    format!("iqn-{NODE}")
}

/// Deterministic pseudo-random bytes, so a misplaced block cannot go unseen.
fn pattern(len: usize) -> Vec<u8> {
    vmdeploy_integration_tests::tools::xorshift_bytes(len, 0x2545_F491_4F6C_DD1D)
}

struct Setup {
    dir: tempfile::TempDir,
    kernel: KernelTree,
    initrd: PathBuf,
}

fn setup() -> Setup {
    let agent = qemu::musl_agent();
    let kernel = qemu::kernel();
    let dir = tempfile::tempdir_in("/var/tmp").expect("scratch dir");
    let initrd = dir.path().join("initrd.cpio.gz");
    let said = qemu::build_initramfs(&agent, &kernel, MODULES, &initrd);
    eprintln!("{said}");
    Setup {
        dir,
        kernel,
        initrd,
    }
}

fn kernel_args(s: &Setup, append: &str) -> Vec<String> {
    vec![
        "-kernel".into(),
        s.kernel.vmlinuz.display().to_string(),
        "-initrd".into(),
        s.initrd.display().to_string(),
        "-append".into(),
        append.into(),
    ]
}

fn drive(path: &Path, extra: &str) -> Vec<String> {
    vec![
        "-drive".into(),
        format!("if=virtio,format=raw,file={}{extra}", path.display()),
    ]
}

/// The console line for `needle`, or a failure that prints the console.
fn expect_line(qemu: &mut Qemu, limit: Duration, what: &str, needle: &str) -> qemu::ConsoleLine {
    match qemu.wait_for(limit, |l| l.contains(needle)) {
        Some(l) => l,
        None => panic!(
            "{what}: no console line with {needle:?} within {limit:?}; console:\n{}",
            qemu.console_text()
        ),
    }
}

/// The conductor's side of a deploy: the stand-in, the parameter floppy it would write, the
/// install disk file and the host ports forwarded to the agent's 3260 and 10000.
struct Deploy {
    standin: IscsiStandin,
    floppy: PathBuf,
    disk: PathBuf,
    iscsi_port: u16,
    done_port: u16,
}

impl Deploy {
    fn new(dir: &Path) -> Deploy {
        let standin = IscsiStandin::start(StandinConfig {
            node: NODE.into(),
            key: KEY.into(),
            iqn: iqn(),
            fail_first: 0,
            tls: None,
        });
        let standin_port = standin
            .api_url()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok())
            .expect("the stand-in URL ends with its port");
        // As the conductor writes it; slirp maps 10.0.2.2 to the host's loopback.
        let params = format!(
            "deployment_id={NODE}\ndeployment_key={KEY}\niscsi_target_iqn={}\n\
             ironic_api_url=http://10.0.2.2:{standin_port}\ndisk=vda\nboot_option=netboot\n\
             boot_mode=bios\n",
            iqn()
        );
        let floppy = dir.join("floppy.img");
        std::fs::write(
            &floppy,
            vmdeploy_shared::fat::build_floppy(
                vmdeploy_shared::fat::FLOPPY_LABEL,
                &[("parameters.txt", params.as_bytes())],
            )
            .expect("building the floppy"),
        )
        .expect("writing the floppy");
        let disk = dir.join("disk.raw");
        std::fs::File::create(&disk)
            .and_then(|f| f.set_len(DISK_LEN))
            .expect("creating the disk file");
        Deploy {
            standin,
            floppy,
            disk,
            iscsi_port: free_port(),
            done_port: free_port(),
        }
    }

    /// The NIC (MAC = BOOTIF) on slirp with the two forwards, and the install disk as vda.
    fn qemu_args(&self) -> Vec<String> {
        let mut args = vec![
            "-netdev".into(),
            format!(
                "user,id=n0,hostfwd=tcp:127.0.0.1:{}-:3260,hostfwd=tcp:127.0.0.1:{}-:10000",
                self.iscsi_port, self.done_port
            ),
            "-device".into(),
            format!("virtio-net-pci,netdev=n0,mac={MAC},romfile="),
        ];
        args.extend(drive(&self.disk, ""));
        args
    }

    /// Waits for pass_deploy_info and checks it; the time since QEMU's start when it came.
    fn expect_ready(&self, vm: &mut Qemu) -> Duration {
        let received = loop {
            let got = self.standin.received();
            if !got.is_empty() {
                break got;
            }
            let gave_up = vm
                .console()
                .iter()
                .any(|l| l.text.contains("deploy failed"));
            if gave_up || vm.started().elapsed() > BOOT_LIMIT || vm.exited() {
                panic!(
                    "no pass_deploy_info within {BOOT_LIMIT:?} (agent gave up: {gave_up}, qemu \
                     exited: {}); console:\n{}",
                    vm.exited(),
                    vm.console_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let at = vm.started().elapsed();
        let call = &received[0];
        assert_eq!(
            call.status,
            202,
            "stand-in refused pass_deploy_info: {:?}; console:\n{}",
            call.problems,
            vm.console_text()
        );
        assert!(call.problems.is_empty(), "{:?}", call.problems);
        assert_eq!(call.body["address"], "10.0.2.15", "{}", call.body);
        assert_eq!(call.body["key"], KEY);
        assert_eq!(call.body["iqn"], iqn());
        assert!(call.error().is_none(), "agent reported {:?}", call.error());
        at
    }

    /// Writes the image through the forwarded target port and sends `done`; returns the image
    /// and how long the write took.
    fn write_and_notify(&self, vm: &Qemu, scratch: &Path) -> (Vec<u8>, Duration) {
        let image = pattern(IMAGE_LEN);
        let image_path = scratch.join("image.raw");
        std::fs::write(&image_path, &image).expect("writing the image file");
        let started = Instant::now();
        let done: SocketAddr = format!("127.0.0.1:{}", self.done_port)
            .parse()
            .expect("a socket address");
        if let Err(e) = iscsi_standin::write_and_notify(
            &format!("127.0.0.1:{}", self.iscsi_port),
            &iqn(),
            &image_path,
            done,
            BOOT_LIMIT,
        ) {
            panic!("{e}; console:\n{}", vm.console_text());
        }
        (image, started.elapsed())
    }

    /// The disk file holds `image` byte for byte and zeros after it.
    fn check_disk(&self, image: &[u8]) {
        let mut on_disk = std::fs::read(&self.disk).expect("reading the disk file");
        assert_eq!(on_disk.len() as u64, DISK_LEN);
        let rest = on_disk.split_off(image.len());
        assert!(on_disk == image, "the disk does not hold the image");
        assert!(rest.iter().all(|&b| b == 0), "bytes past the image changed");
    }
}

/// The bare `/init` start (no arguments), the floppy as a virtio disk.
#[test]
fn agent_boots_in_qemu_finds_floppy_gets_dhcp_and_deploys_over_iscsi() {
    let s = setup();
    let deploy = Deploy::new(s.dir.path());
    let bootif = format!("01-{}", MAC.replace(':', "-"));
    let mut args = kernel_args(
        &s,
        &format!("console=ttyS0 panic=-1 boot_method=vmedia BOOTIF={bootif}"),
    );
    args.extend(deploy.qemu_args());
    // vdb: the floppy. iLO's virtual floppy is a USB disk; any block device must do.
    args.extend(drive(&deploy.floppy, ",readonly=on"));
    let mut vm = Qemu::start(&args, &s.dir.path().join("serial.log"));

    let to_report = deploy.expect_ready(&mut vm);

    // What the console showed on the way.
    for fstype in ["proc", "sysfs", "devtmpfs", "configfs"] {
        let l = expect_line(
            &mut vm,
            Duration::ZERO,
            "PID-1 mounts",
            &format!("mount fstype=\"{fstype}\""),
        );
        assert!(l.text.contains("outcome=mounted"), "{}", l.text);
    }
    let module_lines: Vec<String> = vm
        .console()
        .into_iter()
        .filter(|l| l.text.contains("kernel module module="))
        .map(|l| l.text)
        .collect();
    for module in [
        "virtio_pci.ko",
        "virtio_net.ko",
        "virtio_blk.ko",
        "configfs.ko",
    ] {
        assert!(
            module_lines
                .iter()
                .any(|l| l.contains(module) && l.contains("outcome=loaded")),
            "{module} not loaded: {module_lines:#?}"
        );
    }
    let lease = expect_line(&mut vm, Duration::ZERO, "DHCP", "DHCP lease");
    assert!(lease.text.contains("address=10.0.2.15"), "{}", lease.text);
    assert!(
        lease.text.contains("gateway=Some(10.0.2.2)"),
        "{}",
        lease.text
    );
    let floppy_found = expect_line(
        &mut vm,
        Duration::ZERO,
        "floppy",
        "found the virtual floppy",
    );
    assert!(
        floppy_found.text.contains("/dev/vdb"),
        "{}",
        floppy_found.text
    );
    let init_at = vm
        .console()
        .into_iter()
        .find(|l| l.text.contains("Run /init"))
        .map(|l| l.at);

    let (image, write_took) = deploy.write_and_notify(&vm, s.dir.path());
    let flushed = expect_line(
        &mut vm,
        Duration::from_secs(120),
        "flush",
        "disk flushed disk=",
    );
    assert!(flushed.text.contains("/dev/vda"), "{}", flushed.text);

    // The conductor powers the node off now.
    vm.kill();
    deploy.check_disk(&image);
    eprintln!(
        "timings from QEMU start: /init at {init_at:.1?}, DHCP lease at {:.1?}, \
         pass_deploy_info at {to_report:.1?} (docs/architecture.md target 15 s), {} MiB written through \
         slirp in {write_took:.1?}, flushed at {:.1?}",
        lease.at,
        IMAGE_LEN >> 20,
        flushed.at
    );
}

#[test]
fn agent_without_floppy_says_so_and_powers_the_vm_off() {
    let s = setup();
    let append = "console=ttyS0 panic=-1 boot_method=vmedia -- run --floppy-wait-secs 3 \
                  --fail-timeout-secs 3";
    let mut args = kernel_args(&s, append);
    args.extend(["-nic".into(), "none".into()]);
    let log = s.dir.path().join("serial.log");
    let mut vm = Qemu::start(&args, &log);

    let search = expect_line(
        &mut vm,
        BOOT_LIMIT,
        "floppy search",
        "looking for the virtual floppy",
    );
    assert!(search.text.contains("wait_secs=3"), "{}", search.text);
    let failed = expect_line(
        &mut vm,
        Duration::from_secs(60),
        "no floppy",
        "deploy failed",
    );
    assert!(
        failed.text.contains("no block device labelled") && failed.text.contains("ir-vfd-dev"),
        "{}",
        failed.text
    );
    let Some(exited) = vm.wait_exit(Duration::from_secs(60)) else {
        panic!(
            "QEMU still runs 60 s after the failure: the agent did not power off; console:\n{}",
            vm.console_text()
        );
    };
    assert!(
        vm.console()
            .iter()
            .any(|l| l.text.contains("reboot: Power down")),
        "the kernel did not power down:\n{}",
        vm.console_text()
    );
    eprintln!(
        "no floppy: failure at {:.1?}, QEMU exited at {exited:.1?}",
        failed.at
    );
}

/// A real floppy drive (`-drive if=floppy` on the `pc` machine's FDC, the `floppy` module): the
/// agent must find `/dev/fd0` by its label (fd0 reads size 0 in sysfs until it is first opened,
/// docs/qemu-and-boot.md §9 item 5). Then the whole deploy, and, as `/init run --fail-timeout-secs 3`,
/// the agent's own reboot 3 s after the flush (`-no-reboot` turns it into QEMU's exit).
#[test]
fn agent_reads_a_real_floppy_drive_deploys_and_reboots_by_itself() {
    let s = setup();
    let deploy = Deploy::new(s.dir.path());
    let bootif = format!("01-{}", MAC.replace(':', "-"));
    let append = format!(
        "console=ttyS0 panic=-1 boot_method=vmedia BOOTIF={bootif} -- run \
         --floppy-wait-secs 10 --fail-timeout-secs 3"
    );
    let mut args = kernel_args(&s, &append);
    args.extend(deploy.qemu_args());
    args.extend([
        "-drive".into(),
        format!("if=floppy,format=raw,file={}", deploy.floppy.display()),
    ]);
    let mut vm = Qemu::start(&args, &s.dir.path().join("serial.log"));
    let found = vm.wait_for(BOOT_LIMIT, |l| {
        l.contains("floppy parameters read") || l.contains("deploy failed")
    });
    let Some(found) = found else {
        panic!(
            "neither the floppy nor a failure within {BOOT_LIMIT:?}; console:\n{}",
            vm.console_text()
        );
    };
    assert!(
        found
            .text
            .contains("floppy parameters read device=/dev/fd0 keys=7"),
        "the floppy in the real drive was not read: {}; console:\n{}",
        found.text,
        vm.console_text()
    );

    let to_report = deploy.expect_ready(&mut vm);
    let (image, _) = deploy.write_and_notify(&vm, s.dir.path());
    let Some(exited) = vm.wait_exit(Duration::from_secs(90)) else {
        panic!(
            "QEMU still runs 90 s after done: the agent did not reboot; console:\n{}",
            vm.console_text()
        );
    };
    assert!(
        vm.console()
            .iter()
            .any(|l| l.text.contains("reboot: Restarting system")),
        "the kernel did not restart:\n{}",
        vm.console_text()
    );
    deploy.check_disk(&image);
    eprintln!(
        "real floppy: read at {:.1?}, pass_deploy_info at {to_report:.1?}, QEMU exited (agent \
         reboot) at {exited:.1?}",
        found.at
    );
}
