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
    assert!(!result.status.success());
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("line 2"), "{stderr}");
    assert!(!out.exists());

    let result = image_build()
        .args(["floppy", "--param", "key=has space", "-o"])
        .arg(&out)
        .output()
        .expect("runs");
    assert!(!result.status.success());
    assert!(!out.exists());
}
