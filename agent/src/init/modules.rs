//! Kernel modules from the initramfs, loaded in listed order (there is no modprobe in the
//! ramdisk; docs/qemu-and-boot.md §3 gives the dependency orders).
//!
//! # List format (`/etc/vmdeploy/modules`, written by image-build)
//! One module per line, already in dependency order:
//! ```text
//! # comment
//! kernel/drivers/virtio/virtio_ring.ko
//! kernel/drivers/usb/storage/usb-storage.ko delay_use=0
//! ```
//! The first word is the module's path relative to `/lib/modules/<uname -r>/` (an absolute path
//! is taken as it is); the rest of the line is the parameter string passed to the kernel
//! (`param=value` words separated by spaces, as insmod takes them). Blank lines and lines
//! starting with `#` are skipped. `.ko` files load with `finit_module(2)`; `.ko.xz` files are
//! decompressed in memory and load with `init_module(2)` (Debian 12's kernel ships plain `.ko`,
//! MODULE_COMPRESS_NONE=y, so this is for other kernels).
//!
//! # Failures
//! EEXIST (already loaded, or built in) counts as loaded. Any other failure is logged and the
//! next module is still tried: a missing optional driver (e.g. `crct10dif-pclmul`, ENODEV on a
//! CPU without PCLMUL) must not stop the boot.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Where image-build writes the list, inside the initramfs.
pub const MODULE_LIST_PATH: &str = "/etc/vmdeploy/modules";

/// Longest accepted line (a module path plus parameters); longer ones are refused, not cut.
const MAX_LINE: usize = 4096;

/// Largest decompressed `.ko.xz` accepted (the biggest Debian module we ship is ~1 MiB).
const MAX_MODULE_SIZE: u64 = 64 << 20;

/// One line of the list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModuleEntry {
    /// Path relative to `/lib/modules/<release>/`, or absolute.
    pub path: String,
    /// Parameter string for the kernel, e.g. `delay_use=0`; empty for none.
    pub params: String,
}

/// Why a module list could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModuleListError {
    /// A line is longer than [`MAX_LINE`].
    #[error("line {line}: longer than {MAX_LINE} bytes")]
    LineTooLong {
        /// 1-based line number.
        line: usize,
    },
    /// The path does not name a `.ko` or `.ko.xz` file.
    #[error("line {line}: {path:?} is not a .ko or .ko.xz file")]
    NotAModule {
        /// 1-based line number.
        line: usize,
        /// The offending path.
        path: String,
    },
    /// A NUL byte, which the kernel's C strings cannot carry.
    #[error("line {line}: contains a NUL byte")]
    Nul {
        /// 1-based line number.
        line: usize,
    },
    /// The path climbs out of the modules directory.
    #[error("line {line}: {path:?} contains '..'")]
    ParentDir {
        /// 1-based line number.
        line: usize,
        /// The offending path.
        path: String,
    },
}

/// Parses a module list (format in the module docs).
pub fn parse_module_list(text: &str) -> Result<Vec<ModuleEntry>, ModuleListError> {
    let mut entries = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        if raw.len() > MAX_LINE {
            return Err(ModuleListError::LineTooLong { line });
        }
        if raw.contains('\0') {
            return Err(ModuleListError::Nul { line });
        }
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let mut words = trimmed.split_whitespace();
        let path = words.next().unwrap_or_default().to_owned();
        if !(path.ends_with(".ko") || path.ends_with(".ko.xz")) {
            return Err(ModuleListError::NotAModule { line, path });
        }
        if path.split('/').any(|part| part == "..") {
            return Err(ModuleListError::ParentDir { line, path });
        }
        let params = words.collect::<Vec<_>>().join(" ");
        entries.push(ModuleEntry { path, params });
    }
    Ok(entries)
}

/// What happened to one module.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ModuleOutcome {
    /// The file tried.
    pub path: PathBuf,
    /// `loaded`, `already loaded` or `failed: <reason>`.
    pub outcome: String,
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> std::io::Result<String> {
    // SAFETY: utsname is plain old data; uname fills it and we read the NUL-terminated release.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `uts` is a valid, writable utsname.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let bytes: Vec<u8> = uts
        .release
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Loads every module of `entries`, in order; `modules_dir` is `/lib/modules/<release>`.
pub fn load_all(modules_dir: &Path, entries: &[ModuleEntry]) -> Vec<ModuleOutcome> {
    entries
        .iter()
        .map(|entry| {
            let path = if entry.path.starts_with('/') {
                PathBuf::from(&entry.path)
            } else {
                modules_dir.join(&entry.path)
            };
            let started = std::time::Instant::now();
            let outcome = match load_one(&path, &entry.params) {
                Ok(LoadResult::Loaded) => "loaded".to_owned(),
                Ok(LoadResult::AlreadyLoaded) => "already loaded".to_owned(),
                Err(e) => format!("failed: {e:#}"),
            };
            let ms = started.elapsed().as_millis();
            if outcome.starts_with("failed") {
                tracing::warn!(module = %path.display(), %outcome, ms, "kernel module");
            } else {
                tracing::info!(module = %path.display(), %outcome, ms, "kernel module");
            }
            ModuleOutcome { path, outcome }
        })
        .collect()
}

/// What the kernel did with a module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadResult {
    /// It was loaded now.
    Loaded,
    /// It was loaded already, or is built in (EEXIST).
    AlreadyLoaded,
}

