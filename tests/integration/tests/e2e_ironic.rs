//! End to end with upstream OpenStack Ironic 39 as the conductor and our agent as its deploy
//! ramdisk: Ironic, standalone from the setup's venv, drives the emulated iLO 5 over
//! Redfish (`redfish` hardware type, `redfish-virtual-media` boot, `direct` deploy) with its
//! defaults, `[agent] require_tls = true` among them. It builds its own virtual-media ISO
//! around our Debian kernel and initramfs, with every parameter on the kernel command line and
//! no floppy; our agent looks the node up, heartbeats over TLS, runs the deploy steps Ironic
//! asks for, and the test OS boots from the node's disk.
//!
//! - Whole-disk image (BIOS): first an image that changes under its URL after Ironic checked
//!   it, which our agent's own checksum catches (`deploy failed` with the agent's reason in the node's history,
//!   nothing bootable left); then the image as it should be: `active`, the test OS's marker
//!   with the image's root UUID on the console; then undeploy with automated cleaning (`erase_devices_metadata`) → `available`,
//!   nothing left on the disk for `blkid` to find.
//! - Partition image with local boot (UEFI): the agent lays the partitions out, writes the root
//!   file system and, on Ironic's `image.install_bootloader`, a boot loader on the EFI system
//!   partition; the test OS boots from the disk with the partition image's root UUID.
//!
//! One QEMU at a time (the `vm` test group); a failing test leaves the node's console and
//! the logs (Ironic's among them, as `conductor.log`) in `target/e2e-artifacts/<test>/`.

use std::time::Duration;

use serde_json::Value;
use vmdeploy_integration_tests::e2e::{checks, Firmware, Lab, LabOptions, Peer};
use vmdeploy_integration_tests::test_image::{self, TestImage};

/// Ironic's ISO build, the ramdisk's boot, the image write and Ironic's reboot, under TCG on a
/// busy 2-core machine.
const DEPLOY_LIMIT: Duration = Duration::from_secs(540);
/// GRUB and the test OS's kernel after the final power-on.
const OS_BOOT_LIMIT: Duration = Duration::from_secs(180);
/// Cleaning: the ramdisk's boot and `erase_devices_metadata`.
const CLEAN_LIMIT: Duration = Duration::from_secs(420);

fn ironic_lab(name: &str) -> Lab {
    Lab::start(
        name,
        LabOptions {
            peer: Peer::Ironic,
            callback_timeout_secs: 900,
            ..LabOptions::default()
        },
    )
}

/// After a deploy: `active` without an error, the agent's callback and token wiped by Ironic
/// (it does so once the agent is done), the node on with both media out.
fn assert_deployed(lab: &Lab, node: &Value) {
    assert_eq!(node["provision_state"], "active", "{node}");
    assert_eq!(node["last_error"], Value::Null, "{node}");
    let internal = &node["driver_internal_info"];
    assert!(
        internal.get("agent_url").is_none_or(Value::is_null),
        "Ironic keeps the agent's URL after the deploy: {internal}"
    );
    let state = lab.emulator_state();
    assert_eq!(state["power"], "ON", "{state}");
    assert_eq!(
        state["vmedia"]["CDROM"]["inserted"], false,
        "Ironic ejects its ISO: {state}"
    );
}

