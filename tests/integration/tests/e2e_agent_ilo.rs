//! End to end, `agent_ilo`: the `baremetal` CLI deploys the project's test OS onto a QEMU node
//! behind the emulated iLO, through `vmdeploy-conductor serve`.
//!
//! The node boots our deploy ISO from virtual media, the agent streams the whole-disk image
//! from the media server (through the node's only way out, a guest forward) onto its virtio
//! disk, the conductor powers it off, makes the disk the persistent boot device and powers it
//! on; GRUB (SeaBIOS or OVMF) boots the test OS, whose `/init` prints
//! `VMDEPLOY-TEST-OS booted root=<uuid of the file system it mounted>` on the serial console.
//! The UUID must be the one the image was built with: the right disk booted, not a stale one.
//! The BIOS node is then undeployed with automated cleaning on: the agent boots again and
//! erases the disk's partition metadata (`erase_devices_metadata`), the node is `available`
//! with nothing left for `blkid` to find on the disk, and it deploys and boots again. The UEFI
//! node asks for Secure Boot: a deploy ISO with our unsigned GRUB is refused by OVMF's Secure
//! Boot firmware and fails at the callback timeout with the refusal from the iLO's IML in
//! `last_error`; then the signed deploy ISO deploys the test OS, which boots locked down. After
//! the UEFI deploy, a `redfish` node enrolled on the same server with Ironic's `redfish_*` keys
//! is managed, provided, validated and its power read.
//!
//! One QEMU at a time (the `vm` test group); a failing test leaves the node's console and the
//! logs in `target/e2e-artifacts/<test>/`.

use std::time::Duration;

use serde_json::Value;
use vmdeploy_integration_tests::e2e::{checks, Firmware, Lab, LabOptions, ILO_PASSWORD, ILO_USER};
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
    lab.set_whole_disk_image(node, &lab.guest_media_url(media_path), format, sha256, &[]);
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

/// A second node on the same emulated server, enrolled as a user of Ironic's `redfish`
/// hardware type would: `--driver redfish` with only Ironic's `redfish_*` keys (the address a
/// URL, the system by its path, the CA file as `redfish_verify_ca`). It is managed (its
/// credentials checked over Redfish), provided, validated and its power read, with no boot of
/// its own: the server is the deployed node's, on.
fn enroll_a_redfish_node_beside(lab: &Lab) {
    let driver_info = [
        format!("redfish_address=https://{}", lab.ilo),
        "redfish_system_id=/redfish/v1/Systems/1".to_owned(),
        format!("redfish_username={ILO_USER}"),
        format!("redfish_password={ILO_PASSWORD}"),
        format!("redfish_verify_ca={}", lab.ilo_cert.display()),
    ];
    let mut args = vec![
        "node",
        "create",
        "--driver",
        "redfish",
        "--name",
        "e2e-redfish",
    ];
    for info in &driver_info {
        args.extend(["--driver-info", info.as_str()]);
    }
    args.extend(["-f", "value", "-c", "uuid"]);
    let node = lab.bm(&args).trim().to_owned();
    assert_eq!(lab.show(&node)["provision_state"], "enroll");

    lab.bm(&["node", "manage", &node, "--wait", "180"]);
    let shown = lab.show(&node);
    assert_eq!(shown["provision_state"], "manageable", "{shown}");
    assert_eq!(shown["last_error"], Value::Null, "{shown}");
    lab.bm(&["node", "provide", &node, "--wait", "180"]);
    let shown = lab.show(&node);
    assert_eq!(shown["provision_state"], "available", "{shown}");
    assert_eq!(shown["power_state"], "power on", "{shown}");

    let validate = lab.bm(&["node", "validate", &node, "-f", "json"]);
    let rows: Value = serde_json::from_str(&validate).expect("validate JSON");
    for interface in ["power", "management"] {
        let row = rows
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["Interface"] == interface))
            .unwrap_or_else(|| panic!("no {interface} row: {validate}"));
        assert_eq!(row["Result"], true, "{interface}: {validate}");
    }
    // A power read through the API, then the node goes again.
    let power = lab.bm(&["node", "show", &node, "-f", "value", "-c", "power_state"]);
    assert_eq!(power.trim(), "power on");
    lab.bm(&["node", "delete", &node]);
}

