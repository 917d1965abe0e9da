//! One test per emulator quirk (docs/ilo-firmware.md): the in-process emulator with only that
//! quirk switched on, then
//! 1. the emulator's answer checked with a plain HTTP client against what the reference says
//!    real firmware sends (status, message id suffix, headers), so the quirk is really there;
//! 2. the conductor's driver doing what a deploy does against it, and succeeding: remove the
//!    driver's handling of the quirk and this part fails.
//!
//! The protocol probe is tested against the named profiles, whose identities it reads.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use vmdeploy_conductor::drivers::ilo::detect::{self, Detected};
use vmdeploy_conductor::drivers::ilo::redfish::RedfishClient;
use vmdeploy_conductor::drivers::ilo::{IloClient, IloConfig, Protocol, TlsVerify};
use vmdeploy_conductor::drivers::{
    BootDevice, BootMode, DriverError, Management, Power, PowerAction, PowerState, Secret,
    VirtualMedia, VmediaBootOption, VmediaDevice,
};
use vmdeploy_ilo_emulator::{Emulator, EmulatorConfig, Profile, Quirk, ServerConfig};
use vmdeploy_integration_tests::emulator::MediaServer;

const USER: &str = "Administrator";
const PASSWORD: &str = "password";

/// An emulator with `profile`, its certificate in a file, and clients for it.
struct Lab {
    emulator: Emulator,
    _dir: tempfile::TempDir,
    cert: PathBuf,
}

impl Lab {
    async fn start(profile: Profile) -> Lab {
        Lab::with_config(EmulatorConfig {
            server: ServerConfig::with_profile(profile),
            ..EmulatorConfig::loopback()
        })
        .await
    }

    async fn with_config(config: EmulatorConfig) -> Lab {
        let emulator = Emulator::start(config).await.expect("the emulator starts");
        let dir = tempfile::tempdir().expect("temp dir");
        let cert = dir.path().join("ilo.pem");
        std::fs::write(&cert, emulator.cert_pem()).expect("writing the certificate");
        Lab {
            emulator,
            _dir: dir,
            cert,
        }
    }

    /// An emulator with `profile` whose host boots in UEFI mode.
    async fn uefi(profile: Profile) -> Lab {
        Lab::with_config(EmulatorConfig {
            server: ServerConfig {
                boot_mode: vmdeploy_ilo_emulator::BootMode::Uefi,
                ..ServerConfig::with_profile(profile)
            },
            ..EmulatorConfig::loopback()
        })
        .await
    }

    /// One raw RIBCL script of `SERVER_INFO` read `command`, as the iLO answers it.
    async fn ribcl_read(&self, command: &str) -> String {
        self.raw()
            .post(format!("{}/ribcl", self.base()))
            .body(format!("<RIBCL VERSION=\"2.0\"><LOGIN USER_LOGIN=\"{USER}\" PASSWORD=\"{PASSWORD}\"><SERVER_INFO MODE=\"read\"><{command}/></SERVER_INFO></LOGIN></RIBCL>"))
            .send()
            .await
            .expect("answers")
            .text()
            .await
            .expect("a body")
    }

    /// A Redfish session login as another client makes it (never closed): status and body.
    async fn open_session(&self) -> (u16, Value) {
        let (status, _, body) = self
            .call(
                reqwest::Method::POST,
                "/redfish/v1/SessionService/Sessions/",
                Some(json!({"UserName": USER, "Password": PASSWORD})),
            )
            .await;
        (status, body)
    }

    /// The lab profile with only `quirk` on.
    async fn with_quirk(quirk: Quirk) -> Lab {
        Lab::start(Profile::lab().with(quirk, true)).await
    }

    fn base(&self) -> String {
        format!("https://{}", self.emulator.addresses()[0])
    }

    fn config(&self, protocol: Protocol) -> IloConfig {
        let mut config = IloConfig::new(
            self.emulator.addresses()[0].to_string(),
            USER,
            Secret::new(PASSWORD),
        );
        config.tls = TlsVerify::CaFile(self.cert.clone());
        config.protocol = protocol;
        config.timeout = Duration::from_secs(30);
        config
    }

    fn redfish(&self) -> RedfishClient {
        RedfishClient::new(&self.config(Protocol::Redfish)).expect("a Redfish client")
    }

