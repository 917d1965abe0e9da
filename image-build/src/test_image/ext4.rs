//! ext4 file systems in image files, reproducibly: `mkfs.ext4 -d` from a staged tree, then
//! debugfs to fix the inode change times.
//!
//! # Why debugfs afterwards
//! mke2fs takes its own times from `E2FSPROGS_FAKE_TIME`, and each file's access and modification
//! times from the staged file, which we set; but it copies the change time (`st_ctime`) too, and
//! nothing can set that on the host. `debugfs -w` rewrites it (`set_inode_field PATH ctime`) for
//! every staged path (checksums included), so two builds give the same bytes
//! (e2fsprogs 1.47.0).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context as _;

/// What a staged file holds.
pub enum Source<'a> {
    /// A copy of a host file.
    File(&'a Path),
    /// These bytes.
    Bytes(&'a [u8]),
}

/// Writes `files` (relative paths) under `root`, every file and directory with mode 0644/0755
/// and `epoch` as its times.
pub fn stage(root: &Path, files: &[(&str, Source<'_>)], epoch: u64) -> anyhow::Result<()> {
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    for (rel, source) in files {
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        match source {
            Source::File(from) => {
                std::fs::copy(from, &path)
                    .with_context(|| format!("copying {} to {}", from.display(), path.display()))?;
            }
            Source::Bytes(bytes) => {
                std::fs::write(&path, bytes)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
    }
    // Modes and times last, directories after their contents (a new entry changes a
    // directory's mtime).
    let mut all = staged_paths(root)?;
    all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for rel in all.iter().chain(std::iter::once(&PathBuf::new())) {
        let path = root.join(rel);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = if path.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("setting the mode of {}", path.display()))?;
        let time = UNIX_EPOCH + Duration::from_secs(epoch);
        std::fs::File::open(&path)
            .and_then(|f| {
                f.set_times(
                    std::fs::FileTimes::new()
                        .set_accessed(time)
                        .set_modified(time),
                )
            })
            .with_context(|| format!("setting the times of {}", path.display()))?;
    }
    Ok(())
}

/// Every path under `root`, relative, in a fixed order.
fn staged_paths(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let dir = root.join(&rel);
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .with_context(|| format!("listing {}", dir.display()))?;
        entries.sort();
        for name in entries {
            let child = rel.join(name);
            if root.join(&child).is_dir() {
                todo.push(child.clone());
            }
            out.push(child);
        }
    }
    out.sort();
    Ok(out)
}

/// Makes an ext4 file system of `bytes` in the (new, sparse) file `image` with the files of
/// `tree`, UUID `uuid` (also the directory hash seed) and label `label`.
pub fn make(
    image: &Path,
    bytes: u64,
    uuid: &str,
    label: &str,
    tree: &Path,
    epoch: u64,
) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(image);
    let epoch_s = epoch.to_string();
    // Block size, inode size and ratio given, so the host's mke2fs.conf changes less.
    crate::tool::run(
        Command::new("mkfs.ext4")
            .env("E2FSPROGS_FAKE_TIME", &epoch_s)
            .env("SOURCE_DATE_EPOCH", &epoch_s)
            .args([
                "-q", "-F", "-t", "ext4", "-b", "4096", "-I", "256", "-i", "16384",
            ])
            .args(["-L", label, "-U", uuid, "-E"])
            .arg(format!("hash_seed={uuid},root_owner=0:0"))
            .arg("-d")
            .arg(tree)
            .arg(image)
            .arg(format!("{}k", bytes / 1024)),
        "apt-get install e2fsprogs",
    )
    .with_context(|| format!("running mkfs.ext4 on {}", image.display()))?;

    let mut script = String::new();
    for rel in staged_paths(tree)?
        .iter()
        .map(|p| format!("/{}", p.display()))
        .chain(["/".to_owned(), "/lost+found".to_owned()])
    {
        script.push_str(&format!("set_inode_field {rel} ctime @{epoch}\n"));
    }
    let script_path = tree.with_extension("debugfs");
    std::fs::write(&script_path, script)
        .with_context(|| format!("writing {}", script_path.display()))?;
    // debugfs -f goes on after a failed command and exits 0: its stderr tells (beyond the
    // version banner).
    let out = Command::new("debugfs")
        .env("E2FSPROGS_FAKE_TIME", &epoch_s)
        .arg("-w")
        .arg("-f")
        .arg(&script_path)
        .arg(image)
        .output()
        .context("running debugfs (apt-get install e2fsprogs)")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let complaints: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("debugfs "))
        .collect();
    anyhow::ensure!(
        out.status.success() && complaints.is_empty(),
        "debugfs could not fix the inode times of {} ({}): {}",
        image.display(),
        out.status,
        complaints.join("; ")
    );
    Ok(())
}
