//! One node's BMC, below both the manager (API power, power sync, manage, validate, boot device)
//! and the deploy flows: the only way either reaches a BMC.
//!
//! # Design
//! A [`Bmc`] is built once per node task from the node's `driver_info`
//! ([`BmcDriverInfo::parse`]: `ilo_*` keys for the iLO drivers, Ironic's `redfish_*` keys for
//! `redfish`, defaults from the conductor's `[ilo]` settings) and holds one connected client.
//! It owns what every caller needs the same way: the protocol choice, power polling, power off,
//! the virtual media and boot device steps, and failures worded for the operator with the
//! node's own keys ([`BmcError`], [`describe`]).
//!
//! `ilo_protocol = auto` asks the iLO which protocol it speaks (docs/ilo-management.md §1.7).
//! The answer is remembered in the node's `driver_internal_info` ([`PROTOCOL_KEY`], with the
//! address it was asked at), so later tasks connect without asking again: a power action makes
//! one connection and at most one probe.
//!
//! A Redfish client takes its session from the conductor's cache
//! ([`RedfishSessions::conductor`]): the `Bmc`s of every task for one BMC share one session,
//! which the cache logs out when idle and at shutdown (a node task's `Bmc` is dropped without
//! a logout).
//!
//! # Limitations
//! A remembered choice is asked again only when the address changes. An iLO whose RIBCL is
//! switched off after the probe keeps failing over RIBCL until `ilo_protocol` is set.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::drivers::ilo::redfish::RedfishSessions;
use crate::drivers::ilo::{IloClient, Protocol};
use crate::drivers::{
    virtual_media_licensed, DriverError, FirmwareLogEntry, Inventory, Management, Power,
    VirtualMedia, VmediaBootOption,
};
use crate::node::driver_info::{BmcDriverInfo, BmcKeys, DriverInfoError, IloDefaults};
use crate::states::NodePower;
use crate::store::{JsonObject, Node};
use vmdeploy_shared::error::Chain;

mod error;

pub use crate::drivers::{BootDevice, BootMode, PowerAction, PowerState, VmediaDevice};
pub use error::{describe, BmcError};

/// `driver_internal_info` key of the protocol an `auto` probe chose:
/// `{"address": "https://host:port", "protocol": "ribcl" | "redfish"}`.
pub const PROTOCOL_KEY: &str = "bmc_protocol";

/// How often the BMC is read while a power change is awaited.
const POWER_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// How long [`Bmc::power_on`] and [`Bmc::power_off`] wait for the BMC to report the change.
const POWER_CHANGE_WAIT: Duration = Duration::from_secs(30);

/// The BMC of one node, connected.
#[derive(Debug)]
pub struct Bmc {
    client: IloClient,
    keys: BmcKeys,
    address: String,
}

impl Bmc {
    /// The node's BMC settings, checked without connecting: what the API refuses before it
    /// starts a task.
    pub fn settings(node: &Node, defaults: &IloDefaults) -> Result<BmcDriverInfo, BmcError> {
        BmcDriverInfo::parse(&node.driver, &node.driver_info, defaults)
            .map_err(|error| BmcError::Settings { error })
    }

    /// Connects to the node's BMC, with the protocol `driver_info` names or an `auto` probe
    /// remembered in `driver_internal_info`; a new probe's answer is written there (the caller
    /// saves the node).
    pub async fn connect(node: &mut Node, defaults: &IloDefaults) -> Result<Bmc, BmcError> {
        let (bmc, probed) = Bmc::open(node, defaults).await?;
        if probed {
            node.driver_internal_info.insert(
                PROTOCOL_KEY.into(),
                json!({"address": bmc.address, "protocol": bmc.client.protocol().to_string()}),
            );
        }
        Ok(bmc)
    }

    /// [`Bmc::connect`] for a caller that does not save the node: a remembered protocol is
    /// used, a new probe's answer is not kept.
    pub async fn connect_read_only(node: &Node, defaults: &IloDefaults) -> Result<Bmc, BmcError> {
        Ok(Bmc::open(node, defaults).await?.0)
    }

    /// The client, and whether the protocol was probed for (not named, not remembered).
    async fn open(node: &Node, defaults: &IloDefaults) -> Result<(Bmc, bool), BmcError> {
        Bmc::open_with(node, defaults, RedfishSessions::conductor()).await
    }