    /// A plain HTTP client that trusts the emulator and follows no redirect: what the iLO
    /// sends, unprocessed.
    fn raw(&self) -> reqwest::Client {
        let pem = std::fs::read(&self.cert).expect("the certificate");
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("a certificate"))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .expect("an HTTP client")
    }

    /// One raw Redfish request with Basic auth: status, headers, JSON body (Null if none).
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut request = self
            .raw()
            .request(method, format!("{}{path}", self.base()))
            .basic_auth(USER, Some(PASSWORD));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("the emulator answers");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.expect("a body");
        (
            status,
            headers,
            serde_json::from_str(&text).unwrap_or(Value::Null),
        )
    }
}

/// The message id of a Redfish error body, as iLO nests it.
fn message_id(body: &Value) -> String {
    body.pointer("/error/@Message.ExtendedInfo/0/MessageId")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// What a deploy does before it powers the host on: the image in the virtual CD, boot-once,
/// and the one-time boot to the CD.
async fn attach_boot_once_cd(client: &RedfishClient, url: &str) {
    client
        .insert_vmedia(VmediaDevice::Cdrom, url)
        .await
        .expect("inserted");
    client
        .set_vmedia_status(VmediaDevice::Cdrom, VmediaBootOption::BootOnce, None)
        .await
        .expect("boot once");
    client
        .set_one_time_boot(&BootDevice::Cdrom)
        .await
        .expect("one-time boot to the CD");
}

/// A media server with a small ISO stand-in the emulator can read by range.
fn media() -> MediaServer {
    MediaServer::start(vec![("/boot.iso", vec![0x5a; 256 * 1024])])
}

#[tokio::test]
async fn no_redfish_is_driven_over_ribcl() {
    let lab = Lab::with_quirk(Quirk::NoRedfish).await;
    let (status, _, _) = lab.call(reqwest::Method::GET, "/redfish/v1/", None).await;
    assert_eq!(status, 404, "an iLO 4 before 2.30 has no Redfish");
    let detected = detect::detect(&lab.config(Protocol::Auto))
        .await
        .expect("detects");
    assert!(!detected.redfish, "{detected:?}");
    let client = IloClient::connect(&lab.config(Protocol::Auto))
        .await
        .expect("connects");
    assert_eq!(client.protocol(), Protocol::Ribcl);
    assert_eq!(client.power_state().await.expect("power"), PowerState::Off);
}

#[tokio::test]
async fn ribcl_disabled_is_driven_over_redfish_whatever_the_model() {
    let lab = Lab::with_quirk(Quirk::RibclDisabled).await;
    let reply = lab.ribcl_read("GET_HOST_POWER_STATUS").await;
    assert!(reply.contains("RIBCLI is disabled"), "{reply}");
    let (_, _, manager) = lab
        .call(reqwest::Method::GET, "/redfish/v1/Managers/1/", None)
        .await;
    assert_eq!(manager["Oem"]["Hpe"]["RIBCLEnabled"], false, "{manager}");

    // An iLO 6 (its identity says so): auto chooses Redfish and drives it.
    let ilo6 = Lab::start(Profile::named("ilo6-1.6x").expect("profile")).await;
    let client = IloClient::connect(&ilo6.config(Protocol::Auto))
        .await
        .expect("connects");
    assert_eq!(client.protocol(), Protocol::Redfish);
    client.set_power(PowerAction::On).await.expect("power on");
    assert_eq!(client.power_state().await.expect("power"), PowerState::On);
}

#[tokio::test]
async fn the_probe_reads_each_profiles_generation() {
    for (profile, generation, protocol) in [
        ("ilo4-gen8-ribcl", 4, Protocol::Ribcl),
        ("ilo4-gen9-2.7x", 4, Protocol::Ribcl),
        ("ilo5-1.1x", 5, Protocol::Redfish),
        ("ilo5-2.7x", 5, Protocol::Redfish),
        ("ilo5-3.x", 5, Protocol::Redfish),
        ("ilo6-1.6x", 6, Protocol::Redfish),
    ] {
        let lab = Lab::start(Profile::named(profile).expect("profile")).await;
        let detected: Detected = detect::detect(&lab.config(Protocol::Auto))
            .await
            .expect("detects");
        assert_eq!(detected.generation, Some(generation), "{profile}");
        assert_eq!(detect::choose(&detected), protocol, "{profile}");
        let identity = &Profile::named(profile).expect("profile").identity;
        assert_eq!(detected.firmware.as_deref(), Some(identity.firmware));
        assert_eq!(detected.model.as_deref(), Some(identity.product));
    }
}

#[tokio::test]
async fn trailing_slash_308_is_followed_with_the_same_method() {
    let lab = Lab::with_quirk(Quirk::TrailingSlash308).await;
    let (status, headers, _) = lab
        .call(reqwest::Method::GET, "/redfish/v1/Systems/1", None)
        .await;
    assert_eq!(status, 308);
    assert_eq!(
        headers.get("location").and_then(|l| l.to_str().ok()),
        Some("/redfish/v1/Systems/1/")
    );
    let client = lab.redfish();
    let system = client.get("/redfish/v1/Systems/1").await.expect("GET");
    assert_eq!(system["Id"], "1");
    client
        .patch(
            "/redfish/v1/Systems/1",
            &json!({"Boot": {"BootSourceOverrideTarget": "Cd", "BootSourceOverrideEnabled": "Once"}}),
        )
        .await
        .expect("PATCH re-issued to the slash form");
    assert_eq!(
        client.one_time_boot().await.expect("read"),
        Some(BootDevice::Cdrom)
    );
}

#[tokio::test]
async fn oem_only_virtual_media_is_inserted_and_ejected_by_the_oem_actions() {
    let lab = Lab::with_quirk(Quirk::VmediaOemActionsOnly).await;
    let media = media();
    let (_, _, cd) = lab
        .call(
            reqwest::Method::GET,
            "/redfish/v1/Managers/1/VirtualMedia/2/",
            None,
        )
        .await;
    assert!(
        cd.get("Actions").is_none(),
        "v1_0_0 has no standard actions: {cd}"
    );
    let (status, _, _) = lab
        .call(
            reqwest::Method::POST,
            "/redfish/v1/Managers/1/VirtualMedia/2/Actions/VirtualMedia.InsertMedia/",
            Some(json!({"Image": media.url("/boot.iso")})),
        )
        .await;
    assert_eq!(status, 404);
    let client = lab.redfish();
    client
        .insert_vmedia(VmediaDevice::Cdrom, &media.url("/boot.iso"))
        .await
        .expect("inserted by the OEM action");
    assert!(
        client
            .vmedia_status(VmediaDevice::Cdrom)
            .await
            .expect("status")
            .inserted
    );
    client
        .eject_vmedia(VmediaDevice::Cdrom)
        .await
        .expect("ejected by the OEM action");
    assert!(
        !client
            .vmedia_status(VmediaDevice::Cdrom)
            .await
            .expect("status")
            .inserted
    );
}

#[tokio::test]
async fn eject_without_a_body_is_415_and_the_driver_sends_one() {
    let lab = Lab::with_quirk(Quirk::EjectEmptyBody415).await;
    let media = media();
    let client = lab.redfish();
    client
        .insert_vmedia(VmediaDevice::Cdrom, &media.url("/boot.iso"))
        .await
        .expect("inserted");
    let response = lab
        .raw()
        .post(format!(
            "{}/redfish/v1/Managers/1/VirtualMedia/2/Actions/Oem/Hpe/HpeiLOVirtualMedia.EjectVirtualMedia/",
            lab.base()
        ))
        .basic_auth(USER, Some(PASSWORD))
        .header("content-length", "0")
        .send()
        .await
        .expect("answers");
    assert_eq!(response.status().as_u16(), 415);
    client
        .eject_vmedia(VmediaDevice::Cdrom)
        .await
        .expect("ejected");
    assert!(
        !client
            .vmedia_status(VmediaDevice::Cdrom)
            .await
            .expect("status")
            .inserted
    );
}

#[tokio::test]
async fn a_read_only_override_mode_is_changed_through_bios() {
    let lab = Lab::with_quirk(Quirk::BootModeOverrideReadonly).await;
    let (status, _, body) = lab
        .call(
            reqwest::Method::PATCH,
            "/redfish/v1/Systems/1/",
            Some(json!({"Boot": {"BootSourceOverrideTarget": "Cd", "BootSourceOverrideEnabled": "Once",
                                 "BootSourceOverrideMode": "Legacy"}})),
        )
        .await;
    assert_eq!(status, 400);
    assert!(
        message_id(&body).ends_with(".UnsupportedOperation"),
        "{body}"
    );
    let client = lab.redfish();
    client
        .set_pending_boot_mode(BootMode::Uefi)
        .await
        .expect("pending mode set through BIOS");
    assert_eq!(
        client.pending_boot_mode().await.expect("pending"),
        BootMode::Uefi
    );
    client
        .set_one_time_boot(&BootDevice::Cdrom)
        .await
        .expect("the override carries no mode");
}

#[tokio::test]
async fn a_strict_boot_patch_gets_only_target_and_enabled() {
    let lab = Lab::with_quirk(Quirk::StrictBootPatch).await;
    let (status, _, body) = lab
        .call(
            reqwest::Method::PATCH,
            "/redfish/v1/Systems/1/",
            Some(json!({"Boot": {"BootSourceOverrideTarget": "Cd", "BootSourceOverrideEnabled": "Once",
                                 "HttpBootUri": ""}})),
        )
        .await;
    assert_eq!(status, 400);
    assert!(
        message_id(&body).ends_with(".PropertyNotWritableOrUnknown"),
        "{body}"
    );
    assert_eq!(
        body.pointer("/error/@Message.ExtendedInfo/0/MessageArgs/0"),
        Some(&json!("HttpBootUri"))
    );
    let client = lab.redfish();
    client
        .set_one_time_boot(&BootDevice::Cdrom)
        .await
        .expect("one-time CD");
    client
        .set_persistent_boot(&BootDevice::Hdd)
        .await
        .expect("persistent disk");
}

#[tokio::test]
async fn a_reset_refused_after_a_power_change_is_waited_out() {
    let lab = Lab::with_quirk(Quirk::ResetWindow).await;
    let (status, _, _) = lab
        .call(
            reqwest::Method::POST,
            "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset/",
            Some(json!({"ResetType": "On"})),
        )
        .await;
    assert_eq!(status, 200, "the first change is taken");
    let (status, _, body) = lab
        .call(
            reqwest::Method::POST,
            "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset/",
            Some(json!({"ResetType": "ForceOff"})),
        )
        .await;
    assert_eq!(status, 400, "refused within the window");
    assert!(
        message_id(&body).ends_with(".InvalidOperationForSystemState"),
        "{body}"
    );
    let client = lab.redfish();
    client.set_power(PowerAction::Off).await.expect("off");
    assert_eq!(client.power_state().await.expect("read"), PowerState::Off);
    client.set_power(PowerAction::On).await.expect("on again");
    assert_eq!(client.power_state().await.expect("read"), PowerState::On);
    client.set_power(PowerAction::Reset).await.expect("reset");
}

#[tokio::test]
async fn boot_changes_refused_during_post_are_waited_out() {
    let lab = Lab::with_quirk(Quirk::PostRefusesBootChanges).await;
    let client = lab.redfish();
    client.set_power(PowerAction::On).await.expect("on");
    let (_, _, system) = lab
        .call(reqwest::Method::GET, "/redfish/v1/Systems/1/", None)
        .await;
    assert_eq!(system["Oem"]["Hpe"]["PostState"], "InPost", "{system}");
    let (status, _, body) = lab
        .call(
            reqwest::Method::PATCH,
            "/redfish/v1/Systems/1/",
            Some(json!({"Boot": {"BootSourceOverrideTarget": "Hdd", "BootSourceOverrideEnabled": "Once"}})),
        )
        .await;
    assert_eq!(status, 400);
    assert!(
        message_id(&body).ends_with(".UnableToModifyDuringSystemPOST"),
        "{body}"
    );
    client
        .set_one_time_boot(&BootDevice::Cdrom)
        .await
        .expect("set once POST is over");
    assert_eq!(
        client.one_time_boot().await.expect("read"),
        Some(BootDevice::Cdrom)
    );
}

#[tokio::test]
async fn boot_once_is_flagged_on_the_cd_only() {
    let lab = Lab::with_quirk(Quirk::BootOnceCdOnly).await;
    let media = media();
    let (_, _, floppy) = lab
        .call(
            reqwest::Method::GET,
            "/redfish/v1/Managers/1/VirtualMedia/1/",
            None,
        )
        .await;
    assert!(
        floppy.pointer("/Oem/Hpe/BootOnNextServerReset").is_none(),
        "{floppy}"
    );
    let (status, _, body) = lab
        .call(
            reqwest::Method::PATCH,
            "/redfish/v1/Managers/1/VirtualMedia/1/",
            Some(json!({"Oem": {"Hpe": {"BootOnNextServerReset": false}}})),
        )
        .await;
    assert_eq!(status, 400);
    assert!(
        message_id(&body).ends_with(".PropertyNotWritableOrUnknown"),
        "{body}"
    );
    let client = lab.redfish();
    client
        .insert_vmedia(VmediaDevice::Floppy, &media.url("/boot.iso"))
        .await
        .expect("floppy inserted");
    client
        .set_vmedia_status(VmediaDevice::Floppy, VmediaBootOption::NoBoot, Some(true))
        .await
        .expect("no boot flag sent to the floppy");
    let err = client
        .set_vmedia_status(VmediaDevice::Floppy, VmediaBootOption::BootOnce, None)
        .await
        .expect_err("the floppy cannot boot");
    assert!(matches!(err, DriverError::NotSupported { .. }), "{err}");
    client
        .insert_vmedia(VmediaDevice::Cdrom, &media.url("/boot.iso"))
        .await
        .expect("CD inserted");
    client
        .set_vmedia_status(VmediaDevice::Cdrom, VmediaBootOption::BootOnce, None)
        .await
        .expect("the CD boots once");
}

#[tokio::test]
async fn chunked_replies_without_a_length_are_read() {
    let lab = Lab::with_quirk(Quirk::Chunked).await;
    let response = lab
        .raw()
        .get(format!("{}/redfish/v1/Systems/1/", lab.base()))
        .basic_auth(USER, Some(PASSWORD))
        .send()
        .await
        .expect("answers");
    assert!(response.headers().get("content-length").is_none());
    assert_eq!(
        response
            .headers()
            .get("transfer-encoding")
            .and_then(|v| v.to_str().ok()),
        Some("chunked")
    );
    let client = lab.redfish();
    assert_eq!(client.power_state().await.expect("read"), PowerState::Off);
}

#[tokio::test]
async fn a_boot_reads_its_medium_by_range_as_configured() {
    use vmdeploy_ilo_emulator::media_fetch::BootRead;
    // 1 MiB of a 2 MiB image in 64 KiB ranges, 50 ms each, 4 at once: 16 ranges after the
    // first sectors, at least 4 rounds of 50 ms.
    let config = EmulatorConfig {
        server: ServerConfig {
            boot_read: BootRead {
                boot_bytes: 1 << 20,
                range_bytes: 64 << 10,
                latency: Duration::from_millis(50),
                concurrency: 4,
            },
            ..ServerConfig::default()
        },
        ..EmulatorConfig::loopback()
    };
    let lab = Lab::with_config(config).await;
    let media = MediaServer::start(vec![("/boot.iso", vec![0x5a; 2 << 20])]);
    let client = lab.redfish();
    attach_boot_once_cd(&client, &media.url("/boot.iso")).await;
    client.set_power(PowerAction::On).await.expect("on");
    let state = lab.emulator.state(0).await.expect("server 0");
    let boot = state.state.last_boot.expect("a boot");
    assert_eq!(boot.device, Some(vmdeploy_ilo_emulator::BootDevice::Cdrom));
    let read = boot.media_read.expect("the read's figures");
    assert_eq!(read.ranges, 17, "{read:?}");
    assert!(read.bytes >= 1 << 20, "{read:?}");
    assert!(read.millis >= 200, "{read:?}");
}

#[tokio::test]
async fn a_full_session_table_is_met_with_basic_auth() {
    // An iLO 5's identity, so that the probe speaks Redfish; only this quirk on.
    let mut profile = Profile::lab().with(Quirk::SessionLimit, true);
    profile.identity = Profile::named("ilo5-2.7x").expect("profile").identity;
    let lab = Lab::start(profile).await;
    let cap = Profile::lab().timings.session_cap;
    // Another client logs in `cap` times and never logs out.
    for n in 0..cap {
        let (status, body) = lab.open_session().await;
        assert_eq!(status, 201, "login {n}: {body}");
    }
    let (status, body) = lab.open_session().await;
    assert_eq!(status, 403, "{body}");
    assert!(
        message_id(&body).ends_with(".SessionLimitExceeded"),
        "{body}"
    );
    let (_, _, listed) = lab
        .call(
            reqwest::Method::GET,
            "/redfish/v1/SessionService/Sessions/",
            None,
        )
        .await;
    assert_eq!(
        listed["Members"].as_array().map(Vec::len),
        Some(cap),
        "{listed}"
    );

    // The driver is not told a bad password: it powers the host on with Basic auth and opens
    // no session.
    let client = lab.redfish();
    client.set_power(PowerAction::On).await.expect("power on");
    assert_eq!(client.power_state().await.expect("power"), PowerState::On);
    client.logout().await;
    let ilo = lab.emulator.server(0).expect("server 0");
    assert_eq!(ilo.session_counts(), (cap, cap as u64));

    // The readiness probe names the leak.
    let report =
        vmdeploy_conductor::drivers::ilo::probe::probe(&lab.config(Protocol::Auto), None).await;
    let sessions = report
        .checks
        .iter()
        .find(|c| c.check == "sessions")
        .expect("a sessions check");
    assert_eq!(
        sessions.status,
        vmdeploy_conductor::drivers::ilo::probe::Status::Warn,
        "{}",
        report.text()
    );
}

#[tokio::test]
async fn a_uefi_cd_entry_appears_only_once_the_medium_is_connected() {
    use vmdeploy_conductor::bmc::Bmc;
    use vmdeploy_conductor::node::driver_info::IloDefaults;
    use vmdeploy_conductor::states::ProvisionState;
    use vmdeploy_conductor::store::Node;

    let lab = Lab::uefi(Profile::lab().with(Quirk::UefiCdEntryWhenConnected, true)).await;
    let media = media();
    let ribcl = IloClient::connect(&lab.config(Protocol::Ribcl))
        .await
        .expect("connects");
    assert_eq!(
        ribcl.current_boot_mode().await.expect("mode"),
        BootMode::Uefi
    );
    // Inserted but not connected: no CD entry in the UEFI order, and naming it is refused.
    ribcl
        .insert_vmedia(VmediaDevice::Cdrom, &media.url("/boot.iso"))
        .await
        .expect("inserted");
    let order = ribcl.persistent_boot().await.expect("order");
    assert!(!order.contains(&BootDevice::Cdrom), "{order:?}");
    let err = ribcl
        .set_persistent_boot(&BootDevice::Cdrom)
        .await
        .expect_err("no CD entry yet");
    assert!(err.to_string().contains("no UEFI boot entry"), "{err}");
    ribcl
        .eject_vmedia(VmediaDevice::Cdrom)
        .await
        .expect("ejected");

    // What a netboot instance's attach does, through the BMC layer: insert (and connect),
    // then the CD as the persistent boot device.
    let mut node = Node::new(uuid::Uuid::new_v4(), "ilo", ProvisionState::Manageable);
    node.driver_info = json!({
        "ilo_address": lab.emulator.addresses()[0].to_string(),
        "ilo_username": USER, "ilo_password": PASSWORD,
        "ilo_verify_ca": lab.cert, "ilo_protocol": "ribcl",
    })
    .as_object()
    .expect("an object")
    .clone();
    let bmc = Bmc::connect(&mut node, &IloDefaults::default())
        .await
        .expect("connects");
    bmc.insert(VmediaDevice::Cdrom, &media.url("/boot.iso"))
        .await
        .expect("inserted and connected");
    bmc.boot_from_cd().await.expect("the CD boots persistently");
    let order = ribcl.persistent_boot().await.expect("order");
    assert_eq!(order.first(), Some(&BootDevice::Cdrom), "{order:?}");
}

#[tokio::test]
async fn a_manager_without_power_state_is_not_required() {
    // An iLO 6's identity (the probe then speaks Redfish); only this quirk on.
    let mut profile = Profile::lab().with(Quirk::ManagerNoPowerState, true);
    profile.identity = Profile::named("ilo6-1.6x").expect("profile").identity;
    let lab = Lab::start(profile).await;
    let (_, _, manager) = lab
        .call(reqwest::Method::GET, "/redfish/v1/Managers/1/", None)
        .await;
    assert!(manager.get("FirmwareVersion").is_some(), "{manager}");
    assert!(manager.get("PowerState").is_none(), "{manager}");
    let plain = Lab::start(Profile::lab()).await;
    let (_, _, manager) = plain
        .call(reqwest::Method::GET, "/redfish/v1/Managers/1/", None)
        .await;
    assert_eq!(manager["PowerState"], "On", "{manager}");

    let client = IloClient::connect(&lab.config(Protocol::Redfish))
        .await
        .expect("connects");
    client.set_power(PowerAction::On).await.expect("power on");
    assert_eq!(client.power_state().await.expect("power"), PowerState::On);
    let report =
        vmdeploy_conductor::drivers::ilo::probe::probe(&lab.config(Protocol::Auto), None).await;
    assert!(!report.failed(), "{}", report.text());
    assert!(
        report.checks.iter().any(|c| c.check == "sessions"),
        "the Redfish checks ran: {}",
        report.text()
    );
}

#[tokio::test]
async fn a_body_without_its_content_type_is_415_and_the_driver_names_it() {
    let lab = Lab::with_quirk(Quirk::ContentTypeRequired).await;
    let response = lab
        .raw()
        .patch(format!("{}/redfish/v1/Systems/1/", lab.base()))
        .basic_auth(USER, Some(PASSWORD))
        .body(
            r#"{"Boot": {"BootSourceOverrideTarget": "Cd", "BootSourceOverrideEnabled": "Once"}}"#,
        )
        .send()
        .await
        .expect("answers");
    assert_eq!(response.status().as_u16(), 415);
    // The same body said to be JSON is taken.
    let (status, _, body) = lab
        .call(
            reqwest::Method::PATCH,
            "/redfish/v1/Systems/1/",
            Some(json!({"Boot": {"BootSourceOverrideTarget": "Cd", "BootSourceOverrideEnabled": "Once"}})),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    // Every body the driver sends says what it is: a deploy's boot, media and power calls.
    let media = media();
    let client = lab.redfish();
    attach_boot_once_cd(&client, &media.url("/boot.iso")).await;
    client
        .eject_vmedia(VmediaDevice::Cdrom)
        .await
        .expect("ejected");
    client.set_power(PowerAction::On).await.expect("power on");
    client.logout().await;
}

#[tokio::test]
async fn errors_without_text_are_read_from_their_ids_and_arguments() {
    let profile = Profile::lab()
        .with(Quirk::ErrorIdsOnly, true)
        .with(Quirk::StrictBootPatch, true);
    let lab = Lab::start(profile).await;
    let bad = json!({"Boot": {"BootSourceOverrideTarget": "Cd", "BootSourceOverrideEnabled": "Once",
                              "HttpBootUri": ""}});
    let (status, _, body) = lab
        .call(
            reqwest::Method::PATCH,
            "/redfish/v1/Systems/1/",
            Some(bad.clone()),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let info = &body["error"]["@Message.ExtendedInfo"][0];
    assert!(info.get("Message").is_none(), "{body}");
    assert_eq!(info["MessageArgs"], json!(["HttpBootUri"]), "{body}");
    assert_eq!(
        body["error"]["message"], "See @Message.ExtendedInfo for more information.",
        "{body}"
    );

    // The driver's error says what the id means and names the property.
    let err = lab
        .redfish()
        .patch("/redfish/v1/Systems/1/", &bad)
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(
        text.contains("does not take this property") && text.contains("HttpBootUri"),
        "{text}"
    );
}

#[tokio::test]
async fn a_uefi_one_time_boot_read_as_a_pair_is_still_the_cd() {
    let lab = Lab::uefi(Profile::lab().with(Quirk::RibclBootPair, true)).await;
    let ribcl = IloClient::connect(&lab.config(Protocol::Ribcl))
        .await
        .expect("connects");
    ribcl
        .set_one_time_boot(&BootDevice::Cdrom)
        .await
        .expect("one-time boot set");
    let reply = lab.ribcl_read("GET_ONE_TIME_BOOT").await;
    assert!(
        reply.contains("VALUE=\"Boot000B\"") && reply.contains("DESCRIPTION="),
        "{reply}"
    );
    assert_eq!(
        ribcl.one_time_boot().await.expect("read back"),
        Some(BootDevice::Cdrom)
    );
}
