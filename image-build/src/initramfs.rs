//! The deploy ramdisk: a cpio "newc" archive with the agent as `/init`, the kernel modules it
//! needs and the list the agent loads them from; gzipped for the `initramfs` subcommand
//! ([`build`]), two xz-compressed archives for the deploy ISO ([`xz_ramdisk`],
//! `crate::deploy_iso`).
//!
//! # Layout
//! ```text
//! dev/ dev/console (c 5 1)      the kernel opens /dev/console for init's stdio before devtmpfs
//! proc/ sys/ run/ tmp/          mount points (the agent creates missing ones too)
//! init                          the agent, 0755
//! usr/lib/vmdeploy/grub-x86_64.efi  GRUB for partition images' UEFI local boot (deploy ISO
//!                               ramdisks; vmdeploy_shared::partition::local_boot), 0644
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
use vmdeploy_shared::partition::local_boot;

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
    /// The GRUB EFI binary `image.install_bootloader` puts in a partition image's ESP
    /// ([`crate::loaders::build_local_boot_grub`]), stored at
    /// `vmdeploy_shared::partition::local_boot::GRUB_EFI_INITRAMFS_PATH`; `None` leaves it out
    /// (the agent then refuses UEFI local boot of partition images).
    pub local_boot_grub: Option<Vec<u8>>,
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

/// The modules chosen for a ramdisk, in load order.
#[derive(Debug, Clone)]
pub struct ModulePlan {
    /// The module list text, as written to [`MODULE_LIST`].
    pub list: String,
    /// (archive path, host path) of each module, in load order.
    pub files: Vec<(String, PathBuf)>,
}

impl ModulePlan {
    /// The modules' total size on the host.
    pub fn bytes(&self) -> anyhow::Result<u64> {
        let mut total = 0;
        for (_, host) in &self.files {
            total += std::fs::metadata(host)
                .with_context(|| format!("reading the size of {}", host.display()))?
                .len();
        }
        Ok(total)
    }
}

