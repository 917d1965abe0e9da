//! Boot devices, boot mode, virtual media, licences, inventory and health over RIBCL
//! (docs/ilo-management.md §1.5, §1.6). Each `decode_*` reads one reply payload; the
//! `Management`, `VirtualMedia` and `Inventory` impls send the commands.

use super::client::RibclClient;
use super::codec::{RibclCommand, RibclReply, Wrapper, XmlElement};
use super::error::RibclParseError;
use crate::drivers::ilo::leading_number;
use crate::drivers::{
    BmcInfo, BootDevice, BootEntry, BootMode, DriverError, Fan, Health, Inventory, Licence,
    Management, PowerReading, PowerSupply, SupportedBootModes, Temperature, VirtualMedia,
    VmediaBootOption, VmediaDevice, VmediaStatus,
};

fn missing(command: &str, what: &str) -> RibclParseError {
    RibclParseError::MissingPayload {
        command: command.into(),
        what: what.into(),
    }
}

fn unexpected(command: &str, what: &str, value: &str) -> RibclParseError {
    RibclParseError::UnexpectedValue {
        command: command.into(),
        what: what.into(),
        value: value.into(),
    }
}

/// A RIBCL boot device name (`CDROM`, `Boot000B`, ...) as a [`BootDevice`].
pub fn parse_boot_device(name: &str, description: Option<&str>) -> BootDevice {
    let n = name.trim();
    let is_uefi_entry = n.len() == 8
        && n[..4].eq_ignore_ascii_case("boot")
        && n[4..].chars().all(|c| c.is_ascii_hexdigit());
    if is_uefi_entry {
        return BootDevice::Uefi {
            id: n.to_string(),
            description: description.map(str::to_string),
        };
    }
    match n.to_ascii_uppercase().as_str() {
        "CDROM" => BootDevice::Cdrom,
        "HDD" => BootDevice::Hdd,
        "NETWORK" => BootDevice::Network,
        "FLOPPY" => BootDevice::Floppy,
        "USB" => BootDevice::Usb,
        _ => BootDevice::Other(n.to_string()),
    }
}

/// The RIBCL name of a boot device.
pub fn boot_device_name(device: &BootDevice) -> String {
    match device {
        BootDevice::Cdrom => "CDROM".into(),
        BootDevice::Hdd => "HDD".into(),
        BootDevice::Network => "NETWORK".into(),
        BootDevice::Floppy => "FLOPPY".into(),
        BootDevice::Usb => "USB".into(),
        BootDevice::Uefi { id, .. } => id.clone(),
        BootDevice::Other(name) => name.clone(),
    }
}

fn vmedia_name(device: VmediaDevice) -> &'static str {
    match device {
        VmediaDevice::Floppy => "FLOPPY",
        VmediaDevice::Cdrom => "CDROM",
    }
}

fn vm_boot_option_name(option: VmediaBootOption) -> &'static str {
    match option {
        VmediaBootOption::BootAlways => "BOOT_ALWAYS",
        VmediaBootOption::BootOnce => "BOOT_ONCE",
        VmediaBootOption::NoBoot => "NO_BOOT",
        VmediaBootOption::Connect => "CONNECT",
        VmediaBootOption::Disconnect => "DISCONNECT",
    }
}

fn yes_no(value: &str) -> Option<bool> {
    match value.trim().to_ascii_uppercase().as_str() {
        "YES" | "Y" | "TRUE" => Some(true),
        "NO" | "N" | "FALSE" => Some(false),
        _ => None,
    }
}

/// `<ONE_TIME_BOOT><BOOT_TYPE VALUE="Normal"/></ONE_TIME_BOOT>`; `Normal` means none. iLO 6
/// answers a UEFI entry as a pair, `VALUE="Boot000B" DESCRIPTION=".."` (docs/ilo-quirks.md §3),
/// whose description says the device as in the persistent order; a description that names no
/// known device keeps the entry's id.
pub fn decode_one_time_boot(reply: &RibclReply) -> Result<Option<BootDevice>, RibclParseError> {
    const CMD: &str = "GET_ONE_TIME_BOOT";
    let boot_type = reply
        .payload("ONE_TIME_BOOT")
        .and_then(|e| e.find("BOOT_TYPE"));
    let value = boot_type
        .and_then(|b| b.get("VALUE"))
        .ok_or_else(|| missing(CMD, "ONE_TIME_BOOT/BOOT_TYPE VALUE"))?;
    if value.trim().eq_ignore_ascii_case("normal") {
        return Ok(None);
    }
    let described = boot_type
        .and_then(|b| b.get("DESCRIPTION"))
        .map(|description| BootEntry::uefi(value.trim(), description).device);
    Ok(Some(match described {
        Some(
            device @ (BootDevice::Cdrom
            | BootDevice::Hdd
            | BootDevice::Network
            | BootDevice::Floppy
            | BootDevice::Usb),
        ) => device,
        Some(_) => parse_boot_device(value, boot_type.and_then(|b| b.get("DESCRIPTION"))),
        None => parse_boot_device(value, None),
    }))
}

