//! The conductor's Redfish client against sushy-tools' `sushy-emulator` (fake driver): power,
//! boot override, boot mode and virtual media, over HTTPS with CA verification and HTTP Basic
//! (sushy-tools has no SessionService, so this also exercises the Basic fallback).
//!
//! sushy-tools quirks the assertions allow for (docs/ilo-management.md §4): power changes
//! land 1-11 s later; `BootSourceOverrideEnabled` always reads back `Continuous`; the BIOS
//! resource answers 501, so boot mode goes through `Boot.BootSourceOverrideMode`.

use std::process::Command;
use std::time::{Duration, Instant};

use vmdeploy_conductor::drivers::ilo::redfish::RedfishClient;
use vmdeploy_conductor::drivers::ilo::{IloClient, IloConfig, Protocol, TlsVerify};
use vmdeploy_conductor::drivers::{
    BootDevice, BootMode, DriverError, DriverErrorKind, Inventory, Management, Power, PowerAction,
    PowerState, Secret, VirtualMedia, VmediaDevice,
};
use vmdeploy_integration_tests::bin;
use vmdeploy_integration_tests::sushy::{SushyEmulator, SYSTEM_UUID};

fn config(sushy: &SushyEmulator) -> IloConfig {
    let mut c = IloConfig::new(
        sushy.address.clone(),
        sushy.username.clone(),
        Secret::new(sushy.password.clone()),
    );
    c.tls = TlsVerify::CaFile(sushy.cert_path.clone());
    c.timeout = Duration::from_secs(30);
    c.protocol = Protocol::Redfish;
    c
}

