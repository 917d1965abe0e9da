//! The agent's exit codes, from the built binary: 64 for bad usage, 1 for a failure at run time,
//! 0 for `--help` (README "Exit codes").

use std::process::{Command, Output};

fn agent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vmdeploy-agent"))
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .expect("the agent binary runs")
}

fn code(out: &Output) -> Option<i32> {
    out.status.code()
}

#[test]
fn bad_usage_exits_64() {
    let unknown = agent(&["--no-such-flag"]);
    assert_eq!(code(&unknown), Some(64), "{unknown:?}");
    let said = String::from_utf8_lossy(&unknown.stderr);
    assert!(said.contains("--no-such-flag"), "{said}");

    let missing = agent(&["write-image", "--url", "http://127.0.0.1:1/image"]);
    assert_eq!(code(&missing), Some(64), "{missing:?}");
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(said.contains("--disk"), "{said}");

    let bad_value = agent(&["iscsi-target", "--no-such-option", "x"]);
    assert_eq!(code(&bad_value), Some(64), "{bad_value:?}");
}

#[test]
fn bad_option_values_exit_64_before_anything_is_opened() {
    let dir = tempfile::tempdir().expect("temp dir");
    let disk = dir.path().join("disk.img");
    std::fs::write(&disk, vec![0u8; 4096]).expect("writing the disk file");
    let disk = disk.to_str().expect("UTF-8 temp path");
    let target = |extra: &[&str]| {
        let mut args = vec!["iscsi-target", "--disk", disk, "--iqn", "iqn-node"];
        args.extend_from_slice(extra);
        agent(&args)
    };
    let cases: [(&str, Output); 6] = [
        ("--listen", target(&["--listen", "not-an-address"])),
        (
            "--done-listen",
            target(&["--done-listen", "127.0.0.1:99999"]),
        ),
        ("--chap", target(&["--chap", "no-colon"])),
        (
            "--iqn",
            agent(&["iscsi-target", "--disk", disk, "--iqn", "bad name"]),
        ),
        (
            "--checksum",
            agent(&[
                "write-image",
                "--url",
                "http://127.0.0.1:1/i",
                "--disk",
                disk,
                "--checksum",
                "sha256:zz",
            ]),
        ),
        (
            "no-such-ca.pem",
            agent(&[
                "write-image",
                "--url",
                "https://127.0.0.1:1/i",
                "--disk",
                disk,
                "--ca",
                "/no-such-ca.pem",
            ]),
        ),
    ];
    for (named, out) in cases {
        assert_eq!(code(&out), Some(64), "{named}: {out:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains(named), "{named}: {said}");
    }
    let untouched = std::fs::read(disk).expect("reading the disk file");
    assert!(untouched.iter().all(|&b| b == 0), "nothing was written");
}

#[test]
fn help_and_version_exit_0() {
    let help = agent(&["--help"]);
    assert_eq!(code(&help), Some(0), "{help:?}");
    assert!(String::from_utf8_lossy(&help.stdout).contains("write-image"));
    assert_eq!(code(&agent(&["--version"])), Some(0));
}

#[test]
fn a_failure_at_run_time_exits_1() {
    let dir = tempfile::tempdir().expect("temp dir");
    let disk = dir.path().join("no-such-dir").join("disk.img");
    let disk = disk.to_str().expect("UTF-8 temp path");
    let out = agent(&[
        "write-image",
        "--url",
        "http://127.0.0.1:1/image",
        "--disk",
        disk,
    ]);
    assert_eq!(code(&out), Some(1), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("vmdeploy-agent:") && said.contains("disk.img"),
        "{said}"
    );
}
