//! End to end, `agent_ilo`: the `baremetal` CLI deploys the project's test OS onto a QEMU node
//! behind the emulated iLO, through `vmdeploy-conductor serve` (issue 13, tests 1 and 2).
//!
//! The node boots our deploy ISO from virtual media, the agent streams the whole-disk image
//! from the media server (through the node's only way out, a guest forward) onto its virtio
//! disk, the conductor powers it off, makes the disk the persistent boot device and powers it
//! on; GRUB (SeaBIOS or OVMF) boots the test OS, whose `/init` prints
//! `VMDEPLOY-TEST-OS booted root=<uuid of the file system it mounted>` on the serial console.
//! The UUID must be the one the image was built with: the right disk booted, not a stale one.
//!
//! One QEMU at a time (the `heavy` test group); a failing test leaves the node's console and the
//! logs in `target/e2e-artifacts/<test>/`.

use std::time::Duration;

use serde_json::Value;
use vmdeploy_integration_tests::e2e::{Firmware, Lab, LabOptions};
use vmdeploy_integration_tests::test_image::{self, TestImage};

/// Deploy ISO boot, image write and the final boot under TCG on a busy 2-core machine.
const DEPLOY_LIMIT: Duration = Duration::from_secs(420);
/// GRUB and the test OS's kernel after the final power-on.
const OS_BOOT_LIMIT: Duration = Duration::from_secs(180);

fn read(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// `image_source`, format and checksum fields for `path` on the lab's media server.
fn set_image(lab: &Lab, node: &str, media_path: &str, format: &str, sha256: &str) {
    lab.bm(&[
        "node",
        "set",
        node,
        "--instance-info",
        &format!("image_source={}", lab.guest_media_url(media_path)),
        "--instance-info",
        &format!("image_disk_format={format}"),
        "--instance-info",
        "image_os_hash_algo=sha256",
        "--instance-info",
        &format!("image_os_hash_value={sha256}"),
    ]);
}

/// After an `agent_ilo` deploy: `active`, the node on, booting from its disk, both media out.
fn assert_deployed(lab: &Lab, node: &Value) {
    assert_eq!(node["provision_state"], "active");
    assert_eq!(node["last_error"], Value::Null, "{node}");
    let state = lab.emulator_state();
    assert_eq!(state["power"], "ON", "{state}");
    assert_eq!(state["persistent_boot"][0], "HDD", "{state}");
    for device in ["CDROM", "FLOPPY"] {
        assert_eq!(
            state["vmedia"][device]["inserted"], false,
            "{device}: {state}"
        );
    }
}

fn deploy_and_boot(firmware: Firmware, qcow2: bool, name: &str) {
    let image: TestImage = test_image::ensure();
    let (file, format, sha) = if qcow2 {
        (&image.disk_qcow2, "qcow2", image.disk_qcow2_sha256.clone())
    } else {
        (&image.disk_raw, "raw", image.disk_sha256.clone())
    };
    let media_path = format!("/test-os.{format}");
    let lab = Lab::start(
        name,
        LabOptions {
            media: vec![(media_path.clone(), read(file))],
            ..Default::default()
        },
    );
    let node = lab.enroll("e2e-node", "agent_ilo", firmware);
    set_image(&lab, &node, &media_path, format, &sha);
    let marker = image.marker(&image.disk_root_uuid);
    assert_eq!(
        lab.console_count(&marker),
        0,
        "the marker before the deploy"
    );

    lab.bm(&["node", "deploy", &node]);
    let shown = lab.wait_state(&node, "active", DEPLOY_LIMIT);
    assert_deployed(&lab, &shown);
    lab.wait_console(&marker, 1, OS_BOOT_LIMIT);
    let machine = lab.emulator_state()["machine"].clone();
    let expected_firmware = match firmware {
        Firmware::Bios => "SeaBIOS",
        Firmware::Uefi => "OVMF",
    };
    assert_eq!(machine["firmware"], expected_firmware, "{machine}");
    // The agent's progress reached the conductor on the way.
    let progress = &shown["driver_internal_info"]["deploy_progress"];
    assert!(
        progress["written"].as_u64().is_some_and(|w| w > 0),
        "deploy_progress in driver_internal_info: {shown}"
    );
}

#[test]
fn agent_ilo_deploys_the_raw_test_os_and_it_boots_in_bios() {
    deploy_and_boot(Firmware::Bios, false, "agent_ilo_raw_bios");
}

#[test]
fn agent_ilo_deploys_the_qcow2_test_os_and_it_boots_in_uefi() {
    deploy_and_boot(Firmware::Uefi, true, "agent_ilo_qcow2_uefi");
}