async fn wait_power(client: &RedfishClient, want: PowerState) -> Result<Duration, String> {
    let start = Instant::now();
    loop {
        let state = client.power_state().await.map_err(|e| e.to_string())?;
        if state == want {
            return Ok(start.elapsed());
        }
        if start.elapsed() > Duration::from_secs(25) {
            return Err(format!("power stayed {state} for 25 s, wanted {want}"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn redfish_client_drives_sushy_emulator() {
    let sushy = SushyEmulator::start().expect("starting sushy-emulator");
    let client = RedfishClient::new(&config(&sushy)).expect("client");

    // Discovery found the fake system by its UUID.
    let layout = client.layout().await.expect("layout").clone();
    assert!(
        layout.system.ends_with(SYSTEM_UUID),
        "system {}",
        layout.system
    );

    // Power: starts off, on, then off again (ForceOff: no HPE button here).
    assert_eq!(
        client.power_state().await.expect("power state"),
        PowerState::Off
    );
    assert_eq!(client.set_power(PowerAction::On).await.expect("on"), None);
    let took = wait_power(&client, PowerState::On)
        .await
        .unwrap_or_else(|e| {
            panic!("{e}\n{}", sushy.log());
        });
    eprintln!("sushy power on applied after {took:?}");
    assert_eq!(
        client.set_power(PowerAction::On).await.expect("on again"),
        Some("Host power is already ON.".to_string())
    );
    client
        .set_power(PowerAction::HoldButton)
        .await
        .expect("hold = force off");
    wait_power(&client, PowerState::Off)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", sushy.log()));

    // Boot override: the target is stored; Enabled always reads Continuous on sushy-tools.
    client
        .set_one_time_boot(&BootDevice::Cdrom)
        .await
        .expect("boot once cd");
    let system = client.get(&layout.system).await.expect("system");
    assert_eq!(system["Boot"]["BootSourceOverrideTarget"], "Cd");
    client
        .set_persistent_boot(&BootDevice::Hdd)
        .await
        .expect("persistent hdd");
    assert_eq!(
        client.persistent_boot().await.expect("persistent"),
        vec![BootDevice::Hdd]
    );
    client
        .set_persistent_boot(&BootDevice::Network)
        .await
        .expect("persistent pxe");
    assert_eq!(
        client.persistent_boot().await.expect("persistent"),
        vec![BootDevice::Network]
    );

    // Boot mode through the override mode (BIOS is 501 on the fake driver).
    client
        .set_pending_boot_mode(BootMode::Uefi)
        .await
        .expect("set uefi");
    assert_eq!(
        client.pending_boot_mode().await.expect("pending"),
        BootMode::Uefi
    );
    client
        .set_pending_boot_mode(BootMode::Bios)
        .await
        .expect("set legacy");
    assert_eq!(
        client.current_boot_mode().await.expect("current"),
        BootMode::Bios
    );

    // Virtual media: insert (sushy downloads the image), status, replace, eject.
    let iso = format!("{}/boot.iso", sushy.image_base);
    let before = client
        .vmedia_status(VmediaDevice::Cdrom)
        .await
        .expect("cd status");
    assert!(!before.inserted);
    client
        .insert_vmedia(VmediaDevice::Cdrom, &iso)
        .await
        .expect("insert cd");
    let status = client
        .vmedia_status(VmediaDevice::Cdrom)
        .await
        .expect("cd status");
    assert!(status.inserted, "{status:?}");
    assert_eq!(status.image_url.as_deref(), Some(iso.as_str()));
    // Inserting again replaces the image (eject first).
    client
        .insert_vmedia(VmediaDevice::Cdrom, &iso)
        .await
        .expect("re-insert cd");
    let floppy = format!("{}/floppy.img", sushy.image_base);
    client
        .insert_vmedia(VmediaDevice::Floppy, &floppy)
        .await
        .expect("insert floppy");
    assert_eq!(
        client
            .vmedia_status(VmediaDevice::Floppy)
            .await
            .expect("floppy status")
            .image_url
            .as_deref(),
        Some(floppy.as_str())
    );
    client
        .eject_vmedia(VmediaDevice::Cdrom)
        .await
        .expect("eject cd");
    client
        .eject_vmedia(VmediaDevice::Floppy)
        .await
        .expect("eject floppy");
    assert!(
        !client
            .vmedia_status(VmediaDevice::Cdrom)
            .await
            .expect("status")
            .inserted
    );
    // Ejecting an empty device is a no-op.
    client
        .eject_vmedia(VmediaDevice::Cdrom)
        .await
        .expect("eject empty");

    // Thermal readings through the chassis link; the model falls back to the system's name.
    let health = client.health().await.expect("health");
    assert!(
        health.temperatures.iter().any(|t| t.celsius.is_some()),
        "{health:?}"
    );
    let info = client.info().await.expect("info");
    assert!(!info.product_name.is_empty(), "{info:?}");
    assert_eq!(info.protocol, "redfish");

    // Wrong password: a typed login failure.
    let mut wrong = config(&sushy);
    wrong.password = Secret::new("nope");
    let err = RedfishClient::new(&wrong)
        .expect("client")
        .power_state()
        .await
        .expect_err("401");
    assert!(matches!(err, DriverError::LoginFailed { .. }), "{err}");
    assert_eq!(err.kind(), DriverErrorKind::Auth, "{err}");

    // Auto protocol: no /ribcl on sushy-tools, so Redfish is chosen.
    let mut auto = config(&sushy);
    auto.protocol = Protocol::Auto;
    let chosen = IloClient::connect(&auto).await.expect("auto");
    assert_eq!(chosen.protocol(), Protocol::Redfish);
}

#[test]
fn cli_drives_sushy_emulator() {
    let sushy = SushyEmulator::start().expect("starting sushy-emulator");
    let password = sushy.password_file().expect("password file");
    let run = |args: &[&str]| {
        let out = Command::new(bin("vmdeploy-conductor"))
            .args([
                "ilo",
                "--address",
                &sushy.address,
                "--username",
                &sushy.username,
            ])
            .arg("--password-file")
            .arg(&password)
            .arg("--ca")
            .arg(&sushy.cert_path)
            .args(["--protocol", "redfish", "--timeout", "30"])
            .args(args)
            .output()
            .expect("running vmdeploy-conductor");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        )
    };
    let (ok, out, err) = run(&["power", "status"]);
    assert!(ok, "{err}");
    assert_eq!(out, "off");
    let iso = format!("{}/boot.iso", sushy.image_base);
    let (ok, _, err) = run(&["vmedia", "insert", "cdrom", &iso]);
    assert!(ok, "{err}");
    let (ok, out, err) = run(&["vmedia", "status", "cdrom"]);
    assert!(ok, "{err}");
    assert_eq!(out, format!("inserted {iso}"));
    let (ok, out, err) = run(&["--json", "vmedia", "status", "cdrom"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["inserted"], true);
    assert_eq!(v["image_url"], iso.as_str());
    let (ok, _, err) = run(&["boot-mode", "set", "uefi"]);
    assert!(ok, "{err}");
    let (ok, out, err) = run(&["boot-mode", "get"]);
    assert!(ok, "{err}");
    assert_eq!(out, "uefi");
    // A failure: one line, non-zero exit.
    let (ok, _, err) = run(&["vmedia", "insert", "cdrom"]);
    assert!(!ok);
    assert!(
        err.lines()
            .last()
            .unwrap_or("")
            .contains("needs an image URL"),
        "{err}"
    );
}
