//! The systemd unit shipped in `conductor/systemd/` is one systemd accepts, checked with
//! `systemd-analyze verify` against a scratch root that holds the unit where an operator
//! installs it, a stand-in for `/usr/local/bin/vmdeploy-conductor`, and this machine's own
//! system units (the targets it orders itself after). Any output fails the test: `verify`
//! exits 0 on unknown keys and bad values and only prints them. The flags the unit passes are
//! checked against the built binary's `serve --help`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const UNIT_NAME: &str = "vmdeploy-conductor.service";
/// Where the unit runs the conductor from (README.md, "As a systemd service").
const INSTALLED_BINARY: &str = "/usr/local/bin/vmdeploy-conductor";
/// Where Debian's systemd keeps its units.
const SYSTEM_UNITS: &str = "/usr/lib/systemd/system";

fn unit_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("systemd")
        .join(UNIT_NAME)
}

fn systemd_analyze() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("systemd-analyze"))
            .find(|p| p.is_file())
    });
    match found {
        Some(path) if Path::new(SYSTEM_UNITS).is_dir() => path,
        _ => panic!(
            "systemd-analyze or {SYSTEM_UNITS} is missing: apt-get install systemd \
             (scripts/setup installs it)"
        ),
    }
}

/// `systemd-analyze verify` of `unit_text` installed in a scratch root; its combined output.
fn verify(unit_text: &str) -> (bool, String) {
    let analyze = systemd_analyze();
    let root = tempfile::tempdir().expect("scratch root");
    let r = root.path();
    for dir in ["etc/systemd/system", "usr/local/bin", "usr/lib/systemd"] {
        std::fs::create_dir_all(r.join(dir)).expect("scratch dirs");
    }
    std::fs::write(r.join("etc/systemd/system").join(UNIT_NAME), unit_text).expect("unit");
    let binary = r.join(INSTALLED_BINARY.trim_start_matches('/'));
    std::fs::write(&binary, "#!/bin/sh\n").expect("stand-in binary");
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // cp -a keeps the unit directory's own symlinks (aliases) as they are.
    let copied = Command::new("cp")
        .arg("-a")
        .arg(SYSTEM_UNITS)
        .arg(r.join("usr/lib/systemd/"))
        .status()
        .expect("cp runs");
    assert!(
        copied.success(),
        "copying {SYSTEM_UNITS} into the scratch root"
    );
    let out = Command::new(analyze)
        .arg("verify")
        .arg(format!("--root={}", r.display()))
        .arg(UNIT_NAME)
        .env("SYSTEMD_LOG_COLOR", "0")
        .output()
        .expect("systemd-analyze runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_shipped_unit_passes_systemd_analyze_verify() {
    let unit = std::fs::read_to_string(unit_path()).expect("the shipped unit");
    let (ok, output) = verify(&unit);
    assert!(
        ok && output.trim().is_empty(),
        "systemd-analyze verify {UNIT_NAME}: {}",
        output.trim()
    );
}

#[test]
fn verify_reports_a_broken_unit() {
    let unit = std::fs::read_to_string(unit_path()).expect("the shipped unit");
    let broken = unit.replacen("TimeoutStopSec=", "TimeoutStoopSec=", 1);
    assert_ne!(broken, unit, "the unit sets TimeoutStopSec");
    let (_, output) = verify(&broken);
    assert!(
        output.contains("TimeoutStoopSec"),
        "systemd-analyze verify said nothing about an unknown key: {output:?}"
    );
}

#[test]
fn the_unit_runs_serve_with_flags_the_binary_has() {
    let unit = std::fs::read_to_string(unit_path()).expect("the shipped unit");
    let help = Command::new(env!("CARGO_BIN_EXE_vmdeploy-conductor"))
        .args(["serve", "--help"])
        .output()
        .expect("the conductor binary runs");
    assert!(help.status.success(), "serve --help");
    let help = String::from_utf8_lossy(&help.stdout);
    let commands: Vec<&str> = unit
        .lines()
        .filter_map(|l| {
            l.strip_prefix("ExecStart=")
                .or_else(|| l.strip_prefix("ExecStartPre="))
        })
        .collect();
    assert_eq!(commands.len(), 2, "ExecStartPre (the check) and ExecStart");
    for command in commands {
        let mut words = command.split_whitespace();
        assert_eq!(words.next(), Some(INSTALLED_BINARY), "{command}");
        assert_eq!(words.next(), Some("serve"), "{command}");
        for flag in words.filter(|w| w.starts_with("--")) {
            assert!(help.contains(flag), "serve --help has no {flag}:\n{help}");
        }
    }
}
