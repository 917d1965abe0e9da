//! Confining a requested file name to the boot root: one check for TFTP and HTTP.
//!
//! # Design
//! Two checks, one on the name and one on the file system:
//! 1. the name: `\` is read as `/` (Windows-era boot files, e.g. `boot\x86\wdsnbp.com`, are
//!    asked for that way, and no file we serve has a backslash in its name); one leading `/` is
//!    dropped (PXE ROMs and GRUB often ask for `/pxelinux.0`); what is left must be relative and
//!    have no `..` component, even one that would stay inside the root (`//etc/passwd` and
//!    `a/../b` are refused). `.` components and repeated slashes are harmless and skipped.
//! 2. the file system: the joined path is canonicalized (every symlink resolved) and must still
//!    start with the canonical root, so a symlink inside the root may point to another file
//!    inside it but not out of it.
//!
//! # Limitations
//! Between the check and the open, someone who can write to the root could swap a directory for
//! a symlink. The root is the conductor's own directory, written only by the conductor, and the
//! server opens the canonical path with `O_NOFOLLOW` so at least the last component cannot be
//! swapped; `openat2(RESOLVE_BENEATH)` would close the rest of the window.

use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

use vmdeploy_shared::tftp::ErrorCode;

/// Why a requested name is not served; each maps to the TFTP error the client gets.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// Empty, or names the root itself.
    #[error("no file name")]
    Empty,
    /// Absolute after the one leading `/` is dropped, or has a `..` component.
    #[error("the name leaves the root")]
    Escapes,
    /// A symlink resolves outside the root.
    #[error("the file resolves outside the root")]
    OutsideRoot,
    /// Nothing by that name.
    #[error("no such file")]
    NotFound,
    /// The file system refused (permissions), or some other I/O error.
    #[error("resolving the name: {0}")]
    Io(#[source] std::io::Error),
}

impl PathError {
    /// The TFTP error for this refusal.
    pub fn code(&self) -> ErrorCode {
        match self {
            PathError::Empty | PathError::NotFound => ErrorCode::FileNotFound,
            PathError::Escapes | PathError::OutsideRoot => ErrorCode::AccessViolation,
            PathError::Io(err) if err.kind() == ErrorKind::PermissionDenied => {
                ErrorCode::AccessViolation
            }
            PathError::Io(_) => ErrorCode::NotDefined,
        }
    }
}

/// The relative path a requested name stands for (check 1 of the module docs).
pub fn relative_name(requested: &str) -> Result<PathBuf, PathError> {
    let name = requested.replace('\\', "/");
    let name = name.strip_prefix('/').unwrap_or(&name);
    let mut relative = PathBuf::new();
    for component in Path::new(name).components() {
        match component {
            Component::Normal(part) => relative.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(PathError::Escapes)
            }
        }
    }
    if relative.as_os_str().is_empty() {
        return Err(PathError::Empty);
    }
    Ok(relative)
}

