//! Every BMC call the deploy flows make, in one place: the flows see these few operations, not
//! the iLO client's traits, so a change of the driver layer is adapted here only.

use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use uuid::Uuid;

use crate::drivers::ilo::{IloClient, Protocol};
use crate::drivers::{
    virtual_media_licensed, BootDevice, DriverError, Inventory, Management, Power, PowerAction,
    VirtualMedia, VmediaBootOption,
};
use crate::node::driver_info::{IloDefaults, IloDriverInfo};
use crate::store::Node;

pub(super) use crate::drivers::{BootMode, PowerState, VmediaDevice};

/// How often and how long a power change is polled until the BMC reports it.
const POWER_POLL_INTERVAL: Duration = Duration::from_millis(500);
const POWER_POLL_ATTEMPTS: u32 = 60;

/// The node's `driver_info` as the iLO client reads it: as it is for the iLO drivers; for the
/// `redfish` hardware type, `redfish_address` (a URL in Ironic), `redfish_username`,
/// `redfish_password` and `redfish_verify_ca` under the `ilo_*` names, spoken over Redfish.
fn client_settings(node: &Node) -> serde_json::Map<String, Value> {
    let mut info = node.driver_info.clone();
    if node.driver == "redfish" {
        for (from, to) in [
            ("redfish_address", "ilo_address"),
            ("redfish_username", "ilo_username"),
            ("redfish_password", "ilo_password"),
            ("redfish_verify_ca", "ilo_verify_ca"),
        ] {
            if let (false, Some(v)) = (info.contains_key(to), info.get(from).cloned()) {
                let v = match (to, v) {
                    ("ilo_address", Value::String(s)) => Value::String(
                        s.trim_start_matches("https://")
                            .trim_start_matches("http://")
                            .trim_end_matches('/')
                            .to_owned(),
                    ),
                    (_, v) => v,
                };
                info.insert(to.into(), v);
            }
        }
        info.entry("ilo_protocol")
            .or_insert_with(|| Value::String(Protocol::Redfish.to_string()));
    }
    info
}

/// The BMC of one node.
pub(super) struct Bmc {
    client: IloClient,
    address: String,
    node: Uuid,
}

impl Bmc {
    /// Connects to the node's BMC from its `driver_info` (`ilo_*`; for the `redfish` alias
    /// `redfish_address`/`redfish_username`/`redfish_password`, spoken over Redfish).
    pub(super) async fn connect(node: &Node, defaults: &IloDefaults) -> anyhow::Result<Bmc> {
        let info = client_settings(node);
        let config = IloDriverInfo::parse(&info, defaults)
            .context("reading the BMC settings of driver_info")?
            .config;
        let address = config.address.clone();
        let client = IloClient::connect(&config)
            .await
            .with_context(|| format!("connecting to the iLO at {address}"))?;
        Ok(Bmc {
            client,
            address,
            node: node.uuid,
        })
    }

    /// [`Bmc::connect`] for a clean-up, which must go on without the BMC: a failure is logged
    /// and gives `None`.
    pub(super) async fn connect_for_cleanup(node: &Node, defaults: &IloDefaults) -> Option<Bmc> {
        match Bmc::connect(node, defaults).await {
            Ok(bmc) => Some(bmc),
            Err(e) => {
                tracing::warn!(node = %node.uuid, error = %format!("{e:#}"), "clean-up: cannot reach the BMC");
                None
            }
        }
    }

    fn ctx(&self, what: &str) -> String {
        format!("iLO {} of node {}: {what}", self.address, self.node)
    }

    /// The host's power state (also the check that the credentials work).
    pub(super) async fn power_state(&self) -> anyhow::Result<PowerState> {
        self.client
            .power_state()
            .await
            .with_context(|| self.ctx("reading the power state"))
    }

    /// Whether virtual media is licensed (an Advanced licence, as Ironic checks).
    pub(super) async fn vmedia_licensed(&self) -> anyhow::Result<(bool, String)> {
        let licences = self
            .client
            .licences()
            .await
            .with_context(|| self.ctx("reading the licences"))?;
        let names: Vec<String> = licences.iter().map(|l| l.licence_type.clone()).collect();
        let ok = virtual_media_licensed(&licences);
        Ok((ok, names.join(", ")))
    }

    /// Powers the host off (holding the button, Ironic's hard power-off) and waits until the
    /// BMC reports it off.
    pub(super) async fn power_off(&self) -> anyhow::Result<()> {
        if self.power_state().await? == PowerState::Off {
            return Ok(());
        }
        self.client
            .set_power(PowerAction::HoldButton)
            .await
            .with_context(|| self.ctx("powering off"))?;
        self.wait_power(PowerState::Off, POWER_POLL_ATTEMPTS).await
    }

    /// Powers the host on and waits until the BMC reports it on.
    pub(super) async fn power_on(&self) -> anyhow::Result<()> {
        self.client
            .set_power(PowerAction::On)
            .await
            .with_context(|| self.ctx("powering on"))?;
        self.wait_power(PowerState::On, POWER_POLL_ATTEMPTS).await
    }

    /// Waits up to `attempts` polls for `want`; `Ok(true)` when reached. Used for the agent's
    /// own power-off, which the BMC only sees once the host is down.
    pub(super) async fn wait_for(&self, want: PowerState, wait: Duration) -> anyhow::Result<bool> {
        let attempts = (wait.as_millis() / POWER_POLL_INTERVAL.as_millis()).max(1);
        for i in 0..attempts {
            if self.power_state().await? == want {
                return Ok(true);
            }
            if i + 1 < attempts {
                tokio::time::sleep(POWER_POLL_INTERVAL).await;
            }
        }
        Ok(false)
    }

