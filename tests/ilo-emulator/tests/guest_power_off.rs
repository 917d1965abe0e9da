//! A machine that powers itself off (the guest OS, or the deploy agent, powering down) reads Off
//! on the very next power read, over Redfish and RIBCL, without waiting for the machine's event
//! to be handled. The backend here stops "by itself" and never sends the event at all, so only
//! the read-time check can report it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use vmdeploy_ilo_emulator::backend::ScriptedMachine;
use vmdeploy_ilo_emulator::{Backend, Emulator, EmulatorConfig};

const USER: &str = "Administrator";
const PASSWORD: &str = "password";

async fn power_state(client: &reqwest::Client, addr: std::net::SocketAddr) -> String {
    let v: Value = client
        .get(format!("https://{addr}/redfish/v1/Systems/1/"))
        .basic_auth(USER, Some(PASSWORD))
        .send()
        .await
        .expect("GET System")
        .json()
        .await
        .expect("System is JSON");
    v["PowerState"].as_str().unwrap_or_default().to_owned()
}

async fn ribcl_power(client: &reqwest::Client, addr: std::net::SocketAddr) -> String {
    let body = format!(
        "<RIBCL VERSION=\"2.0\"><LOGIN USER_LOGIN=\"{USER}\" PASSWORD=\"{PASSWORD}\">\
         <SERVER_INFO MODE=\"read\"><GET_HOST_POWER_STATUS/></SERVER_INFO></LOGIN></RIBCL>\r\n"
    );
    let text = client
        .post(format!("https://{addr}/ribcl"))
        .body(body)
        .send()
        .await
        .expect("RIBCL")
        .text()
        .await
        .expect("RIBCL body");
    text.split_once("HOST_POWER=\"")
        .and_then(|(_, rest)| rest.split('"').next())
        .unwrap_or_else(|| panic!("no HOST_POWER in {text}"))
        .to_owned()
}

#[tokio::test]
async fn a_guest_power_off_reads_off_on_the_next_read() {
    let machine = Arc::new(ScriptedMachine::default());
    let mut config = EmulatorConfig::loopback();
    let m = machine.clone();
    config.backend = Arc::new(move |_| m.clone() as Arc<dyn Backend>);
    let emulator = Emulator::start(config).await.expect("starting");
    let addr = emulator.addresses()[0];
    let cert = reqwest::Certificate::from_pem(emulator.cert_pem().as_bytes()).expect("PEM");
    let client = reqwest::Client::builder()
        .tls_certs_only([cert])
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()
        .expect("client");
    let server = emulator.server(0).expect("server 0").clone();

    server.power_on().await.expect("power on");
    assert_eq!(power_state(&client, addr).await, "On");
    assert_eq!(ribcl_power(&client, addr).await, "ON");

    // The guest powers off; no event ever comes. The very next reads say Off.
    machine.guest_powers_off();
    assert_eq!(power_state(&client, addr).await, "Off");
    assert_eq!(ribcl_power(&client, addr).await, "OFF");
    // The emulator cleaned up the stopped machine once, as an iLO-side power-off would.
    assert_eq!(
        machine.calls(),
        [
            "firmware Legacy",
            "boot_device Some(Hdd)",
            "power_on",
            "power_off"
        ]
    );

    // Powered on again, it is a new run that runs until the guest powers off again.
    server.power_on().await.expect("power on again");
    assert_eq!(ribcl_power(&client, addr).await, "ON");
    machine.guest_powers_off();
    assert_eq!(ribcl_power(&client, addr).await, "OFF");
    assert_eq!(power_state(&client, addr).await, "Off");
    emulator.shutdown().await;
}
