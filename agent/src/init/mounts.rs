//! The pseudo filesystems PID 1 mounts (the kernel mounts none of them for an initramfs /init;
//! Debian's kernel has DEVTMPFS_MOUNT unset: docs/qemu-and-boot.md §3).
//!
//! Design: every mount is checked against `/proc/self/mountinfo` first, so running the setup
//! twice (or with `--pid1` on a system that already has them) mounts nothing twice; EBUSY from
//! the kernel also counts as "already mounted".

use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, MsFlags};
use serde::Serialize;

/// One pseudo filesystem to mount.
#[derive(Debug, Clone, Copy)]
pub struct MountSpec {
    /// Filesystem type (and source name).
    pub fstype: &'static str,
    /// Mount point, absolute inside the (new) root.
    pub target: &'static str,
    /// Mount data (options).
    pub data: Option<&'static str>,
    /// Whether the agent cannot work without it (a failure fails the setup).
    pub essential: bool,
}

const NOSUID_NODEV: MsFlags = MsFlags::MS_NOSUID.union(MsFlags::MS_NODEV);

/// Mounted before the kernel modules load, in this order.
pub const EARLY_MOUNTS: &[MountSpec] = &[
    MountSpec {
        fstype: "proc",
        target: "/proc",
        data: None,
        essential: true,
    },
    MountSpec {
        fstype: "sysfs",
        target: "/sys",
        data: None,
        essential: true,
    },
    MountSpec {
        fstype: "devtmpfs",
        target: "/dev",
        data: Some("mode=0755"),
        essential: true,
    },
    MountSpec {
        fstype: "tmpfs",
        target: "/run",
        data: Some("mode=0755"),
        essential: false,
    },
    MountSpec {
        fstype: "tmpfs",
        target: "/tmp",
        data: Some("mode=1777"),
        essential: false,
    },
];

/// Mounted after the kernel modules: configfs is a module in Debian's kernel (CONFIGFS_FS=m,
/// docs/qemu-and-boot.md §3), and /sys/kernel/config only exists once it is registered.
pub const LATE_MOUNTS: &[MountSpec] = &[MountSpec {
    fstype: "configfs",
    target: "/sys/kernel/config",
    data: None,
    essential: false,
}];

/// What happened to one mount.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct MountOutcome {
    /// Filesystem type.
    pub fstype: String,
    /// Full path of the mount point.
    pub target: PathBuf,
    /// `mounted`, `already mounted` or `failed: <reason>`.
    pub outcome: String,
    /// Whether the setup fails with it.
    pub essential: bool,
}

impl MountOutcome {
    /// True unless the mount failed.
    pub fn ok(&self) -> bool {
        !self.outcome.starts_with("failed")
    }
}

/// Mounts `specs` under `root` (`/` as PID 1; a scratch directory in tests).
pub fn mount_all(root: &Path, specs: &[MountSpec]) -> Vec<MountOutcome> {
    specs.iter().map(|spec| mount_one(root, spec)).collect()
}

fn mount_one(root: &Path, spec: &MountSpec) -> MountOutcome {
    let target = root.join(spec.target.trim_start_matches('/'));
    let outcome = match try_mount(&target, spec) {
        Ok(outcome) => outcome.to_owned(),
        Err(reason) => format!("failed: {reason}"),
    };
    if outcome.starts_with("failed") {
        tracing::warn!(fstype = spec.fstype, target = %target.display(), %outcome, "mount");
    } else {
        tracing::info!(fstype = spec.fstype, target = %target.display(), %outcome, "mount");
    }
    MountOutcome {
        fstype: spec.fstype.to_owned(),
        target,
        outcome,
        essential: spec.essential,
    }
}

fn try_mount(target: &Path, spec: &MountSpec) -> Result<&'static str, String> {
    if is_mounted(target, spec.fstype) {
        return Ok("already mounted");
    }
    // A scratch tmpfs goes only on an empty directory: in the ramdisk /run and /tmp are empty,
    // and `run --pid1` on a real system must not hide its files.
    if spec.fstype == "tmpfs"
        && std::fs::read_dir(target).is_ok_and(|mut entries| entries.next().is_some())
    {
        return Ok("skipped: not empty");
    }
    if !target.is_dir() {
        std::fs::create_dir_all(target)
            .map_err(|e| format!("creating mount point {}: {e}", target.display()))?;
    }
    match mount(
        Some(spec.fstype),
        target,
        Some(spec.fstype),
        mount_flags(spec),
        spec.data,
    ) {
        Ok(()) => Ok("mounted"),
        Err(Errno::EBUSY) => Ok("already mounted"),
        Err(e) => Err(e.desc().to_owned()),
    }
}

// devtmpfs must keep device nodes usable, so it only gets nosuid.
fn mount_flags(spec: &MountSpec) -> MsFlags {
    if spec.fstype == "devtmpfs" {
        MsFlags::MS_NOSUID
    } else {
        NOSUID_NODEV
    }
}

/// True when `/proc/self/mountinfo` (if readable) lists a `fstype` mount at `target`.
pub fn is_mounted(target: &Path, fstype: &str) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let target = target.to_string_lossy();
    let found = mountinfo_entries(&info).any(|(point, fs)| point == target && fs == fstype);
    found
}

/// `(mount point, fstype)` of each line of a mountinfo file (proc(5): field 5 is the mount
/// point, the fstype follows the ` - ` separator). Escapes (`\040`) are left as they are.
pub fn mountinfo_entries(info: &str) -> impl Iterator<Item = (&str, &str)> {
    info.lines().filter_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let point = left.split(' ').nth(4)?;
        let fstype = right.split(' ').next()?;
        Some((point, fstype))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_give_point_and_type() {
        let info = "22 1 0:21 / /proc rw,nosuid - proc proc rw\n\
                    23 1 0:22 / /sys rw shared:7 - sysfs sysfs rw\n\
                    garbage\n";
        let got: Vec<_> = mountinfo_entries(info).collect();
        assert_eq!(got, vec![("/proc", "proc"), ("/sys", "sysfs")]);
    }

    #[test]
    fn configfs_is_mounted_after_sysfs() {
        assert!(EARLY_MOUNTS.iter().any(|m| m.target == "/sys"));
        assert_eq!(LATE_MOUNTS[0].target, "/sys/kernel/config");
    }
}
