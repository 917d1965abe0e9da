//! The Redfish boot override (`Systems/1` `Boot`) as an iLO 5 answers it, checked over HTTPS
//! against names written out here from docs/ilo-management.md §3.3: the
//! targets iLO 5 lists, each of them taken by PATCH (and what it boots), a target it does not
//! list refused with iLO's error shape, and a `Continuous` BiosSetup lasting one boot without
//! entering the persistent boot order.

use std::time::Duration;

use serde_json::{json, Value};
use vmdeploy_ilo_emulator::{Emulator, EmulatorConfig};

const USER: &str = "Administrator";
const PASSWORD: &str = "password";

/// `BootSourceOverrideTarget@Redfish.AllowableValues` of iLO 5, in its order (docs/ilo-management.md §3.3
/// "Targets").
const ILO5_TARGETS: [&str; 12] = [
    "None",
    "Cd",
    "Hdd",
    "Usb",
    "SDCard",
    "Utilities",
    "Diags",
    "BiosSetup",
    "Pxe",
    "UefiShell",
    "UefiHttp",
    "UefiTarget",
];

struct Ilo {
    emulator: Emulator,
    client: reqwest::Client,
}

impl Ilo {
    async fn start() -> Ilo {
        let emulator = Emulator::start(EmulatorConfig::loopback())
            .await
            .expect("starting the emulator");
        let cert = reqwest::Certificate::from_pem(emulator.cert_pem().as_bytes())
            .expect("the emulator's certificate is valid PEM");
        let client = reqwest::Client::builder()
            .tls_certs_only([cert])
            .timeout(Duration::from_secs(20))
            .no_proxy()
            .build()
            .expect("building the test client");
        Ilo { emulator, client }
    }

    fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.emulator.addresses()[0])
    }

    async fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self
            .client
            .request(method, self.url(path))
            .basic_auth(USER, Some(PASSWORD));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let reply = req.send().await.expect("the request is answered");
        let status = reply.status().as_u16();
        let text = reply.text().await.expect("reading the body");
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"));
        (status, value)
    }

    async fn system(&self) -> Value {
        let (status, v) = self
            .send(reqwest::Method::GET, "/redfish/v1/Systems/1/", None)
            .await;
        assert_eq!(status, 200, "{v}");
        v
    }

    async fn patch_boot(&self, boot: Value) -> (u16, Value) {
        self.send(
            reqwest::Method::PATCH,
            "/redfish/v1/Systems/1/",
            Some(json!({ "Boot": boot })),
        )
        .await
    }

    async fn reset(&self, reset_type: &str) {
        let (status, v) = self
            .send(
                reqwest::Method::POST,
                "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset/",
                Some(json!({ "ResetType": reset_type })),
            )
            .await;
        assert_eq!(status, 200, "{reset_type}: {v}");
    }

    /// `GET /_emulator/state` (the admin API).
    async fn admin_state(&self) -> Value {
        let text = self
            .client
            .get(self.url("/_emulator/state"))
            .send()
            .await
            .expect("admin state")
            .text()
            .await
            .expect("admin state body");
        serde_json::from_str(&text).expect("admin state is JSON")
    }
}

#[tokio::test]
async fn allowable_targets_are_ilo5s() {
    let ilo = Ilo::start().await;
    let boot = &ilo.system().await["Boot"];
    let listed: Vec<&str> = boot["BootSourceOverrideTarget@Redfish.AllowableValues"]
        .as_array()
        .expect("an AllowableValues array")
        .iter()
        .map(|v| v.as_str().expect("a string"))
        .collect();
    assert_eq!(listed, ILO5_TARGETS);
    assert!(!listed.contains(&"Floppy"));
    assert_eq!(
        boot["BootSourceOverrideEnabled@Redfish.AllowableValues"],
        json!(["Disabled", "Once", "Continuous"])
    );
    // Every target reported must be one of those listed: a fresh server reports None.
    assert_eq!(boot["BootSourceOverrideTarget"], "None");
    assert_eq!(boot["BootSourceOverrideEnabled"], "Disabled");
    ilo.emulator.shutdown().await;
}

#[tokio::test]
async fn every_listed_target_is_taken_and_an_unlisted_one_refused() {
    let ilo = Ilo::start().await;
    for target in ILO5_TARGETS {
        let (status, reply) = ilo
            .patch_boot(
                json!({"BootSourceOverrideTarget": target, "BootSourceOverrideEnabled": "Once"}),
            )
            .await;
        assert_eq!(status, 200, "{target}: {reply}");
        let boot = &ilo.system().await["Boot"];
        let listed = boot["BootSourceOverrideTarget@Redfish.AllowableValues"]
            .as_array()
            .expect("an AllowableValues array");
        assert!(listed.contains(&boot["BootSourceOverrideTarget"]), "{boot}");
        if target == "None" {
            assert_eq!(boot["BootSourceOverrideEnabled"], "Disabled", "{boot}");
        } else {
            assert_eq!(boot["BootSourceOverrideTarget"], target, "{boot}");
            assert_eq!(boot["BootSourceOverrideEnabled"], "Once", "{boot}");
        }
    }

    for refused in [
        json!("Floppy"),
        json!("uefihttp"),
        json!("Network"),
        json!(3),
    ] {
        let before = ilo.system().await["Boot"].clone();
        let (status, reply) = ilo
            .patch_boot(
                json!({"BootSourceOverrideTarget": refused, "BootSourceOverrideEnabled": "Once"}),
            )
            .await;
        assert_eq!(status, 400, "{refused}: {reply}");
        let info = &reply["error"]["@Message.ExtendedInfo"][0];
        assert_eq!(
            info["MessageId"], "Base.1.4.PropertyValueNotInList",
            "{reply}"
        );
        assert_eq!(
            info["MessageArgs"][1], "BootSourceOverrideTarget",
            "{reply}"
        );
        assert_eq!(reply["error"]["code"], "iLO.0.10.ExtendedInfo", "{reply}");
        // A refused PATCH changes nothing.
        assert_eq!(ilo.system().await["Boot"], before, "{refused}");
    }
    let (status, reply) = ilo
        .patch_boot(
            json!({"BootSourceOverrideTarget": "Hdd", "BootSourceOverrideEnabled": "Sometimes"}),
        )
        .await;
    assert_eq!(status, 400, "{reply}");
    assert_eq!(
        reply["error"]["@Message.ExtendedInfo"][0]["MessageArgs"],
        json!(["Sometimes", "BootSourceOverrideEnabled"])
    );
    ilo.emulator.shutdown().await;
}