    async fn wait_power(&self, want: PowerState, attempts: u32) -> anyhow::Result<()> {
        let wait = POWER_POLL_INTERVAL * attempts;
        if self.wait_for(want, wait).await? {
            Ok(())
        } else {
            anyhow::bail!(self.ctx(&format!(
                "the host did not reach power {want} within {} s",
                wait.as_secs()
            )))
        }
    }

    /// Inserts `url` into `device` (ejecting what is there first) and connects it read-only.
    pub(super) async fn insert(&self, device: VmediaDevice, url: &str) -> anyhow::Result<()> {
        let status = self
            .client
            .vmedia_status(device)
            .await
            .with_context(|| self.ctx(&format!("reading the virtual {device}")))?;
        if status.inserted {
            self.eject(device).await?;
        }
        self.client
            .insert_vmedia(device, url)
            .await
            .with_context(|| self.ctx(&format!("inserting the virtual {device}")))?;
        self.client
            .set_vmedia_status(device, VmediaBootOption::Connect, Some(true))
            .await
            .with_context(|| self.ctx(&format!("connecting the virtual {device}")))
    }

    /// Ejects `device` (a no-op when empty).
    pub(super) async fn eject(&self, device: VmediaDevice) -> anyhow::Result<()> {
        self.client
            .eject_vmedia(device)
            .await
            .with_context(|| self.ctx(&format!("ejecting the virtual {device}")))
    }

    /// Boots the next boot only from the (virtual) CD.
    pub(super) async fn boot_once_from_cd(&self) -> anyhow::Result<()> {
        self.client
            .set_one_time_boot(&BootDevice::Cdrom)
            .await
            .with_context(|| self.ctx("setting the one-time boot to the CD"))
    }

    /// Boots from the (virtual) CD from now on, at every boot: a netboot instance's boot ISO
    /// (RIBCL `SET_PERSISTENT_BOOT` with `CDROM`, Redfish `BootSourceOverrideEnabled:
    /// Continuous` with `Cd`), as Ironic's iLO driver sets it for netboot.
    pub(super) async fn boot_from_cd(&self) -> anyhow::Result<()> {
        self.client
            .set_persistent_boot(&BootDevice::Cdrom)
            .await
            .with_context(|| self.ctx("setting the persistent boot to the CD"))
    }

    /// Boots the next boot only from the network (PXE): `pxe_ilo`'s deploy ramdisk.
    pub(super) async fn boot_once_from_network(&self) -> anyhow::Result<()> {
        self.client
            .set_one_time_boot(&BootDevice::Network)
            .await
            .with_context(|| self.ctx("setting the one-time boot to the network"))
    }

    /// Boots from the network from now on, at every boot: a `pxe_ilo` netboot instance.
    pub(super) async fn boot_from_network(&self) -> anyhow::Result<()> {
        self.client
            .set_persistent_boot(&BootDevice::Network)
            .await
            .with_context(|| self.ctx("setting the persistent boot to the network"))
    }

    /// Boots from the local disk from now on.
    pub(super) async fn boot_from_disk(&self) -> anyhow::Result<()> {
        self.client
            .set_persistent_boot(&BootDevice::Hdd)
            .await
            .with_context(|| self.ctx("setting the persistent boot to the disk"))
    }

    /// Makes `wanted` (or, when `None`, whatever is pending) the boot mode of the next boot;
    /// returns the mode the host will boot in. A BMC that cannot tell or set boot modes is a
    /// legacy-BIOS-only machine, as Ironic assumes.
    pub(super) async fn ensure_boot_mode(
        &self,
        wanted: Option<BootMode>,
    ) -> anyhow::Result<BootMode> {
        let pending = match self.client.pending_boot_mode().await {
            Ok(mode) => mode,
            Err(DriverError::NotSupported { .. }) => BootMode::Bios,
            Err(e) => return Err(e).with_context(|| self.ctx("reading the pending boot mode")),
        };
        let Some(wanted) = wanted else {
            return Ok(pending);
        };
        if wanted == pending {
            return Ok(pending);
        }
        match self.client.set_pending_boot_mode(wanted).await {
            Ok(()) => Ok(wanted),
            Err(DriverError::NotSupported { .. }) if wanted == BootMode::Bios => Ok(wanted),
            Err(e @ DriverError::NotSupported { .. }) => Err(anyhow::Error::new(e)).with_context(|| {
                self.ctx(&format!(
                    "the node asks for boot mode {wanted} (properties.capabilities), which this BMC cannot set"
                ))
            }),
            Err(e) => {
                Err(e).with_context(|| self.ctx(&format!("setting the boot mode to {wanted}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::states::ProvisionState;
    use serde_json::json;

    #[test]
    fn redfish_nodes_are_read_under_the_ilo_names() {
        let mut node = Node::new(Uuid::new_v4(), "redfish", ProvisionState::Available);
        if let Value::Object(o) = json!({"redfish_address": "https://10.0.0.9:8443/",
                                         "redfish_username": "u", "redfish_password": "p",
                                         "redfish_verify_ca": false})
        {
            node.driver_info = o;
        }
        let config = IloDriverInfo::parse(&client_settings(&node), &IloDefaults::default())
            .expect("readable")
            .config;
        assert_eq!(config.base_url().expect("url"), "https://10.0.0.9:8443");
        assert_eq!(config.protocol, Protocol::Redfish);
        assert_eq!(config.username, "u");
        node.driver = "agent_ilo".into();
        assert!(IloDriverInfo::parse(&client_settings(&node), &IloDefaults::default()).is_err());
    }
}
