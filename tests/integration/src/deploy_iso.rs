//! The deploy ISO for QEMU tests: `vmdeploy-image-build deploy-iso` from the static musl agent
//! ([`crate::qemu::musl_agent`]) and the kernel .deb in `.cache/kernel`, built once per target
//! directory and rebuilt when an input changes.
//!
//! # Cache
//! The ISO is the Secure Boot one (`--signed-loaders`, [`signed_loaders`]): shim and Debian's
//! signed GRUB for UEFI, signed modules.
//!
//! `$CARGO_TARGET_DIR/deploy-iso/` holds `deploy.iso`, `initrd.xz` (the `--initramfs-out`
//! copy), `vmlinuz` (the `--kernel-out` copy: with the initramfs, what `pxe_ilo` network boots),
//! `report.txt` (what the command printed) and `inputs.key`: the path, size and mtime of the
//! agent, the .deb, the firmware and signed loader packages' stamps and `vmdeploy-image-build`, plus the outputs
//! asked for. A different key (a
//! cache from before `--kernel-out`, say) or a missing file means a rebuild. Builds run under a lock and land through a rename, so parallel tests neither build
//! twice nor see half an ISO.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::UNIX_EPOCH;

use crate::lock::ResourceLock;

/// A built deploy ISO and what went into it.
#[derive(Debug, Clone)]
pub struct DeployIso {
    /// The ISO.
    pub iso: PathBuf,
    /// The initramfs alone, as written by `--initramfs-out` (`pxe_deploy_ramdisk`).
    pub initramfs: PathBuf,
    /// The kernel alone, as written by `--kernel-out` (`pxe_deploy_kernel`).
    pub kernel: PathBuf,
    /// What `deploy-iso` printed: the parts, their sizes and the module list.
    pub report: String,
}

/// The default deploy ISO (no extra modules or arguments), built if needed.
pub fn deploy_iso() -> PathBuf {
    deploy_iso_build().iso
}

/// The default deploy ISO with its kernel, initramfs and report.
pub fn deploy_iso_build() -> DeployIso {
    let signed = signed_loaders();
    let signed_arg = signed.to_str().expect("a UTF-8 checkout path").to_owned();
    let signed_stamp = crate::workspace_root().join(".cache/secure-boot/.packages");
    cached_build(
        "deploy-iso",
        &["--signed-loaders", signed_arg.as_str()],
        &[signed_stamp.as_path()],
    )
}

/// A deploy ISO built without `--signed-loaders`: our own unsigned GRUB on the UEFI entry and
/// stripped modules, as an operator who skipped the signed chain would have. OVMF's Secure Boot
/// firmware must refuse it (`e2e_agent_ilo`).
pub fn unsigned_deploy_iso() -> PathBuf {
    cached_build("deploy-iso-unsigned", &[], &[]).iso
}

