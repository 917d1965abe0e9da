//! End to end, `pxe_ilo`: the `baremetal` CLI deploys the project's test OS as a
//! partition image onto a QEMU node whose emulated iLO has only a Standard licence (no virtual
//! media), through `vmdeploy-conductor serve` with its network boot service on.
//!
//! The node's NIC keeps QEMU's iPXE option ROM, and slirp's built-in DHCP hands it a boot file:
//! - UEFI (OVMF), through iPXE: the URL of the conductor's master iPXE script, reached through a
//!   guest forward; it chains the node's script by MAC, which fetches the deploy kernel and
//!   initramfs over the conductor's HTTP;
//! - BIOS (SeaBIOS), through PXELINUX: `pxelinux.0`, which iPXE fetches from slirp's own TFTP
//!   server serving the conductor's boot root (slirp cannot forward UDP to the conductor's TFTP
//!   server; the test fetches the node's file from that one itself); PXELINUX reads the node's
//!   `pxelinux.cfg/01-<mac>` and loads the kernel and initramfs it names.
//!
//! The deploy kernel and initramfs are the deploy ISO's (`netboot.deploy_kernel`/
//! `deploy_ramdisk`), with the iSCSI deploy's parameters on the kernel command line. The ramdisk
//! serves its disk over iSCSI and calls `pass_deploy_info`; the conductor writes the image,
//! sends `done`, puts the test OS's kernel and ramdisk in the boot root with
//! `root=UUID=<written root>`, makes the network the persistent boot device and power-cycles
//! the node, which boots the test OS from the network the same way:
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

fn mac_names(lab: &Lab) -> [String; 3] {
    let mac = lab.emulator_state()["machine"]["mac"]
        .as_str()
        .expect("the emulator names the node's MAC")
        .to_lowercase()
        .replace(':', "-");
    [
        format!("grub.cfg-01-{mac}"),
        format!("pxelinux.cfg/01-{mac}"),
        format!("pxelinux.cfg/{mac}"),
    ]
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
    let [grub, pxelinux, ipxe] = mac_names(&lab);

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
    let tftp = lab.netboot_tftp_port.expect("a TFTP port");
    let fetched = tool_ok(
        "curl",
        "curl",
        &[
            "-sS",
            "--max-time",
            "20",
            &format!("tftp://127.0.0.1:{tftp}/{pxelinux}"),
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

    // A reboot through the API boots the instance from the network again.
    lab.bm(&["node", "reboot", &node]);
    lab.wait_console(&marker, 2, OS_BOOT_LIMIT);

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
    pxe_deploy(Firmware::Bios, NetbootLoader::Pxelinux, "pxe_ilo_bios");
}

#[test]
fn pxe_ilo_deploys_the_partition_test_os_and_it_netboots_in_uefi_through_ipxe() {
    pxe_deploy(Firmware::Uefi, NetbootLoader::Ipxe, "pxe_ilo_uefi");
}