/// `<PERSISTENT_BOOT><DEVICE value=".." [DESCRIPTION=".."]/>...`: in legacy mode the entries
/// name devices; in UEFI mode they are `BootXXXX` ids whose descriptions say the device
/// (docs/ilo-management.md §1.5), classified by [`crate::drivers::classify_boot_entry`].
pub fn decode_persistent_boot(reply: &RibclReply) -> Result<Vec<BootEntry>, RibclParseError> {
    const CMD: &str = "GET_PERSISTENT_BOOT";
    let list = reply
        .payload("PERSISTENT_BOOT")
        .ok_or_else(|| missing(CMD, "PERSISTENT_BOOT"))?;
    list.find_all("DEVICE")
        .map(|d| {
            let value = d.get("VALUE").ok_or_else(|| missing(CMD, "DEVICE VALUE"))?;
            Ok(match d.get("DESCRIPTION") {
                Some(description) => BootEntry::uefi(value.trim(), description),
                None => match parse_boot_device(value, None) {
                    // A bare BootXXXX id without a description: nothing to classify it by.
                    uefi @ BootDevice::Uefi { .. } => BootEntry {
                        device: uefi,
                        id: Some(value.trim().to_string()),
                        description: None,
                    },
                    device => BootEntry::device(device),
                },
            })
        })
        .collect()
}

/// The SET_PERSISTENT_BOOT command for `wanted`, given the current order: legacy mode sends the
/// device name, UEFI mode (proliantutils tells it by a DESCRIPTION on the first entry,
/// `_check_boot_mode`) the `BootXXXX` ids of every entry of that device, in their order.
pub fn persistent_boot_command(
    wanted: &BootDevice,
    current: &[BootEntry],
) -> Result<RibclCommand, DriverError> {
    let uefi = current.first().is_some_and(|e| e.description.is_some());
    let ids: Vec<String> = if let BootDevice::Uefi { id, .. } = wanted {
        vec![id.clone()]
    } else if uefi {
        let ids: Vec<String> = current
            .iter()
            .filter(|e| e.description.is_some() && e.device == *wanted)
            .filter_map(|e| e.id.clone())
            .collect();
        if ids.is_empty() {
            return Err(DriverError::InvalidRequest(format!(
                "no UEFI boot entry is a {wanted} device"
            )));
        }
        ids
    } else {
        vec![boot_device_name(wanted)]
    };
    let mut element = XmlElement::new("SET_PERSISTENT_BOOT");
    for id in ids {
        element = element.child(XmlElement::new("DEVICE").attr("VALUE", id));
    }
    Ok(RibclCommand::write(Wrapper::ServerInfo, element))
}

/// `<CMD><BOOT_MODE VALUE="LEGACY|UEFI"/></CMD>` for GET_CURRENT/PENDING_BOOT_MODE.
pub fn decode_boot_mode(reply: &RibclReply, command: &str) -> Result<BootMode, RibclParseError> {
    let value = reply
        .payload(command)
        .and_then(|e| e.child_value("BOOT_MODE"))
        .ok_or_else(|| missing(command, "BOOT_MODE VALUE"))?;
    match value.trim().to_ascii_uppercase().as_str() {
        "UEFI" => Ok(BootMode::Uefi),
        "LEGACY" => Ok(BootMode::Bios),
        _ => Err(unexpected(command, "BOOT_MODE", value)),
    }
}

/// `<GET_SUPPORTED_BOOT_MODE><SUPPORTED_BOOT_MODE VALUE="LEGACY_UEFI"/>`.
pub fn decode_supported_boot_modes(
    reply: &RibclReply,
) -> Result<SupportedBootModes, RibclParseError> {
    const CMD: &str = "GET_SUPPORTED_BOOT_MODE";
    let value = reply
        .payload(CMD)
        .and_then(|e| e.child_value("SUPPORTED_BOOT_MODE"))
        .ok_or_else(|| missing(CMD, "SUPPORTED_BOOT_MODE VALUE"))?;
    match value.trim().to_ascii_uppercase().as_str() {
        "LEGACY_ONLY" => Ok(SupportedBootModes::BiosOnly),
        "UEFI_ONLY" => Ok(SupportedBootModes::UefiOnly),
        "LEGACY_UEFI" => Ok(SupportedBootModes::BiosAndUefi),
        _ => Err(unexpected(CMD, "SUPPORTED_BOOT_MODE", value)),
    }
}

