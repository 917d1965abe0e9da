//! End to end, `pxe_ilo`: the `baremetal` CLI deploys the project's test OS as a
//! partition image onto a QEMU node whose emulated iLO has only a Standard licence (no virtual
//! media), through `vmdeploy-conductor serve` with its network boot service on.
//!
//! The node is on a real layer-2 provisioning network (`e2e::provisioning_net`: a bridge in a
//! network namespace made by the test, a tap for QEMU, Debian's dnsmasq for DHCP with the
//! README's per-architecture boot files), and every file it boots from comes from the
//! conductor's own TFTP (port 69) and HTTP servers there:
//! - BIOS (SeaBIOS): the NIC's ROM is answered as a plain PXE ROM, so dnsmasq names
//!   `pxelinux.0`; PXELINUX reads the node's `pxelinux.cfg/01-<mac>` and loads the kernel and
//!   initramfs it names, all over our TFTP.
//! - UEFI (OVMF): the ROM's iPXE gets the master `boot.ipxe` URL and chains the node's script
//!   by MAC over our HTTP, for the deploy and the instance's first boot; then the test answers
//!   the node as a plain PXE ROM and the reboot goes through GRUB's network image, which reads
//!   `grub.cfg-01-<mac>` and the instance's kernel and initramfs over our TFTP.
//!
//! The test reads our TFTP server's own log of what it sent, and dnsmasq's of the boot files it
//! named.
//!
//! The deploy kernel and initramfs are the deploy ISO's (`netboot.deploy_kernel`/
//! `deploy_ramdisk`), with the iSCSI deploy's parameters on the kernel command line. The ramdisk
//! takes a DHCP lease, serves its disk over iSCSI and calls `pass_deploy_info`; the conductor
//! logs in to the node's own address, writes the image, sends `done`, puts the test OS's kernel
//! and ramdisk in the boot root with `root=UUID=<written root>`, makes the network the
//! persistent boot device and power-cycles the node, which boots the test OS from the network:
//! `VMDEPLOY-TEST-OS booted root=<uuid of the file system it mounted>`.
//!
//! Also here, because they need the Standard-licence lab and no boot of their own: an
//! `iscsi_ilo` node on the same iLO fails validation with a message naming `pxe_ilo`; an
//! aborted deploy (in `wait call-back`, the deploy entry on disk) leaves no boot file behind;
//! and after tear-down the node's files are gone.

use std::time::Duration;

use serde_json::Value;
use vmdeploy_integration_tests::e2e::{partition_media, Firmware, Lab, LabOptions, NetbootLoader};
use vmdeploy_integration_tests::test_image::{self, TestImage};
use vmdeploy_integration_tests::tools::tool_ok;

/// The deploy ramdisk over iPXE/HTTP, the iSCSI write and the final boot under TCG.
const DEPLOY_LIMIT: Duration = Duration::from_secs(480);
/// The test OS's kernel from the network after a power-on.
const OS_BOOT_LIMIT: Duration = Duration::from_secs(240);
/// API-only steps.
const STEP_LIMIT: Duration = Duration::from_secs(120);

/// The names each loader looks the node's configuration up by, for `mac` (`aa:bb:..`).
fn mac_names(mac: &str) -> [String; 3] {
    let mac = mac.replace(':', "-");
    [
        format!("grub.cfg-01-{mac}"),
        format!("pxelinux.cfg/01-{mac}"),
        format!("pxelinux.cfg/{mac}"),
    ]
}

/// Our TFTP server's log lines of the transfers it finished, in order.
fn tftp_done_lines(lab: &Lab) -> Vec<String> {
    lab.conductor_log()
        .lines()
        .filter(|l| l.contains("tftp: transfer done"))
        .map(str::to_owned)
        .collect()
}

/// The files our TFTP server says it sent in full (`tftp: transfer done ... file=NAME`), in
/// order.
fn tftp_sent(lab: &Lab) -> Vec<String> {
    tftp_done_lines(lab)
        .iter()
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("file="))
                .map(|f| f.trim_start_matches('/').to_owned())
        })
        .collect()
}

/// The files of `wanted` that our TFTP server has not sent (yet).
fn not_sent(lab: &Lab, wanted: &[&str]) -> Vec<String> {
    let sent = tftp_sent(lab);
    wanted
        .iter()
        .filter(|w| !sent.iter().any(|s| s == *w))
        .map(|w| (*w).to_owned())
        .collect()
}

