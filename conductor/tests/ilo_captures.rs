//! Evidence that is not ours: published iLO responses (tests/fixtures/ilo-captures, sources and
//! licences in its SOURCES.md) read by our Redfish parsers, and the emulator's answers for the
//! matching profile compared with them field by field.

use std::path::PathBuf;

use serde_json::Value;
use vmdeploy_conductor::drivers::ilo::redfish::codec::{
    action_target, bios_boot_mode, boot_override, licence, members, power_state,
    supported_boot_modes, vmedia_status,
};
use vmdeploy_conductor::drivers::ilo::redfish::error::{message_ids, status_error};
use vmdeploy_conductor::drivers::ilo::redfish::refusals::{refusal_for, Answer};
use vmdeploy_conductor::drivers::{
    BootDevice, BootMode, DriverError, PowerState, SupportedBootModes, VmediaDevice,
};
use vmdeploy_ilo_emulator::{Emulator, EmulatorConfig, Profile, ServerConfig};

fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/ilo-captures")
        .join(name)
}

fn capture(name: &str) -> Value {
    let path = fixture_path(name);
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn raw(name: &str) -> Vec<u8> {
    std::fs::read(fixture_path(name)).expect("the fixture")
}

#[test]
fn ilo5_1_x_resources_read_as_the_driver_needs() {
    let system = capture("proliantutils-ilo5-1.x/computer_system.json");
    assert!(power_state(&system).is_ok(), "{:?}", power_state(&system));
    let (_, enabled) = boot_override(&system);
    assert!(enabled.is_some());
    assert_eq!(
        action_target(&system, "#ComputerSystem.Reset"),
        Some("/redfish/v1/Systems/1/Actions/ComputerSystem.Reset/")
    );
    assert!(supported_boot_modes(&system).is_some());

    let cd = capture("proliantutils-ilo5-1.x/virtual_media_cd_empty.json");
    let status = vmedia_status(&cd, VmediaDevice::Cdrom);
    assert!(!status.inserted);
    // v1_0_0: no standard action, the OEM one is found.
    assert_eq!(action_target(&cd, "#VirtualMedia.InsertMedia"), None);
    assert!(
        action_target(&cd, "#HpeiLOVirtualMedia.InsertVirtualMedia").is_some(),
        "{cd}"
    );
    let inserted = capture("proliantutils-ilo5-1.x/virtual_media_cd_inserted.json");
    let status = vmedia_status(&inserted, VmediaDevice::Cdrom);
    assert!(status.inserted, "{status:?}");
    assert!(status.image_url.is_some(), "{status:?}");

    let collection = capture("proliantutils-ilo5-1.x/virtual_media_collection.json");
    // proliantutils' sample lists the CD slot only.
    assert_eq!(
        members(&collection),
        ["/redfish/v1/Managers/1/VirtualMedia/2/"],
        "{collection}"
    );

    let bios = capture("proliantutils-ilo5-1.x/bios_current.json");
    assert!(matches!(
        bios_boot_mode(&bios),
        Ok(BootMode::Uefi | BootMode::Bios)
    ));
    let manager = capture("proliantutils-ilo5-1.x/manager.json");
    let found = licence(&manager);
    assert!(found.is_some(), "the licence in Oem.Hpe.License: {manager}");
}

#[test]
fn ilo5_2_72_virtual_media_has_both_action_kinds() {
    let cd = capture("libredfish-ilo5-2.72/virtual_media_cd.json");
    assert!(action_target(&cd, "#VirtualMedia.InsertMedia").is_some());
    assert!(action_target(&cd, "#HpeiLOVirtualMedia.InsertVirtualMedia").is_some());
    assert!(!vmedia_status(&cd, VmediaDevice::Cdrom).inserted);
}

#[test]
fn published_error_bodies_map_to_the_right_errors() {
    // iLO 6's 401: a login failure, its id found.
    let body = raw("redfishdocs/error_401_no_valid_session_ilo6.json");
    assert_eq!(message_ids(&body), ["Base.1.12.NoValidSession"]);
    assert!(matches!(
        status_error("GET", "/redfish/v1/Systems/", 401, &body),
        DriverError::LoginFailed { .. }
    ));
    // iLO 4's legacy dual form: MessageID with a capital D, in both places.
    let body = raw("redfishdocs/error_400_ilo4_legacy_dual_format.json");
    let ids = message_ids(&body);
    assert!(
        !ids.is_empty() && ids.iter().all(|i| i == "Base.0.10.MalformedJSON"),
        "{ids:?}"
    );
    // The read-only override mode (iLO.2.30): not a rule to wait out, an invalid request.
    let body = raw("issues/error_400_boot_override_unsupported_operation.json");
    assert_eq!(message_ids(&body), ["iLO.2.30.UnsupportedOperation"]);
    assert!(refusal_for(&message_ids(&body)).is_none());
    let err = status_error("PATCH", "/redfish/v1/Systems/1", 400, &body);
    assert!(!err.is_transient(), "{err}");
    assert!(err.to_string().contains("UnsupportedOperation"), "{err}");
    let body = raw("redfishdocs/error_400_property_value_type_error.json");
    assert!(!message_ids(&body).is_empty());
    // A licence refusal of any registry version is "not licensed".
    let licence_body = br#"{"error":{"code":"iLO.0.10.ExtendedInfo","message":"See @Message.ExtendedInfo for more information.","@Message.ExtendedInfo":[{"MessageId":"iLO.2.25.LicenseKeyRequired"}]}}"#;
    let (rule, _) = refusal_for(&message_ids(licence_body)).expect("a rule");
    assert_eq!(rule.answer, Answer::NotLicensed);
}

#[test]
fn an_ilo4_ris_system_is_not_mistaken_for_redfish() {
    // Gen9's RIS body has `Power`, not `PowerState`: the Redfish parser says so instead of
    // guessing.
    let ris = capture("proliantutils-ilo4-ris/rest_v1_computer_system_gen9.json");
    assert!(ris.get("PowerState").is_none());
    assert!(power_state(&ris).is_err());
}

/// The emulator's resource at `path` (Basic auth, the emulator's certificate trusted).
async fn emulated(emulator: &Emulator, path: &str) -> Value {
    let cert = reqwest::Certificate::from_pem(emulator.cert_pem().as_bytes()).expect("pem");
    let client = reqwest::Client::builder()
        .add_root_certificate(cert)
        .no_proxy()
        .build()
        .expect("client");
    client
        .get(format!("https://{}{path}", emulator.addresses()[0]))
        .basic_auth("Administrator", Some("password"))
        .send()
        .await
        .expect("the emulator answers")
        .json()
        .await
        .expect("JSON")
}

/// The JSON type of a value, for comparing shapes.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Every pointer of `same_type` exists in both with the same JSON type; every pointer of
/// `same_value` has the same value; every pointer of `absent_in_both` is absent from both.
fn compare(
    what: &str,
    capture: &Value,
    emulated: &Value,
    same_type: &[&str],
    same_value: &[&str],
    absent_in_both: &[&str],
) {
    for p in same_type {
        let (c, e) = (capture.pointer(p), emulated.pointer(p));
        assert!(c.is_some(), "{what}: the capture has no {p}");
        assert_eq!(
            c.map(kind),
            e.map(kind),
            "{what} {p}: capture {c:?}, emulator {e:?}"
        );
    }
    for p in same_value {
        assert_eq!(capture.pointer(p), emulated.pointer(p), "{what} {p}");
    }
    for p in absent_in_both {
        assert!(capture.pointer(p).is_none(), "{what}: the capture has {p}");
        assert!(
            emulated.pointer(p).is_none(),
            "{what}: the emulator has {p}"
        );
    }
}

async fn start(profile: &str) -> Emulator {
    let config = EmulatorConfig {
        server: ServerConfig::with_profile(Profile::named(profile).expect("profile")),
        ..EmulatorConfig::loopback()
    };
    Emulator::start(config).await.expect("the emulator starts")
}

#[tokio::test]
async fn the_ilo5_1_1x_profile_answers_like_the_1_15_captures() {
    let emulator = start("ilo5-1.1x").await;
    let cd = emulated(&emulator, "/redfish/v1/Managers/1/VirtualMedia/2/").await;
    compare(
        "CD",
        &capture("proliantutils-ilo5-1.x/virtual_media_cd_empty.json"),
        &cd,
        &[
            "/Image",
            "/Inserted",
            "/WriteProtected",
            "/ConnectedVia",
            "/Oem/Hpe/BootOnNextServerReset",
            "/Oem/Hpe/Actions/#HpeiLOVirtualMedia.InsertVirtualMedia/target",
            "/Oem/Hpe/Actions/#HpeiLOVirtualMedia.EjectVirtualMedia/target",
        ],
        &[
            "/@odata.id",
            "/@odata.type",
            "/Id",
            "/MediaTypes",
            "/Inserted",
            "/ConnectedVia",
        ],
        &["/Actions"],
    );
    let floppy = emulated(&emulator, "/redfish/v1/Managers/1/VirtualMedia/1/").await;
    compare(
        "floppy",
        &capture("proliantutils-ilo5-1.x/virtual_media_floppy_empty.json"),
        &floppy,
        &["/Image", "/Inserted", "/Oem/Hpe/Actions"],
        &["/@odata.id", "/Id", "/MediaTypes"],
        &["/Oem/Hpe/BootOnNextServerReset"],
    );
    let system = emulated(&emulator, "/redfish/v1/Systems/1/").await;
    compare(
        "system",
        &capture("proliantutils-ilo5-1.x/computer_system.json"),
        &system,
        &[
            "/PowerState",
            "/Boot/BootSourceOverrideEnabled",
            "/Boot/BootSourceOverrideTarget",
            "/Boot/BootSourceOverrideMode",
            "/Boot/BootSourceOverrideTarget@Redfish.AllowableValues",
            "/Oem/Hpe/PostState",
            "/Oem/Hpe/Bios/UefiClass",
            "/Bios/@odata.id",
        ],
        &[
            "/@odata.id",
            "/Id",
            "/Actions/#ComputerSystem.Reset/target",
            "/Actions/#ComputerSystem.Reset/ResetType@Redfish.AllowableValues",
            "/Manufacturer",
            "/Model",
        ],
        &[],
    );
    let manager = emulated(&emulator, "/redfish/v1/Managers/1/").await;
    compare(
        "manager",
        &capture("proliantutils-ilo5-1.x/manager.json"),
        &manager,
        &[
            "/Oem/Hpe/Firmware/Current/VersionString",
            "/Oem/Hpe/License/LicenseString",
            "/VirtualMedia/@odata.id",
        ],
        &[
            "/@odata.id",
            "/Id",
            "/FirmwareVersion",
            "/Oem/Hpe/RIBCLEnabled",
        ],
        &[],
    );
    let root = emulated(&emulator, "/redfish/v1/").await;
    compare(
        "service root",
        &capture("proliantutils-ilo5-1.x/service_root.json"),
        &root,
        &["/RedfishVersion", "/UUID", "/Oem/Hpe/Manager"],
        &[
            "/Systems/@odata.id",
            "/Managers/@odata.id",
            "/SessionService/@odata.id",
        ],
        &[],
    );
}

#[tokio::test]
async fn the_ilo5_2_7x_profile_answers_like_the_2_72_capture() {
    let emulator = start("ilo5-2.7x").await;
    let cd = emulated(&emulator, "/redfish/v1/Managers/1/VirtualMedia/2/").await;
    compare(
        "CD",
        &capture("libredfish-ilo5-2.72/virtual_media_cd.json"),
        &cd,
        &[
            "/Actions/#VirtualMedia.InsertMedia/target",
            "/Actions/#VirtualMedia.EjectMedia/target",
            "/Oem/Hpe/Actions/#HpeiLOVirtualMedia.InsertVirtualMedia/target",
            "/Oem/Hpe/BootOnNextServerReset",
            "/Image",
            "/WriteProtected",
        ],
        &["/Id", "/MediaTypes", "/Inserted", "/ConnectedVia"],
        &[],
    );
    // The parsers read the emulator's answers as they read the capture's.
    assert_eq!(
        vmedia_status(&cd, VmediaDevice::Cdrom).inserted,
        vmedia_status(
            &capture("libredfish-ilo5-2.72/virtual_media_cd.json"),
            VmediaDevice::Cdrom
        )
        .inserted
    );
    let system = emulated(&emulator, "/redfish/v1/Systems/1/").await;
    assert_eq!(power_state(&system).ok(), Some(PowerState::Off));
    assert_eq!(
        supported_boot_modes(&system),
        Some(SupportedBootModes::BiosAndUefi)
    );
    let (target, _) = boot_override(&system);
    assert!(
        matches!(target, None | Some(BootDevice::Other(_))),
        "{target:?}"
    );
}

#[tokio::test]
async fn the_ilo4_gen9_profile_answers_ris_like_the_gen9_capture() {
    let emulator = start("ilo4-gen9-2.7x").await;
    let system = emulated(&emulator, "/rest/v1/Systems/1").await;
    let capture = capture("proliantutils-ilo4-ris/rest_v1_computer_system_gen9.json");
    // What proliantutils' RIS client reads (ilo/ris.py), by kind; the fixed parts of the wire
    // (links, action lists, targets, manufacturer) by value. Serial, UUID, model and the BIOS
    // version are the emulated machine's own.
    compare(
        "RIS system",
        &capture,
        &system,
        &[
            "/Type",
            "/Model",
            "/Power",
            "/Boot/BootSourceOverrideEnabled",
            "/Boot/BootSourceOverrideTarget",
            "/Boot/UefiTargetBootSourceOverride",
            "/Boot/UefiTargetBootSourceOverrideSupported",
            "/Bios/Current/VersionString",
            "/Oem/Hp/Type",
            "/Oem/Hp/Bios/UefiClass",
            "/Oem/Hp/Bios/Current/VersionString",
            "/Oem/Hp/PostState",
            "/Oem/Hp/links/BIOS/href",
            "/Oem/Hp/links/SecureBoot/href",
            "/Oem/Hp/links/PCIDevices/href",
            "/HostCorrelation/HostMACAddress",
            "/Memory/TotalSystemMemoryGB",
            "/Processors/Count",
            "/SerialNumber",
            "/UUID",
            "/Status/State",
        ],
        &[
            "/Manufacturer",
            "/Name",
            "/SystemType",
            "/AvailableActions",
            "/Oem/Hp/AvailableActions",
            "/Boot/BootSourceOverrideSupported",
            "/Boot/BootSourceOverrideEnabled",
            "/Boot/BootSourceOverrideTarget",
            "/Oem/Hp/Bios/UefiClass",
            "/Oem/Hp/PostState",
            "/Oem/Hp/links/BIOS/href",
            "/Oem/Hp/links/SecureBoot/href",
            "/Power",
            "/Status/State",
            "/links/self/href",
            "/links/ManagedBy",
            "/links/Chassis",
        ],
        // iLO 4 RIS is not Redfish: none of its names.
        &[
            "/PowerState",
            "/@odata.id",
            "/@odata.type",
            "/Actions",
            "/Oem/Hpe",
            "/Boot/BootSourceOverrideMode",
        ],
    );
    // proliantutils' type check (`ComputerSystem.0` or `.1`) passes.
    let major = |v: &Value| {
        v["Type"]
            .as_str()
            .and_then(|t| t.split('.').nth(1))
            .map(str::to_owned)
    };
    assert!(
        matches!(major(&system).as_deref(), Some("0" | "1")),
        "{system}"
    );
    // The Redfish parser refuses the emulated RIS body as it refuses the captured one.
    assert!(power_state(&system).is_err());
}
