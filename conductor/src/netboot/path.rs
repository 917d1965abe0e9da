//! A requested name to a file under the boot root, or a refusal: what TFTP and HTTP clients
//! ask for is untrusted input.

use std::path::{Component, Path, PathBuf};

/// Why a request names no servable file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// `..`, a NUL, or a link that leads out of the root.
    #[error("{0:?} is outside the boot root")]
    Outside(String),
    /// No such file (or a directory).
    #[error("{0:?} not found")]
    NotFound(String),
}

/// The file `requested` names under `root`: one leading `/` is dropped (PXE ROMs often ask
/// for `/pxelinux.0`), `.` and empty components are skipped, `..` is refused before the file
/// system is asked, and the canonical path, links resolved, must still lie under the
/// canonical root (the MAC links point inside it; any other link is refused).
pub fn confine(root: &Path, requested: &str) -> Result<PathBuf, Refused> {
    let outside = || Refused::Outside(requested.to_string());
    if requested.contains('\0') {
        return Err(outside());
    }
    let mut rel = PathBuf::new();
    for component in Path::new(requested.trim_start_matches('/')).components() {
        match component {
            Component::Normal(part) => rel.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(outside())
            }
        }
    }
    if rel.as_os_str().is_empty() {
        return Err(Refused::NotFound(requested.to_string()));
    }
    let root = root
        .canonicalize()
        .map_err(|_| Refused::NotFound(requested.to_string()))?;
    let path = match root.join(&rel).canonicalize() {
        Ok(path) => path,
        Err(_) => return Err(Refused::NotFound(requested.to_string())),
    };
    if !path.starts_with(&root) {
        return Err(outside());
    }
    if !path.is_file() {
        return Err(Refused::NotFound(requested.to_string()));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_under_the_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("n/sub")).expect("dirs");
        std::fs::write(root.join("n/k"), b"k").expect("file");
        std::fs::write(dir.path().join("secret"), b"s").expect("secret");
        std::os::unix::fs::symlink("../secret", root.join("out")).expect("link out");
        std::os::unix::fs::symlink("n/k", root.join("in")).expect("link in");
        let canon = root.canonicalize().expect("canon");
        assert_eq!(confine(&root, "n/k"), Ok(canon.join("n/k")));
        assert_eq!(confine(&root, "/n/k"), Ok(canon.join("n/k")));
        assert_eq!(confine(&root, "./n//k"), Ok(canon.join("n/k")));
        assert_eq!(confine(&root, "in"), Ok(canon.join("n/k")));
        for bad in [
            "../secret",
            "n/../../secret",
            "out",
            "n/k\0",
            "//etc/passwd/..",
        ] {
            assert!(
                matches!(confine(&root, bad), Err(Refused::Outside(_))),
                "{bad:?}"
            );
        }
        for missing in ["", "/", "n", "n/sub", "nothing", "/etc/passwd"] {
            assert!(
                matches!(confine(&root, missing), Err(Refused::NotFound(_))),
                "{missing:?}"
            );
        }
    }
}