fn read_root(lab: &Lab, rel: &str) -> String {
    std::fs::read_to_string(lab.boot_root().join(rel))
        .unwrap_or_else(|e| panic!("reading {rel} in the boot root: {e}"))
}

fn pxe_deploy(firmware: Firmware, loader: NetbootLoader, name: &str) {
    let image: TestImage = test_image::ensure();
    let lab = Lab::start(
        name,
        LabOptions {
            media: partition_media(&image),
            netboot: Some(loader),
            ..Default::default()
        },
    );
    let node = lab.enroll("e2e-pxe", "pxe_ilo", firmware);
    lab.set_partition_image(&node, &image);
    let mac = lab.node_mac();
    let [grub, pxelinux, ipxe] = mac_names(&mac);

    // An iscsi_ilo node on this Standard-licence iLO is refused at validate, naming pxe_ilo.
    let other = lab.create_node("e2e-iscsi-standard", "iscsi_ilo", firmware);
    lab.set_partition_image(&other, &image);
    let validate = lab.bm(&["node", "validate", &other, "-f", "json"]);
    let rows: Value = serde_json::from_str(&validate).expect("validate JSON");
    let deploy_row = rows
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["Interface"] == "deploy"))
        .unwrap_or_else(|| panic!("no deploy row: {validate}"));
    assert_eq!(deploy_row["Result"], false, "{validate}");
    let reason = deploy_row["Reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("Advanced licence") && reason.contains("pxe_ilo"),
        "{reason}"
    );
    lab.bm(&["node", "delete", &other]);

    // Deploy, then abort in wait call-back: the deploy entry is on disk, then gone.
    lab.bm(&["node", "deploy", &node]);
    lab.wait_state(&node, "wait call-back", STEP_LIMIT);
    let files = lab.netboot_files(&node);
    for expected in [&grub, &pxelinux, &ipxe] {
        assert!(files.contains(expected), "{expected} missing: {files:?}");
    }
    for expected in [
        "deploy_kernel",
        "deploy_ramdisk",
        "config",
        "grub.cfg",
        "boot.ipxe",
    ] {
        let rel = format!("{node}/{expected}");
        assert!(files.contains(&rel), "{rel} missing: {files:?}");
    }
    let script = read_root(&lab, &ipxe);
    assert!(script.contains("deployment_key="), "{script}");
    assert!(
        script.contains(&format!("deployment_id={node}")),
        "{script}"
    );
    assert!(script.contains("ipa-driver-name=pxe_ilo"), "{script}");
    assert!(!script.contains("boot_method=vmedia"), "{script}");
    let pxelinux_cfg = read_root(&lab, &pxelinux);
    assert!(
        pxelinux_cfg.contains(&format!("kernel {node}/deploy_kernel")),
        "{pxelinux_cfg}"
    );
    // The conductor's TFTP serves the same files, by the names the loaders ask for.
    let net = lab.net.as_ref().expect("a provisioning network");
    let fetched = tool_ok(
        "curl",
        "curl",
        &[
            "-sS",
            "--max-time",
            "20",
            &format!("tftp://{}/{pxelinux}", net.server_ip),
        ],
    );
    assert_eq!(fetched, pxelinux_cfg, "TFTP {pxelinux}");
    lab.bm(&["node", "abort", &node]);
    let shown = lab.wait_state(&node, "deploy failed", STEP_LIMIT);
    assert_eq!(
        lab.netboot_files(&node),
        Vec::<String>::new(),
        "after abort"
    );
    assert!(
        shown["driver_internal_info"]
            .get("deployment_key")
            .is_none(),
        "the key is wiped: {shown}"
    );

    // The real deploy.
    let marker = image.marker(&image.part_root_uuid);
    lab.deploy_to_netboot(&node, DEPLOY_LIMIT);
    lab.wait_console(&marker, 1, OS_BOOT_LIMIT);
    let state = lab.emulator_state();
    assert_eq!(state["power"], "ON", "{state}");
    assert_eq!(state["persistent_boot"][0], "NETWORK", "{state}");
    assert_eq!(state["vmedia"]["CDROM"]["inserted"], false, "{state}");
    assert_eq!(
        state["machine"]["firmware"],
        firmware.emulator_name(),
        "{state}"
    );
    // The instance's entry: its own kernel and ramdisk, the written root, no deploy key.
    let files = lab.netboot_files(&node);
    assert!(files.contains(&format!("{node}/kernel")), "{files:?}");
    assert!(
        !files.contains(&format!("{node}/deploy_kernel")),
        "{files:?}"
    );
    let script = read_root(&lab, &ipxe);
    assert!(
        script.contains(&format!("root=UUID={}", image.part_root_uuid)),
        "{script}"
    );
    assert!(!script.contains("deployment_key"), "{script}");

    let node_kernel = format!("{node}/kernel");
    let node_ramdisk = format!("{node}/ramdisk");
    let boot_files = net.boot_files_sent(&mac);
    match loader {
        NetbootLoader::PxeRom => {
            // BIOS: every file of both boots came from our TFTP server, found by PXELINUX.
            assert!(
                boot_files.iter().all(|f| f == "pxelinux.0"),
                "dnsmasq named {boot_files:?}"
            );
            let missing = not_sent(
                &lab,
                &[
                    "pxelinux.0",
                    "ldlinux.c32",
                    &pxelinux,
                    &format!("{node}/deploy_kernel"),
                    &format!("{node}/deploy_ramdisk"),
                    &node_kernel,
                    &node_ramdisk,
                ],
            );
            assert!(missing.is_empty(), "not sent over TFTP: {missing:?}");
        }
        NetbootLoader::Ipxe => {
            // UEFI through iPXE: the master script's URL, then everything over our HTTP.
            let url = format!(
                "http://{}:{}/boot.ipxe",
                net.server_ip,
                lab.netboot_http_port.expect("an HTTP port")
            );
            assert!(
                !boot_files.is_empty() && boot_files.iter().all(|f| *f == url),
                "dnsmasq named {boot_files:?}, not only {url}"
            );
            // Over TFTP only the test's own fetch so far; the node's files went over HTTP.
            let sent = tftp_sent(&lab);
            assert!(sent.iter().all(|f| *f == pxelinux), "TFTP sent {sent:?}");
            let log = lab.conductor_log();
            let served = |path: &str| {
                log.lines().any(|l| {
                    l.contains("netboot HTTP: serving") && l.contains(&format!("path=/{path} "))
                })
            };
            for path in [
                "boot.ipxe".to_owned(),
                ipxe.clone(),
                format!("{node}/deploy_kernel"),
                format!("{node}/deploy_ramdisk"),
                node_kernel.clone(),
                node_ramdisk.clone(),
            ] {
                assert!(served(&path), "HTTP did not serve /{path}");
            }
        }
    }

    // UEFI: a reboot through the API boots the instance from the network again, now as from a
    // plain PXE ROM: GRUB's network image over our TFTP. (The BIOS node would only repeat its
    // PXELINUX boot: it skips the reboot, one TCG boot less in the test command.)
    if loader == NetbootLoader::Ipxe {
        lab.boot_as_pxe_rom();
        lab.bm(&["node", "reboot", &node]);
        lab.wait_console(&marker, 2, OS_BOOT_LIMIT);
        assert_eq!(
            net.boot_files_sent(&mac).last().map(String::as_str),
            Some("grubnetx64.efi"),
            "{}",
            net.dnsmasq_log()
        );
        let missing = not_sent(
            &lab,
            &["grubnetx64.efi", &grub, &node_kernel, &node_ramdisk],
        );
        assert!(missing.is_empty(), "not sent over TFTP: {missing:?}");
    }

    // What our TFTP server sent, for the log (a slow loader shows here first).
    for line in tftp_done_lines(&lab) {
        let fields: Vec<&str> = line
            .split_whitespace()
            .filter(|w| {
                ["file=", "bytes=", "blksize=", "elapsed_ms="]
                    .iter()
                    .any(|k| w.starts_with(k))
            })
            .collect();
        eprintln!("tftp sent: {}", fields.join(" "));
    }

    // Tear-down: powered off, every boot file gone.
    lab.bm(&["node", "undeploy", &node]);
    lab.wait_state(&node, "available", STEP_LIMIT);
    assert_eq!(
        lab.netboot_files(&node),
        Vec::<String>::new(),
        "after undeploy"
    );
    assert_eq!(lab.emulator_state()["power"], "OFF");
}

#[test]
fn pxe_ilo_deploys_the_partition_test_os_and_it_netboots_in_bios_through_pxelinux() {
    pxe_deploy(Firmware::Bios, NetbootLoader::PxeRom, "pxe_ilo_bios");
}

#[test]
fn pxe_ilo_deploys_the_partition_test_os_and_it_netboots_in_uefi_through_ipxe_then_grub() {
    pxe_deploy(Firmware::Uefi, NetbootLoader::Ipxe, "pxe_ilo_uefi");
}