/// `<GET_VM_STATUS VM_APPLET=.. DEVICE=.. BOOT_OPTION=.. WRITE_PROTECT=.. IMAGE_INSERTED=..
/// IMAGE_URL=../>`.
pub fn decode_vm_status(
    reply: &RibclReply,
    device: VmediaDevice,
) -> Result<VmediaStatus, RibclParseError> {
    const CMD: &str = "GET_VM_STATUS";
    let e = reply.payload(CMD).ok_or_else(|| missing(CMD, CMD))?;
    let inserted_raw = e
        .get("IMAGE_INSERTED")
        .ok_or_else(|| missing(CMD, "IMAGE_INSERTED"))?;
    let inserted =
        yes_no(inserted_raw).ok_or_else(|| unexpected(CMD, "IMAGE_INSERTED", inserted_raw))?;
    let image_url = e
        .get("IMAGE_URL")
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_string);
    let boot_option = match e.get("BOOT_OPTION").map(|v| v.trim().to_ascii_uppercase()) {
        None => None,
        Some(v) => Some(match v.as_str() {
            "BOOT_ALWAYS" => VmediaBootOption::BootAlways,
            "BOOT_ONCE" => VmediaBootOption::BootOnce,
            "NO_BOOT" => VmediaBootOption::NoBoot,
            "CONNECT" => VmediaBootOption::Connect,
            "DISCONNECT" => VmediaBootOption::Disconnect,
            _ => return Err(unexpected(CMD, "BOOT_OPTION", &v)),
        }),
    };
    Ok(VmediaStatus {
        device,
        inserted,
        image_url: if inserted { image_url } else { None },
        connected: e
            .get("VM_APPLET")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("CONNECTED")),
        boot_option,
        write_protected: e.get("WRITE_PROTECT").and_then(yes_no),
    })
}

/// `<GET_ALL_LICENSES><LICENSE><LICENSE_TYPE VALUE=..>...</LICENSE>...`.
pub fn decode_licences(reply: &RibclReply) -> Result<Vec<Licence>, RibclParseError> {
    const CMD: &str = "GET_ALL_LICENSES";
    let all = reply.payload(CMD).ok_or_else(|| missing(CMD, CMD))?;
    all.find_all("LICENSE")
        .map(|l| {
            Ok(Licence {
                licence_type: l
                    .child_value("LICENSE_TYPE")
                    .ok_or_else(|| missing(CMD, "LICENSE_TYPE"))?
                    .to_string(),
                key: l.child_value("LICENSE_KEY").map(str::to_string),
                install_date: l.child_value("LICENSE_INSTALL_DATE").map(str::to_string),
                class: l.child_value("LICENSE_CLASS").map(str::to_string),
            })
        })
        .collect()
}

/// `<GET_PRODUCT_NAME><PRODUCT_NAME VALUE=".."/></GET_PRODUCT_NAME>`.
pub fn decode_product_name(reply: &RibclReply) -> Result<String, RibclParseError> {
    const CMD: &str = "GET_PRODUCT_NAME";
    reply
        .payload(CMD)
        .and_then(|e| e.child_value("PRODUCT_NAME"))
        .map(|v| v.trim().to_string())
        .ok_or_else(|| missing(CMD, "PRODUCT_NAME VALUE"))
}

/// `<GET_FW_VERSION FIRMWARE_VERSION=.. MANAGEMENT_PROCESSOR=.. .../>`: (version, processor).
pub fn decode_fw_version(reply: &RibclReply) -> Result<(String, Option<String>), RibclParseError> {
    const CMD: &str = "GET_FW_VERSION";
    let e = reply.payload(CMD).ok_or_else(|| missing(CMD, CMD))?;
    let version = e
        .get("FIRMWARE_VERSION")
        .ok_or_else(|| missing(CMD, "FIRMWARE_VERSION"))?;
    Ok((
        version.trim().to_string(),
        e.get("MANAGEMENT_PROCESSOR").map(|v| v.trim().to_string()),
    ))
}

