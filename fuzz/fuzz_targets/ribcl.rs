//! RIBCL replies from an iLO (`ribcl::codec::parse_reply`: several XML documents back to back)
//! and every decoder the conductor runs on one (`ribcl::management::decode_*`,
//! `ribcl::power::decode_power_state`), then the command built from a decoded boot order
//! (`persistent_boot_command`), as the management interface does.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vmdeploy_conductor::drivers::ilo::ribcl::codec::parse_reply;
use vmdeploy_conductor::drivers::ilo::ribcl::management::{self as m, parse_boot_device};
use vmdeploy_conductor::drivers::ilo::ribcl::power::decode_power_state;
use vmdeploy_conductor::drivers::{BootDevice, VmediaDevice};

fuzz_target!(|data: &[u8]| {
    let reply = match parse_reply(data) {
        Ok(r) => r,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    assert!(reply.documents >= 1 || reply.responses.is_empty());
    if let Some(error) = reply.first_error() {
        assert_ne!(error.status, 0);
    }
    let _ = reply.informational();

    let _ = decode_power_state(&reply);
    let _ = m::decode_one_time_boot(&reply);
    let _ = m::decode_boot_mode(&reply, "GET_CURRENT_BOOT_MODE");
    let _ = m::decode_boot_mode(&reply, "GET_PENDING_BOOT_MODE");
    let _ = m::decode_supported_boot_modes(&reply);
    let _ = m::decode_vm_status(&reply, VmediaDevice::Cdrom);
    let _ = m::decode_vm_status(&reply, VmediaDevice::Floppy);
    let _ = m::decode_licences(&reply);
    let _ = m::decode_product_name(&reply);
    let _ = m::decode_fw_version(&reply);
    let _ = m::decode_embedded_health(&reply);
    let _ = m::decode_power_readings(&reply);
    if let Ok(entries) = m::decode_persistent_boot(&reply) {
        let fixed = [BootDevice::Cdrom, BootDevice::Hdd, BootDevice::Network];
        let found = entries.iter().map(|e| e.device.clone());
        for wanted in fixed.into_iter().chain(found) {
            if let Ok(cmd) = m::persistent_boot_command(&wanted, &entries) {
                assert!(!cmd.encode("user", "password").is_empty());
            }
            let _ = m::boot_device_name(&wanted);
        }
        for entry in &entries {
            let name = entry.id.as_deref().unwrap_or_default();
            let _ = parse_boot_device(name, entry.description.as_deref());
        }
    }
});
