//! Object stores: where floppies, deploy ISOs and images wait for the iLO and the agent, behind
//! expiring temp URLs (docs/architecture.md §6, §7; docs/ironic-protocols.md §4).
//!
//! # Design
//! One trait, [`ObjectStore`], two siblings with the same files: `builtin` (files in the state
//! directory, served by the conductor itself over HTTPS, temp URLs checked with
//! `vmdeploy_shared::tempurl`) and `swift` (OpenStack Swift, tempauth v1 or Keystone v3). The
//! flows see only the trait (`Arc<dyn ObjectStore>`), so they run the same on both.
//!
//! Metadata is Swift's model for both: a put sets the whole set, [`ObjectStore::set_metadata`]
//! replaces it (a Swift `POST`), keys in lower case. [`testing`] holds the contract both
//! stores run, the built-in one in its unit tests and Swift in `tests/integration`.
//!
//! Objects are named by container and object name, as Swift names them; the built-in store
//! keeps one directory per container. Both stores check names with [`ObjectPath::validate`]
//! before anything reaches a disk or a URL, and write them into URLs with
//! [`ObjectPath::url_path`], so a temp URL of either store has the same shape.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use percent_encoding::{AsciiSet, CONTROLS};
use time::OffsetDateTime;

/// The built-in store: files in the state directory, served over HTTPS.
pub mod builtin;
/// OpenStack Swift (tempauth v1 or Keystone v3).
pub mod swift;
/// The [`ObjectStore`] contract as one test suite, run against every store.
pub mod testing;

/// Longest container name Swift accepts (`container_name_max_length`, swift.conf default).
pub const MAX_CONTAINER_NAME: usize = 256;
/// Longest object name Swift accepts (`max_object_name_length`, swift.conf default).
pub const MAX_OBJECT_NAME: usize = 1024;

/// Bytes escaped in a URL path segment: everything but RFC 3986 unreserved characters and the
/// sub-delimiters that are harmless in a path. `/` is escaped too; object names keep theirs by
/// being encoded segment by segment.
const PATH_SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'\\')
    .add(b'^')
    .add(b'|')
    .add(b'[')
    .add(b']');

/// A container and an object in it (`swift://container/object`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectPath {
    /// Container.
    pub container: String,
    /// Object name inside it.
    pub object: String,
}

impl ObjectPath {
    /// `container/object`.
    pub fn new(container: impl Into<String>, object: impl Into<String>) -> ObjectPath {
        ObjectPath {
            container: container.into(),
            object: object.into(),
        }
    }

    /// Checks the names before they reach a disk or a URL: Swift's length limits, no `/` in
    /// the container, no NUL or control characters (they would end up in headers and file
    /// names), and no `.` or `..` segment in the object (HTTP clients fold those away, so the
    /// URL would name another object).
    pub fn validate(&self) -> Result<(), ObjectError> {
        let bad = |what: &str, why: &str| {
            Err(ObjectError::Other(format!(
                "invalid {what} name {:?}: {why}",
                self.to_string().chars().take(80).collect::<String>()
            )))
        };
        let c = &self.container;
        let o = &self.object;
        if c.is_empty() || o.is_empty() {
            return bad("object", "container and object must not be empty");
        }
        if c.len() > MAX_CONTAINER_NAME {
            return bad("container", "longer than 256 bytes");
        }
        if o.len() > MAX_OBJECT_NAME {
            return bad("object", "longer than 1024 bytes");
        }
        if c.contains('/') {
            return bad("container", "contains '/'");
        }
        if c.chars().chain(o.chars()).any(char::is_control) {
            return bad("object", "contains a control character");
        }
        if c == "." || c == ".." {
            return bad("container", "'.' and '..' name no container");
        }
        if o.split('/').any(|seg| seg == "." || seg == "..") {
            return bad("object", "has a '.' or '..' segment");
        }
        Ok(())
    }

    /// `/<container>` percent-encoded for a URL.
    pub fn container_url_path(&self) -> String {
        let mut out = String::with_capacity(self.container.len() + 1);
        out.push('/');
        out.extend(percent_encoding::utf8_percent_encode(
            &self.container,
            PATH_SEGMENT,
        ));
        out
    }

    /// `/<container>/<object>` percent-encoded for a URL (the object's `/` kept).
    pub fn url_path(&self) -> String {
        let mut out = self.container_url_path();
        for segment in self.object.split('/') {
            out.push('/');
            out.extend(percent_encoding::utf8_percent_encode(segment, PATH_SEGMENT));
        }
        out
    }
}

impl std::fmt::Display for ObjectPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.container, self.object)
    }
}

