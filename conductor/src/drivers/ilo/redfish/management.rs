//! Boot override, BIOS boot mode, virtual media, licences, inventory and health over Redfish
//! (docs/ilo-management.md §3.3).

use std::collections::HashMap;

use serde_json::{json, Value};

use super::client::RedfishClient;
use super::codec::{
    action_target, bios_boot_mode, bios_boot_mode_body, boot_option_name, boot_order,
    boot_override, boot_override_body, boot_target, firmware_log_entry, has_hpe_oem, join, licence,
    link, link_at, members, override_entry, override_mode, power, supported_boot_modes, thermal,
    vmedia_status, PathStep,
};
use crate::drivers::ilo::ribcl::management::parse_boot_device;
use crate::drivers::{
    BmcInfo, BootDevice, BootEntry, BootMode, DriverError, FirmwareLogEntry, Health, Inventory,
    Licence, Management, SupportedBootModes, VirtualMedia, VmediaBootOption, VmediaDevice,
    VmediaStatus,
};
use vmdeploy_shared::error::Chain;

const INSERT_MEDIA: &str = "#VirtualMedia.InsertMedia";
const EJECT_MEDIA: &str = "#VirtualMedia.EjectMedia";
const HPE_INSERT: &str = "#HpeiLOVirtualMedia.InsertVirtualMedia";
const HPE_EJECT: &str = "#HpeiLOVirtualMedia.EjectVirtualMedia";

fn malformed(url: &str, message: String) -> DriverError {
    DriverError::MalformedReply {
        url: url.to_string(),
        message,
    }
}

/// The OEM key (`Hpe`, iLO 4: `Hp`) under which a VirtualMedia member shows
/// `BootOnNextServerReset`, if it does.
fn boot_once_flag(member: &Value) -> Option<&'static str> {
    let oem = member.get("Oem")?;
    ["Hpe", "Hp"].into_iter().find(|key| {
        oem.get(key)
            .and_then(|o| o.get("BootOnNextServerReset"))
            .is_some()
    })
}

/// Errors after which the HPE OEM action is tried instead of the standard one: the service
/// refused the action itself, not the credentials or the connection.
fn try_oem_after(err: &DriverError) -> bool {
    matches!(
        err,
        DriverError::NotSupported { .. } | DriverError::HttpStatus { .. }
    )
}

impl RedfishClient {
    async fn system(&self) -> Result<(String, Value), DriverError> {
        let uri = self.layout().await?.system.clone();
        let system = self.get(&uri).await?;
        Ok((uri, system))
    }

    async fn set_boot_override(&self, device: &BootDevice, once: bool) -> Result<(), DriverError> {
        let target = boot_target(device).map_err(DriverError::InvalidRequest)?;
        let (uri, _) = self.system().await?;
        let uefi_path = match device {
            BootDevice::Uefi { id, .. } => Some(id.as_str()),
            _ => None,
        };
        self.patch(&uri, &boot_override_body(target, once, uefi_path))
            .await
    }

    /// `BootOptionReference` (lower-cased) to `DisplayName` of the system's BootOptions, empty
    /// when the service has none (sushy-tools, iLO 5 before 1.40).
    async fn boot_option_names(
        &self,
        system: &Value,
    ) -> Result<HashMap<String, String>, DriverError> {
        let mut names = HashMap::new();
        let collection = link_at(
            system,
            &[PathStep::Key("Boot"), PathStep::Key("BootOptions")],
        )
        .or_else(|| link(system, "BootOptions"));
        let Some(collection) = collection else {
            return Ok(names);
        };
        let collection = match self.get(collection).await {
            Ok(c) => c,
            Err(DriverError::NotSupported { .. })
            | Err(DriverError::HttpStatus { status: 404, .. }) => return Ok(names),
            Err(err) => return Err(err),
        };
        for member in members(&collection) {
            let option = self.get(&member).await?;
            if let Some((reference, name)) = boot_option_name(&option) {
                names.insert(reference.to_ascii_lowercase(), name);
            }
        }
        Ok(names)
    }