/// What each target boots on the emulated machine: UefiHttp and Pxe the NIC, Cd/Hdd their
/// devices, BiosSetup RBSU; an SD card the machine does not have falls through to the order.
#[tokio::test]
async fn each_target_boots_what_it_means() {
    let ilo = Ilo::start().await;
    ilo.reset("On").await;
    for (target, device) in [
        ("UefiHttp", json!("NETWORK")),
        ("Pxe", json!("NETWORK")),
        ("Hdd", json!("HDD")),
        ("Cd", json!("CDROM")),
        ("BiosSetup", json!("RBSU")),
        // CD first in the default order but empty, floppy empty, USB nothing: the disk.
        ("SDCard", json!("HDD")),
        ("UefiTarget", json!("HDD")),
    ] {
        let (status, reply) = ilo
            .patch_boot(
                json!({"BootSourceOverrideTarget": target, "BootSourceOverrideEnabled": "Once"}),
            )
            .await;
        assert_eq!(status, 200, "{target}: {reply}");
        ilo.reset("ForceRestart").await;
        let state = ilo.admin_state().await;
        assert_eq!(state["last_boot"]["device"], device, "{target}: {state:#}");
        assert_eq!(
            state["last_boot"]["reason"], "one_time",
            "{target}: {state:#}"
        );
        // Once is spent by that boot.
        let boot = &ilo.system().await["Boot"];
        assert_eq!(
            boot["BootSourceOverrideEnabled"], "Disabled",
            "{target}: {boot}"
        );
        assert_eq!(boot["BootSourceOverrideTarget"], "None", "{target}: {boot}");
    }
    // Continuous UefiHttp: the NIC heads the persistent order, and Redfish reports UefiHttp.
    let (status, reply) = ilo
        .patch_boot(json!({"BootSourceOverrideTarget": "UefiHttp", "BootSourceOverrideEnabled": "Continuous"}))
        .await;
    assert_eq!(status, 200, "{reply}");
    for _ in 0..2 {
        ilo.reset("ForceRestart").await;
        let state = ilo.admin_state().await;
        assert_eq!(state["last_boot"]["device"], "NETWORK", "{state:#}");
        assert_eq!(state["last_boot"]["reason"], "persistent", "{state:#}");
        let boot = &ilo.system().await["Boot"];
        assert_eq!(boot["BootSourceOverrideTarget"], "UefiHttp", "{boot}");
        assert_eq!(boot["BootSourceOverrideEnabled"], "Continuous", "{boot}");
    }
    ilo.emulator.shutdown().await;
}

/// A Continuous BiosSetup (as `baremetal node boot device set bios --persistent` sends it)
/// enters setup at the next boot only; RBSU never joins the persistent order, and the boots
/// after it follow the order as it was.
#[tokio::test]
async fn a_continuous_bios_setup_lasts_one_boot_and_leaves_the_order_alone() {
    let ilo = Ilo::start().await;
    let order_before = ilo.admin_state().await["persistent_boot"].clone();
    let (status, reply) = ilo
        .patch_boot(json!({"BootSourceOverrideTarget": "BiosSetup", "BootSourceOverrideEnabled": "Continuous"}))
        .await;
    assert_eq!(status, 200, "{reply}");
    let state = ilo.admin_state().await;
    assert_eq!(state["persistent_boot"], order_before, "{state:#}");
    assert!(
        !state["persistent_boot"]
            .as_array()
            .expect("an order")
            .contains(&json!("RBSU")),
        "{state:#}"
    );
    let boot = &ilo.system().await["Boot"];
    assert_eq!(boot["BootSourceOverrideTarget"], "BiosSetup", "{boot}");
    assert_eq!(boot["BootSourceOverrideEnabled"], "Once", "{boot}");

    ilo.reset("On").await;
    let state = ilo.admin_state().await;
    assert_eq!(state["last_boot"]["device"], "RBSU", "{state:#}");
    assert_eq!(state["last_boot"]["reason"], "one_time", "{state:#}");
    // The next power-ons follow the order as it was (the drives are empty: the disk).
    for _ in 0..2 {
        ilo.reset("ForceOff").await;
        ilo.reset("On").await;
        let state = ilo.admin_state().await;
        assert_eq!(state["last_boot"]["device"], "HDD", "{state:#}");
        assert_eq!(state["last_boot"]["reason"], "persistent", "{state:#}");
        assert_eq!(state["persistent_boot"], order_before, "{state:#}");
    }
    let boot = &ilo.system().await["Boot"];
    assert_eq!(boot["BootSourceOverrideTarget"], "None", "{boot}");
    assert_eq!(boot["BootSourceOverrideEnabled"], "Disabled", "{boot}");
    ilo.emulator.shutdown().await;
}
