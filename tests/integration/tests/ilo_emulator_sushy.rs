//! Fidelity of the iLO emulator's Redfish side, checked by sushy (PyPI) as an independent client:
//! sessions, power (ComputerSystem.Reset), the boot override (Once/Continuous/mode), BIOS boot
//! mode (current vs pending), virtual media insert/eject/boot-once, a bad image URL, and the
//! `busy` fault; and proliantutils' own iLO 5 (Redfish) path. Asserts are in
//! tests/integration/py/ilo_emulator_sushy.py and ilo_emulator_proliantutils_redfish.py.

#[path = "ilo_emulator_support.rs"]
mod support;

use support::{write_images, EmulatorProcess, ImageServer};
use vmdeploy_ilo_emulator::Profile;

#[test]
fn sushy_drives_the_emulator_over_redfish() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_images(dir.path());
    let images = ImageServer::start(dir.path());
    // Redfish is served on the same port whatever the product name.
    let emulator = EmulatorProcess::start(dir.path(), 1, &[]);
    support::run_client_script("ilo_emulator_sushy.py", &emulator, 0, &images);
}

/// proliantutils' iLO 5 path: `IloClient` on a Gen10 product name switches to Redfish
/// (RedfishOperations over sushy, with the HPE OEM extensions) for power, boot, boot mode and
/// virtual media.
#[test]
fn proliantutils_ilo5_path_drives_the_emulator_over_redfish() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_images(dir.path());
    let images = ImageServer::start(dir.path());
    let emulator = EmulatorProcess::start(dir.path(), 1, &["--product", "ProLiant DL360 Gen10"]);
    support::run_client_script(
        "ilo_emulator_proliantutils_redfish.py",
        &emulator,
        0,
        &images,
    );
}

/// Runs `script` against one emulator per Redfish profile in `profiles`, with the profile's
/// model, firmware string and quirks as the script's expectations.
fn drive_profiles(script: &str, profiles: &[&str]) {
    for name in profiles {
        let profile = Profile::named(name).expect("a profile");
        let dir = tempfile::tempdir().expect("temp dir");
        write_images(dir.path());
        let images = ImageServer::start(dir.path());
        let emulator = EmulatorProcess::start(dir.path(), 1, &["--profile", name]);
        let quirks: Vec<&str> = profile.quirks.iter().map(|q| q.name()).collect();
        let firmware = profile.identity.firmware_version();
        support::run_client_script_with(
            script,
            &emulator,
            0,
            &images,
            &[
                "--model",
                profile.identity.product,
                "--firmware",
                &firmware,
                "--quirks",
                &quirks.join(","),
            ],
        );
    }
}

/// sushy, the Redfish library of upstream Ironic, against every Redfish profile: it gets
/// through the reset window by its own retry of InvalidOperationForSystemState, cannot insert
/// media on firmware without the standard action (the OEM action does it), and is refused the
/// override mode and boot changes during POST as on real firmware.
#[test]
fn sushy_drives_every_redfish_profile() {
    drive_profiles(
        "ilo_emulator_sushy_profile.py",
        &["ilo5-1.1x", "ilo5-2.7x", "ilo5-3.x", "ilo6-1.6x"],
    );
}

/// proliantutils' Redfish path against the iLO 5 profiles (it routes a Gen11's model to RIBCL,
/// which iLO 6 disables, and a Gen9's to RIS, which the emulator does not serve: neither is a
/// path proliantutils can drive on those).
#[test]
fn proliantutils_drives_every_ilo5_profile() {
    drive_profiles(
        "ilo_emulator_proliantutils_redfish.py",
        &["ilo5-1.1x", "ilo5-2.7x", "ilo5-3.x"],
    );
}
