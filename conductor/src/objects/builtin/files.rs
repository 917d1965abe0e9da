//! The built-in store's on-disk layout.
//!
//! ```text
//! <root>/.tmp/<uuid>                    uploads in progress (cleared at start)
//! <root>/<container>/<object>.data      the bytes
//! <root>/<container>/<object>.json      the sidecar: names, size, ETag, metadata, delete-at
//! ```
//! Container and object names are percent-encoded into single file names ([`encode_name`]):
//! only `[A-Za-z0-9_.-]` stay as they are, a leading `.` is escaped, so no name can climb out
//! of the root, hide as a dot file or collide with `.tmp`; an object's `/` becomes `%2F`.
//!
//! # Design
//! A put writes the data and the sidecar to `.tmp`, syncs the data, then renames the data into
//! place and the sidecar after it: the sidecar is the commit record, a reader that finds one
//! finds its data. A delete removes the sidecar first, so a reader sees the object vanish
//! whole. A metadata change ([`Files::replace_metadata`]) writes a new sidecar to `.tmp` and
//! renames it over the old one: a reader sees the old set or the new, never half of one. The
//! renames that commit a put, the removals of a delete and the read-modify-rename of a
//! metadata change take one lock, so a metadata change cannot pair an old sidecar with the
//! bytes of a put that landed meanwhile, nor bring back an object deleted meanwhile. At start,
//! [`Files::scan`] deletes what a crash left half done (data without a
//! sidecar, a sidecar without data or whose size disagrees).
//!
//! Every directory is made 0700 and every file 0600, whatever the umask and however the root
//! came to exist: floppies carry the agent token, the deploy key and the CHAP secret, and
//! systemd's `StateDirectory=` makes the directory above 0755.
//!
//! # Limitations
//! An encoded name longer than 240 bytes is refused (file systems stop at 255). A GET that
//! races a put of the same object may pair the new sidecar with the old bytes; the body is
//! always one version, whole, because an open file keeps its inode across the rename.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};

use crate::objects::{ObjectError, ObjectPath};
use vmdeploy_shared::error::Chain;

/// Longest encoded name kept as one file name (ext4 and XFS stop at 255 bytes; the suffix
/// needs 5).
const MAX_ENCODED_NAME: usize = 240;
/// Copy buffer of a put: large enough that an ISO is not copied in tiny writes.
const COPY_BUFFER: usize = 256 * 1024;
/// The directory of uploads in progress.
const TMP_DIR: &str = ".tmp";

/// What the store knows about an object beside its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sidecar {
    /// Container name, as given.
    pub container: String,
    /// Object name, as given.
    pub object: String,
    /// Size of the data in bytes.
    pub size: u64,
    /// SHA-256 of the data, lower-case hex (served as the ETag).
    pub sha256: String,
    /// Metadata, keys in lower case.
    pub metadata: BTreeMap<String, String>,
    /// When the object is deleted, Unix milliseconds.
    pub delete_at_ms: Option<u64>,
    /// When the put finished, Unix seconds (served as Last-Modified).
    pub modified: u64,
}

impl Sidecar {
    /// The object this sidecar describes.
    pub fn path(&self) -> ObjectPath {
        ObjectPath::new(self.container.clone(), self.object.clone())
    }

    /// Whether the object is past its deletion time at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.delete_at_ms.is_some_and(|at| at <= now_ms)
    }
}