/// Builds a deploy ISO with the firmware pack, the kernel copy and `extra` arguments into
/// `$CARGO_TARGET_DIR/<name>/`, unless the cache there was built from the same inputs
/// (`inputs`: more files whose identity is part of the key).
fn cached_build(name: &str, extra: &[&str], inputs: &[&Path]) -> DeployIso {
    let agent = crate::qemu::musl_agent();
    let deb = kernel_deb();
    let tool = crate::bin("vmdeploy-image-build");
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("target"))
        .join(name);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let built = DeployIso {
        iso: dir.join("deploy.iso"),
        initramfs: dir.join("initrd.xz"),
        kernel: dir.join("vmlinuz"),
        report: String::new(),
    };
    let kernel_out = built
        .kernel
        .to_str()
        .expect("a UTF-8 target dir")
        .to_owned();
    let firmware = firmware_dir();
    let firmware_arg = firmware.to_str().expect("a UTF-8 checkout path").to_owned();
    let mut args = vec![
        "--kernel-out",
        kernel_out.as_str(),
        "--firmware-dir",
        firmware_arg.as_str(),
    ];
    args.extend_from_slice(extra);
    let firmware_stamp = crate::workspace_root().join(".cache/firmware/.packages");
    let mut key = [&agent, &deb, &tool, &firmware_stamp]
        .iter()
        .map(|p| identity(p))
        .chain(inputs.iter().map(|p| identity(p)))
        .collect::<Vec<_>>();
    key.push(format!("outputs: initramfs {}", args.join(" ")));
    let key = key.join("\n");
    let key_path = dir.join("inputs.key");
    let report_path = dir.join("report.txt");
    let _lock = ResourceLock::acquire(&format!("{name}-build"));
    let fresh = std::fs::read_to_string(&key_path).is_ok_and(|k| k == key)
        && built.iso.is_file()
        && built.initramfs.is_file()
        && built.kernel.is_file();
    if !fresh {
        let _ = std::fs::remove_file(&key_path);
        let report = build(&tool, &agent, &deb, &built.iso, &built.initramfs, &args);
        std::fs::write(&report_path, &report).expect("writing the build report");
        std::fs::write(&key_path, &key).expect("writing the input key");
    }
    let report = std::fs::read_to_string(&report_path).expect("reading the build report");
    DeployIso { report, ..built }
}

/// Runs `vmdeploy-image-build deploy-iso` with `extra` arguments; returns what it printed.
/// Panics with that output when it fails.
pub fn build(
    tool: &Path,
    agent: &Path,
    deb: &Path,
    iso: &Path,
    initramfs: &Path,
    extra: &[&str],
) -> String {
    let out = Command::new(tool)
        .arg("deploy-iso")
        .arg("--agent")
        .arg(agent)
        .arg("--kernel-deb")
        .arg(deb)
        .arg("--initramfs-out")
        .arg(initramfs)
        .arg("-o")
        .arg(iso)
        .args(extra)
        .output()
        .unwrap_or_else(|e| panic!("starting {}: {e}", tool.display()));
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "vmdeploy-image-build deploy-iso failed ({}):\n{said}",
        out.status
    );
    said
}

/// `.cache/firmware/root/lib/firmware`: Debian's firmware packages, unpacked by scripts/setup,
/// which the driver pack takes its firmware from.
pub fn firmware_dir() -> PathBuf {
    let dir = crate::workspace_root().join(".cache/firmware/root/lib/firmware");
    assert!(
        dir.is_dir(),
        "{} is missing: run scripts/setup (it downloads Debian's firmware packages)",
        dir.display()
    );
    dir
}

/// `.cache/secure-boot/root`: Debian's signed shim and GRUB, unpacked by scripts/setup. The
/// tests' deploy ISO and test OS carry that chain, so every UEFI boot goes through shim (with
/// Secure Boot off) and one deploy runs with it on.
pub fn signed_loaders() -> PathBuf {
    let root = crate::workspace_root().join(".cache/secure-boot/root");
    assert!(
        root.join("usr/lib/shim/shimx64.efi.signed").is_file(),
        "{} has no shim: run scripts/setup (it downloads Debian's shim-signed and \
         grub-efi-amd64-signed)",
        root.display()
    );
    root
}

/// `.cache/kernel/linux-image-*.deb` (scripts/setup downloads it); the newest name if several.
pub fn kernel_deb() -> PathBuf {
    let cache = crate::workspace_root().join(".cache/kernel");
    std::fs::read_dir(&cache)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("linux-image-") && n.ends_with(".deb"))
        })
        .max()
        .unwrap_or_else(|| {
            panic!(
                "no linux-image-*.deb in {}: run scripts/setup (it downloads the kernel)",
                cache.display()
            )
        })
}

/// Path, size and mtime: changes when the file is rebuilt or replaced.
fn identity(path: &Path) -> String {
    let meta =
        std::fs::metadata(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{} {} {mtime}", path.display(), meta.len())
}
