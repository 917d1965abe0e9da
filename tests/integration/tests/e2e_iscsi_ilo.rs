//! End to end, `iscsi_ilo`: the `baremetal` CLI deploys the project's test OS as a partition
//! image onto a QEMU node behind the emulated iLO, through `vmdeploy-conductor serve`, and the
//! node netboots it from the boot ISO the conductor builds.
//!
//! The node boots our deploy ISO from virtual media; the agent serves its virtio disk over iSCSI
//! and calls `pass_deploy_info`; the conductor (through the emulator's host forwards to the
//! guest's 3260 and 10000) writes the partition table, the root file system image and swap,
//! reads the root UUID back, sends `done`, builds a boot ISO with the test OS's kernel and
//! ramdisk and `root=UUID=<that uuid>`, attaches it as the CD, makes the CD the persistent boot
//! device and powers the node on. The test OS prints
//! `VMDEPLOY-TEST-OS booted root=<uuid of the file system it mounted>`: the partition image's
//! UUID, read from the disk the conductor wrote. `baremetal node reboot` then boots it again
//! from the re-attached ISO (a fresh temp URL): the marker shows twice.
//!
//! One QEMU at a time (the `vm` test group); a failing test leaves the node's console and the
//! logs in `target/e2e-artifacts/<test>/`.

use std::time::Duration;

use vmdeploy_integration_tests::e2e::{checks, partition_media, Firmware, Lab, LabOptions};
use vmdeploy_integration_tests::test_image::{self, TestImage};

/// Deploy ISO boot, the iSCSI write, the boot ISO build and the final boot under TCG.
const DEPLOY_LIMIT: Duration = Duration::from_secs(420);
/// The boot ISO's loader and the test OS's kernel after a power-on.
const OS_BOOT_LIMIT: Duration = Duration::from_secs(180);

/// `watched`: with debug logging on everywhere, no secret the deploy and the reboot issued
/// shows in a log, an API response or a state file.
/// `profile`: the emulator's firmware profile, if not its default.
fn netboot_deploy_and_reboot(
    firmware: Firmware,
    name: &str,
    watched: bool,
    profile: Option<&'static str>,
) {
    let image: TestImage = test_image::ensure();
    let lab = Lab::start(
        name,
        LabOptions {
            media: partition_media(&image),
            debug_logging: watched,
            profile,
            ..Default::default()
        },
    );
    let node = lab.enroll("e2e-iscsi", "iscsi_ilo", firmware);
    lab.set_partition_image(&node, &image);
    let marker = image.marker(&image.part_root_uuid);
    let watch = watched.then(|| lab.watch_secrets(&node));

    lab.deploy_to_netboot(&node, DEPLOY_LIMIT);
    lab.wait_console(&marker, 1, OS_BOOT_LIMIT);
    let state = lab.emulator_state();
    assert_eq!(state["power"], "ON", "{state}");
    assert_eq!(state["persistent_boot"][0], "CDROM", "{state}");
    assert_eq!(
        state["vmedia"]["CDROM"]["inserted"], true,
        "the boot ISO: {state}"
    );
    assert_eq!(state["vmedia"]["FLOPPY"]["inserted"], false, "{state}");
    let first_url = state["vmedia"]["CDROM"]["url"].clone();
    let shown = lab.show(&node);
    assert_eq!(
        shown["driver_internal_info"]["bmc_protocol"]["protocol"], "ribcl",
        "an iLO 4 is driven over RIBCL: {shown}"
    );
    assert_eq!(
        state["machine"]["firmware"],
        firmware.emulator_name(),
        "{state}"
    );

    // A reboot through the API attaches the boot ISO again, with a fresh temp URL.
    lab.bm(&["node", "reboot", &node]);
    lab.wait_console(&marker, 2, OS_BOOT_LIMIT);
    let state = lab.emulator_state();
    assert_eq!(state["vmedia"]["CDROM"]["inserted"], true, "{state}");
    assert_ne!(
        state["vmedia"]["CDROM"]["url"], first_url,
        "the reboot re-attached the ISO with a fresh temp URL"
    );
    assert_eq!(lab.show(&node)["provision_state"], "active");
    if let Some(watch) = watch {
        let mut issued = watch.finish();
        // The boot ISO URLs the emulator reported, in case a poll fell between two.
        for url in [&first_url, &state["vmedia"]["CDROM"]["url"]] {
            issued.add_signatures_of(url.as_str().unwrap_or_default());
        }
        assert!(
            issued.floppies_read > 0 && !issued.deploy_keys.is_empty(),
            "the watch saw no floppy and no deploy key: {} media URL(s), {} floppies",
            issued.media_urls.len(),
            issued.floppies_read
        );
        assert!(
            issued.signatures.len() >= 3,
            "the floppy's and both boot ISOs' signatures: {}",
            issued.signatures.len()
        );
        checks::assert_no_secret_leaked(&lab, &node, &issued);
    }
}

/// The BMC answers as a Gen8's iLO 4 2.10: RIBCL only, no Redfish.
#[test]
fn iscsi_ilo_deploys_the_partition_test_os_and_it_netboots_twice_in_bios() {
    netboot_deploy_and_reboot(
        Firmware::Bios,
        "iscsi_ilo_netboot_bios",
        true,
        Some("ilo4-gen8-ribcl"),
    );
}

#[test]
fn iscsi_ilo_deploys_the_partition_test_os_and_it_netboots_twice_in_uefi() {
    netboot_deploy_and_reboot(Firmware::Uefi, "iscsi_ilo_netboot_uefi", false, None);
}