/// What to store: bytes in memory (a floppy) or a local file streamed from disk (an ISO).
#[derive(Debug, Clone)]
pub enum ObjectBody {
    /// In memory.
    Bytes(Bytes),
    /// A local file, read when uploaded.
    File(PathBuf),
}

/// Options of a put.
#[derive(Debug, Clone, Default)]
pub struct PutOptions {
    /// Delete the object this long after the put (`X-Delete-After`); `None` keeps it.
    pub delete_after: Option<Duration>,
    /// Metadata (`X-Object-Meta-<key>`), keys in lower case.
    pub metadata: BTreeMap<String, String>,
}

/// What a head reports.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectInfo {
    /// Size in bytes.
    pub size: u64,
    /// Metadata, keys in lower case.
    pub metadata: BTreeMap<String, String>,
    /// When the store deletes it, if ever.
    pub delete_at: Option<OffsetDateTime>,
}

/// Why an object store call failed.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// No such object (or container).
    #[error("object {0} not found")]
    NotFound(ObjectPath),
    /// The store refused our credentials.
    #[error("object store refused the credentials: {0}")]
    Auth(String),
    /// The store could not be reached or answered 5xx: try again later.
    #[error("object store unavailable: {0}")]
    Unavailable(String),
    /// Anything else the store answered.
    #[error("object store: {0}")]
    Other(String),
    /// Local I/O (reading the body file, the built-in store's directory).
    #[error("object store I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// An object store with expiring temp URLs.
#[async_trait::async_trait]
pub trait ObjectStore: Send + Sync + 'static {
    /// Stores `body` at `path`, creating the container when missing.
    async fn put(
        &self,
        path: &ObjectPath,
        body: ObjectBody,
        options: &PutOptions,
    ) -> Result<(), ObjectError>;
    /// Deletes `path`; `Ok(false)` when it was already gone.
    async fn delete(&self, path: &ObjectPath) -> Result<bool, ObjectError>;
    /// Size and metadata of `path`; [`ObjectError::NotFound`] when missing.
    async fn head(&self, path: &ObjectPath) -> Result<ObjectInfo, ObjectError>;
    /// Replaces the custom metadata of `path` with `metadata` (keys in lower case), leaving its
    /// bytes and its deletion time as they are; [`ObjectError::NotFound`] when missing. As a
    /// Swift `POST` does, it replaces the whole set: keys not given are removed
    /// (docs/ironic-protocols.md §4.2), so a caller changing one key sends the others too.
    ///
    /// Both stores implement it (and [`testing`] checks it); the default, which refuses, is
    /// for test doubles that never hold counted objects.
    async fn set_metadata(
        &self,
        path: &ObjectPath,
        metadata: &BTreeMap<String, String>,
    ) -> Result<(), ObjectError> {
        let _ = metadata;
        Err(ObjectError::Other(format!(
            "the {} object store cannot change the metadata of {path}",
            self.kind()
        )))
    }
    /// A `GET` temp URL for `path`, valid for `ttl`, at an address the BMCs and agents reach.
    async fn temp_url(&self, path: &ObjectPath, ttl: Duration) -> Result<String, ObjectError>;
    /// A short name for logs and errors (`builtin`, `swift`).
    fn kind(&self) -> &'static str;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        let long_container = "c".repeat(MAX_CONTAINER_NAME + 1);
        let long_object = "o".repeat(MAX_OBJECT_NAME + 1);
        let good = [
            ("ironic_ilo_container", "image-7b3e"),
            ("vmdeploy", "boot-abc.iso"),
            ("c", "dir/sub/file name.img"),
            ("c", ".hidden"),
            ("c", "..x"),
            ("c", "ünïcode"),
        ];
        for (c, o) in good {
            assert!(ObjectPath::new(c, o).validate().is_ok(), "{c}/{o}");
        }
        let bad = [
            ("", "o"),
            ("c", ""),
            ("a/b", "o"),
            (".", "o"),
            ("..", "o"),
            ("c", ".."),
            ("c", "a/../b"),
            ("c", "a/./b"),
            ("c", "line\nbreak"),
            ("c\0", "o"),
            (long_container.as_str(), "o"),
            ("c", long_object.as_str()),
        ];
        for (c, o) in bad {
            let err = ObjectPath::new(c, o).validate().expect_err(o);
            assert!(err.to_string().contains("invalid"), "{err}");
        }
    }

    #[test]
    fn url_paths_escape_segments_and_keep_object_slashes() {
        assert_eq!(ObjectPath::new("c", "image-1").url_path(), "/c/image-1");
        assert_eq!(
            ObjectPath::new("my c", "a/b c?#%.iso").url_path(),
            "/my%20c/a/b%20c%3F%23%25.iso"
        );
        assert_eq!(ObjectPath::new("c", "é").url_path(), "/c/%C3%A9");
    }
}
