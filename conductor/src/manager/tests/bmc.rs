//! The BMC seen from the manager: credentials checked on `manage`, and a `redfish` node
//! enrolled with Ironic's `redfish_*` keys.

use serde_json::{json, Value};
use uuid::Uuid;
use vmdeploy_ilo_emulator::Power as EmuPower;

use super::harness::*;
use crate::manager::*;
use crate::states::ProvisionState;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manage_checks_the_credentials() {
    let h = Harness::new().await;
    let good = h.node_in(ProvisionState::Enroll).await;
    let bad = h.ilo_node(ProvisionState::Enroll, "wrong").await;
    for uuid in [good, bad] {
        h.request(uuid, ProvisionVerb::Manage).await;
    }
    h.settle().await;
    let node = h.node(good).await;
    assert_eq!(node.provision_state, ProvisionState::Manageable);
    assert!(node.power_state.is_some());
    let node = h.node(bad).await;
    assert_eq!(node.provision_state, ProvisionState::Enroll);
    let error = node.last_error.expect("last_error");
    assert!(error.contains("verify the BMC credentials"), "{error}");
}

impl Harness {
    /// `driver_info` of a `redfish` node as Ironic's redfish hardware type takes it: only
    /// `redfish_*` keys, the address a URL, the system named by its path.
    fn redfish_driver_info(&self, password: &str) -> Value {
        json!({
            "redfish_address": format!("https://{}", self.emulator.addresses()[0]),
            "redfish_system_id": "/redfish/v1/Systems/1",
            "redfish_username": "Administrator",
            "redfish_password": password,
            "redfish_verify_ca": self.cert.to_string_lossy(),
        })
    }

    async fn redfish_node(&self, password: &str) -> Uuid {
        let driver_info = self.redfish_driver_info(password);
        self.create_node("redfish", ProvisionState::Enroll, driver_info)
            .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redfish_node_with_ironics_keys_is_managed_validated_and_powered() {
    let h = Harness::new().await;
    let uuid = h.redfish_node("password").await;
    let node = h.provision(uuid, ProvisionVerb::Manage).await;
    assert_eq!(
        node.provision_state,
        ProvisionState::Manageable,
        "{:?}",
        node.last_error
    );
    assert_eq!(node.power_state, Some(NodePower::Off));

    let lines = h.manager.validate(&id(uuid)).await.expect("validate");
    for interface in ["power", "management"] {
        assert_eq!(
            lines[interface].result,
            Some(true),
            "{interface}: {:?}",
            lines[interface]
        );
    }

    let node = h.power(uuid, NodePower::On).await;
    assert_eq!(node.last_error, None);
    assert_eq!(node.power_state, Some(NodePower::On));
    assert_eq!(h.emulator_power().await, EmuPower::On);
    let reading = h.manager.boot_device(&id(uuid)).await.expect("boot device");
    assert!(reading.persistent.is_some(), "{reading:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redfish_node_with_a_wrong_password_is_told_about_its_redfish_keys() {
    let h = Harness::new().await;
    let uuid = h.redfish_node("wrong").await;
    let node = h.provision(uuid, ProvisionVerb::Manage).await;
    assert_eq!(node.provision_state, ProvisionState::Enroll);
    let error = node.last_error.expect("last_error");
    assert!(error.contains("redfish_password"), "{error}");
    assert!(!error.contains("ilo_"), "an iLO key named: {error}");
    assert!(!error.contains("wrong"), "the password leaked: {error}");
}
