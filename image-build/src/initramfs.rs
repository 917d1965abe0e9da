//! The deploy ramdisk: a gzipped cpio "newc" archive with the agent as `/init`, the kernel
//! modules it needs and the list the agent loads them from.
//!
//! # Layout
//! ```text
//! dev/ dev/console (c 5 1)      the kernel opens /dev/console for init's stdio before devtmpfs
//! proc/ sys/ run/ tmp/          mount points (the agent creates missing ones too)
//! init                          the agent, 0755
//! etc/vmdeploy/modules          the module list (format: agent/src/init/modules.rs)
//! lib/modules/<release>/kernel/...  the chosen modules and their dependencies
//! ```
//! The modules come from an unpacked Debian linux-image package:
//! `dpkg-deb -x linux-image-*.deb ROOT && depmod -b ROOT RELEASE` (the .deb ships no
//! `modules.dep`), then `--modules-dir ROOT/lib/modules/RELEASE`. The load order is resolved from
//! `modules.dep` ([`crate::kmod`]), never hard-coded.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use flate2::write::GzEncoder;
use vmdeploy_shared::cpio::CpioWriter;

use crate::kmod::ModuleIndex;

/// Where the agent reads its module list (agent/src/init/modules.rs `MODULE_LIST_PATH`).
pub const MODULE_LIST: &str = "etc/vmdeploy/modules";

/// One module asked for, with the parameters to load it with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleRequest {
    /// The module's name (`virtio_net`, `usb-storage`).
    pub name: String,
    /// Parameter string (`delay_use=0`), empty for none.
    pub params: String,
}

impl ModuleRequest {
    /// `NAME [PARAM=VALUE ...]`, as given on the command line.
    pub fn parse(spec: &str) -> anyhow::Result<ModuleRequest> {
        let mut words = spec.split_whitespace();
        let name = words
            .next()
            .with_context(|| format!("empty module request {spec:?}"))?;
        Ok(ModuleRequest {
            name: name.to_owned(),
            params: words.collect::<Vec<_>>().join(" "),
        })
    }
}

/// What goes into the ramdisk.
#[derive(Debug, Clone)]
pub struct InitramfsSpec {
    /// The agent binary (static musl build), stored as `/init`.
    pub agent: PathBuf,
    /// `.../lib/modules/<release>` with a `modules.dep`; `None` for a ramdisk without modules.
    pub modules_dir: Option<PathBuf>,
    /// The modules wanted; their dependencies are added.
    pub modules: Vec<ModuleRequest>,
}

/// What [`build`] wrote.
#[derive(Debug, Clone)]
pub struct InitramfsSummary {
    /// The module list as written to `etc/vmdeploy/modules`.
    pub module_list: String,
    /// Number of modules in it.
    pub module_count: usize,
    /// Compressed size.
    pub bytes: u64,
}

/// The module list text and the (archive path, host path) of each module, in load order.
fn plan_modules(spec: &InitramfsSpec) -> anyhow::Result<(String, Vec<(String, PathBuf)>)> {
    let mut list = String::from("# written by vmdeploy-image-build initramfs; load order\n");
    let Some(dir) = &spec.modules_dir else {
        anyhow::ensure!(
            spec.modules.is_empty(),
            "modules were asked for but no --modules-dir given"
        );
        return Ok((list, Vec::new()));
    };
    let release = dir
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} has no release name", dir.display()))?
        .to_owned();
    let dep_path = dir.join("modules.dep");
    let dep = std::fs::read_to_string(&dep_path).with_context(|| {
        format!(
            "reading {} (a linux-image .deb has none: run `depmod -b ROOT {release}` first)",
            dep_path.display()
        )
    })?;
    let index =
        ModuleIndex::parse(&dep).with_context(|| format!("parsing {}", dep_path.display()))?;
    let names: Vec<&str> = spec.modules.iter().map(|m| m.name.as_str()).collect();
    let order = index.load_order(&names)?;
    let mut files = Vec::new();
    for rel in order {
        let name = crate::kmod::module_name(&rel).unwrap_or_default();
        let params = spec
            .modules
            .iter()
            .find(|m| m.name.replace('-', "_") == name)
            .map(|m| m.params.as_str())
            .unwrap_or("");
        if params.is_empty() {
            list.push_str(&format!("{rel}\n"));
        } else {
            list.push_str(&format!("{rel} {params}\n"));
        }
        files.push((format!("lib/modules/{release}/{rel}"), dir.join(&rel)));
    }
    Ok((list, files))
}

/// Every parent directory of `path` not yet written, outermost first.
fn parents<'a>(path: &'a str, written: &mut Vec<String>) -> Vec<&'a str> {
    let mut out = Vec::new();
    for (i, c) in path.char_indices() {
        if c == '/' {
            let dir = &path[..i];
            if !written.iter().any(|w| w == dir) {
                written.push(dir.to_owned());
                out.push(dir);
            }
        }
    }
    out
}

/// Writes the gzipped archive to `out` (through `out.partial`, renamed when complete, so a
/// failure never leaves a truncated ramdisk under the real name).
pub fn build(spec: &InitramfsSpec, out: &Path) -> anyhow::Result<InitramfsSummary> {
    let (module_list, modules) = plan_modules(spec)?;
    let mut partial = out.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    match write_archive(spec, &module_list, &modules, &partial) {
        Ok(()) => std::fs::rename(&partial, out)
            .with_context(|| format!("renaming {} to {}", partial.display(), out.display()))?,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    }
    let bytes = std::fs::metadata(out)
        .with_context(|| format!("reading the size of {}", out.display()))?
        .len();
    Ok(InitramfsSummary {
        module_count: modules.len(),
        module_list,
        bytes,
    })
}

