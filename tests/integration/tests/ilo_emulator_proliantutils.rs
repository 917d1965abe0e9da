//! Fidelity of the iLO emulator's RIBCL side, checked by independent clients from PyPI:
//! proliantutils (`IloClient`, what ironic's iLO driver uses) and python-hpilo (its own raw HTTP
//! framing, chunked replies only). The Python scripts in tests/integration/py/ hold the asserts
//! (power, one-time/persistent boot, boot mode, virtual media insert/status/eject and boot-once,
//! licences, embedded health, login failure and injected faults); the test fails when a script
//! exits non-zero. The Gen9 profile is also driven over RIS (`/rest/v1`), proliantutils' path
//! for every Gen9.

#[path = "ilo_emulator_support.rs"]
mod support;

use support::{write_images, EmulatorProcess, ImageServer};

#[test]
fn proliantutils_drives_the_emulator_over_ribcl() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_images(dir.path());
    let images = ImageServer::start(dir.path());
    let emulator = EmulatorProcess::start(dir.path(), 1, &[]);
    support::run_client_script("ilo_emulator_proliantutils.py", &emulator, 0, &images);
}

/// The same checks against the Gen8 profile (iLO 4 2.10, no Redfish): proliantutils stays on
/// RIBCL for a Gen8 and never needs Redfish.
#[test]
fn proliantutils_drives_the_gen8_profile_over_ribcl() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_images(dir.path());
    let images = ImageServer::start(dir.path());
    let emulator = EmulatorProcess::start(dir.path(), 1, &["--profile", "ilo4-gen8-ribcl"]);
    support::run_client_script_with(
        "ilo_emulator_proliantutils.py",
        &emulator,
        0,
        &images,
        &["--firmware", "2.10", "--uefi-cd-entry-when-connected"],
    );
}

/// The Gen9 profile (iLO 4 2.70 with RIS): proliantutils reads the model over RIBCL, then
/// drives every operation through its RIS client under `/rest/v1` (power, one-time and
/// persistent boot, boot mode, Secure Boot, virtual media, licence); the script fails if any of
/// them goes over RIBCL or sends no `/rest/v1` request.
#[test]
fn proliantutils_drives_the_gen9_profile_over_ris() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_images(dir.path());
    let images = ImageServer::start(dir.path());
    let emulator = EmulatorProcess::start(dir.path(), 1, &["--profile", "ilo4-gen9-2.7x"]);
    support::run_client_script_with(
        "ilo_emulator_proliantutils_ris.py",
        &emulator,
        0,
        &images,
        &[],
    );
}

#[test]
fn python_hpilo_drives_the_emulator_over_ribcl() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_images(dir.path());
    let images = ImageServer::start(dir.path());
    // Two servers: the script drives server 1, so this also checks that server i answers on
    // its own port with its own state.
    let emulator = EmulatorProcess::start(dir.path(), 2, &[]);
    support::run_client_script("ilo_emulator_hpilo.py", &emulator, 1, &images);
}
