//! `vmdeploy-image-build floppy` end to end: the image it writes is read back by mtools.

use std::process::Command;

fn image_build() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vmdeploy-image-build"))
}

#[test]
fn floppy_from_pairs_is_read_back_by_mtools() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("fd.img");
    let status = image_build()
        .args([
            "floppy",
            "--param",
            "deployment_id=abc",
            "--param",
            "boot_mode=uefi",
            "-o",
        ])
        .arg(&out)
        .status()
        .expect("runs");
    assert!(status.success());
    let back = Command::new("mtype")
        .arg("-i")
        .arg(&out)
        .arg("::parameters.txt")
        .output()
        .expect("mtype runs");
    assert_eq!(
        String::from_utf8_lossy(&back.stdout),
        "deployment_id=abc\nboot_mode=uefi\n"
    );
}

#[test]
fn bad_parameters_fail_with_a_reason_and_write_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("parameters.txt");
    std::fs::write(&src, "good=1\nno equals here\n").expect("write");
    let out = dir.path().join("fd.img");
    let result = image_build()
        .args(["floppy", "--params"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .output()
        .expect("runs");
    assert_eq!(
        result.status.code(),
        Some(64),
        "a bad input is a usage error"
    );
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("line 2"), "{stderr}");
    assert!(!out.exists());

    let result = image_build()
        .args(["floppy", "--param", "key=has space", "-o"])
        .arg(&out)
        .output()
        .expect("runs");
    assert_eq!(
        result.status.code(),
        Some(64),
        "a bad input is a usage error"
    );
    assert!(!out.exists());
}

#[test]
fn exit_codes_tell_usage_from_run_time_failures() {
    let dir = tempfile::tempdir().expect("temp dir");
    let unknown = image_build()
        .args(["floppy", "--no-such-flag"])
        .output()
        .expect("runs");
    assert_eq!(unknown.status.code(), Some(64), "{unknown:?}");
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("--no-such-flag"));
    let help = image_build().arg("--help").output().expect("runs");
    assert_eq!(help.status.code(), Some(0), "{help:?}");
    // Writing the image fails at run time: 1.
    let out = dir.path().join("no-such-dir").join("fd.img");
    let failed = image_build()
        .args(["floppy", "--param", "a=1", "-o"])
        .arg(&out)
        .output()
        .expect("runs");
    assert_eq!(failed.status.code(), Some(1), "{failed:?}");
    assert!(String::from_utf8_lossy(&failed.stderr).contains("fd.img"));
}