fn write_archive(
    spec: &InitramfsSpec,
    module_list: &str,
    modules: &[(String, PathBuf)],
    out: &Path,
) -> anyhow::Result<()> {
    let file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let gz = GzEncoder::new(BufWriter::new(file), flate2::Compression::best());
    let mut cpio = CpioWriter::new(gz);
    let mut dirs = Vec::new();
    for dir in ["dev", "proc", "sys", "run", "tmp", "etc", "etc/vmdeploy"] {
        cpio.dir(dir, 0o755)
            .with_context(|| format!("adding {dir}"))?;
        dirs.push(dir.to_owned());
    }
    // Console: the kernel opens it for init's stdio before the agent can mount devtmpfs.
    cpio.char_device("dev/console", 0o600, 5, 1)
        .context("adding dev/console")?;
    let agent = File::open(&spec.agent)
        .with_context(|| format!("opening the agent {}", spec.agent.display()))?;
    let len = agent
        .metadata()
        .with_context(|| format!("reading the size of {}", spec.agent.display()))?
        .len();
    cpio.file_from_reader("init", 0o755, len, agent)
        .context("adding init")?;
    cpio.file(MODULE_LIST, 0o644, module_list.as_bytes())
        .context("adding the module list")?;
    for (archive_path, host_path) in modules {
        for dir in parents(archive_path, &mut dirs) {
            cpio.dir(dir, 0o755)
                .with_context(|| format!("adding {dir}"))?;
        }
        let f =
            File::open(host_path).with_context(|| format!("opening {}", host_path.display()))?;
        let len = f
            .metadata()
            .with_context(|| format!("reading the size of {}", host_path.display()))?
            .len();
        cpio.file_from_reader(archive_path, 0o644, len, f)
            .with_context(|| format!("adding {archive_path}"))?;
    }
    let gz = cpio.finish().context("finishing the archive")?;
    let mut buffered = gz.finish().context("finishing the gzip stream")?;
    buffered.flush().context("flushing the ramdisk")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn ramdisk_holds_init_console_modules_and_the_list() {
        let dir = tempfile::tempdir().expect("tempdir");
        let release = dir.path().join("lib/modules/9.9.9-test");
        std::fs::create_dir_all(release.join("kernel/b")).expect("dirs");
        std::fs::write(
            release.join("modules.dep"),
            "kernel/b/top.ko: kernel/b/low-level.ko\nkernel/b/low-level.ko:\nkernel/b/unused.ko:\n",
        )
        .expect("dep");
        std::fs::write(release.join("kernel/b/top.ko"), b"TOP").expect("ko");
        std::fs::write(release.join("kernel/b/low-level.ko"), b"LOW").expect("ko");
        let agent = dir.path().join("agent");
        std::fs::write(&agent, b"\x7fELF-agent").expect("agent");
        let out = dir.path().join("initrd.cpio.gz");
        let summary = build(
            &InitramfsSpec {
                agent,
                modules_dir: Some(release),
                modules: vec![ModuleRequest::parse("top  opt=1 x=2").expect("req")],
            },
            &out,
        )
        .expect("build");
        assert_eq!(summary.module_count, 2);
        assert_eq!(
            summary.module_list,
            "# written by vmdeploy-image-build initramfs; load order\n\
             kernel/b/low-level.ko\nkernel/b/top.ko opt=1 x=2\n"
        );
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(File::open(&out).expect("open"))
            .read_to_end(&mut raw)
            .expect("gunzip");
        let text = String::from_utf8_lossy(&raw);
        for needle in [
            "dev/console",
            "\x7fELF-agent",
            "lib/modules/9.9.9-test/kernel/b/top.ko\0",
            "TOP",
            "LOW",
            "TRAILER!!!",
        ] {
            assert!(text.contains(needle), "{needle:?} missing");
        }
        assert!(!text.contains("unused"));
    }

    #[test]
    fn missing_modules_dep_says_to_run_depmod() {
        let dir = tempfile::tempdir().expect("tempdir");
        let release = dir.path().join("6.1.0-x");
        std::fs::create_dir_all(&release).expect("dir");
        let err = build(
            &InitramfsSpec {
                agent: dir.path().join("agent"),
                modules_dir: Some(release),
                modules: vec![ModuleRequest::parse("virtio_net").expect("req")],
            },
            &dir.path().join("out"),
        )
        .expect_err("no modules.dep");
        assert!(format!("{err:#}").contains("depmod -b"), "{err:#}");
    }

    #[test]
    fn a_failed_write_leaves_no_ramdisk_behind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("initrd.cpio.gz");
        let err = build(
            &InitramfsSpec {
                agent: dir.path().join("no-such-agent"),
                modules_dir: None,
                modules: Vec::new(),
            },
            &out,
        )
        .expect_err("no agent");
        assert!(format!("{err:#}").contains("no-such-agent"), "{err:#}");
        let left: Vec<_> = std::fs::read_dir(dir.path()).expect("list").collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