fn opt_value(e: &XmlElement, child: &str) -> Option<String> {
    e.child_value(child)
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

fn opt_number(e: &XmlElement, child: &str) -> Option<f64> {
    e.child_value(child).and_then(leading_number)
}

/// GET_EMBEDDED_HEALTH's `<GET_EMBEDDED_HEALTH_DATA>` (docs/ilo-management.md §1.6): temperatures, fans,
/// supplies, and the supply summary's present reading.
pub fn decode_embedded_health(reply: &RibclReply) -> Result<Health, RibclParseError> {
    const CMD: &str = "GET_EMBEDDED_HEALTH_DATA";
    let data = reply
        .payload(CMD)
        .ok_or_else(|| missing("GET_EMBEDDED_HEALTH", CMD))?;
    let temperatures = data
        .find("TEMPERATURE")
        .map(|t| {
            t.find_all("TEMP")
                .map(|s| Temperature {
                    label: opt_value(s, "LABEL").unwrap_or_default(),
                    location: opt_value(s, "LOCATION"),
                    status: opt_value(s, "STATUS"),
                    celsius: opt_number(s, "CURRENTREADING"),
                    caution: opt_number(s, "CAUTION"),
                    critical: opt_number(s, "CRITICAL"),
                })
                .collect()
        })
        .unwrap_or_default();
    let fans = data
        .find("FANS")
        .map(|f| {
            f.find_all("FAN")
                .map(|s| Fan {
                    label: opt_value(s, "LABEL").unwrap_or_default(),
                    zone: opt_value(s, "ZONE"),
                    status: opt_value(s, "STATUS"),
                    speed_percent: opt_number(s, "SPEED"),
                })
                .collect()
        })
        .unwrap_or_default();
    let supplies = data.find("POWER_SUPPLIES");
    let power_supplies = supplies
        .map(|p| {
            p.find_all("SUPPLY")
                .map(|s| PowerSupply {
                    label: opt_value(s, "LABEL").unwrap_or_default(),
                    present: s.child_value("PRESENT").and_then(yes_no),
                    status: opt_value(s, "STATUS"),
                    capacity_watts: opt_number(s, "CAPACITY"),
                })
                .collect()
        })
        .unwrap_or_default();
    let present_watts = supplies
        .and_then(|p| p.find("POWER_SUPPLY_SUMMARY"))
        .and_then(|s| opt_number(s, "PRESENT_POWER_READING"));
    Ok(Health {
        temperatures,
        fans,
        power_supplies,
        power: PowerReading {
            present_watts,
            ..PowerReading::default()
        },
    })
}

/// `<GET_POWER_READINGS><PRESENT_POWER_READING VALUE="37" UNIT="Watts"/>...`.
pub fn decode_power_readings(reply: &RibclReply) -> Result<PowerReading, RibclParseError> {
    const CMD: &str = "GET_POWER_READINGS";
    let e = reply.payload(CMD).ok_or_else(|| missing(CMD, CMD))?;
    Ok(PowerReading {
        present_watts: opt_number(e, "PRESENT_POWER_READING"),
        average_watts: opt_number(e, "AVERAGE_POWER_READING"),
        maximum_watts: opt_number(e, "MAXIMUM_POWER_READING"),
        minimum_watts: opt_number(e, "MINIMUM_POWER_READING"),
    })
}

fn server_read(name: &str) -> RibclCommand {
    RibclCommand::read(Wrapper::ServerInfo, XmlElement::new(name))
}

fn rib_read(name: &str) -> RibclCommand {
    RibclCommand::read(Wrapper::RibInfo, XmlElement::new(name))
}

impl RibclClient {
    /// GET_PRODUCT_NAME: the model, e.g. `ProLiant DL380p Gen8` (used to pick the protocol).
    pub async fn product_name(&self) -> Result<String, DriverError> {
        let reply = self.execute(&server_read("GET_PRODUCT_NAME")).await?;
        decode_product_name(&reply).map_err(|e| self.malformed(e))
    }

    async fn boot_mode(&self, command: &str) -> Result<BootMode, DriverError> {
        let reply = self.execute(&server_read(command)).await?;
        decode_boot_mode(&reply, command).map_err(|e| self.malformed(e))
    }
}

impl Management for RibclClient {
    async fn one_time_boot(&self) -> Result<Option<BootDevice>, DriverError> {
        let reply = self.execute(&server_read("GET_ONE_TIME_BOOT")).await?;
        decode_one_time_boot(&reply).map_err(|e| self.malformed(e))
    }

    async fn set_one_time_boot(&self, device: &BootDevice) -> Result<(), DriverError> {
        // Lower-case `value`, as proliantutils sends it (docs/ilo-management.md §1.5).
        let element = XmlElement::new("SET_ONE_TIME_BOOT").attr("value", boot_device_name(device));
        self.execute(&RibclCommand::write(Wrapper::ServerInfo, element))
            .await?;
        Ok(())
    }

    async fn persistent_boot_entries(&self) -> Result<Vec<BootEntry>, DriverError> {
        let reply = self.execute(&server_read("GET_PERSISTENT_BOOT")).await?;
        decode_persistent_boot(&reply).map_err(|e| self.malformed(e))
    }

    async fn set_persistent_boot(&self, device: &BootDevice) -> Result<(), DriverError> {
        // The current order tells legacy from UEFI, whose entries are set by BootXXXX id.
        let current = self.persistent_boot_entries().await?;
        let command = persistent_boot_command(device, &current)?;
        self.execute(&command).await?;
        Ok(())
    }

    async fn current_boot_mode(&self) -> Result<BootMode, DriverError> {
        self.boot_mode("GET_CURRENT_BOOT_MODE").await
    }

    async fn pending_boot_mode(&self) -> Result<BootMode, DriverError> {
        self.boot_mode("GET_PENDING_BOOT_MODE").await
    }

    async fn set_pending_boot_mode(&self, mode: BootMode) -> Result<(), DriverError> {
        let value = match mode {
            BootMode::Uefi => "UEFI",
            BootMode::Bios => "LEGACY",
        };
        let element = XmlElement::new("SET_PENDING_BOOT_MODE").attr("value", value);
        self.execute(&RibclCommand::write(Wrapper::ServerInfo, element))
            .await?;
        Ok(())
    }

    async fn supported_boot_modes(&self) -> Result<SupportedBootModes, DriverError> {
        let reply = self
            .execute(&server_read("GET_SUPPORTED_BOOT_MODE"))
            .await?;
        decode_supported_boot_modes(&reply).map_err(|e| self.malformed(e))
    }

    async fn secure_boot_enabled(&self) -> Result<bool, DriverError> {
        Err(no_ribcl_secure_boot("reading Secure Boot"))
    }

    async fn set_secure_boot(&self, enable: bool) -> Result<(), DriverError> {
        Err(no_ribcl_secure_boot(if enable {
            "turning Secure Boot on"
        } else {
            "turning Secure Boot off"
        }))
    }
}

/// RIBCL has no Secure Boot command: neither python-hpilo nor proliantutils knows one, and
/// proliantutils reads and sets it on iLO 4 through RIS only (docs/ilo-firmware.md).
fn no_ribcl_secure_boot(operation: &str) -> DriverError {
    DriverError::NotSupported {
        operation: operation.into(),
        message: "iLO 4's RIBCL has no Secure Boot command (its RIS interface, which vmdeploy \
                  does not drive, has one): set Secure Boot in the server's RBSU"
            .into(),
    }
}

impl VirtualMedia for RibclClient {
    async fn vmedia_status(&self, device: VmediaDevice) -> Result<VmediaStatus, DriverError> {
        let element = XmlElement::new("GET_VM_STATUS").attr("DEVICE", vmedia_name(device));
        let reply = self
            .execute(&RibclCommand::read(Wrapper::RibInfo, element))
            .await?;
        decode_vm_status(&reply, device).map_err(|e| self.malformed(e))
    }

    async fn insert_vmedia(&self, device: VmediaDevice, url: &str) -> Result<(), DriverError> {
        let parsed = url::Url::parse(url)
            .map_err(|e| DriverError::InvalidRequest(format!("image URL {url:?}: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(DriverError::InvalidRequest(format!(
                "image URL {url:?}: the iLO fetches only http(s) URLs"
            )));
        }
        let element = XmlElement::new("INSERT_VIRTUAL_MEDIA")
            .attr("DEVICE", vmedia_name(device))
            .attr("IMAGE_URL", url);
        self.execute(&RibclCommand::write(Wrapper::RibInfo, element))
            .await?;
        Ok(())
    }

    async fn eject_vmedia(&self, device: VmediaDevice) -> Result<(), DriverError> {
        // Ejecting an empty device is an error on a real iLO; proliantutils checks first
        // (docs/ilo-management.md §1.5).
        if !self.vmedia_status(device).await?.inserted {
            return Ok(());
        }
        let element = XmlElement::new("EJECT_VIRTUAL_MEDIA").attr("DEVICE", vmedia_name(device));
        self.execute(&RibclCommand::write(Wrapper::RibInfo, element))
            .await?;
        Ok(())
    }

    async fn set_vmedia_status(
        &self,
        device: VmediaDevice,
        boot_option: VmediaBootOption,
        write_protect: Option<bool>,
    ) -> Result<(), DriverError> {
        let mut element = XmlElement::new("SET_VM_STATUS")
            .attr("DEVICE", vmedia_name(device))
            .child(
                XmlElement::new("VM_BOOT_OPTION").attr("VALUE", vm_boot_option_name(boot_option)),
            );
        if let Some(wp) = write_protect {
            element = element.child(
                XmlElement::new("VM_WRITE_PROTECT").attr("VALUE", if wp { "YES" } else { "NO" }),
            );
        }
        self.execute(&RibclCommand::write(Wrapper::RibInfo, element))
            .await?;
        Ok(())
    }
}