    /// [`Bmc::open`] with Redfish sessions from `sessions`.
    async fn open_with(
        node: &Node,
        defaults: &IloDefaults,
        sessions: &RedfishSessions,
    ) -> Result<(Bmc, bool), BmcError> {
        let BmcDriverInfo { mut config, keys } = Bmc::settings(node, defaults)?;
        config.redfish_sessions = Some(sessions.clone());
        // Checked by the parse already; an error here would name the address key all the same.
        let address = config.base_url().map_err(|e| BmcError::Settings {
            error: DriverInfoError::Invalid {
                field: keys.address,
                reason: e.to_string(),
            },
        })?;
        let mut probed = false;
        if config.protocol == Protocol::Auto {
            match remembered(&node.driver_internal_info, &address) {
                Some(known) => config.protocol = known,
                None => probed = true,
            }
        }
        let client = IloClient::connect(&config)
            .await
            .map_err(|error| failed(&keys, &address, "connecting", error))?;
        let bmc = Bmc {
            client,
            keys,
            address,
        };
        Ok((bmc, probed))
    }

    /// Connects and reads the power state: the check that `driver_info` reaches the BMC with
    /// working credentials (manage, power sync).
    pub async fn read_power(
        node: &mut Node,
        defaults: &IloDefaults,
    ) -> Result<NodePower, BmcError> {
        Bmc::connect(node, defaults).await?.node_power().await
    }

    /// [`Bmc::connect`] for a clean-up, which must go on without the BMC: a failure is logged
    /// and gives `None`.
    pub async fn connect_for_cleanup(node: &mut Node, defaults: &IloDefaults) -> Option<Bmc> {
        match Bmc::connect(node, defaults).await {
            Ok(bmc) => Some(bmc),
            Err(e) => {
                tracing::warn!(node = %node.uuid, error = %Chain(&e), "clean-up: cannot reach the BMC");
                None
            }
        }
    }

    /// The `driver_info` keys this BMC's settings came from.
    pub fn keys(&self) -> &BmcKeys {
        &self.keys
    }

    fn failed(&self, step: &str, error: DriverError) -> BmcError {
        failed(&self.keys, &self.address, step, error)
    }

    /// The host's power state (also the check that the credentials work).
    pub async fn power_state(&self) -> Result<PowerState, BmcError> {
        self.client
            .power_state()
            .await
            .map_err(|e| self.failed("reading the power state", e))
    }

    /// The host's power state as the API shows it.
    pub async fn node_power(&self) -> Result<NodePower, BmcError> {
        Ok(match self.power_state().await? {
            PowerState::On => NodePower::On,
            PowerState::Off => NodePower::Off,
        })
    }

    /// Asks the BMC for a power action, without waiting for its effect.
    pub async fn set_power(&self, action: PowerAction) -> Result<(), BmcError> {
        self.client
            .set_power(action)
            .await
            .map(|_| ())
            .map_err(|e| self.failed(power_step(action), e))
    }

    /// Polls until the BMC reports `want`; `false` when `deadline` comes first.
    async fn poll_until(
        &self,
        want: PowerState,
        deadline: Instant,
    ) -> Result<PowerState, BmcError> {
        loop {
            let now = self.power_state().await?;
            if now == want || Instant::now() + POWER_POLL_INTERVAL > deadline {
                return Ok(now);
            }
            tokio::time::sleep(POWER_POLL_INTERVAL).await;
        }
    }

    /// Waits up to `wait` for `want`; `Ok(true)` when reached. Used for the agent's own
    /// power-off, which the BMC only sees once the host is down.
    pub async fn wait_for(&self, want: PowerState, wait: Duration) -> Result<bool, BmcError> {
        Ok(self.poll_until(want, Instant::now() + wait).await? == want)
    }

    /// Waits until the BMC reports `want`, or fails at `deadline` with
    /// [`BmcError::PowerTimeout`] (`waited` is what the message reports).
    pub async fn wait_power(
        &self,
        want: PowerState,
        deadline: Instant,
        waited: Duration,
    ) -> Result<(), BmcError> {
        let now = self.poll_until(want, deadline).await?;
        if now == want {
            return Ok(());
        }
        Err(BmcError::PowerTimeout {
            bmc: self.keys.bmc,
            address: self.address.clone(),
            now,
            want,
            seconds: waited.as_secs(),
        })
    }

    /// Powers the host off (holding the button, Ironic's hard power-off) and waits until the
    /// BMC reports it off.
    pub async fn power_off(&self) -> Result<(), BmcError> {
        if self.power_state().await? == PowerState::Off {
            return Ok(());
        }
        self.set_power(PowerAction::HoldButton).await?;
        self.wait_power(
            PowerState::Off,
            Instant::now() + POWER_CHANGE_WAIT,
            POWER_CHANGE_WAIT,
        )
        .await
    }

    /// Powers the host on and waits until the BMC reports it on.
    pub async fn power_on(&self) -> Result<(), BmcError> {
        self.set_power(PowerAction::On).await?;
        self.wait_power(
            PowerState::On,
            Instant::now() + POWER_CHANGE_WAIT,
            POWER_CHANGE_WAIT,
        )
        .await
    }

