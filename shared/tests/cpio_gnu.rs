//! The newc writer checked against GNU cpio (Debian `cpio`, installed by scripts/setup) as the
//! peer: `cpio -t` lists what was written, `cpio -i` unpacks it, and the unpacked tree holds the
//! same files, modes, symlinks and device numbers.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::process::{Command, Stdio};

use vmdeploy_shared::cpio::CpioWriter;

fn archive() -> (Vec<u8>, Vec<u8>) {
    // 4097 bytes: a length that needs padding, from a reader.
    let big: Vec<u8> = (0..4097u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut w = CpioWriter::new(Vec::new()).with_mtime(1_700_000_000);
    w.dir("dev", 0o755).expect("dir");
    w.char_device("dev/console", 0o600, 5, 1).expect("console");
    w.block_device("dev/vdz", 0o640, 254, 7).expect("block");
    w.dir("etc", 0o755).expect("dir");
    w.dir("etc/vmdeploy", 0o700).expect("dir");
    w.file("etc/vmdeploy/modules", 0o644, b"kernel/a.ko\n")
        .expect("file");
    w.file_from_reader("/init", 0o755, big.len() as u64, &big[..])
        .expect("init");
    w.file("empty", 0o600, b"").expect("empty");
    w.symlink("sbin-init", "init").expect("symlink");
    (w.finish().expect("finish"), big)
}

fn cpio(args: &[&str], dir: &std::path::Path, input: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new("cpio")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running GNU cpio (apt cpio; scripts/setup installs it)");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(input)
        .expect("feeding cpio");
    child.wait_with_output().expect("cpio output")
}

#[test]
fn gnu_cpio_lists_and_unpacks_the_archive() {
    let (bytes, big) = archive();
    let dir = tempfile::tempdir().expect("tempdir");

    let listed = cpio(&["-t", "--quiet", "-H", "newc"], dir.path(), &bytes);
    assert!(
        listed.status.success(),
        "cpio -t: {}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let names: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        names,
        [
            "dev",
            "dev/console",
            "dev/vdz",
            "etc",
            "etc/vmdeploy",
            "etc/vmdeploy/modules",
            "init",
            "empty",
            "sbin-init"
        ]
    );

    let unpacked = cpio(
        &[
            "-i",
            "--quiet",
            "-d",
            "-m",
            "--no-absolute-filenames",
            "-H",
            "newc",
        ],
        dir.path(),
        &bytes,
    );
    assert!(
        unpacked.status.success(),
        "cpio -i: {}",
        String::from_utf8_lossy(&unpacked.stderr)
    );
    let root = dir.path();
    assert_eq!(std::fs::read(root.join("init")).expect("init"), big);
    let init = std::fs::metadata(root.join("init")).expect("init meta");
    assert_eq!(init.permissions().mode() & 0o7777, 0o755);
    assert_eq!(init.mtime(), 1_700_000_000);
    assert_eq!(
        std::fs::read(root.join("etc/vmdeploy/modules")).expect("modules"),
        b"kernel/a.ko\n"
    );
    assert_eq!(
        std::fs::metadata(root.join("etc/vmdeploy"))
            .expect("dir")
            .permissions()
            .mode()
            & 0o7777,
        0o700
    );
    assert_eq!(std::fs::read(root.join("empty")).expect("empty").len(), 0);
    assert_eq!(
        std::fs::read_link(root.join("sbin-init")).expect("symlink"),
        std::path::Path::new("init")
    );
    // Device nodes: GNU cpio makes them with mknod (the tests run as root).
    let console = std::fs::metadata(root.join("dev/console")).expect("console");
    assert!(console.file_type().is_char_device());
    assert_eq!(console.rdev(), libc_makedev(5, 1));
    let vdz = std::fs::metadata(root.join("dev/vdz")).expect("vdz");
    assert!(vdz.file_type().is_block_device());
    assert_eq!(vdz.rdev(), libc_makedev(254, 7));
}

/// glibc's makedev for small numbers: major in bits 8–19, minor in bits 0–7 (and 20–31).
fn libc_makedev(major: u64, minor: u64) -> u64 {
    ((major & 0xfff) << 8) | (minor & 0xff) | ((minor & !0xff) << 12) | ((major & !0xfff) << 32)
}