/// The most a deploy boot may read from the virtual CD on a node with igb and megasas (issue
/// 29): the boot files and the two drivers, not the driver pack.
const MAX_CD_READ: u64 = 16 << 20;

/// On the igb + megasas node: the agent loaded both drivers from the CD's pack (its console
/// says so), the node read at most [`MAX_CD_READ`] of the CD, and the ISO is larger than that
/// (so the figure means the pack was not read whole).
fn assert_drivers_came_from_the_cd(lab: &Lab, machine: &Value) {
    for module in ["igb", "megaraid_sas"] {
        let line = format!("module={module} outcome=loaded");
        assert!(
            lab.console_count(&line) >= 1,
            "the agent's console shows no `{line}` from the driver pack"
        );
    }
    assert_eq!(
        lab.console_count("no driver on the deploy media drives it"),
        0,
        "a NIC or disk controller was left undriven"
    );
    let read = machine["media"]["CDROM"]["read_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("the emulator counts no CD reads: {machine}"));
    let iso = std::fs::metadata(vmdeploy_integration_tests::deploy_iso::deploy_iso())
        .expect("the deploy ISO")
        .len();
    eprintln!(
        "bytes read from the virtual CD in the deploy boot: {read} ({:.1} MiB) of a {:.1} MiB ISO",
        read as f64 / f64::from(1 << 20),
        iso as f64 / f64::from(1 << 20)
    );
    assert!(read > 0, "no CD read counted: {machine}");
    assert!(
        read <= MAX_CD_READ,
        "the node read {read} bytes from the CD, over {MAX_CD_READ}"
    );
    assert!(
        iso > MAX_CD_READ,
        "the ISO ({iso} bytes) is no larger than the read budget"
    );
}

/// Where the lab's media server serves the deploy ISO built without the signed chain.
const UNSIGNED_ISO: &str = "/unsigned-deploy.iso";
/// `deploy_callback_timeout` of the Secure Boot lab: the unsigned ISO's deploy waits it out,
/// and the signed one's first heartbeat (OVMF's Secure Boot firmware, shim, GRUB and the agent
/// under TCG) must come within it, so it is short with some room.
const SECURE_BOOT_CALLBACK_TIMEOUT: Duration = Duration::from_secs(135);

/// Before the Secure Boot deploy, the same node with a deploy ISO whose UEFI loader is our own
/// unsigned GRUB: OVMF's Secure Boot firmware refuses it, no ramdisk ever calls back, and at the
/// callback timeout the deploy fails. `last_error` quotes the refusal from the iLO's Integrated
/// Management Log (where the emulator, like an iLO, recorded what the firmware said), and the
/// node is left off with both media ejected. The node's deploy ISO is the signed one again
/// afterwards.
fn an_unsigned_deploy_iso_is_refused(lab: &Lab, node: &str) {
    let unsigned = format!("ilo_deploy_iso={}", lab.media.url(UNSIGNED_ISO));
    lab.bm(&["node", "set", node, "--driver-info", &unsigned]);
    let started = std::time::Instant::now();
    lab.bm(&["node", "deploy", node]);
    let failed = lab.wait_state(
        node,
        "deploy failed",
        SECURE_BOOT_CALLBACK_TIMEOUT + Duration::from_secs(240),
    );
    let error = failed["last_error"].as_str().unwrap_or_default().to_owned();
    eprintln!(
        "unsigned deploy ISO: deploy failed after {:?}: {error}",
        started.elapsed()
    );
    assert!(
        started.elapsed() >= SECURE_BOOT_CALLBACK_TIMEOUT - Duration::from_secs(5),
        "the unsigned ISO's deploy failed before the callback timeout: {error}"
    );
    for said in [
        "Timeout reached while waiting for callback",
        "Integrated Management Log",
        "Secure Boot violation",
        "Access Denied",
    ] {
        assert!(error.contains(said), "last_error lacks {said:?}: {error}");
    }
    assert!(
        lab.console_count("VMDEPLOY") == 0 && lab.console_count("vmdeploy_agent") == 0,
        "something of the unsigned ISO ran under Secure Boot"
    );
    let state = lab.emulator_state();
    assert_eq!(state["power"], "OFF", "the node is left on: {state}");
    for device in ["CDROM", "FLOPPY"] {
        assert_eq!(
            state["vmedia"][device]["inserted"], false,
            "{device} is still inserted: {state}"
        );
    }
    let signed = format!("ilo_deploy_iso={}", lab.media.url("/deploy.iso"));
    lab.bm(&["node", "set", node, "--driver-info", &signed]);
}

/// After a `secure_boot:true` deploy: the conductor turned Secure Boot on (and remembers it
/// did, to turn it off at undeploy), the emulator ran OVMF's Secure Boot firmware, the deploy
/// ramdisk's kernel saw Secure Boot on, and the test OS's kernel booted locked down, which
/// Debian's kernel does only under Secure Boot.
fn assert_booted_under_secure_boot(lab: &Lab, shown: &Value, machine: &Value) {
    assert_eq!(
        shown["driver_internal_info"]["secure_boot_enabled_by_vmdeploy"], true,
        "{shown}"
    );
    let state = lab.emulator_state();
    assert_eq!(state["secure_boot"]["enable"], true, "{state}");
    assert_eq!(state["secure_boot"]["current"], true, "{state}");
    assert_eq!(machine["firmware"], "OVMF (Secure Boot)", "{machine}");
    assert!(
        lab.console_count("secureboot: Secure boot enabled") >= 1,
        "the deploy ramdisk's kernel did not report Secure Boot on"
    );
    // The agent reads the same state (image.install_bootloader acts on it).
    assert!(
        lab.console_count("UEFI Secure Boot: enabled") >= 1,
        "the agent did not see Secure Boot on"
    );
    assert!(
        lab.console_count("VMDEPLOY-TEST-OS lockdown: none [integrity]") >= 1,
        "the test OS's kernel is not locked down: it did not boot under Secure Boot"
    );
}

/// Which checks follow the first deploy.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Then {
    /// With debug logging on everywhere and the image behind a temp URL: no secret the deploy
    /// issued shows in a log, an API response or a state file; then a `redfish` node enrolled
    /// on the same server with Ironic's keys ([`enroll_a_redfish_node_beside`]).
    CheckNoSecretLeakedThenEnrollRedfish,
    /// Undeploy with automated cleaning, then deploy the node again.
    CleanAndDeployAgain,
}