#[test]
fn ironic_39_deploys_a_whole_disk_image_with_our_agent_and_cleans_it_away() {
    let image: TestImage = test_image::ensure();
    let lab = ironic_lab("ironic_whole_disk");
    let node = lab.enroll_redfish("ironic-wd", Firmware::Bios);
    let disk = lab.publish("test-os.raw", &image.disk_raw);
    assert_eq!(disk.sha256, image.disk_sha256, "the published image");

    // First a bad image. It changes under its URL after Ironic read and checked it (Ironic 39
    // checks a checksum itself; with `image_download_source=http` the agent fetches the image
    // again): the agent's own check fails the deploy, Ironic records the agent's reason, and
    // the disk is left with nothing to boot.
    lab.set_ironic_whole_disk_image(&node, &disk, "http");
    lab.bm(&["node", "deploy", &node]);
    lab.wait_state(&node, "wait call-back", DEPLOY_LIMIT);
    let mut changed = std::fs::read(&image.disk_raw).expect("reading the test image");
    let middle = changed.len() / 2;
    changed[middle..middle + 4096]
        .iter_mut()
        .for_each(|b| *b ^= 0x5a);
    let changed_path = lab.dir().join("changed.raw");
    std::fs::write(&changed_path, &changed).expect("writing the changed image");
    assert_ne!(
        lab.publish("test-os.raw", &changed_path).sha256,
        disk.sha256
    );
    lab.wait_state(&node, "deploy failed", DEPLOY_LIMIT);
    let errors = lab.history_errors(&node);
    let says = [
        "image checksum mismatch",
        disk.sha256.as_str(),
        "first MiB of the disk was zeroed",
    ];
    assert!(
        errors.iter().any(|e| says.iter().all(|s| e.contains(s))),
        "no error event of the node says {says:?}: {errors:#?}"
    );
    checks::assert_nothing_bootable(&lab, "a failed image write");

    // The good image again, fetched and served by Ironic: a deploy from `deploy failed`.
    assert_eq!(
        lab.publish("test-os.raw", &image.disk_raw).sha256,
        disk.sha256
    );
    lab.set_ironic_whole_disk_image(&node, &disk, "local");
    lab.bm(&["node", "deploy", &node]);
    let shown = lab.wait_state(&node, "active", DEPLOY_LIMIT);
    assert_deployed(&lab, &shown);
    lab.wait_console(&image.marker(&image.disk_root_uuid), 1, OS_BOOT_LIMIT);
    // The deploy logs Ironic collected from our agent (`deploy_logs_collect = always`).
    let logs = lab.ironic_deploy_logs();
    assert!(
        !logs.is_empty(),
        "Ironic stored no deploy logs from the agent's log.collect_system_logs"
    );

    // Undeploy with automated cleaning: the ramdisk boots again and erases the metadata.
    lab.bm(&["node", "set", &node, "--automated-clean"]);
    lab.bm(&["node", "undeploy", &node]);
    let shown = lab.wait_state(&node, "available", DEPLOY_LIMIT + CLEAN_LIMIT);
    assert_eq!(shown["last_error"], Value::Null, "{shown}");
    // Ironic powers the node off at the end of cleaning; the emulator reads a guest power-off
    // at once.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while lab.emulator_state()["power"] != "OFF" {
        assert!(
            std::time::Instant::now() < deadline,
            "the node is still on 60 s after cleaning"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    checks::assert_metadata_erased(&lab, &image);
}

#[test]
fn ironic_39_deploys_a_partition_image_with_local_boot_in_uefi() {
    let image: TestImage = test_image::ensure();
    let lab = ironic_lab("ironic_partition_uefi");
    let node = lab.enroll_redfish("ironic-part", Firmware::Uefi);
    let root = lab.publish("test-os-root.img", &image.part_image);
    let kernel = lab.publish("test-os.kernel", &image.kernel);
    let ramdisk = lab.publish("test-os.ramdisk", &image.ramdisk);
    lab.bm(&[
        "node",
        "set",
        &node,
        "--instance-info",
        &format!("image_source={}", root.url),
        "--instance-info",
        &format!("kernel={}", kernel.url),
        "--instance-info",
        &format!("ramdisk={}", ramdisk.url),
        "--instance-info",
        "image_type=partition",
        "--instance-info",
        "image_disk_format=raw",
        "--instance-info",
        "root_gb=1",
        "--instance-info",
        "image_os_hash_algo=sha256",
        "--instance-info",
        &format!("image_os_hash_value={}", root.sha256),
    ]);
    lab.bm(&["node", "deploy", &node]);
    let shown = lab.wait_state(&node, "active", DEPLOY_LIMIT);
    assert_deployed(&lab, &shown);
    assert_eq!(
        shown["driver_internal_info"]["is_whole_disk_image"], false,
        "{shown}"
    );
    lab.wait_console(&image.marker(&image.part_root_uuid), 1, OS_BOOT_LIMIT);
}