    /// Whether virtual media is licensed (an Advanced licence, as Ironic checks), and the
    /// licences there are, for the message when not.
    pub async fn vmedia_licensed(&self) -> Result<(bool, String), BmcError> {
        let licences = self
            .client
            .licences()
            .await
            .map_err(|e| self.failed("reading the licences", e))?;
        let names: Vec<String> = licences.iter().map(|l| l.licence_type.clone()).collect();
        Ok((virtual_media_licensed(&licences), names.join(", ")))
    }

    /// Inserts `url` into `device` (ejecting what is there first) and connects it read-only.
    pub async fn insert(&self, device: VmediaDevice, url: &str) -> Result<(), BmcError> {
        let status = self
            .client
            .vmedia_status(device)
            .await
            .map_err(|e| self.failed(&format!("reading the virtual {device}"), e))?;
        if status.inserted {
            self.eject(device).await?;
        }
        self.client
            .insert_vmedia(device, url)
            .await
            .map_err(|e| self.failed(&format!("inserting the virtual {device}"), e))?;
        self.client
            .set_vmedia_status(device, VmediaBootOption::Connect, Some(true))
            .await
            .map_err(|e| self.failed(&format!("connecting the virtual {device}"), e))
    }

    /// Ejects `device` (a no-op when empty).
    pub async fn eject(&self, device: VmediaDevice) -> Result<(), BmcError> {
        self.client
            .eject_vmedia(device)
            .await
            .map_err(|e| self.failed(&format!("ejecting the virtual {device}"), e))
    }

    /// Boots from `device`, at the next boot only or (`persistent`) at every boot.
    pub async fn set_boot_device(
        &self,
        device: &BootDevice,
        persistent: bool,
    ) -> Result<(), BmcError> {
        let result = if persistent {
            self.client.set_persistent_boot(device).await
        } else {
            self.client.set_one_time_boot(device).await
        };
        let how = if persistent { "persistent" } else { "one-time" };
        let to = match device {
            BootDevice::Cdrom => "the CD".to_string(),
            BootDevice::Hdd => "the disk".to_string(),
            BootDevice::Network => "the network".to_string(),
            other => other.to_string(),
        };
        result.map_err(|e| self.failed(&format!("setting the {how} boot to {to}"), e))
    }

    /// Boots the next boot only from the (virtual) CD.
    pub async fn boot_once_from_cd(&self) -> Result<(), BmcError> {
        self.set_boot_device(&BootDevice::Cdrom, false).await
    }

    /// Boots from the (virtual) CD from now on, at every boot: a netboot instance's boot ISO
    /// (RIBCL `SET_PERSISTENT_BOOT` with `CDROM`, Redfish `BootSourceOverrideEnabled:
    /// Continuous` with `Cd`), as Ironic's iLO driver sets it for netboot.
    pub async fn boot_from_cd(&self) -> Result<(), BmcError> {
        self.set_boot_device(&BootDevice::Cdrom, true).await
    }

    /// Boots the next boot only from the network (PXE): `pxe_ilo`'s deploy ramdisk.
    pub async fn boot_once_from_network(&self) -> Result<(), BmcError> {
        self.set_boot_device(&BootDevice::Network, false).await
    }

    /// Boots from the network from now on, at every boot: a `pxe_ilo` netboot instance.
    pub async fn boot_from_network(&self) -> Result<(), BmcError> {
        self.set_boot_device(&BootDevice::Network, true).await
    }

    /// Boots from the local disk from now on.
    pub async fn boot_from_disk(&self) -> Result<(), BmcError> {
        self.set_boot_device(&BootDevice::Hdd, true).await
    }

    /// The one-time boot device, if one is set.
    pub async fn one_time_boot(&self) -> Result<Option<BootDevice>, BmcError> {
        self.client
            .one_time_boot()
            .await
            .map_err(|e| self.failed("reading the one-time boot device", e))
    }

    /// The persistent boot order, first device first.
    pub async fn persistent_boot(&self) -> Result<Vec<BootDevice>, BmcError> {
        self.client
            .persistent_boot()
            .await
            .map_err(|e| self.failed("reading the persistent boot order", e))
    }

