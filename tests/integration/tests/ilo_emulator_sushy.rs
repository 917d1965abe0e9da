//! Fidelity of the iLO emulator's Redfish side, checked by sushy (PyPI) as an independent client:
//! sessions, power (ComputerSystem.Reset), the boot override (Once/Continuous/mode), BIOS boot
//! mode (current vs pending), virtual media insert/eject/boot-once, a bad image URL, and the
//! `busy` fault; and proliantutils' own iLO 5 (Redfish) path. Asserts are in
//! tests/integration/py/ilo_emulator_sushy.py and ilo_emulator_proliantutils_redfish.py.

#[path = "ilo_emulator_support.rs"]
mod support;

use support::{write_images, EmulatorProcess, ImageServer};

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
