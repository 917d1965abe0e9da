//! `vmdeploy-image-build initramfs` end to end: the gzipped archive it writes is unpacked by
//! `gzip -dc | cpio -i` (GNU cpio, the peer) and holds the agent as /init, /dev/console, the
//! modules in dependency order and the module list.

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

fn unpack(archive: &Path, into: &Path) {
    let gz = std::fs::read(archive).expect("reading the ramdisk");
    let mut gunzip = Command::new("gzip")
        .arg("-dc")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("gzip runs");
    let mut stdin = gunzip.stdin.take().expect("piped stdin");
    let feeder = std::thread::spawn(move || stdin.write_all(&gz));
    let cpio = Command::new("cpio")
        .args([
            "-i",
            "--quiet",
            "-d",
            "-H",
            "newc",
            "--no-absolute-filenames",
        ])
        .current_dir(into)
        .stdin(gunzip.stdout.take().expect("piped stdout"))
        .output()
        .expect("cpio runs (apt cpio; scripts/setup installs it)");
    feeder.join().expect("feeder thread").expect("feeding gzip");
    assert!(gunzip.wait().expect("gzip exits").success());
    assert!(
        cpio.status.success(),
        "cpio -i: {}",
        String::from_utf8_lossy(&cpio.stderr)
    );
}

#[test]
fn initramfs_is_unpacked_by_gnu_cpio_with_modules_in_dependency_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    let release = dir.path().join("root/lib/modules/6.1.0-test");
    std::fs::create_dir_all(release.join("kernel/drivers/net")).expect("dirs");
    std::fs::create_dir_all(release.join("kernel/net/core")).expect("dirs");
    std::fs::write(
        release.join("modules.dep"),
        "kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko\n\
         kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko\n\
         kernel/net/core/failover.ko:\n",
    )
    .expect("modules.dep");
    for (rel, body) in [
        ("kernel/drivers/net/virtio_net.ko", "VNET"),
        ("kernel/drivers/net/net_failover.ko", "NETFO"),
        ("kernel/net/core/failover.ko", "FO"),
    ] {
        std::fs::write(release.join(rel), body).expect("module");
    }
    let agent = dir.path().join("agent");
    std::fs::write(&agent, b"\x7fELF static agent").expect("agent");
    let out = dir.path().join("initrd.cpio.gz");
    let run = Command::new(env!("CARGO_BIN_EXE_vmdeploy-image-build"))
        .arg("initramfs")
        .arg("--agent")
        .arg(&agent)
        .arg("--modules-dir")
        .arg(&release)
        .args(["--module", "virtio-net napi_tx=1", "-o"])
        .arg(&out)
        .output()
        .expect("image-build runs");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );

    let root = dir.path().join("unpacked");
    std::fs::create_dir(&root).expect("unpack dir");
    unpack(&out, &root);
    assert_eq!(
        std::fs::read(root.join("init")).expect("init"),
        b"\x7fELF static agent"
    );
    assert_eq!(
        std::fs::metadata(root.join("init"))
            .expect("init")
            .permissions()
            .mode()
            & 0o7777,
        0o755
    );
    let console = std::fs::metadata(root.join("dev/console")).expect("dev/console");
    assert!(console.file_type().is_char_device());
    assert_eq!(console.rdev(), (5 << 8) | 1);
    for dir in ["proc", "sys", "run", "tmp"] {
        assert!(root.join(dir).is_dir(), "{dir}");
    }
    let list = std::fs::read_to_string(root.join("etc/vmdeploy/modules")).expect("module list");
    let lines: Vec<&str> = list.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        lines,
        [
            "kernel/net/core/failover.ko",
            "kernel/drivers/net/net_failover.ko",
            "kernel/drivers/net/virtio_net.ko napi_tx=1"
        ]
    );
    let mods = root.join("lib/modules/6.1.0-test");
    assert_eq!(
        std::fs::read(mods.join("kernel/drivers/net/virtio_net.ko")).expect("ko"),
        b"VNET"
    );
    assert_eq!(
        std::fs::read(mods.join("kernel/net/core/failover.ko")).expect("ko"),
        b"FO"
    );
}

#[test]
fn unknown_module_fails_with_its_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let release = dir.path().join("6.1.0-test");
    std::fs::create_dir_all(&release).expect("dir");
    std::fs::write(release.join("modules.dep"), "kernel/a.ko:\n").expect("dep");
    std::fs::write(dir.path().join("agent"), b"x").expect("agent");
    let out = dir.path().join("initrd.cpio.gz");
    let run = Command::new(env!("CARGO_BIN_EXE_vmdeploy-image-build"))
        .arg("initramfs")
        .arg("--agent")
        .arg(dir.path().join("agent"))
        .arg("--modules-dir")
        .arg(&release)
        .args(["--module", "e1000e", "-o"])
        .arg(&out)
        .output()
        .expect("image-build runs");
    assert!(!run.status.success());
    let said = String::from_utf8_lossy(&run.stderr);
    assert!(said.contains("e1000e"), "{said}");
    assert!(!out.exists(), "nothing is written when planning fails");
}
