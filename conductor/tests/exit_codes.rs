//! The conductor's exit codes, from the built binary: 64 for bad usage or configuration, 1 for a
//! failure at run time, 0 for `--help` (README "Exit codes").

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};

fn conductor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vmdeploy-conductor"))
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("the conductor binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A local port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

fn ilo(address: &str, password_file: &Path, extra: &[&str]) -> Output {
    let password_file = password_file.to_str().expect("UTF-8 temp path");
    let mut args = vec![
        "ilo",
        "--address",
        address,
        "--username",
        "admin",
        "--password-file",
        password_file,
    ];
    args.extend_from_slice(extra);
    conductor(&args)
}

#[test]
fn bad_usage_exits_64() {
    let unknown = conductor(&["--no-such-flag"]);
    assert_eq!(unknown.status.code(), Some(64), "{unknown:?}");
    assert!(stderr(&unknown).contains("--no-such-flag"));
    let missing = conductor(&["ilo", "power", "status"]);
    assert_eq!(missing.status.code(), Some(64), "{missing:?}");
    assert!(stderr(&missing).contains("--address"));
}

#[test]
fn help_exits_0() {
    let help = conductor(&["--help"]);
    assert_eq!(help.status.code(), Some(0), "{help:?}");
    assert!(String::from_utf8_lossy(&help.stdout).contains("ilo"));
}

#[test]
fn bad_configuration_exits_64() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("missing-password");
    let out = ilo("127.0.0.1:1", &missing, &["power", "status"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(
        stderr(&out).contains("missing-password"),
        "{}",
        stderr(&out)
    );

    let password = dir.path().join("password");
    std::fs::write(&password, "secret\n").expect("write");
    let out = ilo(
        "127.0.0.1:1",
        &password,
        &["--timeout", "0", "power", "status"],
    );
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(stderr(&out).contains("--timeout"), "{}", stderr(&out));

    let ca = dir.path().join("no-such-ca.pem");
    let ca = ca.to_str().expect("UTF-8 temp path");
    let out = ilo("127.0.0.1:1", &password, &["--ca", ca, "power", "status"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(stderr(&out).contains("no-such-ca.pem"), "{}", stderr(&out));

    let out = conductor(&["iscsi", "capacity", "--portal", "127.0.0.1:1"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(stderr(&out).contains("--iqn"), "{}", stderr(&out));
}

#[test]
fn a_failure_at_run_time_exits_1() {
    let dir = tempfile::tempdir().expect("temp dir");
    let password = dir.path().join("password");
    std::fs::write(&password, "secret\n").expect("write");
    let address = format!("127.0.0.1:{}", closed_port());
    let out = ilo(
        &address,
        &password,
        &["--timeout", "2", "--protocol", "redfish", "power", "status"],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr(&out).contains(&address), "{}", stderr(&out));

    let portal = format!("127.0.0.1:{}", closed_port());
    let out = conductor(&[
        "iscsi",
        "capacity",
        "--portal",
        &portal,
        "--iqn",
        "iqn.2024-01.org.example:disk",
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(stderr(&out).contains(&portal), "{}", stderr(&out));
}
