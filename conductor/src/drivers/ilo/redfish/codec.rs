//! Redfish resources as the driver reads them (docs/ilo-management.md §3): link lookup,
//! and decoding of ComputerSystem, Bios, VirtualMedia, Thermal, Power and licence resources
//! into driver types. Pure functions over `serde_json::Value`, so every field is optional and a
//! missing or odd one is an error value, never a panic.

use serde_json::{json, Value};

use crate::drivers::{
    BootDevice, BootEntry, BootMode, Fan, Health, Licence, PowerReading, PowerState, PowerSupply,
    SupportedBootModes, Temperature, VmediaBootOption, VmediaDevice, VmediaStatus,
};

/// The `@odata.id` of `resource[key]`.
pub fn link<'a>(resource: &'a Value, key: &str) -> Option<&'a str> {
    resource.get(key)?.get("@odata.id")?.as_str()
}

/// The `@odata.id` of a nested link, e.g. `["Links", "ManagedBy", 0]`.
pub fn link_at<'a>(resource: &'a Value, path: &[PathStep<'_>]) -> Option<&'a str> {
    let mut v = resource;
    for step in path {
        v = match step {
            PathStep::Key(k) => v.get(*k)?,
            PathStep::Index(i) => v.get(*i)?,
        };
    }
    v.get("@odata.id")?.as_str()
}

/// One step into a JSON document.
#[derive(Debug, Clone, Copy)]
pub enum PathStep<'a> {
    /// An object key.
    Key(&'a str),
    /// An array index.
    Index(usize),
}

/// A `LogEntry` of the IML: its time, severity and message; `None` without a message.
pub fn firmware_log_entry(entry: &Value) -> Option<crate::drivers::FirmwareLogEntry> {
    let text = |key: &str| entry.get(key).and_then(Value::as_str).map(str::to_owned);
    Some(crate::drivers::FirmwareLogEntry {
        created: text("Created").unwrap_or_default(),
        severity: text("Severity").unwrap_or_else(|| "unknown".to_owned()),
        message: text("Message").filter(|m| !m.trim().is_empty())?,
    })
}

/// The members' `@odata.id`s of a collection, in its order.
pub fn members(collection: &Value) -> Vec<String> {
    collection
        .get("Members")
        .and_then(Value::as_array)
        .map(|m| {
            m.iter()
                .filter_map(|e| e.get("@odata.id").and_then(Value::as_str))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The target URI of action `name` (`#ComputerSystem.Reset`) in `resource.Actions`, or under
/// `Oem.Hpe.Actions` (HPE OEM actions, docs/ilo-management.md §3.3).
pub fn action_target<'a>(resource: &'a Value, name: &str) -> Option<&'a str> {
    let standard = resource.get("Actions").and_then(|a| a.get(name));
    let oem = resource
        .get("Oem")
        .and_then(|o| o.get("Hpe").or_else(|| o.get("Hp")))
        .and_then(|h| h.get("Actions"))
        .and_then(|a| a.get(name));
    standard.or(oem)?.get("target")?.as_str()
}

/// A URI below `base`, whatever `base`'s trailing slash (iLO 5 collections end in `/`,
/// sushy-tools' do not; docs/ilo-management.md §3.2).
pub fn join(base: &str, tail: &str) -> String {
    format!(
        "{}/{}",
        base.trim_end_matches('/'),
        tail.trim_start_matches('/')
    )
}

/// `PowerState`: On/PoweringOn are on, Off/PoweringOff are off.
pub fn power_state(system: &Value) -> Result<PowerState, String> {
    match system.get("PowerState").and_then(Value::as_str) {
        Some("On") | Some("PoweringOn") => Ok(PowerState::On),
        Some("Off") | Some("PoweringOff") => Ok(PowerState::Off),
        Some(other) => Err(format!("unknown PowerState {other:?}")),
        None => Err("ComputerSystem has no PowerState".to_string()),
    }
}

/// The `BootSourceOverrideTarget` for a device.
pub fn boot_target(device: &BootDevice) -> Result<&'static str, String> {
    match device {
        BootDevice::Cdrom => Ok("Cd"),
        BootDevice::Hdd => Ok("Hdd"),
        BootDevice::Network => Ok("Pxe"),
        BootDevice::Floppy => Ok("Floppy"),
        BootDevice::Usb => Ok("Usb"),
        BootDevice::Uefi { .. } => Ok("UefiTarget"),
        BootDevice::Other(name) => match name.to_ascii_lowercase().as_str() {
            "biossetup" | "rbsu" => Ok("BiosSetup"),
            "utilities" => Ok("Utilities"),
            "diags" => Ok("Diags"),
            "uefishell" => Ok("UefiShell"),
            "uefihttp" => Ok("UefiHttp"),
            "sdcard" => Ok("SDCard"),
            _ => Err(format!("no Redfish boot target for {name:?}")),
        },
    }
}

/// A `BootSourceOverrideTarget` as a device; `None` for `None`.
pub fn parse_boot_target(target: &str) -> Option<BootDevice> {
    match target {
        "None" | "" => None,
        "Cd" => Some(BootDevice::Cdrom),
        "Hdd" => Some(BootDevice::Hdd),
        "Pxe" => Some(BootDevice::Network),
        "Floppy" => Some(BootDevice::Floppy),
        "Usb" => Some(BootDevice::Usb),
        other => Some(BootDevice::Other(other.to_string())),
    }
}

/// The PATCH body of a boot override (DSP2046 ComputerSystem.Boot).
pub fn boot_override_body(target: &str, once: bool, uefi_target: Option<&str>) -> Value {
    let mut boot = json!({
        "BootSourceOverrideTarget": target,
        "BootSourceOverrideEnabled": if once { "Once" } else { "Continuous" },
    });
    if let Some(path) = uefi_target {
        boot["UefiTargetBootSourceOverride"] = json!(path);
    }
    json!({ "Boot": boot })
}

/// The override in effect: (target, enabled).
pub fn boot_override(system: &Value) -> (Option<BootDevice>, Option<String>) {
    let boot = system.get("Boot");
    let target = boot
        .and_then(|b| b.get("BootSourceOverrideTarget"))
        .and_then(Value::as_str)
        .and_then(parse_boot_target);
    let enabled = boot
        .and_then(|b| b.get("BootSourceOverrideEnabled"))
        .and_then(Value::as_str)
        .map(str::to_string);
    (target, enabled)
}

/// The persistent override as a boot entry: a `UefiTarget` override names its device by the
/// UEFI device path in `UefiTargetBootSourceOverride`, classified like a description.
pub fn override_entry(system: &Value, device: BootDevice) -> BootEntry {
    let boot = system.get("Boot");
    let target = boot
        .and_then(|b| b.get("BootSourceOverrideTarget"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let uefi_path = boot
        .and_then(|b| b.get("UefiTargetBootSourceOverride"))
        .and_then(Value::as_str)
        // iLO 5 writes "None" when no UEFI target is set (proliantutils
        // `tests/redfish/json_samples/system.json`).
        .filter(|p| !p.trim().is_empty() && *p != "None");
    match (target, uefi_path) {
        ("UefiTarget", Some(path)) => BootEntry::uefi(path, path),
        // A named target (`Pxe`, `Hdd`) is the device itself, as a legacy RIBCL entry.
        _ => BootEntry::device(device),
    }
}

/// `Boot.BootOrder`: the firmware's `BootXXXX` references, first first.
pub fn boot_order(system: &Value) -> Vec<String> {
    system
        .get("Boot")
        .and_then(|b| b.get("BootOrder"))
        .and_then(Value::as_array)
        .map(|o| {
            o.iter()
                .filter_map(Value::as_str)
                .map(|s| s.trim().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// A BootOption resource's (`BootOptionReference`, `DisplayName`), falling back to its
/// `Description` or `Name` for the text (DSP2046 BootOption).
pub fn boot_option_name(option: &Value) -> Option<(String, String)> {
    let reference = option.get("BootOptionReference")?.as_str()?.trim();
    let name = ["DisplayName", "Description", "Name"]
        .iter()
        .find_map(|k| option.get(*k).and_then(Value::as_str))?;
    Some((reference.to_string(), name.to_string()))
}

/// `Boot.BootSourceOverrideMode` (UEFI/Legacy), for BMCs without a BIOS resource.
pub fn override_mode(system: &Value) -> Option<BootMode> {
    match system
        .get("Boot")?
        .get("BootSourceOverrideMode")?
        .as_str()?
    {
        "UEFI" => Some(BootMode::Uefi),
        "Legacy" => Some(BootMode::Bios),
        _ => None,
    }
}

/// BIOS `Attributes.BootMode`: `Uefi` or `LegacyBios` (docs/ilo-management.md §3.3).
pub fn bios_boot_mode(bios: &Value) -> Result<BootMode, String> {
    match bios
        .get("Attributes")
        .and_then(|a| a.get("BootMode"))
        .and_then(Value::as_str)
    {
        Some("Uefi") => Ok(BootMode::Uefi),
        Some("LegacyBios") | Some("Legacy") => Ok(BootMode::Bios),
        Some(other) => Err(format!("unknown BIOS BootMode {other:?}")),
        None => Err("BIOS has no Attributes.BootMode".to_string()),
    }
}

/// The PATCH body that sets the pending BIOS boot mode (proliantutils bios.py: UEFI also turns
/// on UefiOptimizedBoot).
pub fn bios_boot_mode_body(mode: BootMode) -> Value {
    match mode {
        BootMode::Uefi => {
            json!({"Attributes": {"BootMode": "Uefi", "UefiOptimizedBoot": "Enabled"}})
        }
        BootMode::Bios => json!({"Attributes": {"BootMode": "LegacyBios"}}),
    }
}

/// Supported boot modes: HPE `Oem.Hpe.Bios.UefiClass` (0 legacy only, 2 both, 3 UEFI only), else
/// the override mode's allowable values.
pub fn supported_boot_modes(system: &Value) -> Option<SupportedBootModes> {
    let uefi_class = system
        .get("Oem")
        .and_then(|o| o.get("Hpe"))
        .and_then(|h| h.get("Bios"))
        .and_then(|b| b.get("UefiClass"))
        .and_then(Value::as_u64);
    match uefi_class {
        Some(0) => return Some(SupportedBootModes::BiosOnly),
        Some(2) => return Some(SupportedBootModes::BiosAndUefi),
        Some(3) => return Some(SupportedBootModes::UefiOnly),
        _ => {}
    }
    let allowed: Vec<&str> = system
        .get("Boot")?
        .get("BootSourceOverrideMode@Redfish.AllowableValues")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    match (allowed.contains(&"Legacy"), allowed.contains(&"UEFI")) {
        (true, true) => Some(SupportedBootModes::BiosAndUefi),
        (true, false) => Some(SupportedBootModes::BiosOnly),
        (false, true) => Some(SupportedBootModes::UefiOnly),
        (false, false) => None,
    }
}

/// Which virtual media device a member serves, from `MediaTypes` (docs/ilo-management.md §3.3), its Id
/// (`Cd`, `Floppy` in sushy-tools) as a fallback.
pub fn vmedia_kind(member: &Value) -> Option<VmediaDevice> {
    let types: Vec<&str> = member
        .get("MediaTypes")
        .and_then(Value::as_array)
        .map(|t| t.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if types.iter().any(|t| matches!(*t, "CD" | "DVD")) {
        return Some(VmediaDevice::Cdrom);
    }
    if types.iter().any(|t| matches!(*t, "Floppy" | "USBStick")) {
        return Some(VmediaDevice::Floppy);
    }
    match member.get("Id").and_then(Value::as_str)? {
        id if id.eq_ignore_ascii_case("cd") || id.eq_ignore_ascii_case("dvd") => {
            Some(VmediaDevice::Cdrom)
        }
        id if id.eq_ignore_ascii_case("floppy") || id.eq_ignore_ascii_case("usbstick") => {
            Some(VmediaDevice::Floppy)
        }
        _ => None,
    }
}

/// Whether the member advertises the HPE OEM block (`Oem.Hpe`, or `Oem.Hp` on Gen9).
pub fn has_hpe_oem(resource: &Value) -> bool {
    resource
        .get("Oem")
        .is_some_and(|o| o.get("Hpe").is_some() || o.get("Hp").is_some())
}

/// A VirtualMedia member's state.
pub fn vmedia_status(member: &Value, device: VmediaDevice) -> VmediaStatus {
    let image = member
        .get("Image")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    let inserted = member
        .get("Inserted")
        .and_then(Value::as_bool)
        .unwrap_or(image.is_some());
    let connected = match member.get("ConnectedVia").and_then(Value::as_str) {
        Some(via) => via != "NotConnected",
        None => inserted,
    };
    let boot_once = member
        .get("Oem")
        .and_then(|o| o.get("Hpe").or_else(|| o.get("Hp")))
        .and_then(|h| h.get("BootOnNextServerReset"))
        .and_then(Value::as_bool);
    VmediaStatus {
        device,
        inserted,
        image_url: if inserted { image } else { None },
        connected,
        boot_option: boot_once.map(|once| {
            if once {
                VmediaBootOption::BootOnce
            } else {
                VmediaBootOption::NoBoot
            }
        }),
        write_protected: member.get("WriteProtected").and_then(Value::as_bool),
    }
}

fn status_text(v: &Value) -> Option<String> {
    let status = v.get("Status")?;
    status
        .get("Health")
        .and_then(Value::as_str)
        .or_else(|| status.get("State").and_then(Value::as_str))
        .map(str::to_string)
}

fn name_of(v: &Value) -> String {
    v.get("Name")
        .or_else(|| v.get("FanName"))
        .or_else(|| v.get("MemberId"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn number(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

/// Temperatures and fans from a Thermal resource.
pub fn thermal(thermal: &Value, health: &mut Health) {
    let list = |key: &str| {
        thermal
            .get(key)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    health.temperatures = list("Temperatures")
        .iter()
        .map(|t| Temperature {
            label: name_of(t),
            location: t
                .get("PhysicalContext")
                .and_then(Value::as_str)
                .map(str::to_string),
            status: status_text(t),
            celsius: number(t, "ReadingCelsius"),
            caution: number(t, "UpperThresholdNonCritical"),
            critical: number(t, "UpperThresholdCritical"),
        })
        .collect();
    health.fans = list("Fans")
        .iter()
        .map(|f| Fan {
            label: name_of(f),
            zone: f
                .get("PhysicalContext")
                .and_then(Value::as_str)
                .map(str::to_string),
            status: status_text(f),
            speed_percent: match f.get("ReadingUnits").and_then(Value::as_str) {
                Some("RPM") => None,
                _ => number(f, "Reading").or_else(|| number(f, "CurrentReading")),
            },
        })
        .collect();
}

/// Power readings and supplies from a Power resource.
pub fn power(power: &Value, health: &mut Health) {
    let control = power
        .get("PowerControl")
        .and_then(Value::as_array)
        .and_then(|c| c.first());
    let metrics = control.and_then(|c| c.get("PowerMetrics"));
    health.power = PowerReading {
        present_watts: control.and_then(|c| number(c, "PowerConsumedWatts")),
        average_watts: metrics.and_then(|m| number(m, "AverageConsumedWatts")),
        maximum_watts: metrics.and_then(|m| number(m, "MaxConsumedWatts")),
        minimum_watts: metrics.and_then(|m| number(m, "MinConsumedWatts")),
    };
    health.power_supplies = power
        .get("PowerSupplies")
        .and_then(Value::as_array)
        .map(|s| {
            s.iter()
                .map(|p| PowerSupply {
                    label: name_of(p),
                    present: p
                        .get("Status")
                        .and_then(|s| s.get("State"))
                        .and_then(Value::as_str)
                        .map(|s| s != "Absent"),
                    status: status_text(p),
                    capacity_watts: number(p, "PowerCapacityWatts"),
                })
                .collect()
        })
        .unwrap_or_default();
}

/// An HPE licence resource (`Managers/1/LicenseService/1`): `License` is the tier text
/// (`iLO Advanced`), `LicenseType` the class (`Perpetual`, `Evaluation`).
pub fn licence(resource: &Value) -> Option<Licence> {
    let text = |k: &str| {
        resource
            .get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    Some(Licence {
        licence_type: text("License")
            .or_else(|| text("LicenseString"))
            .or_else(|| text("Name"))?,
        key: text("LicenseKey"),
        install_date: text("LicenseInstallDate"),
        class: text("LicenseType"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn links_actions_and_joins() {
        let system = json!({
            "Actions": {"#ComputerSystem.Reset": {"target": "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset/"}},
            "Oem": {"Hpe": {"Actions": {"#HpeComputerSystemExt.PowerButton": {"target": "/x/PowerButton/"}}}},
            "Links": {"ManagedBy": [{"@odata.id": "/redfish/v1/Managers/1/"}]},
            "Bios": {"@odata.id": "/redfish/v1/systems/1/bios/"}
        });
        assert_eq!(
            action_target(&system, "#ComputerSystem.Reset"),
            Some("/redfish/v1/Systems/1/Actions/ComputerSystem.Reset/")
        );
        assert_eq!(
            action_target(&system, "#HpeComputerSystemExt.PowerButton"),
            Some("/x/PowerButton/")
        );
        assert_eq!(
            link_at(
                &system,
                &[
                    PathStep::Key("Links"),
                    PathStep::Key("ManagedBy"),
                    PathStep::Index(0)
                ]
            ),
            Some("/redfish/v1/Managers/1/")
        );
        assert_eq!(link(&system, "Bios"), Some("/redfish/v1/systems/1/bios/"));
        assert_eq!(join("/redfish/v1/Systems/", "1"), "/redfish/v1/Systems/1");
        assert_eq!(join("/redfish/v1/Systems", "1"), "/redfish/v1/Systems/1");
    }

    #[test]
    fn vmedia_members() {
        let cd = json!({"Id": "2", "MediaTypes": ["CD", "DVD"], "Inserted": true,
            "Image": "http://h/boot.iso", "ConnectedVia": "URI", "WriteProtected": true,
            "Oem": {"Hpe": {"BootOnNextServerReset": true}}});
        assert_eq!(vmedia_kind(&cd), Some(VmediaDevice::Cdrom));
        let s = vmedia_status(&cd, VmediaDevice::Cdrom);
        assert!(s.inserted && s.connected);
        assert_eq!(s.image_url.as_deref(), Some("http://h/boot.iso"));
        assert_eq!(s.boot_option, Some(VmediaBootOption::BootOnce));
        let floppy = json!({"Id": "Floppy", "Inserted": false, "Image": ""});
        assert_eq!(vmedia_kind(&floppy), Some(VmediaDevice::Floppy));
        let s = vmedia_status(&floppy, VmediaDevice::Floppy);
        assert!(!s.inserted && s.image_url.is_none());
    }

    #[test]
    fn boot_and_modes() {
        let system = json!({"PowerState": "PoweringOn", "Boot": {
            "BootSourceOverrideTarget": "Cd", "BootSourceOverrideEnabled": "Once",
            "BootSourceOverrideMode": "UEFI",
            "BootSourceOverrideMode@Redfish.AllowableValues": ["Legacy", "UEFI"]}});
        assert_eq!(power_state(&system), Ok(PowerState::On));
        assert_eq!(
            boot_override(&system),
            (Some(BootDevice::Cdrom), Some("Once".to_string()))
        );
        assert_eq!(override_mode(&system), Some(BootMode::Uefi));
        assert_eq!(
            supported_boot_modes(&system),
            Some(SupportedBootModes::BiosAndUefi)
        );
        let hpe = json!({"Oem": {"Hpe": {"Bios": {"UefiClass": 3}}}});
        assert_eq!(
            supported_boot_modes(&hpe),
            Some(SupportedBootModes::UefiOnly)
        );
        assert_eq!(
            bios_boot_mode(&json!({"Attributes": {"BootMode": "LegacyBios"}})),
            Ok(BootMode::Bios)
        );
        assert!(bios_boot_mode(&json!({})).is_err());
        assert!(power_state(&json!({"PowerState": 3})).is_err());
        assert_eq!(
            boot_override_body("Pxe", false, None),
            json!({"Boot": {"BootSourceOverrideTarget": "Pxe", "BootSourceOverrideEnabled": "Continuous"}})
        );
    }

    #[test]
    fn thermal_power_licence() {
        let mut h = Health::default();
        thermal(
            &json!({"Temperatures": [{"Name": "01-Inlet Ambient", "ReadingCelsius": 21,
                "UpperThresholdCritical": 42, "Status": {"Health": "OK", "State": "Enabled"}}],
                "Fans": [{"Name": "Fan 1", "Reading": 19, "ReadingUnits": "Percent"}]}),
            &mut h,
        );
        power(
            &json!({"PowerControl": [{"PowerConsumedWatts": 62, "PowerMetrics": {"AverageConsumedWatts": 60}}],
                "PowerSupplies": [{"Name": "PS 1", "PowerCapacityWatts": 500, "Status": {"State": "Enabled", "Health": "OK"}}]}),
            &mut h,
        );
        assert_eq!(h.temperatures[0].celsius, Some(21.0));
        assert_eq!(h.temperatures[0].status.as_deref(), Some("OK"));
        assert_eq!(h.fans[0].speed_percent, Some(19.0));
        assert_eq!(h.power.present_watts, Some(62.0));
        assert_eq!(h.power.average_watts, Some(60.0));
        assert_eq!(h.power_supplies[0].present, Some(true));
        let l = licence(&json!({"License": "iLO Advanced", "LicenseType": "Perpetual"}))
            .expect("licence");
        assert_eq!(l.licence_type, "iLO Advanced");
        assert!(licence(&json!({})).is_none());
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            "[A-Za-z@.#/ ]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            let keys = prop_oneof![
                Just("PowerState".to_string()),
                Just("Boot".to_string()),
                Just("Members".to_string()),
                Just("@odata.id".to_string()),
                Just("Actions".to_string()),
                Just("Oem".to_string()),
                Just("Hpe".to_string()),
                Just("Attributes".to_string()),
                Just("BootMode".to_string()),
                Just("Temperatures".to_string()),
                Just("PowerControl".to_string()),
                Just("MediaTypes".to_string()),
                Just("Inserted".to_string()),
                Just("Image".to_string()),
                "[A-Za-z]{1,8}",
            ];
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(keys, inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Every decoder accepts any JSON without panicking.
        #[test]
        fn decoders_never_panic(v in arb_json()) {
            let _ = power_state(&v);
            let _ = boot_override(&v);
            let _ = override_mode(&v);
            let _ = bios_boot_mode(&v);
            let _ = supported_boot_modes(&v);
            let _ = vmedia_kind(&v);
            let _ = vmedia_status(&v, VmediaDevice::Cdrom);
            let _ = members(&v);
            let _ = action_target(&v, "#ComputerSystem.Reset");
            let _ = licence(&v);
            let mut h = Health::default();
            thermal(&v, &mut h);
            power(&v, &mut h);
        }
    }
}