/// `name` as one safe file name: `[A-Za-z0-9_.-]` kept (a leading `.` escaped), every other
/// byte `%XX`.
pub fn encode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for (i, b) in name.bytes().enumerate() {
        let keep = b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (b == b'.' && i > 0);
        if keep {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The objects of one store under its root directory.
#[derive(Debug, Clone)]
pub struct Files {
    root: PathBuf,
    /// Held while a sidecar is renamed into place or removed (see the module documentation).
    commit: Arc<tokio::sync::Mutex<()>>,
}

impl Files {
    /// Opens (creating) the root and clears uploads a previous run left in `.tmp`.
    pub async fn open(root: &Path) -> io::Result<Files> {
        let tmp = root.join(TMP_DIR);
        match tokio::fs::remove_dir_all(&tmp).await {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        make_private_dir(root).await?;
        make_private_dir(&tmp).await?;
        Ok(Files {
            root: root.to_path_buf(),
            commit: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `(data file, sidecar)` of `path`, after checking the names.
    pub fn locate(&self, path: &ObjectPath) -> Result<(PathBuf, PathBuf), ObjectError> {
        path.validate()?;
        let container = encode_name(&path.container);
        let object = encode_name(&path.object);
        if container.len() > MAX_ENCODED_NAME || object.len() > MAX_ENCODED_NAME {
            return Err(ObjectError::Other(format!(
                "invalid object name {path}: longer than the built-in store keeps \
                 ({MAX_ENCODED_NAME} bytes once encoded)"
            )));
        }
        let dir = self.root.join(container);
        Ok((
            dir.join(format!("{object}.data")),
            dir.join(format!("{object}.json")),
        ))
    }

    /// Stores the bytes `body` yields at `path`, replacing any object there; returns the
    /// sidecar written. `sidecar.size` and `sha256` are filled in here.
    pub async fn write(
        &self,
        path: &ObjectPath,
        body: &mut (dyn AsyncRead + Unpin + Send),
        mut sidecar: Sidecar,
    ) -> Result<Sidecar, ObjectError> {
        let (data_path, sidecar_path) = self.locate(path)?;
        let tmp_dir = self.root.join(TMP_DIR);
        let stem = uuid::Uuid::new_v4().simple().to_string();
        let tmp_data = tmp_dir.join(format!("{stem}.data"));
        let tmp_sidecar = tmp_dir.join(format!("{stem}.json"));
        let result = async {
            let mut file = create_private(&tmp_data).await?;
            let mut hasher = sha2::Sha256::new();
            let mut size = 0u64;
            let mut buf = vec![0u8; COPY_BUFFER];
            loop {
                let n = body.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                let chunk = &buf[..n];
                hasher.update(chunk);
                file.write_all(chunk).await?;
                size += n as u64;
            }
            // The sidecar claims these bytes once renamed: they must be on disk first.
            file.sync_all().await?;
            drop(file);
            sidecar.size = size;
            sidecar.sha256 = hex::encode(hasher.finalize());
            let json = serde_json::to_vec_pretty(&sidecar).map_err(io::Error::other)?;
            let mut file = create_private(&tmp_sidecar).await?;
            file.write_all(&json).await?;
            drop(file);
            if let Some(dir) = data_path.parent() {
                make_private_dir(dir).await?;
            }
            let _commit = self.commit.lock().await;
            tokio::fs::rename(&tmp_data, &data_path).await?;
            tokio::fs::rename(&tmp_sidecar, &sidecar_path).await?;
            Ok::<_, io::Error>(())
        }
        .await;
        if let Err(e) = result {
            let _ = tokio::fs::remove_file(&tmp_data).await;
            let _ = tokio::fs::remove_file(&tmp_sidecar).await;
            return Err(ObjectError::Io(io::Error::new(
                e.kind(),
                format!("storing {path} under {}: {e}", self.root.display()),
            )));
        }
        Ok(sidecar)
    }

    /// The sidecar of `path`, `None` when there is no such object.
    pub async fn sidecar(&self, path: &ObjectPath) -> Result<Option<Sidecar>, ObjectError> {
        let (_, sidecar_path) = self.locate(path)?;
        read_sidecar(&sidecar_path).await.map_err(|e| {
            ObjectError::Io(io::Error::new(
                e.kind(),
                format!("reading {}: {e}", sidecar_path.display()),
            ))
        })
    }

    /// The data file of `path` (which may not exist).
    pub fn data_path(&self, path: &ObjectPath) -> Result<PathBuf, ObjectError> {
        Ok(self.locate(path)?.0)
    }

    /// Deletes `path`; `false` when it was not there.
    pub async fn remove(&self, path: &ObjectPath) -> Result<bool, ObjectError> {
        let (data_path, sidecar_path) = self.locate(path)?;
        let _commit = self.commit.lock().await;
        let had_sidecar = remove_if_present(&sidecar_path).await?;
        let had_data = remove_if_present(&data_path).await?;
        // The container's directory stays, empty or not, as Swift keeps empty containers:
        // removing it could pull it from under a put into the same container.
        Ok(had_sidecar && had_data)
    }

    /// Replaces the metadata in the sidecar of `path`, when `live` says the object is there
    /// (not past its deadline); returns the new sidecar, `None` when there is no live object.
    /// The data file is not touched.
    pub async fn replace_metadata(
        &self,
        path: &ObjectPath,
        metadata: BTreeMap<String, String>,
        live: impl Fn(&Sidecar) -> bool + Send,
    ) -> Result<Option<Sidecar>, ObjectError> {
        let (_, sidecar_path) = self.locate(path)?;
        let tmp_sidecar = self
            .root
            .join(TMP_DIR)
            .join(format!("{}.json", uuid::Uuid::new_v4().simple()));
        let _commit = self.commit.lock().await;
        let result = async {
            let Some(mut sidecar) = read_sidecar(&sidecar_path).await? else {
                return Ok(None);
            };
            if !live(&sidecar) {
                return Ok(None);
            }
            sidecar.metadata = metadata;
            let json = serde_json::to_vec_pretty(&sidecar).map_err(io::Error::other)?;
            let mut file = create_private(&tmp_sidecar).await?;
            file.write_all(&json).await?;
            // The rename replaces the only copy of the object's metadata: the new one must be
            // on disk before it does.
            file.sync_all().await?;
            drop(file);
            tokio::fs::rename(&tmp_sidecar, &sidecar_path).await?;
            Ok::<_, io::Error>(Some(sidecar))
        }
        .await;
        match result {
            Ok(sidecar) => Ok(sidecar),
            Err(e) => {
                // Best effort: `.tmp` is cleared at the next start anyway.
                let _ = tokio::fs::remove_file(&tmp_sidecar).await;
                Err(ObjectError::Io(io::Error::new(
                    e.kind(),
                    format!(
                        "replacing the metadata of {path} under {}: {e}",
                        self.root.display()
                    ),
                )))
            }
        }
    }

    /// Every complete object under the root; deletes the remains of interrupted puts and
    /// deletes (data without sidecar, sidecar without data, sizes that disagree, unreadable
    /// sidecars).
    pub async fn scan(&self) -> io::Result<Vec<Sidecar>> {
        let mut found = Vec::new();
        let mut containers = tokio::fs::read_dir(&self.root).await?;
        while let Some(container) = containers.next_entry().await? {
            if container.file_name() == TMP_DIR || !container.file_type().await?.is_dir() {
                continue;
            }
            let mut entries = tokio::fs::read_dir(container.path()).await?;
            let mut names = Vec::new();
            while let Some(entry) = entries.next_entry().await? {
                names.push(entry.path());
            }
            for file in &names {
                let is_sidecar = file.extension().is_some_and(|e| e == "json");
                let is_data = file.extension().is_some_and(|e| e == "data");
                if is_data && !names.contains(&file.with_extension("json")) {
                    tracing::warn!(file = %file.display(), "removing object data without a sidecar (interrupted put)");
                    remove_if_present(file).await?;
                    continue;
                }
                if !is_sidecar {
                    continue;
                }
                let data = file.with_extension("data");
                let sidecar = match read_sidecar(file).await {
                    Ok(Some(s)) => Some(s),
                    Ok(None) => None,
                    Err(e) => {
                        tracing::warn!(file = %file.display(), error = %Chain(&e), "unreadable sidecar");
                        None
                    }
                };
                let data_len = match tokio::fs::metadata(&data).await {
                    Ok(m) => Some(m.len()),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                    Err(e) => return Err(e),
                };
                match (sidecar, data_len) {
                    (Some(s), Some(len)) if s.size == len => found.push(s),
                    _ => {
                        tracing::warn!(file = %file.display(), "removing an incomplete object");
                        remove_if_present(file).await?;
                        remove_if_present(&data).await?;
                    }
                }
            }
        }
        Ok(found)
    }
}

async fn read_sidecar(path: &Path) -> io::Result<Option<Sidecar>> {
    let bytes = match tokio::fs::read(path).await {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Creates (truncating) `path` as a file only its owner can read: 0600 whatever the umask.
async fn create_private(path: &Path) -> io::Result<tokio::fs::File> {
    tokio::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .await
}

/// Creates `dir` (and its parents) and makes it 0700, also when it was there already with a
/// looser mode.
async fn make_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    tokio::fs::create_dir_all(dir).await?;
    let mode = tokio::fs::metadata(dir).await?.permissions().mode() & 0o777;
    if mode != 0o700 {
        tokio::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).await?;
    }
    Ok(())
}

async fn remove_if_present(path: &Path) -> Result<bool, io::Error> {
    match tokio::fs::remove_file(path).await {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sidecar_for(path: &ObjectPath) -> Sidecar {
        Sidecar {
            container: path.container.clone(),
            object: path.object.clone(),
            size: 0,
            sha256: String::new(),
            metadata: BTreeMap::from([("usage-count".to_string(), "2".to_string())]),
            delete_at_ms: Some(1_764_500_000_123),
            modified: 1_764_499_000,
        }
    }

    #[test]
    fn encoded_names_stay_inside_one_directory() {
        let cases = [
            ("image-1.img", "image-1.img"),
            ("..", "%2E."),
            (".", "%2E"),
            (".tmp", "%2Etmp"),
            ("a/../../etc/passwd", "a%2F..%2F..%2Fetc%2Fpasswd"),
            ("sp ace", "sp%20ace"),
            ("é", "%C3%A9"),
            ("100%", "100%25"),
        ];
        for (name, encoded) in cases {
            assert_eq!(encode_name(name), encoded, "{name}");
            assert!(!encode_name(name).contains('/'));
            assert!(!encode_name(name).starts_with('.'));
        }
    }

    /// A floppy holds the agent token: whatever the umask and however loose the directories
    /// found at start, no other user can list or read what the store keeps.
    #[tokio::test]
    async fn objects_are_private_in_a_root_found_loose() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("objects");
        std::fs::create_dir(&root).expect("root");
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let container = root.join(encode_name("vmdeploy"));
        std::fs::create_dir(&container).expect("container");
        std::fs::set_permissions(&container, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let files = Files::open(&root).await.expect("opens");
        let path = ObjectPath::new("vmdeploy", "floppy-n1.img");
        files
            .write(&path, &mut b"agent token".as_slice(), sidecar_for(&path))
            .await
            .expect("stored");
        files
            .replace_metadata(&path, BTreeMap::new(), |_| true)
            .await
            .expect("replaced")
            .expect("live");
        let (data, sidecar) = files.locate(&path).expect("named");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        for d in [root.clone(), root.join(TMP_DIR), container] {
            assert_eq!(mode(&d), 0o700, "{}", d.display());
        }
        for f in [data, sidecar] {
            assert_eq!(mode(&f), 0o600, "{}", f.display());
        }
    }

    #[tokio::test]
    async fn sidecar_round_trip_and_delete() {
        let dir = tempfile::tempdir().expect("temp dir");
        let files = Files::open(dir.path()).await.expect("opens");
        let path = ObjectPath::new("vmdeploy", "dir/image-1");
        let body = b"hello floppy".to_vec();
        let written = files
            .write(&path, &mut body.as_slice(), sidecar_for(&path))
            .await
            .expect("writes");
        assert_eq!(written.size, 12);
        assert_eq!(
            written.sha256,
            hex::encode(sha2::Sha256::digest(b"hello floppy"))
        );
        let read = files.sidecar(&path).await.expect("reads").expect("present");
        assert_eq!(read, written);
        assert_eq!(read.path(), path);
        let data = files.data_path(&path).expect("valid");
        assert!(data.starts_with(dir.path().join("vmdeploy")));
        assert_eq!(std::fs::read(&data).expect("data"), body);
        // Nothing left in .tmp.
        assert_eq!(
            std::fs::read_dir(dir.path().join(TMP_DIR))
                .expect("tmp")
                .count(),
            0
        );
        assert!(files.remove(&path).await.expect("deletes"));
        assert!(!files.remove(&path).await.expect("second delete"));
        assert_eq!(files.sidecar(&path).await.expect("reads"), None);
    }

    #[tokio::test]
    async fn scan_keeps_complete_objects_and_removes_remains() {
        let dir = tempfile::tempdir().expect("temp dir");
        let files = Files::open(dir.path()).await.expect("opens");
        let keep = ObjectPath::new("c", "keep");
        let written = files
            .write(&keep, &mut &b"0123"[..], sidecar_for(&keep))
            .await
            .expect("writes");
        let cdir = dir.path().join("c");
        std::fs::write(cdir.join("orphan.data"), b"x").expect("orphan data");
        std::fs::write(cdir.join("lonely.json"), b"{}").expect("lonely sidecar");
        let short = ObjectPath::new("c", "short");
        files
            .write(&short, &mut &b"abcdef"[..], sidecar_for(&short))
            .await
            .expect("writes");
        std::fs::write(cdir.join("short.data"), b"abc").expect("truncating");
        std::fs::write(dir.path().join(TMP_DIR).join("x.data"), b"partial").expect("tmp");

        let files = Files::open(dir.path()).await.expect("reopens");
        let found = files.scan().await.expect("scans");
        assert_eq!(found, vec![written]);
        let mut left: Vec<String> = std::fs::read_dir(&cdir)
            .expect("container")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, vec!["keep.data", "keep.json"]);
        assert_eq!(
            std::fs::read_dir(dir.path().join(TMP_DIR))
                .expect("tmp")
                .count(),
            0
        );
    }

    #[tokio::test]
    async fn bad_names_never_touch_the_disk() {
        let dir = tempfile::tempdir().expect("temp dir");
        let files = Files::open(dir.path()).await.expect("opens");
        for path in [
            ObjectPath::new("..", "x"),
            ObjectPath::new("c", "../x"),
            ObjectPath::new("c", "a".repeat(300)),
        ] {
            let err = files
                .write(&path, &mut &b"x"[..], sidecar_for(&path))
                .await
                .expect_err("refused");
            assert!(err.to_string().contains("invalid"), "{err}");
        }
        assert_eq!(std::fs::read_dir(dir.path()).expect("root").count(), 1);
    }
}
