//! `deploy-iso` failures seen from outside: missing inputs are usage errors (exit 64), a file that
//! is no kernel package fails the build (exit 1) with the reason, and neither leaves an ISO or a
//! `.partial` file behind. The successful build, and booting it, are in
//! tests/integration/tests/deploy_iso_qemu.rs (they need the kernel .deb and QEMU).

use std::process::Command;

fn image_build() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vmdeploy-image-build"))
}

#[test]
fn missing_inputs_are_usage_errors_and_a_bad_package_fails_without_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("deploy.iso");
    let missing = image_build()
        .args([
            "deploy-iso",
            "--agent",
            "/nonexistent/agent",
            "--kernel-deb",
        ])
        .arg(dir.path().join("none.deb"))
        .arg("-o")
        .arg(&out)
        .output()
        .expect("run");
    assert_eq!(missing.status.code(), Some(64), "{missing:?}");
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/agent does not exist"),
        "{missing:?}"
    );

    let agent = dir.path().join("agent");
    std::fs::write(&agent, b"\x7fELF").expect("agent");
    let deb = dir.path().join("linux-image-bad.deb");
    std::fs::write(&deb, b"not a debian package").expect("deb");
    let bad = image_build()
        .arg("deploy-iso")
        .arg("--agent")
        .arg(&agent)
        .arg("--kernel-deb")
        .arg(&deb)
        .arg("-o")
        .arg(&out)
        .output()
        .expect("run");
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("unpacking"),
        "{bad:?}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !left.iter().any(|n| n.starts_with("deploy.iso")),
        "{left:?}"
    );
}