/// `profile`: the emulator's firmware profile and the protocol the conductor's probe must
/// choose for it.
fn deploy_and_boot(
    firmware: Firmware,
    qcow2: bool,
    name: &str,
    then: Then,
    profile: (&'static str, &str),
) {
    let image: TestImage = test_image::ensure();
    let (file, format, sha) = if qcow2 {
        (&image.disk_qcow2, "qcow2", image.disk_qcow2_sha256.clone())
    } else {
        (&image.disk_raw, "raw", image.disk_sha256.clone())
    };
    let watched = then == Then::CheckNoSecretLeakedThenEnrollRedfish;
    // A watched deploy's image is a Swift temp URL, as an operator hands one over: the media
    // server serves it by its whole path, query included.
    let media_path = if watched {
        format!(
            "/test-os.{format}?temp_url_sig={}&temp_url_expires=4102444800",
            test_signature()
        )
    } else {
        format!("/test-os.{format}")
    };
    // The BIOS node is a ProLiant with an HPE 361i (igb) and an MR controller (megaraid_sas)
    // and nothing else: neither driver is in the deploy ISO's initramfs, so the deploy works
    // only if the agent loads them from the CD's driver pack.
    let proliant_adapters = then == Then::CleanAndDeployAgain;
    let secure_boot = firmware == Firmware::Uefi;
    let mut media = vec![(media_path.clone(), read(file))];
    if secure_boot {
        let unsigned = vmdeploy_integration_tests::deploy_iso::unsigned_deploy_iso();
        media.push((UNSIGNED_ISO.to_owned(), read(&unsigned)));
    }
    let lab = Lab::start(
        name,
        LabOptions {
            media,
            // Short enough that the refused unsigned ISO fails within the run; the signed deploy
            // ramdisk heartbeats well within it.
            callback_timeout_secs: if secure_boot {
                SECURE_BOOT_CALLBACK_TIMEOUT.as_secs()
            } else {
                LabOptions::default().callback_timeout_secs
            },
            automated_clean: then == Then::CleanAndDeployAgain,
            debug_logging: watched,
            profile: Some(profile.0),
            nic: if proliant_adapters { "igb" } else { "virtio" },
            disk_controller: if proliant_adapters {
                "megasas"
            } else {
                "virtio"
            },
            ..Default::default()
        },
    );
    let node = lab.enroll("e2e-node", "agent_ilo", firmware);
    // The UEFI node asks for Secure Boot (Ironic's capability): the conductor turns it on
    // through the iLO before the deploy boot, the emulator then runs OVMF's Secure Boot
    // firmware with Microsoft's keys, and only a signed chain boots: shim, Debian's GRUB and
    // kernel, signed modules, in the deploy ISO and in the test OS alike.
    if secure_boot {
        let capabilities = format!(
            "capabilities=boot_mode:{},secure_boot:true",
            firmware.capability()
        );
        lab.bm(&["node", "set", &node, "--property", &capabilities]);
    }
    set_image(&lab, &node, &media_path, format, &sha);
    if secure_boot {
        an_unsigned_deploy_iso_is_refused(&lab, &node);
        set_image(&lab, &node, &media_path, format, &sha);
    }
    let watch = watched.then(|| lab.watch_secrets(&node));
    let marker = image.marker(&image.disk_root_uuid);
    assert_eq!(
        lab.console_count(&marker),
        0,
        "the marker before the deploy"
    );

    lab.bm(&["node", "deploy", &node]);
    let shown = lab.wait_state(&node, "active", DEPLOY_LIMIT);
    assert_deployed(&lab, &shown);
    assert_eq!(
        shown["driver_internal_info"]["bmc_protocol"]["protocol"], profile.1,
        "the protocol the probe chose for {}: {shown}",
        profile.0
    );
    lab.wait_console(&marker, 1, OS_BOOT_LIMIT);
    let machine = lab.emulator_state()["machine"].clone();
    if secure_boot {
        assert_booted_under_secure_boot(&lab, &shown, &machine);
    } else {
        assert_eq!(machine["firmware"], firmware.emulator_name(), "{machine}");
    }
    if proliant_adapters {
        assert_drivers_came_from_the_cd(&lab, &machine);
    }
    // The agent's progress reached the conductor on the way.
    let progress = &shown["driver_internal_info"]["deploy_progress"];
    assert!(
        progress["written"].as_u64().is_some_and(|w| w > 0),
        "deploy_progress in driver_internal_info: {shown}"
    );
    // Progress is against the image's own size (a qcow2's virtual size), never past 100%.
    if let (Some(written), Some(total)) = (progress["written"].as_u64(), progress["total"].as_u64())
    {
        assert!(written <= total, "progress past 100%: {progress}");
    }
    if let Some(watch) = watch {
        let mut issued = watch.finish();
        issued.add_signatures_of(&media_path);
        assert!(
            issued.floppies_read > 0 && !issued.agent_tokens.is_empty(),
            "the watch saw no floppy and no agent token: {} media URL(s), {} floppies",
            issued.media_urls.len(),
            issued.floppies_read
        );
        assert!(
            issued.signatures.len() >= 2,
            "the floppy's and the image's signatures"
        );
        checks::assert_no_secret_leaked(&lab, &node, &issued);
    }
    if then == Then::CheckNoSecretLeakedThenEnrollRedfish {
        return enroll_a_redfish_node_beside(&lab);
    }

    // Undeploy with automated cleaning: the agent boots again and erases the disk's metadata
    // (Ironic's default automated step), and the node is offered again.
    let agent_boots = lab.console_count("vmdeploy_agent");
    lab.bm(&["node", "undeploy", &node]);
    let cleaning = lab.wait_state(&node, "clean wait", DEPLOY_LIMIT);
    assert_eq!(cleaning["last_error"], Value::Null, "{cleaning}");
    let available = lab.wait_state(&node, "available", DEPLOY_LIMIT);
    assert!(
        lab.console_count("vmdeploy_agent") > agent_boots,
        "the agent ramdisk booted again to clean"
    );
    let run = &available["driver_internal_info"]["clean_steps_run"];
    assert!(
        run.to_string().contains("erase_devices_metadata"),
        "driver_internal_info.clean_steps_run: {available}"
    );
    checks::assert_metadata_erased(&lab, &image);
    for device in ["CDROM", "FLOPPY"] {
        let state = lab.emulator_state();
        assert_eq!(
            state["vmedia"][device]["inserted"], false,
            "{device}: {state}"
        );
    }

    // The cleaned node deploys again (its instance_info was cleared by the undeploy, as
    // Ironic clears it), and the OS boots again.
    set_image(&lab, &node, &media_path, format, &sha);
    lab.bm(&["node", "deploy", &node]);
    let shown = lab.wait_state(&node, "active", DEPLOY_LIMIT);
    assert_deployed(&lab, &shown);
    lab.wait_console(&marker, 2, OS_BOOT_LIMIT);
}

/// Tests 1 and 5 of the issue on one node: the raw image in BIOS, then an undeploy with
/// automated cleaning, then the same node deployed again; the BMC answers as an iLO 5 2.72
/// (Redfish, with its POST and reset-window refusals).
#[test]
fn agent_ilo_deploys_the_raw_test_os_in_bios_cleans_it_away_and_deploys_it_again() {
    deploy_and_boot(
        Firmware::Bios,
        false,
        "agent_ilo_raw_bios_clean",
        Then::CleanAndDeployAgain,
        ("ilo5-2.7x", "redfish"),
    );
}

/// The qcow2 image in UEFI with Secure Boot on (`secure_boot:true`: OVMF with Microsoft's keys
/// runs the signed chain of the deploy ISO and of the test OS), after a deploy ISO with an
/// unsigned loader was refused on the same node and failed at the callback timeout, watched for leaked secrets with
/// debug logging on everywhere (the "no secret is logged" test, agent side); then a `redfish`
/// node enrolled with Ironic's keys on the same server goes to `available`. The BMC answers as
/// an iLO 6 1.70 (RIBCL disabled, strict Boot PATCH).
#[test]
fn agent_ilo_deploys_the_qcow2_test_os_and_it_boots_in_uefi() {
    deploy_and_boot(
        Firmware::Uefi,
        true,
        "agent_ilo_qcow2_uefi",
        Then::CheckNoSecretLeakedThenEnrollRedfish,
        ("ilo6-1.6x", "redfish"),
    );
}

/// A signature for the image's temp URL, new for each run (its value only has to be unique:
/// the media server does not check it).
fn test_signature() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{nanos:032x}{:08x}", std::process::id())
}