/// The module list and files for `spec`: the modules asked for and their dependencies from
/// `modules.dep`, each after what it needs.
pub fn plan_modules(spec: &InitramfsSpec) -> anyhow::Result<ModulePlan> {
    let mut list = String::from("# written by vmdeploy-image-build initramfs; load order\n");
    let Some(dir) = &spec.modules_dir else {
        anyhow::ensure!(
            spec.modules.is_empty(),
            "modules were asked for but no --modules-dir given"
        );
        return Ok(ModulePlan {
            list,
            files: Vec::new(),
        });
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
    Ok(ModulePlan { list, files })
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
    let plan = plan_modules(spec)?;
    write_via_partial(out, |file| {
        let gz = GzEncoder::new(BufWriter::new(file), flate2::Compression::best());
        let gz = write_cpio(gz, spec, &plan)?;
        let mut buffered = gz.finish().context("finishing the gzip stream")?;
        buffered.flush().context("flushing the ramdisk")?;
        Ok(())
    })?;
    let bytes = std::fs::metadata(out)
        .with_context(|| format!("reading the size of {}", out.display()))?
        .len();
    Ok(InitramfsSummary {
        module_count: plan.files.len(),
        module_list: plan.list,
        bytes,
    })
}

/// Creates `out.partial`, lets `write` fill it and renames it to `out`; on any failure the
/// partial file is removed, so `out` is either complete or untouched.
pub fn write_via_partial(
    out: &Path,
    write: impl FnOnce(File) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut partial = out.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let result = File::create(&partial)
        .with_context(|| format!("creating {}", partial.display()))
        .and_then(write)
        .and_then(|()| {
            std::fs::rename(&partial, out)
                .with_context(|| format!("renaming {} to {}", partial.display(), out.display()))
        });
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

/// Writes the uncompressed archive (layout in the module docs) to `out` and returns it.
pub fn write_cpio<W: Write>(out: W, spec: &InitramfsSpec, plan: &ModulePlan) -> anyhow::Result<W> {
    let mut cpio = CpioWriter::new(out);
    let mut dirs = Vec::new();
    add_base(&mut cpio, spec, &mut dirs)?;
    add_modules(&mut cpio, plan, &mut dirs)?;
    cpio.finish().context("finishing the archive")
}

/// The ramdisk as two concatenated xz-compressed archives, which the kernel unpacks one after
/// the other (Documentation/driver-api/early-userspace/buffer-format.rst): the agent with the
/// x86 BCJ filter, which shrinks it by ~6%, and the modules without, because BCJ makes
/// relocatable objects larger. Returns the compressed ramdisk and its uncompressed size.
pub fn xz_ramdisk(spec: &InitramfsSpec, plan: &ModulePlan) -> anyhow::Result<(Vec<u8>, u64)> {
    let mut dirs = Vec::new();
    let mut base = CpioWriter::new(Vec::new());
    add_base(&mut base, spec, &mut dirs)?;
    let base = base.finish().context("finishing the agent's archive")?;
    let mut modules = CpioWriter::new(Vec::new());
    add_modules(&mut modules, plan, &mut dirs)?;
    let modules = modules.finish().context("finishing the modules' archive")?;
    let mut ramdisk = compress_xz(&base, true).context("compressing the agent's archive")?;
    ramdisk.extend(compress_xz(&modules, false).context("compressing the modules' archive")?);
    Ok((ramdisk, (base.len() + modules.len()) as u64))
}

/// The mount points, /dev/console and the agent as /init.
fn add_base<W: Write>(
    cpio: &mut CpioWriter<W>,
    spec: &InitramfsSpec,
    dirs: &mut Vec<String>,
) -> anyhow::Result<()> {
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
    if let Some(grub) = &spec.local_boot_grub {
        let path = local_boot::GRUB_EFI_INITRAMFS_PATH.trim_start_matches('/');
        for dir in parents(path, dirs) {
            cpio.dir(dir, 0o755)
                .with_context(|| format!("adding {dir}"))?;
        }
        cpio.file(path, 0o644, grub)
            .with_context(|| format!("adding {path}"))?;
    }
    Ok(())
}

/// The module list and the modules, with the directories not in `dirs` yet.
fn add_modules<W: Write>(
    cpio: &mut CpioWriter<W>,
    plan: &ModulePlan,
    dirs: &mut Vec<String>,
) -> anyhow::Result<()> {
    for dir in parents(MODULE_LIST, dirs) {
        cpio.dir(dir, 0o755)
            .with_context(|| format!("adding {dir}"))?;
    }
    cpio.file(MODULE_LIST, 0o644, plan.list.as_bytes())
        .context("adding the module list")?;
    for (archive_path, host_path) in &plan.files {
        for dir in parents(archive_path, dirs) {
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
    Ok(())
}

/// The largest LZMA2 dictionary used: the kernel's decoder allocates the whole dictionary the
/// stream header names (lib/xz, XZ_DYNALLOC), and the agent must boot in 256 MiB.
const MAX_XZ_DICT: u32 = 32 << 20;

/// LZMA's longest match (xz's `nice=273`).
const XZ_NICE_LEN_MAX: u32 = 273;
/// The match-finder depth of xz's extreme presets.
const XZ_EXTREME_DEPTH: i32 = 512;

/// Compresses one file of the driver pack for the agent's xz decoder: CRC32 (as
/// [`compress_xz`]), LZMA2 preset 6, whose 8 MiB dictionary covers the largest module. Preset 6
/// is about three times as fast as `-9e` and a few percent larger; the pack is ~80 MB raw.
pub fn compress_xz_fast(data: &[u8]) -> anyhow::Result<Vec<u8>> {
    use lzma_rust2::{CheckType, XzOptions, XzWriter};
    let mut options = XzOptions::with_preset(6);
    options.set_check_sum_type(CheckType::Crc32);
    let mut writer = XzWriter::new(Vec::new(), options).context("starting the xz stream")?;
    writer.write_all(data).context("compressing")?;
    writer.finish().context("finishing the xz stream")
}

/// Compresses for the kernel's xz decoder: CRC32 check (the decoder has no CRC64 support;
/// Documentation/staging/xz.rst asks for `--check=crc32`), optionally the x86 BCJ filter (for
/// executables; CONFIG_XZ_DEC_X86=y in Debian's kernel), LZMA2 preset 9 with the dictionary no
/// larger than the input needs, in its extreme variant (`-9e`).
pub fn compress_xz(data: &[u8], x86_bcj: bool) -> anyhow::Result<Vec<u8>> {
    use lzma_rust2::{CheckType, FilterType, XzOptions, XzWriter};
    let mut options = XzOptions::with_preset(9);
    options.set_check_sum_type(CheckType::Crc32);
    if x86_bcj {
        options.prepend_pre_filter(FilterType::BcjX86, 0);
    }
    let needed = u32::try_from(data.len())
        .unwrap_or(u32::MAX)
        .max(1 << 20)
        .checked_next_power_of_two()
        .unwrap_or(MAX_XZ_DICT);
    options.lzma_options.dict_size = needed.min(MAX_XZ_DICT).min(options.lzma_options.dict_size);
    // xz's "extreme" variant of preset 9 (`xz -9e`): the longest match length and a deeper
    // match-finder search. Slower to compress (once, at build time), about 1 % smaller, and
    // the decoder's work is the same: the ISO budget is what counts.
    options.lzma_options.nice_len = XZ_NICE_LEN_MAX;
    options.lzma_options.depth_limit = XZ_EXTREME_DEPTH;
    let mut xz = XzWriter::new(Vec::new(), options).context("starting the xz encoder")?;
    xz.write_all(data).context("compressing the ramdisk")?;
    xz.finish().context("finishing the xz stream")
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
                local_boot_grub: None,
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
    fn xz_ramdisk_is_two_crc32_streams_agent_then_modules() {
        let dir = tempfile::tempdir().expect("tempdir");
        let release = dir.path().join("lib/modules/9.9.9-test");
        std::fs::create_dir_all(release.join("kernel/b")).expect("dirs");
        std::fs::write(release.join("modules.dep"), "kernel/b/top.ko:\n").expect("dep");
        std::fs::write(release.join("kernel/b/top.ko"), b"TOP-MODULE").expect("ko");
        let agent = dir.path().join("agent");
        std::fs::write(&agent, b"\x7fELF-agent").expect("agent");
        let spec = InitramfsSpec {
            agent,
            modules_dir: Some(release),
            modules: vec![ModuleRequest::parse("top").expect("req")],
            local_boot_grub: Some(b"MZ local-boot GRUB".to_vec()),
        };
        let plan = plan_modules(&spec).expect("plan");
        let (xz, raw_len) = xz_ramdisk(&spec, &plan).expect("ramdisk");
        let mut raw = Vec::new();
        lzma_rust2::XzReader::new(&xz[..], true)
            .read_to_end(&mut raw)
            .expect("unxz");
        assert_eq!(raw.len() as u64, raw_len);
        let text = String::from_utf8_lossy(&raw);
        // Two archives, each with its trailer; the agent in the first, the modules in the second.
        assert_eq!(text.matches("TRAILER!!!").count(), 2);
        let first_trailer = text.find("TRAILER!!!").expect("trailer");
        assert!(text.find("\x7fELF-agent").expect("agent") < first_trailer);
        // The local-boot GRUB is in the agent's archive, at the path the agent reads.
        let grub = text
            .find("usr/lib/vmdeploy/grub-x86_64.efi\0")
            .expect("GRUB entry");
        assert!(grub < first_trailer);
        assert!(text.contains("MZ local-boot GRUB"));
        assert!(text.find("TOP-MODULE").expect("module") > first_trailer);
        assert!(text.contains("etc/vmdeploy/modules\0"));
        // Both streams carry a CRC32 check (stream flags byte 7), which the kernel supports.
        let second = xz[6..]
            .windows(6)
            .position(|w| w == b"\xfd7zXZ\0")
            .map(|p| p + 6)
            .expect("a second stream");
        assert_eq!((xz[7], xz[second + 7]), (0x01, 0x01));
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
                local_boot_grub: None,
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
                local_boot_grub: None,
            },
            &out,
        )
        .expect_err("no agent");
        assert!(format!("{err:#}").contains("no-such-agent"), "{err:#}");
        let left: Vec<_> = std::fs::read_dir(dir.path()).expect("list").collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