impl Inventory for RibclClient {
    async fn licences(&self) -> Result<Vec<Licence>, DriverError> {
        let reply = self.execute(&rib_read("GET_ALL_LICENSES")).await?;
        decode_licences(&reply).map_err(|e| self.malformed(e))
    }

    async fn info(&self) -> Result<BmcInfo, DriverError> {
        let product_name = self.product_name().await?;
        let reply = self.execute(&rib_read("GET_FW_VERSION")).await?;
        let (version, processor) = decode_fw_version(&reply).map_err(|e| self.malformed(e))?;
        Ok(BmcInfo {
            product_name,
            firmware_version: Some(version),
            management_processor: processor,
            protocol: "ribcl".into(),
        })
    }

    async fn health(&self) -> Result<Health, DriverError> {
        let reply = self.execute(&server_read("GET_EMBEDDED_HEALTH")).await?;
        let mut health = decode_embedded_health(&reply).map_err(|e| self.malformed(e))?;
        // GET_POWER_READINGS has average/min/max too; older iLOs lack it, then the supply
        // summary's present reading stays.
        match self.execute(&server_read("GET_POWER_READINGS")).await {
            Ok(reply) => {
                let readings = decode_power_readings(&reply).map_err(|e| self.malformed(e))?;
                health.power = PowerReading {
                    present_watts: readings.present_watts.or(health.power.present_watts),
                    ..readings
                };
            }
            Err(DriverError::NotSupported { .. }) => {}
            Err(e) => return Err(e),
        }
        Ok(health)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drivers::ilo::ribcl::codec::{parse_reply, samples::reply_with};

    fn reply(payload: &str) -> RibclReply {
        parse_reply(reply_with(payload).as_bytes()).expect("valid sample")
    }

    #[test]
    fn one_time_boot() {
        let r = reply("<ONE_TIME_BOOT><BOOT_TYPE VALUE=\"Normal\"/></ONE_TIME_BOOT>");
        assert_eq!(decode_one_time_boot(&r), Ok(None));
        let r = reply("<ONE_TIME_BOOT><BOOT_TYPE VALUE=\"CDROM\"/></ONE_TIME_BOOT>");
        assert_eq!(decode_one_time_boot(&r), Ok(Some(BootDevice::Cdrom)));
        let r = reply("<ONE_TIME_BOOT><BOOT_TYPE value=\"Boot0009\"/></ONE_TIME_BOOT>");
        assert!(matches!(
            decode_one_time_boot(&r),
            Ok(Some(BootDevice::Uefi { .. }))
        ));
        // iLO 6's pair shape: the description says the device.
        let r = reply("<ONE_TIME_BOOT><BOOT_TYPE VALUE=\"Boot000B\" DESCRIPTION=\"iLO Virtual USB 2 : HPE iLO Virtual USB CD/DVD ROM\"/></ONE_TIME_BOOT>");
        assert_eq!(
            decode_one_time_boot(&r).expect("pair"),
            Some(BootDevice::Cdrom)
        );
        let r = reply("<ONE_TIME_BOOT><BOOT_TYPE VALUE=\"Boot0012\" DESCRIPTION=\"Something new\"/></ONE_TIME_BOOT>");
        assert!(
            matches!(decode_one_time_boot(&r).expect("pair"), Some(BootDevice::Uefi { ref id, .. }) if id == "Boot0012")
        );
    }

    #[test]
    fn persistent_boot_legacy_and_uefi() {
        let legacy = reply(
            "<PERSISTENT_BOOT><DEVICE value=\"CDROM\"/><DEVICE value=\"HDD\"/><DEVICE value=\"NETWORK\"/></PERSISTENT_BOOT>",
        );
        let order = decode_persistent_boot(&legacy).expect("valid");
        let devices: Vec<BootDevice> = order.iter().map(|e| e.device.clone()).collect();
        assert_eq!(
            devices,
            vec![BootDevice::Cdrom, BootDevice::Hdd, BootDevice::Network]
        );
        let cmd = persistent_boot_command(&BootDevice::Hdd, &order).expect("legacy");
        assert!(cmd
            .encode("u", "p")
            .contains("<SET_PERSISTENT_BOOT><DEVICE VALUE=\"HDD\" /></SET_PERSISTENT_BOOT>"));

        let uefi = reply(
            "<PERSISTENT_BOOT><DEVICE value=\"Boot000A\" DESCRIPTION=\"Embedded LOM 1 Port 1 : HP Ethernet 1Gb 4-port 331i Adapter - NIC (PXE IPv4)\"/><DEVICE value=\"Boot000B\" DESCRIPTION=\"iLO Virtual USB 2 : HP iLO Virtual USB CD/DVD ROM\"/><DEVICE value=\"Boot000C\" DESCRIPTION=\"Embedded RAID 1 : Smart Array P440ar Controller - 279.37 GiB, RAID 0 Logical Drive(Target:0, Lun:0)\"/></PERSISTENT_BOOT>",
        );
        let order = decode_persistent_boot(&uefi).expect("valid");
        assert_eq!(order.len(), 3);
        assert_eq!(order[0].device, BootDevice::Network);
        assert_eq!(order[0].id.as_deref(), Some("Boot000A"));
        let enc = |d| {
            persistent_boot_command(&d, &order)
                .expect("entry exists")
                .encode("u", "p")
        };
        assert!(enc(BootDevice::Cdrom).contains("<DEVICE VALUE=\"Boot000B\" />"));
        assert!(enc(BootDevice::Network).contains("<DEVICE VALUE=\"Boot000A\" />"));
        assert!(enc(BootDevice::Hdd).contains("<DEVICE VALUE=\"Boot000C\" />"));
        assert!(persistent_boot_command(&BootDevice::Floppy, &order).is_err());
    }

    /// A real iLO 4 UEFI answer, as data: proliantutils
    /// `proliantutils/tests/ilo/ribcl_sample_outputs.py`, GET_PERSISTENT_BOOT_DEVICE_HDD_UEFI_XML
    /// (attribute values wrapped over lines, NIC entries for IPv4 and IPv6).
    const REAL_UEFI_HDD_FIRST: &str = r#"<?xml version="1.0"?>
<RIBCL VERSION="2.23">
<RESPONSE
    STATUS="0x0000"
    MESSAGE='No error'
     />
<PERSISTENT_BOOT>
    <DEVICE value="Boot0007"
        DESCRIPTION="Embedded SAS : Smart Array P830i Controller - 279.367 GB,
             RAID 1 Logical Drive(Target:0, Lun:0)"/>
    <DEVICE value="Boot000B"
        DESCRIPTION="iLO Virtual USB 2 : HP iLO Virtual USB CD/DVD ROM"/>
    <DEVICE value="Boot000A"
        DESCRIPTION="iLO Virtual USB 1 : HP iLO Virtual USB Key"/>
    <DEVICE value="Boot0009"
        DESCRIPTION="Embedded FlexibleLOM 1 Port 1 :HP Ethernet 1Gb
            4-port 331FLR Adapter - NIC (IPv4) "/>
    <DEVICE value="Boot0008"
        DESCRIPTION="Embedded FlexibleLOM 1 Port 1 :HP Ethernet 1Gb
            4-port 331FLR Adapter - NIC (IPv6) "/>
</PERSISTENT_BOOT>
</RIBCL>
<?xml version="1.0"?>
<RIBCL VERSION="2.23">
<RESPONSE
    STATUS="0x0000"
    MESSAGE='No error'
     />
</RIBCL>
"#;

    #[test]
    fn real_ilo4_uefi_order_reads_as_devices() {
        let r = parse_reply(REAL_UEFI_HDD_FIRST.as_bytes()).expect("real reply parses");
        let order = decode_persistent_boot(&r).expect("valid");
        let devices: Vec<String> = order.iter().map(|e| e.device.to_string()).collect();
        assert_eq!(devices, ["hdd", "cdrom", "floppy", "network", "network"]);
        assert_eq!(
            order[0].description.as_deref(),
            Some("Embedded SAS : Smart Array P830i Controller - 279.367 GB, RAID 1 Logical Drive(Target:0, Lun:0)")
        );
        // Network boot selects both NIC entries, in the iLO's order (as proliantutils does).
        let cmd = persistent_boot_command(&BootDevice::Network, &order)
            .expect("NIC entries exist")
            .encode("u", "p");
        assert!(
            cmd.contains("<DEVICE VALUE=\"Boot0009\" /><DEVICE VALUE=\"Boot0008\" />"),
            "{cmd}"
        );
    }

    #[test]
    fn boot_modes() {
        let r = reply("<GET_PENDING_BOOT_MODE><BOOT_MODE VALUE=\"UEFI\"/></GET_PENDING_BOOT_MODE>");
        assert_eq!(
            decode_boot_mode(&r, "GET_PENDING_BOOT_MODE"),
            Ok(BootMode::Uefi)
        );
        let r =
            reply("<GET_CURRENT_BOOT_MODE><BOOT_MODE VALUE=\"LEGACY\"/></GET_CURRENT_BOOT_MODE>");
        assert_eq!(
            decode_boot_mode(&r, "GET_CURRENT_BOOT_MODE"),
            Ok(BootMode::Bios)
        );
        let r =
            reply("<GET_CURRENT_BOOT_MODE><BOOT_MODE VALUE=\"UNKNOWN\"/></GET_CURRENT_BOOT_MODE>");
        assert!(decode_boot_mode(&r, "GET_CURRENT_BOOT_MODE").is_err());
        let r = reply("<GET_SUPPORTED_BOOT_MODE><SUPPORTED_BOOT_MODE VALUE=\"LEGACY_UEFI\"/></GET_SUPPORTED_BOOT_MODE>");
        assert_eq!(
            decode_supported_boot_modes(&r),
            Ok(SupportedBootModes::BiosAndUefi)
        );
    }

    #[test]
    fn vm_status() {
        let r = reply("<GET_VM_STATUS VM_APPLET=\"CONNECTED\" DEVICE=\"CDROM\" BOOT_OPTION=\"BOOT_ONCE\" WRITE_PROTECT=\"YES\" IMAGE_INSERTED=\"YES\" IMAGE_URL=\"http://10.0.0.1/boot.iso\" />");
        let s = decode_vm_status(&r, VmediaDevice::Cdrom).expect("valid");
        assert!(s.inserted && s.connected);
        assert_eq!(s.image_url.as_deref(), Some("http://10.0.0.1/boot.iso"));
        assert_eq!(s.boot_option, Some(VmediaBootOption::BootOnce));
        assert_eq!(s.write_protected, Some(true));
        let r = reply("<GET_VM_STATUS VM_APPLET=\"DISCONNECTED\" DEVICE=\"FLOPPY\" BOOT_OPTION=\"NO_BOOT\" WRITE_PROTECT=\"NO\" IMAGE_INSERTED=\"NO\" IMAGE_URL=\"\" />");
        let s = decode_vm_status(&r, VmediaDevice::Floppy).expect("valid");
        assert!(!s.inserted && !s.connected && s.image_url.is_none());
    }

    #[test]
    fn vm_commands() {
        let element = XmlElement::new("SET_VM_STATUS")
            .attr("DEVICE", "CDROM")
            .child(XmlElement::new("VM_BOOT_OPTION").attr("VALUE", "BOOT_ONCE"));
        let mut s = String::new();
        element.write_to(&mut s);
        assert_eq!(
            s,
            "<SET_VM_STATUS DEVICE=\"CDROM\"><VM_BOOT_OPTION VALUE=\"BOOT_ONCE\" /></SET_VM_STATUS>"
        );
    }

    #[test]
    fn licences_product_firmware() {
        let r = reply("<GET_ALL_LICENSES><LICENSE><LICENSE_TYPE VALUE=\"iLO 3 Advanced\"/><LICENSE_KEY VALUE=\"XXXXX\"/><LICENSE_INSTALL_DATE VALUE=\"Fri Jan 15 2015\"/><LICENSE_CLASS VALUE=\"FQL\"/></LICENSE></GET_ALL_LICENSES>");
        let l = decode_licences(&r).expect("valid");
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].licence_type, "iLO 3 Advanced");
        assert_eq!(l[0].class.as_deref(), Some("FQL"));
        let r = reply(
            "<GET_PRODUCT_NAME><PRODUCT_NAME VALUE=\"ProLiant DL380p Gen8\"/></GET_PRODUCT_NAME>",
        );
        assert_eq!(
            decode_product_name(&r).expect("valid"),
            "ProLiant DL380p Gen8"
        );
        let r = reply("<GET_FW_VERSION FIRMWARE_VERSION=\"2.80\" FIRMWARE_DATE=\"Jan 25 2022\" MANAGEMENT_PROCESSOR=\"iLO4\" LICENSE_TYPE=\"iLO Advanced\"/>");
        assert_eq!(
            decode_fw_version(&r).expect("valid"),
            ("2.80".to_string(), Some("iLO4".to_string()))
        );
    }

    #[test]
    fn embedded_health_and_power() {
        let r = reply(
            "<GET_EMBEDDED_HEALTH_DATA>\
             <FANS><FAN><ZONE VALUE=\"System\"/><LABEL VALUE=\"Fan 1\"/><STATUS VALUE=\"OK\"/><SPEED VALUE=\"19\" UNIT=\"Percentage\"/></FAN></FANS>\
             <TEMPERATURE><TEMP><LABEL VALUE=\"01-Inlet Ambient\"/><LOCATION VALUE=\"Ambient\"/><STATUS VALUE=\"OK\"/><CURRENTREADING VALUE=\"21\" UNIT=\"Celsius\"/><CAUTION VALUE=\"42\" UNIT=\"Celsius\"/><CRITICAL VALUE=\"46\" UNIT=\"Celsius\"/></TEMP>\
             <TEMP><LABEL VALUE=\"02-CPU 1\"/><CURRENTREADING VALUE=\"N/A\"/></TEMP></TEMPERATURE>\
             <POWER_SUPPLIES><POWER_SUPPLY_SUMMARY><PRESENT_POWER_READING VALUE=\"62 Watts\"/></POWER_SUPPLY_SUMMARY>\
             <SUPPLY><LABEL VALUE=\"Power Supply 1\"/><PRESENT VALUE=\"Yes\"/><STATUS VALUE=\"Good, In Use\"/><CAPACITY VALUE=\"460 Watts\"/></SUPPLY></POWER_SUPPLIES>\
             </GET_EMBEDDED_HEALTH_DATA>",
        );
        let h = decode_embedded_health(&r).expect("valid");
        assert_eq!(h.temperatures.len(), 2);
        assert_eq!(h.temperatures[0].celsius, Some(21.0));
        assert_eq!(h.temperatures[0].critical, Some(46.0));
        assert_eq!(h.temperatures[1].celsius, None);
        assert_eq!(h.fans[0].speed_percent, Some(19.0));
        assert_eq!(h.power_supplies[0].capacity_watts, Some(460.0));
        assert_eq!(h.power_supplies[0].present, Some(true));
        assert_eq!(h.power.present_watts, Some(62.0));
        let r = reply("<GET_POWER_READINGS><PRESENT_POWER_READING VALUE=\"37\" UNIT=\"Watts\"/><AVERAGE_POWER_READING VALUE=\"36\" UNIT=\"Watts\"/><MAXIMUM_POWER_READING VALUE=\"40\" UNIT=\"Watts\"/><MINIMUM_POWER_READING VALUE=\"30\" UNIT=\"Watts\"/></GET_POWER_READINGS>");
        let p = decode_power_readings(&r).expect("valid");
        assert_eq!(p.present_watts, Some(37.0));
        assert_eq!(p.minimum_watts, Some(30.0));
    }
}