    /// The result of the BIOS's last apply of pending settings (`@Redfish.Settings.Messages`:
    /// `Base.1.0.Success`, or what it refused and why), as `MessageId (args)` texts; empty
    /// when the service shows none.
    pub async fn bios_settings_result(&self) -> Result<Vec<String>, DriverError> {
        let (_, system) = self.system().await?;
        let Some((bios, _)) = self.bios(&system).await? else {
            return Ok(Vec::new());
        };
        let messages = bios
            .pointer("/@Redfish.Settings/Messages")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        Ok(messages
            .iter()
            .filter_map(|m| {
                let id = m
                    .get("MessageId")
                    .or_else(|| m.get("MessageID"))
                    .and_then(Value::as_str)?;
                let args: Vec<String> = m
                    .get("MessageArgs")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                Some(if args.is_empty() {
                    id.to_string()
                } else {
                    format!("{id} ({})", args.join(", "))
                })
            })
            .collect())
    }

    /// The BIOS resource and its pending-settings URI, if the system has a working one
    /// (sushy-tools' fake driver answers 501: then `None`).
    async fn bios(&self, system: &Value) -> Result<Option<(Value, Option<String>)>, DriverError> {
        let Some(uri) = link(system, "Bios") else {
            return Ok(None);
        };
        match self.get(uri).await {
            Ok(bios) => {
                let settings = link_at(
                    &bios,
                    &[
                        PathStep::Key("@Redfish.Settings"),
                        PathStep::Key("SettingsObject"),
                    ],
                )
                .map(str::to_string);
                Ok(Some((bios, settings)))
            }
            Err(DriverError::NotSupported { .. })
            | Err(DriverError::HttpStatus { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn vmedia_action(
        &self,
        member_uri: &str,
        member: &Value,
        standard: (&str, &str, &Value),
        oem: (&str, &str, &Value),
    ) -> Result<(), DriverError> {
        let (std_name, std_tail, std_body) = standard;
        let (oem_name, oem_tail, oem_body) = oem;
        let std_target = action_target(member, std_name)
            .map(str::to_string)
            .unwrap_or_else(|| join(member_uri, std_tail));
        // proliantutils tries the standard action first and falls back to the HPE one
        // (docs/ilo-management.md §3.3: standard InsertMedia only exists on iLO 5 2.73 and later).
        match self.post(&std_target, std_body).await {
            Ok(_) => Ok(()),
            Err(err) if try_oem_after(&err) && has_hpe_oem(member) => {
                tracing::info!(error = %Chain(&err), "standard virtual media action refused, trying the HPE OEM one");
                let oem_target = action_target(member, oem_name)
                    .map(str::to_string)
                    .unwrap_or_else(|| join(member_uri, oem_tail));
                self.post(&oem_target, oem_body).await.map(|_| ())
            }
            Err(err) => Err(err),
        }
    }
}

impl Management for RedfishClient {
    async fn one_time_boot(&self) -> Result<Option<BootDevice>, DriverError> {
        let (_, system) = self.system().await?;
        Ok(match boot_override(&system) {
            (Some(device), Some(enabled)) if enabled == "Once" => Some(device),
            _ => None,
        })
    }

    async fn set_one_time_boot(&self, device: &BootDevice) -> Result<(), DriverError> {
        self.set_boot_override(device, true).await
    }

    async fn persistent_boot_entries(&self) -> Result<Vec<BootEntry>, DriverError> {
        let (_, system) = self.system().await?;
        if let (Some(device), Some(enabled)) = boot_override(&system) {
            if enabled == "Continuous" {
                return Ok(vec![override_entry(&system, device)]);
            }
        }
        // No persistent override: the firmware's own order, `BootXXXX` references whose
        // descriptions are the BootOptions members' DisplayName.
        let order = boot_order(&system);
        if order.is_empty() {
            return Ok(Vec::new());
        }
        let names = self.boot_option_names(&system).await?;
        Ok(order
            .into_iter()
            .map(|id| match names.get(&id.to_ascii_lowercase()) {
                Some(name) => BootEntry::uefi(id, name),
                None => match parse_boot_device(&id, None) {
                    uefi @ BootDevice::Uefi { .. } => BootEntry {
                        device: uefi,
                        id: Some(id),
                        description: None,
                    },
                    device => BootEntry::device(device),
                },
            })
            .collect())
    }

    async fn set_persistent_boot(&self, device: &BootDevice) -> Result<(), DriverError> {
        self.set_boot_override(device, false).await
    }

    async fn current_boot_mode(&self) -> Result<BootMode, DriverError> {
        let (uri, system) = self.system().await?;
        if let Some((bios, _)) = self.bios(&system).await? {
            return bios_boot_mode(&bios).map_err(|m| malformed(&uri, m));
        }
        override_mode(&system).ok_or_else(|| DriverError::NotSupported {
            operation: "boot mode".into(),
            message: "no BIOS resource and no Boot.BootSourceOverrideMode".into(),
        })
    }

    async fn pending_boot_mode(&self) -> Result<BootMode, DriverError> {
        let (uri, system) = self.system().await?;
        if let Some((bios, settings)) = self.bios(&system).await? {
            if let Some(settings) = settings {
                let pending = self.get(&settings).await?;
                // A settings object that does not change BootMode leaves the current one.
                if pending
                    .get("Attributes")
                    .and_then(|a| a.get("BootMode"))
                    .is_some()
                {
                    return bios_boot_mode(&pending).map_err(|m| malformed(&settings, m));
                }
            }
            return bios_boot_mode(&bios).map_err(|m| malformed(&uri, m));
        }
        override_mode(&system).ok_or_else(|| DriverError::NotSupported {
            operation: "boot mode".into(),
            message: "no BIOS resource and no Boot.BootSourceOverrideMode".into(),
        })
    }

    async fn set_pending_boot_mode(&self, mode: BootMode) -> Result<(), DriverError> {
        let (uri, system) = self.system().await?;
        if let Some((_, settings)) = self.bios(&system).await? {
            let target = settings
                .or_else(|| link(&system, "Bios").map(|b| join(b, "Settings")))
                .unwrap_or_else(|| join(&uri, "Bios/Settings"));
            return self.patch(&target, &bios_boot_mode_body(mode)).await;
        }
        // Without a BIOS resource the override mode is the only knob (sushy-tools, docs/ilo-management.md §4).
        let value = match mode {
            BootMode::Uefi => "UEFI",
            BootMode::Bios => "Legacy",
        };
        self.patch(&uri, &json!({"Boot": {"BootSourceOverrideMode": value}}))
            .await
    }

    async fn supported_boot_modes(&self) -> Result<SupportedBootModes, DriverError> {
        let (_, system) = self.system().await?;
        supported_boot_modes(&system).ok_or_else(|| DriverError::NotSupported {
            operation: "supported boot modes".into(),
            message: "the system advertises neither UefiClass nor override modes".into(),
        })
    }

    async fn secure_boot_enabled(&self) -> Result<bool, DriverError> {
        let uri = self.secure_boot_uri().await?;
        let resource = self.get(&uri).await?;
        resource
            .get("SecureBootEnable")
            .and_then(Value::as_bool)
            .ok_or_else(|| malformed(&uri, "no boolean SecureBootEnable".into()))
    }

    async fn set_secure_boot(&self, enable: bool) -> Result<(), DriverError> {
        let uri = self.secure_boot_uri().await?;
        self.patch(&uri, &json!({ "SecureBootEnable": enable }))
            .await
    }

    /// The collection lists its entries as links, a page at a time on a long log
    /// (`Members@odata.nextLink`). The newest `limit` by entry id are read, whatever order the
    /// pages come in.
    async fn firmware_log(&self, limit: usize) -> Result<Vec<FirmwareLogEntry>, DriverError> {
        let entries_uri = self.iml_entries_uri().await?;
        let mut uris = Vec::new();
        let mut page = Some(entries_uri.clone());
        let mut pages = 0;
        while let Some(uri) = page.take() {
            let collection = self.get(&uri).await?;
            uris.extend(members(&collection));
            pages += 1;
            // A log that pages on and on is read no further: the timeout's message must come.
            if pages < MAX_LOG_PAGES {
                page = collection
                    .get("Members@odata.nextLink")
                    .and_then(Value::as_str)
                    .filter(|next| *next != uri)
                    .map(str::to_owned);
            }
        }
        let newest = newest_entries(uris, limit);
        let mut entries = Vec::new();
        for uri in &newest {
            let entry = self.get(uri).await?;
            entries.extend(firmware_log_entry(&entry));
        }
        Ok(entries)
    }
}

/// Pages of the IML's entry collection read at most.
const MAX_LOG_PAGES: usize = 20;

/// The `limit` newest of an entry collection's member URIs, oldest first: ordered by the
/// numeric id that ends each URI (iLO numbers entries from 1), or kept in the listed order
/// when an id is not a number.
fn newest_entries(mut uris: Vec<String>, limit: usize) -> Vec<String> {
    let id =
        |uri: &str| -> Option<u64> { uri.trim_end_matches('/').rsplit('/').next()?.parse().ok() };
    if uris.iter().all(|u| id(u).is_some()) {
        uris.sort_by_key(|u| id(u));
    }
    uris.dedup();
    let skip = uris.len().saturating_sub(limit);
    uris.split_off(skip)
}

impl RedfishClient {
    /// The IML's entries collection: the system's `LogServices` link (or the iLO path when
    /// the system has none), the member whose path ends in `IML`, its `Entries` link.
    async fn iml_entries_uri(&self) -> Result<String, DriverError> {
        let (system_uri, system) = self.system().await?;
        let services_uri = link(&system, "LogServices")
            .map(str::to_owned)
            .unwrap_or_else(|| join(&system_uri, "LogServices"));
        let services = self.get(&services_uri).await?;
        let iml_uri = members(&services)
            .into_iter()
            .find(|m| {
                m.trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .is_some_and(|last| last.eq_ignore_ascii_case("IML"))
            })
            .ok_or_else(|| DriverError::NotSupported {
                operation: "reading the Integrated Management Log".into(),
                message: format!("{services_uri} lists no IML log service"),
            })?;
        let iml = self.get(&iml_uri).await?;
        Ok(link(&iml, "Entries")
            .map(str::to_owned)
            .unwrap_or_else(|| join(&iml_uri, "Entries")))
    }

    /// The system's `SecureBoot` resource (DSP0268 `SecureBoot`, iLO 5/6
    /// `Systems/1/SecureBoot`); a system without the link has no Secure Boot.
    async fn secure_boot_uri(&self) -> Result<String, DriverError> {
        let (_, system) = self.system().await?;
        link(&system, "SecureBoot")
            .map(str::to_owned)
            .ok_or_else(|| DriverError::NotSupported {
                operation: "Secure Boot".into(),
                message: "the system has no SecureBoot resource".into(),
            })
    }
}

impl VirtualMedia for RedfishClient {
    async fn vmedia_status(&self, device: VmediaDevice) -> Result<VmediaStatus, DriverError> {
        let (_, member) = self.vmedia_member(device).await?;
        Ok(vmedia_status(&member, device))
    }

    async fn insert_vmedia(&self, device: VmediaDevice, url: &str) -> Result<(), DriverError> {
        let parsed = url::Url::parse(url)
            .map_err(|e| DriverError::InvalidRequest(format!("image URL {url:?}: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(DriverError::InvalidRequest(format!(
                "image URL {url:?}: the BMC fetches only http(s) URLs"
            )));
        }
        let (member_uri, member) = self.vmedia_member(device).await?;
        if vmedia_status(&member, device).inserted {
            // Replace, as proliantutils does: eject first.
            self.eject_vmedia(device).await?;
        }
        let standard = json!({"Image": url, "Inserted": true, "WriteProtected": true});
        let oem = json!({"Image": url});
        self.vmedia_action(
            &member_uri,
            &member,
            (INSERT_MEDIA, "Actions/VirtualMedia.InsertMedia", &standard),
            (
                HPE_INSERT,
                "Actions/Oem/Hpe/HpeiLOVirtualMedia.InsertVirtualMedia/",
                &oem,
            ),
        )
        .await
    }

    async fn eject_vmedia(&self, device: VmediaDevice) -> Result<(), DriverError> {
        let (member_uri, member) = self.vmedia_member(device).await?;
        if !vmedia_status(&member, device).inserted {
            return Ok(());
        }
        let empty = json!({});
        self.vmedia_action(
            &member_uri,
            &member,
            (EJECT_MEDIA, "Actions/VirtualMedia.EjectMedia", &empty),
            (
                HPE_EJECT,
                "Actions/Oem/Hpe/HpeiLOVirtualMedia.EjectVirtualMedia/",
                &empty,
            ),
        )
        .await
    }

    async fn set_vmedia_status(
        &self,
        device: VmediaDevice,
        boot_option: VmediaBootOption,
        write_protect: Option<bool>,
    ) -> Result<(), DriverError> {
        let (member_uri, member) = self.vmedia_member(device).await?;
        if boot_option == VmediaBootOption::Disconnect {
            return self.eject_vmedia(device).await;
        }
        let mut patch = serde_json::Map::new();
        // Only a change is sent: many BMCs (sushy-tools among them) refuse PATCHing it.
        let current_wp = member.get("WriteProtected").and_then(Value::as_bool);
        if let Some(wp) = write_protect.filter(|wp| Some(*wp) != current_wp) {
            patch.insert("WriteProtected".into(), json!(wp));
        }
        // RIBCL → Redfish (docs/ilo-management.md §3.3): BOOT_ONCE is BootOnNextServerReset true,
        // BOOT_ALWAYS and NO_BOOT are false, CONNECT changes nothing.
        let boot_once = match boot_option {
            VmediaBootOption::BootOnce => Some(true),
            VmediaBootOption::BootAlways | VmediaBootOption::NoBoot => Some(false),
            VmediaBootOption::Connect | VmediaBootOption::Disconnect => None,
        };
        if let Some(once) = boot_once {
            // Only a slot that shows the flag takes it: iLO has it on the CD slot alone and
            // refuses it on the floppy (PropertyNotWritableOrUnknown, docs/ilo-quirks.md §5).
            match boot_once_flag(&member) {
                Some(oem) => {
                    patch.insert(
                        "Oem".into(),
                        json!({ oem: {"BootOnNextServerReset": once} }),
                    );
                }
                // A BMC without the HPE flag: boot once from the CD by override instead.
                None if once && device == VmediaDevice::Cdrom => {
                    self.set_boot_override(&BootDevice::Cdrom, true).await?;
                }
                None if once => {
                    return Err(DriverError::NotSupported {
                        operation: format!("boot once from the {device} virtual media"),
                        message: "this slot has no BootOnNextServerReset: only the CD boots".into(),
                    })
                }
                // Nothing armed, nothing to clear.
                None => {}
            }
        }
        if patch.is_empty() {
            return Ok(());
        }
        self.patch(&member_uri, &Value::Object(patch)).await
    }
}

impl Inventory for RedfishClient {
    async fn licences(&self) -> Result<Vec<Licence>, DriverError> {
        let layout = self.layout().await?;
        let manager_uri = layout
            .manager
            .clone()
            .ok_or_else(|| DriverError::NotSupported {
                operation: "licences".into(),
                message: "no manager".into(),
            })?;
        let manager = self.get(&manager_uri).await?;
        let service = link_at(
            &manager,
            &[
                PathStep::Key("Oem"),
                PathStep::Key("Hpe"),
                PathStep::Key("Links"),
                PathStep::Key("LicenseService"),
            ],
        )
        .map(str::to_string)
        .unwrap_or_else(|| join(&manager_uri, "LicenseService/"));
        let collection = match self.get(&service).await {
            Ok(c) => c,
            Err(DriverError::HttpStatus { status: 404, .. }) => {
                return Err(DriverError::NotSupported {
                    operation: "licences".into(),
                    message: format!("{service} not found"),
                })
            }
            Err(e) => return Err(e),
        };
        let mut licences = Vec::new();
        for member in members(&collection) {
            let resource = self.get(&member).await?;
            licences.extend(licence(&resource));
        }
        Ok(licences)
    }

    async fn info(&self) -> Result<BmcInfo, DriverError> {
        let (_, system) = self.system().await?;
        let product_name = system
            .get("Model")
            .and_then(Value::as_str)
            .filter(|m| !m.trim().is_empty())
            .or_else(|| system.get("Name").and_then(Value::as_str))
            .unwrap_or_default()
            .trim()
            .to_string();
        let (firmware_version, management_processor) = match &self.layout().await?.manager {
            Some(uri) => {
                let manager = self.get(uri).await?;
                let text = |k: &str| manager.get(k).and_then(Value::as_str).map(str::to_string);
                (text("FirmwareVersion"), text("Model"))
            }
            None => (None, None),
        };
        Ok(BmcInfo {
            product_name,
            firmware_version,
            management_processor,
            protocol: "redfish".into(),
        })
    }

    async fn health(&self) -> Result<Health, DriverError> {
        let layout = self.layout().await?;
        let mut health = Health::default();
        let Some(chassis_uri) = layout.chassis.clone() else {
            return Ok(health);
        };
        let chassis = self.get(&chassis_uri).await?;
        if let Some(uri) = link(&chassis, "Thermal") {
            thermal(&self.get(uri).await?, &mut health);
        }
        if let Some(uri) = link(&chassis, "Power") {
            power(&self.get(uri).await?, &mut health);
        }
        Ok(health)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_newest_entries_by_id_whatever_the_order() {
        let uris = |ids: &[&str]| -> Vec<String> {
            ids.iter()
                .map(|i| format!("/redfish/v1/Systems/1/LogServices/IML/Entries/{i}/"))
                .collect()
        };
        assert_eq!(
            super::newest_entries(uris(&["12", "3", "11", "10"]), 2),
            uris(&["11", "12"])
        );
        assert_eq!(
            super::newest_entries(uris(&["2", "1"]), 5),
            uris(&["1", "2"])
        );
        // Ids that are not numbers keep the listed order.
        assert_eq!(
            super::newest_entries(uris(&["b", "a", "c"]), 2),
            uris(&["a", "c"])
        );
        assert!(super::newest_entries(Vec::new(), 3).is_empty());
    }
    use std::time::Duration;

    use super::*;
    use crate::drivers::ilo::test_server::{Reply, Request, TestServer};
    use crate::drivers::ilo::{IloConfig, Protocol, RetryPolicy, TlsVerify};
    use crate::drivers::Secret;

    /// An early iLO 5: no standard InsertMedia (404), only the HPE OEM action.
    fn early_ilo5(req: &Request) -> Reply {
        let body = match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/redfish/v1/") => json!({"Systems": {"@odata.id": "/redfish/v1/Systems/"}}),
            ("GET", "/redfish/v1/Systems/") => {
                json!({"Members": [{"@odata.id": "/redfish/v1/Systems/1/"}]})
            }
            ("GET", "/redfish/v1/Systems/1/") => json!({"PowerState": "Off",
                "Links": {"ManagedBy": [{"@odata.id": "/redfish/v1/Managers/1/"}]}}),
            ("GET", "/redfish/v1/Managers/1/") => {
                json!({"VirtualMedia": {"@odata.id": "/redfish/v1/Managers/1/VirtualMedia/"}})
            }
            ("GET", "/redfish/v1/Managers/1/VirtualMedia/") => json!({"Members": [
                {"@odata.id": "/redfish/v1/Managers/1/VirtualMedia/1/"},
                {"@odata.id": "/redfish/v1/Managers/1/VirtualMedia/2/"}]}),
            ("GET", "/redfish/v1/Managers/1/VirtualMedia/1/") => {
                json!({"MediaTypes": ["Floppy", "USBStick"], "Inserted": false})
            }
            ("GET", "/redfish/v1/Managers/1/VirtualMedia/2/") => json!({
                "MediaTypes": ["CD", "DVD"], "Inserted": false, "Image": "",
                "Oem": {"Hpe": {"BootOnNextServerReset": false, "Actions": {
                    "#HpeiLOVirtualMedia.InsertVirtualMedia": {"target": "/redfish/v1/Managers/1/VirtualMedia/2/Actions/Oem/Hpe/HpeiLOVirtualMedia.InsertVirtualMedia/"}}}}}),
            ("POST", "/redfish/v1/Managers/1/VirtualMedia/2/Actions/Oem/Hpe/HpeiLOVirtualMedia.InsertVirtualMedia/") => json!({}),
            ("PATCH", "/redfish/v1/Managers/1/VirtualMedia/2/") => json!({}),
            _ => {
                return Reply::status(
                    404,
                    json!({"error": {"message": "no such resource"}}).to_string(),
                )
            }
        };
        Reply::ok(body.to_string())
    }

    /// A UEFI iLO 5 without a persistent override: the firmware's BootOrder, described by the
    /// BootOptions members (names from proliantutils
    /// `tests/redfish/json_samples/bios_boot.json`).
    fn uefi_ilo5(req: &Request) -> Reply {
        let option = |reference: &str, name: &str| json!({"BootOptionReference": reference, "DisplayName": name});
        let body = match (req.method.as_str(), req.path.as_str()) {
            ("GET", "/redfish/v1/") => json!({"Systems": {"@odata.id": "/redfish/v1/Systems/"}}),
            ("GET", "/redfish/v1/Systems/") => {
                json!({"Members": [{"@odata.id": "/redfish/v1/Systems/1/"}]})
            }
            ("GET", "/redfish/v1/Systems/1/") => json!({"PowerState": "Off",
                "Boot": {"BootSourceOverrideEnabled": "Disabled",
                    "BootSourceOverrideTarget": "None", "UefiTargetBootSourceOverride": "None",
                    "BootOrder": ["Boot0007", "Boot0009", "Boot000C", "Boot0001"],
                    "BootOptions": {"@odata.id": "/redfish/v1/Systems/1/BootOptions/"}}}),
            ("GET", "/redfish/v1/Systems/1/BootOptions/") => json!({"Members": [
                {"@odata.id": "/redfish/v1/Systems/1/BootOptions/1/"},
                {"@odata.id": "/redfish/v1/Systems/1/BootOptions/2/"},
                {"@odata.id": "/redfish/v1/Systems/1/BootOptions/3/"}]}),
            ("GET", "/redfish/v1/Systems/1/BootOptions/1/") => option(
                "Boot0007",
                "Embedded Storage : HPE Smart Array S100i SR Gen10 - LogVol (Lun:1 VolId:1) 931.48 GiB, RAID 0",
            ),
            ("GET", "/redfish/v1/Systems/1/BootOptions/2/") => option(
                "Boot0009",
                "Embedded LOM 1 Port 1 : HPE Ethernet 1Gb 4-port 331i Adapter - NIC (PXE IPv4)",
            ),
            ("GET", "/redfish/v1/Systems/1/BootOptions/3/") => {
                option("Boot000C", "Generic USB Boot")
            }
            _ => {
                return Reply::status(
                    404,
                    json!({"error": {"message": "no such resource"}}).to_string(),
                )
            }
        };
        Reply::ok(body.to_string())
    }

    #[tokio::test]
    async fn uefi_boot_order_reads_as_devices_with_their_names() {
        let server = TestServer::start(uefi_ilo5).await;
        let mut c = IloConfig::new(server.address.clone(), "admin", Secret::new("x"));
        c.tls = TlsVerify::CaFile(server.cert_path.clone());
        c.timeout = Duration::from_secs(5);
        c.protocol = Protocol::Redfish;
        let client = RedfishClient::new(&c).expect("client");
        let entries = client.persistent_boot_entries().await.expect("order");
        let devices: Vec<String> = entries.iter().map(|e| e.device.to_string()).collect();
        assert_eq!(devices, ["hdd", "network", "usb", "Boot0001"]);
        assert_eq!(entries[0].id.as_deref(), Some("Boot0007"));
        assert!(entries[0]
            .description
            .as_deref()
            .is_some_and(|d| d.contains("Smart Array S100i")));
        // An entry without a BootOption stays a raw UEFI id: nothing to classify it by.
        assert_eq!(entries[3].description, None);
        assert_eq!(
            client.persistent_boot().await.expect("devices")[0],
            BootDevice::Hdd
        );
    }

    #[tokio::test]
    async fn insert_falls_back_to_the_hpe_oem_action_and_boot_once_uses_the_oem_flag() {
        let server = TestServer::start(early_ilo5).await;
        let mut c = IloConfig::new(server.address.clone(), "admin", Secret::new("x"));
        c.tls = TlsVerify::CaFile(server.cert_path.clone());
        c.timeout = Duration::from_secs(5);
        c.protocol = Protocol::Redfish;
        c.retry = RetryPolicy::new(1, Duration::from_millis(1));
        let client = RedfishClient::new(&c).expect("client");
        client
            .insert_vmedia(VmediaDevice::Cdrom, "http://10.0.0.1/boot.iso")
            .await
            .expect("OEM insert");
        client
            .set_vmedia_status(VmediaDevice::Cdrom, VmediaBootOption::BootOnce, None)
            .await
            .expect("boot once");
        let requests = server.requests();
        let posts: Vec<(String, String)> = requests
            .iter()
            .filter(|r| r.method != "GET")
            .map(|r| (r.path.clone(), r.body.clone()))
            .collect();
        assert_eq!(posts.len(), 3, "{posts:?}");
        assert_eq!(
            posts[0].0,
            "/redfish/v1/Managers/1/VirtualMedia/2/Actions/VirtualMedia.InsertMedia"
        );
        assert!(posts[1]
            .0
            .ends_with("HpeiLOVirtualMedia.InsertVirtualMedia/"));
        assert_eq!(
            serde_json::from_str::<Value>(&posts[1].1).expect("json"),
            json!({"Image": "http://10.0.0.1/boot.iso"})
        );
        assert_eq!(posts[2].0, "/redfish/v1/Managers/1/VirtualMedia/2/");
        assert_eq!(
            serde_json::from_str::<Value>(&posts[2].1).expect("json"),
            json!({"Oem": {"Hpe": {"BootOnNextServerReset": true}}})
        );
    }
}
