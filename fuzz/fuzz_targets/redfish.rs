//! Redfish bodies from an iLO: the JSON the client reads (`serde_json` into `Value`, as
//! `redfish::client` does) and every accessor the conductor runs on a resource
//! (`redfish::codec`), plus the error-body readers (`redfish::error`) and the refusal rules
//! (`redfish::refusals`), and the probe's `xmldata` reader (`detect`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use vmdeploy_conductor::drivers::ilo::detect;
use vmdeploy_conductor::drivers::ilo::redfish::codec::{self as c, PathStep};
use vmdeploy_conductor::drivers::ilo::redfish::error::{error_message, message_ids};
use vmdeploy_conductor::drivers::ilo::redfish::refusals::refusal_for;
use vmdeploy_conductor::drivers::{BootDevice, Health, VmediaDevice};

fuzz_target!(|data: &[u8]| {
    // The unauthenticated xmldata document the protocol probe reads.
    let detected = detect::parse_xmldata(data);
    let _ = detect::choose(&detected);
    // Error bodies are read whatever they hold, and matched against the refusal rules.
    let message = error_message(data);
    let ids = message_ids(data);
    let _ = refusal_for(&ids);
    assert!(
        message.len() <= data.len() + 256,
        "an error message larger than its body"
    );

    let Ok(resource) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    for key in [
        "Systems",
        "Managers",
        "Bios",
        "VirtualMedia",
        "Thermal",
        "Power",
    ] {
        let _ = c::link(&resource, key);
    }
    let _ = c::link_at(
        &resource,
        &[
            PathStep::Key("Oem"),
            PathStep::Key("Hpe"),
            PathStep::Key("Links"),
        ],
    );
    let members = c::members(&resource);
    for m in &members {
        let joined = c::join("https://bmc.example/", m);
        assert!(joined.contains(m.trim_start_matches('/')));
    }
    let _ = c::action_target(&resource, "#ComputerSystem.Reset");
    let _ = c::power_state(&resource);
    let (device, _) = c::boot_override(&resource);
    if let Some(device) = device {
        let _ = c::override_entry(&resource, device.clone());
        // The fixed devices map one to one; `Other` names are normalised on the way out.
        let fixed = !matches!(device, BootDevice::Other(_) | BootDevice::Uefi { .. });
        if let (true, Ok(target)) = (fixed, c::boot_target(&device)) {
            assert_eq!(
                c::parse_boot_target(target).as_ref(),
                Some(&device),
                "boot target round trip"
            );
        }
    }
    let _ = c::override_entry(&resource, BootDevice::Cdrom);
    let _ = c::boot_order(&resource);
    let _ = c::boot_option_name(&resource);
    let _ = c::override_mode(&resource);
    let _ = c::bios_boot_mode(&resource);
    let _ = c::supported_boot_modes(&resource);
    let _ = c::vmedia_kind(&resource);
    let _ = c::has_hpe_oem(&resource);
    let _ = c::vmedia_status(&resource, VmediaDevice::Cdrom);
    let _ = c::vmedia_status(&resource, VmediaDevice::Floppy);
    let mut health = Health::default();
    c::thermal(&resource, &mut health);
    c::power(&resource, &mut health);
    let _ = c::licence(&resource);
});