    /// Checks that the host booted in `expected`, the mode set as pending before the boot: iLO
    /// 5/6 apply a BIOS change at the reboot and may refuse it (a BIOS password, a setting it
    /// depends on), saying why only in the BIOS settings result. A BMC that cannot tell the
    /// current mode passes.
    pub async fn confirm_boot_mode(&self, expected: BootMode) -> Result<(), BmcError> {
        let current = match self.client.current_boot_mode().await {
            Ok(mode) => mode,
            Err(DriverError::NotSupported { .. }) => return Ok(()),
            Err(e) => return Err(self.failed("reading the current boot mode", e)),
        };
        if current == expected {
            return Ok(());
        }
        let result = match &self.client {
            IloClient::Redfish(redfish) => redfish
                .bios_settings_result()
                .await
                .map(|m| m.join("; "))
                .unwrap_or_else(|e| format!("unreadable: {e}")),
            IloClient::Ribcl(_) => "not reported over RIBCL".into(),
        };
        Err(self.failed(
            "checking the boot mode after the reboot",
            DriverError::Bmc {
                code: None,
                message: format!(
                    "boot mode {expected} did not apply: the host booted in {current}; the                      BIOS settings result: {}",
                    if result.is_empty() { "none" } else { &result }
                ),
            },
        ))
    }

    /// Reads the Secure Boot setting: `validate`'s check that a node asking for Secure Boot
    /// has a BMC that can set it (iLO 4 over RIBCL cannot).
    pub async fn secure_boot_enabled(&self) -> Result<bool, BmcError> {
        self.client
            .secure_boot_enabled()
            .await
            .map_err(|e| self.failed("reading the Secure Boot setting", e))
    }

    /// The newest `limit` entries of the server's Integrated Management Log, oldest first: what
    /// the firmware recorded about its boots (a refused boot loader, say), for an error message
    /// to quote.
    pub async fn firmware_log(&self, limit: usize) -> Result<Vec<FirmwareLogEntry>, BmcError> {
        self.client
            .firmware_log(limit)
            .await
            .map_err(|e| self.failed("reading the Integrated Management Log", e))
    }

    /// Makes UEFI Secure Boot `wanted` for the next boot; returns whether it changed the
    /// setting (so the caller can undo only its own change). A BMC without a Secure Boot
    /// setting is fine when Secure Boot is not wanted, and an error naming why when it is.
    pub async fn ensure_secure_boot(&self, wanted: bool) -> Result<bool, BmcError> {
        let enabled =
            match self.client.secure_boot_enabled().await {
                Ok(enabled) => enabled,
                Err(DriverError::NotSupported { .. }) if !wanted => return Ok(false),
                Err(e @ DriverError::NotSupported { .. }) => return Err(self.failed(
                    "the node asks for UEFI Secure Boot (capabilities secure_boot:true), which \
                     this BMC cannot set",
                    e,
                )),
                Err(e) => return Err(self.failed("reading the Secure Boot setting", e)),
            };
        if enabled == wanted {
            return Ok(false);
        }
        let step = if wanted {
            "turning Secure Boot on"
        } else {
            "turning Secure Boot off"
        };
        self.client
            .set_secure_boot(wanted)
            .await
            .map_err(|e| self.failed(step, e))?;
        Ok(true)
    }

    /// Makes `wanted` (or, when `None`, whatever is pending) the boot mode of the next boot;
    /// returns the mode the host will boot in. A BMC that cannot tell or set boot modes is a
    /// legacy-BIOS-only machine, as Ironic assumes.
    pub async fn ensure_boot_mode(&self, wanted: Option<BootMode>) -> Result<BootMode, BmcError> {
        let pending = match self.client.pending_boot_mode().await {
            Ok(mode) => mode,
            Err(DriverError::NotSupported { .. }) => BootMode::Bios,
            Err(e) => return Err(self.failed("reading the pending boot mode", e)),
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
            Err(e @ DriverError::NotSupported { .. }) => Err(self.failed(
                &format!(
                    "the node asks for boot mode {wanted} (properties.capabilities), which \
                     this BMC cannot set"
                ),
                e,
            )),
            Err(e) => Err(self.failed(&format!("setting the boot mode to {wanted}"), e)),
        }
    }
}

/// The step a power action is, in messages.
fn power_step(action: PowerAction) -> &'static str {
    match action {
        PowerAction::On => "powering on",
        PowerAction::Off => "powering off",
        PowerAction::Reset => "resetting the host",
        PowerAction::PressButton => "pressing the power button",
        PowerAction::HoldButton => "holding the power button",
    }
}

fn failed(keys: &BmcKeys, address: &str, step: &str, error: DriverError) -> BmcError {
    BmcError::Driver {
        bmc: keys.bmc,
        address: address.to_string(),
        step: step.to_string(),
        description: describe(&error, keys),
        error: Box::new(error),
    }
}

/// The protocol an earlier `auto` probe chose for the BMC at `address`.
fn remembered(internal: &JsonObject, address: &str) -> Option<Protocol> {
    let memory = internal.get(PROTOCOL_KEY)?;
    if memory.get("address").and_then(Value::as_str) != Some(address) {
        return None;
    }
    match memory.get("protocol").and_then(Value::as_str)?.parse() {
        Ok(Protocol::Auto) | Err(_) => None,
        Ok(known) => Some(known),
    }
}

#[cfg(test)]
mod tests;
