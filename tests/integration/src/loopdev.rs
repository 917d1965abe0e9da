//! Loop devices for the tests that need a real block device (the agent's floppy search, disk
//! selection, O_DIRECT writes, the iSCSI LUN).
//!
//! A test that needs one and cannot have one fails with a one-line hint on how to fix the
//! machine: it never returns early and never falls back to a plain file, because either would
//! let the test pass without testing the block-device path it exists for.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How the loop device reads and writes its backing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopIo {
    /// Through the page cache (`losetup` default).
    Buffered,
    /// `losetup --direct-io=on`: the backing file is opened O_DIRECT, as a real disk behaves.
    Direct,
}

/// A file in /var/tmp attached as a loop device; detached (and the file removed) on drop.
pub struct LoopDevice {
    device: PathBuf,
    // The backing file: removed only after Drop has detached the device.
    _dir: tempfile::TempDir,
}

impl LoopDevice {
    /// Writes `contents` to a new backing file, grows it (sparse) to `len` bytes if that is more,
    /// and attaches it. Panics with a fix hint when loop devices are not available here.
    pub fn attach(contents: &[u8], len: u64, io: LoopIo) -> LoopDevice {
        require_loop_devices();
        // /var/tmp, not /tmp: /tmp may be a tmpfs, which has no O_DIRECT.
        let dir = tempfile::Builder::new()
            .prefix("vmdeploy-loop")
            .tempdir_in("/var/tmp")
            .expect("creating a scratch dir in /var/tmp");
        let file = dir.path().join("backing.img");
        std::fs::write(&file, contents).expect("writing the loop device's backing file");
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .expect("reopening the backing file");
        f.set_len(len.max(contents.len() as u64))
            .expect("sizing the backing file");
        drop(f);
        let mut cmd = Command::new("losetup");
        cmd.args(["--find", "--show"]);
        if io == LoopIo::Direct {
            cmd.arg("--direct-io=on");
        }
        let out = cmd
            .arg(&file)
            .output()
            .unwrap_or_else(|e| panic!("{}", missing_losetup_hint(&e)));
        assert!(
            out.status.success(),
            "losetup --find --show {} failed ({}): {}; fix: free a loop device (`losetup -a` lists \
             leftovers, `losetup -d /dev/loopN` detaches one) or load the loop module (`modprobe loop`)",
            file.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let device = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(
            device.starts_with("/dev"),
            "losetup printed {device:?}, not a device path"
        );
        LoopDevice { device, _dir: dir }
    }

    /// The device node, e.g. `/dev/loop3`.
    pub fn device(&self) -> &Path {
        &self.device
    }

    /// The kernel name, e.g. `loop3`.
    pub fn name(&self) -> String {
        self.device
            .file_name()
            .expect("a device path has a name")
            .to_string_lossy()
            .into_owned()
    }

    /// Everything on the device, read through the device node.
    pub fn contents(&self) -> Vec<u8> {
        std::fs::read(&self.device)
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.device.display()))
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        // Best effort: a failure here leaves a device `losetup -a` shows, and a panic in drop
        // would hide the test's own failure.
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

/// Panics with a one-line fix hint unless this process can attach loop devices: `losetup` on
/// PATH and root.
pub fn require_loop_devices() {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "loop devices need root (running as uid {euid}): run the integration tests as root, \
         e.g. `sudo -E scripts/test`"
    );
    if let Err(e) = Command::new("losetup").arg("--version").output() {
        panic!("{}", missing_losetup_hint(&e));
    }
}

fn missing_losetup_hint(e: &std::io::Error) -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    if e.kind() == ErrorKind::NotFound {
        format!(
            "losetup not found on PATH ({path}): install util-linux (scripts/setup does) and put \
             /usr/sbin and /sbin on PATH"
        )
    } else {
        format!(
            "running losetup failed: {e} (PATH {path}); it comes with util-linux (scripts/setup)"
        )
    }
}