/// The canonical path of `requested` under `root` (itself canonical), checked to stay inside it
/// (checks 1 and 2 of the module docs). Blocking: call it from `spawn_blocking`.
pub fn resolve(root: &Path, requested: &str) -> Result<PathBuf, PathError> {
    let relative = relative_name(requested)?;
    let canonical = root.join(relative).canonicalize().map_err(|err| {
        match err.kind() {
            // ENOTDIR: a component in the middle is a file.
            ErrorKind::NotFound | ErrorKind::NotADirectory => PathError::NotFound,
            _ => PathError::Io(err),
        }
    })?;
    if !canonical.starts_with(root) || canonical == root {
        return Err(PathError::OutsideRoot);
    }
    Ok(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_are_made_relative_or_refused() {
        let cases: &[(&str, Option<&str>)] = &[
            ("pxelinux.0", Some("pxelinux.0")),
            ("/pxelinux.0", Some("pxelinux.0")),
            (
                "pxelinux.cfg/01-52-54-00-12-34-56",
                Some("pxelinux.cfg/01-52-54-00-12-34-56"),
            ),
            ("./a//b/./c", Some("a/b/c")),
            ("boot\\x86\\wdsnbp.com", Some("boot/x86/wdsnbp.com")),
            ("\\boot.ipxe", Some("boot.ipxe")),
            ("a/", Some("a")),
            ("//etc/passwd", None),
            ("/../etc/passwd", None),
            ("../etc/passwd", None),
            ("a/../b", None),
            ("a/..", None),
            ("..\\..\\etc\\passwd", None),
            ("", None),
            ("/", None),
            (".", None),
        ];
        for (requested, expected) in cases {
            let got = relative_name(requested).ok();
            assert_eq!(got.as_deref(), expected.map(Path::new), "{requested:?}");
        }
    }

    #[test]
    fn resolve_stays_inside_the_root() {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub")).expect("mkdir");
        std::fs::write(root.join("sub/file"), b"x").expect("write");
        std::fs::write(dir.path().join("secret"), b"s").expect("write");
        std::os::unix::fs::symlink("sub/file", root.join("inside")).expect("symlink");
        std::os::unix::fs::symlink("../secret", root.join("outside")).expect("symlink");
        std::os::unix::fs::symlink("/etc", root.join("etc-link")).expect("symlink");
        std::os::unix::fs::symlink(".", root.join("self")).expect("symlink");
        let root = root.canonicalize().expect("canonical root");

        let ok = |name: &str| resolve(&root, name).expect(name);
        assert_eq!(ok("sub/file"), root.join("sub/file"));
        assert_eq!(ok("/inside"), root.join("sub/file"));
        assert_eq!(ok("self/sub/file"), root.join("sub/file"));

        let code = |name: &str| resolve(&root, name).expect_err(name).code();
        assert_eq!(code("outside"), ErrorCode::AccessViolation);
        assert_eq!(code("etc-link/passwd"), ErrorCode::AccessViolation);
        assert_eq!(code("../secret"), ErrorCode::AccessViolation);
        assert_eq!(code("//etc/passwd"), ErrorCode::AccessViolation);
        // `/etc/passwd` is `etc/passwd` under the root, which does not exist there.
        assert_eq!(code("/etc/passwd"), ErrorCode::FileNotFound);
        assert_eq!(code("missing"), ErrorCode::FileNotFound);
        assert_eq!(code("sub/file/below"), ErrorCode::FileNotFound);
        assert_eq!(code("self"), ErrorCode::AccessViolation);
        assert_eq!(code(""), ErrorCode::FileNotFound);
    }

    proptest! {
        /// Names built from the pieces attacks are made of never resolve outside the root (and
        /// never panic), whatever the order.
        #[test]
        fn no_name_resolves_outside_the_root(parts in prop::collection::vec(prop_oneof![
            Just(".."), Just("."), Just(""), Just("/"), Just("\\"), Just("sub"), Just("file"),
            Just("up"), Just("abs"), Just("loop"), Just("%2e%2e"), Just("..."),
        ], 0..8), seps in prop::collection::vec(prop_oneof![Just("/"), Just("\\"), Just("//")], 8)) {
            let dir = tempfile::tempdir().expect("temp dir");
            let root = dir.path().join("root");
            std::fs::create_dir_all(root.join("sub")).expect("mkdir");
            std::fs::write(root.join("sub/file"), b"x").expect("write");
            std::fs::write(dir.path().join("file"), b"outside").expect("write");
            std::os::unix::fs::symlink("..", root.join("up")).expect("symlink");
            std::os::unix::fs::symlink(dir.path(), root.join("abs")).expect("symlink");
            std::os::unix::fs::symlink("loop", root.join("loop")).expect("symlink");
            let root = root.canonicalize().expect("canonical root");
            let mut name = String::new();
            for (part, sep) in parts.iter().zip(seps.iter().cycle()) {
                name.push_str(part);
                name.push_str(sep);
            }
            name.pop();
            if let Ok(path) = resolve(&root, &name) {
                prop_assert!(path.starts_with(&root) && path != root, "{name:?} -> {path:?}");
            }
        }
    }
}
