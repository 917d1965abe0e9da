//! A machine that powers itself off (the guest OS, or the deploy agent, powering down) reads Off
//! on the very next power read, over Redfish and RIBCL, without waiting for the machine's event
//! to be handled. The backend here stops "by itself" and never sends the event at all, so only
//! the read-time check can report it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use vmdeploy_ilo_emulator::backend::{
    BackendFuture, MachineEvent, MachineEventKind, MachineEvents,
};
use vmdeploy_ilo_emulator::{Backend, BootDevice, BootMode, Emulator, EmulatorConfig, VmDevice};

const USER: &str = "Administrator";
const PASSWORD: &str = "password";

/// A machine whose guest can power it off; its events channel stays silent.
#[derive(Default)]
struct SilentMachine {
    run: AtomicU64,
    guest_powered_off: AtomicBool,
    calls: Mutex<Vec<&'static str>>,
    _events: Mutex<Option<MachineEvents>>,
}

impl SilentMachine {
    fn call(&self, name: &'static str) -> BackendFuture<'_> {
        if let Ok(mut c) = self.calls.lock() {
            c.push(name);
        }
        match name {
            "power_on" | "reset" => {
                self.run.fetch_add(1, Ordering::SeqCst);
                self.guest_powered_off.store(false, Ordering::SeqCst);
            }
            "power_off" => self.run.store(0, Ordering::SeqCst),
            _ => {}
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

impl Backend for SilentMachine {
    fn power_on(&self) -> BackendFuture<'_> {
        self.call("power_on")
    }
    fn power_off(&self) -> BackendFuture<'_> {
        self.call("power_off")
    }
    fn reset(&self) -> BackendFuture<'_> {
        self.call("reset")
    }
    fn set_boot_device(&self, _: Option<BootDevice>) -> BackendFuture<'_> {
        Box::pin(std::future::ready(Ok(())))
    }
    fn attach_media<'a>(&'a self, _: VmDevice, _: &'a str) -> BackendFuture<'a> {
        Box::pin(std::future::ready(Ok(())))
    }
    fn detach_media(&self, _: VmDevice) -> BackendFuture<'_> {
        Box::pin(std::future::ready(Ok(())))
    }
    fn firmware_boot_mode(&self) -> BackendFuture<'_, Option<BootMode>> {
        Box::pin(std::future::ready(Ok(None)))
    }
    fn set_firmware_boot_mode(&self, _: BootMode) -> BackendFuture<'_> {
        Box::pin(std::future::ready(Ok(())))
    }
    fn stopped_by_itself(&self) -> Option<MachineEvent> {
        let run = self.run.load(Ordering::SeqCst);
        (run != 0 && self.guest_powered_off.load(Ordering::SeqCst)).then(|| MachineEvent {
            kind: MachineEventKind::PoweredOff,
            generation: run,
            reason: "guest-shutdown".into(),
        })
    }
    fn is_current(&self, generation: u64) -> bool {
        generation != 0 && self.run.load(Ordering::SeqCst) == generation
    }
    fn is_running(&self) -> bool {
        self.run.load(Ordering::SeqCst) != 0
    }
}

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
    let machine = Arc::new(SilentMachine::default());
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
    machine.guest_powered_off.store(true, Ordering::SeqCst);
    assert_eq!(power_state(&client, addr).await, "Off");
    assert_eq!(ribcl_power(&client, addr).await, "OFF");
    // The emulator cleaned up the stopped machine once, as an iLO-side power-off would.
    let calls = machine.calls.lock().map(|c| c.clone()).unwrap_or_default();
    assert_eq!(calls, ["power_on", "power_off"]);

    // Powered on again, it is a new run that runs until the guest powers off again.
    server.power_on().await.expect("power on again");
    assert_eq!(ribcl_power(&client, addr).await, "ON");
    machine.guest_powered_off.store(true, Ordering::SeqCst);
    assert_eq!(ribcl_power(&client, addr).await, "OFF");
    assert_eq!(power_state(&client, addr).await, "Off");
    emulator.shutdown().await;
}