fn load_one(path: &Path, params: &str) -> anyhow::Result<LoadResult> {
    use anyhow::Context as _;
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    if path.to_string_lossy().ends_with(".xz") {
        let mut image = Vec::new();
        lzma_rust2::XzReader::new(file, true)
            .take(MAX_MODULE_SIZE + 1)
            .read_to_end(&mut image)
            .with_context(|| format!("decompressing {}", path.display()))?;
        anyhow::ensure!(
            image.len() as u64 <= MAX_MODULE_SIZE,
            "decompressed module is larger than {MAX_MODULE_SIZE} bytes"
        );
        return load_image(&image, params);
    }
    let params = CString::new(params).context("module parameters contain a NUL byte")?;
    // SAFETY: finit_module(2) takes an open fd, a NUL-terminated string and flags; the fd
    // and string outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_finit_module,
            file.as_raw_fd(),
            params.as_ptr(),
            0 as libc::c_int,
        )
    };
    outcome(rc)
}

/// Loads a module from memory with init_module(2) (the driver pack's modules are decompressed
/// in memory; their signatures, if any, are checked by the kernel on these bytes).
pub fn load_image(image: &[u8], params: &str) -> anyhow::Result<LoadResult> {
    use anyhow::Context as _;
    let params = CString::new(params).context("module parameters contain a NUL byte")?;
    // SAFETY: init_module(2) reads `image.len()` bytes from the buffer and the NUL-terminated
    // parameter string; both outlive the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_init_module,
            image.as_ptr(),
            image.len() as libc::c_ulong,
            params.as_ptr(),
        )
    };
    outcome(rc)
}

fn outcome(rc: libc::c_long) -> anyhow::Result<LoadResult> {
    if rc == 0 {
        return Ok(LoadResult::Loaded);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EEXIST) {
        return Ok(LoadResult::AlreadyLoaded);
    }
    Err(anyhow::Error::new(err).context("the kernel refused the module"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_paths_params_comments_and_blanks() {
        let text = "# virtio\n\nkernel/drivers/virtio/virtio.ko\n  kernel/drivers/usb/storage/usb-storage.ko   delay_use=0  quirks=1\n/abs/x.ko.xz\n";
        let got = parse_module_list(text).expect("valid list");
        assert_eq!(
            got,
            vec![
                ModuleEntry {
                    path: "kernel/drivers/virtio/virtio.ko".into(),
                    params: String::new()
                },
                ModuleEntry {
                    path: "kernel/drivers/usb/storage/usb-storage.ko".into(),
                    params: "delay_use=0 quirks=1".into()
                },
                ModuleEntry {
                    path: "/abs/x.ko.xz".into(),
                    params: String::new()
                },
            ]
        );
    }

    #[test]
    fn refuses_bad_lines_with_their_number() {
        let cases = [
            (
                "a.ko\nnot-a-module\n",
                ModuleListError::NotAModule {
                    line: 2,
                    path: "not-a-module".into(),
                },
            ),
            (
                "../../etc/x.ko\n",
                ModuleListError::ParentDir {
                    line: 1,
                    path: "../../etc/x.ko".into(),
                },
            ),
            ("a.ko p=\0\n", ModuleListError::Nul { line: 1 }),
        ];
        for (text, want) in cases {
            assert_eq!(parse_module_list(text), Err(want), "{text:?}");
        }
        let long = format!("a.ko {}\n", "x".repeat(MAX_LINE));
        assert_eq!(
            parse_module_list(&long),
            Err(ModuleListError::LineTooLong { line: 1 })
        );
    }

    #[test]
    fn missing_module_fails_and_the_next_is_still_tried() {
        let dir = tempfile::tempdir().expect("tempdir");
        let entries = parse_module_list("missing-a.ko\nmissing-b.ko x=1\n").expect("valid");
        let got = load_all(dir.path(), &entries);
        assert_eq!(got.len(), 2);
        assert!(
            got.iter().all(|o| o.outcome.starts_with("failed: opening")),
            "{got:?}"
        );
        assert_eq!(got[1].path, dir.path().join("missing-b.ko"));
    }

    #[test]
    fn kernel_release_is_not_empty() {
        assert!(!kernel_release().expect("uname").is_empty());
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_text(text in ".{0,600}") {
            let _ = parse_module_list(&text);
        }

        #[test]
        fn rendered_lists_parse_back(
            entries in proptest::collection::vec(
                ("[a-z0-9_/-]{1,40}\\.ko(\\.xz)?", proptest::collection::vec("[a-z_]{1,8}=[a-z0-9]{1,6}", 0..4)),
                0..20,
            )
        ) {
            let text: String = entries
                .iter()
                .map(|(path, params)| format!("{path} {}\n# note\n\n", params.join(" ")))
                .collect();
            let got = parse_module_list(&text).expect("rendered list parses");
            let want: Vec<ModuleEntry> = entries
                .into_iter()
                .map(|(path, params)| ModuleEntry { path, params: params.join(" ") })
                .collect();
            prop_assert_eq!(got, want);
        }
    }
}
