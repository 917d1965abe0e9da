//! Object stores: where floppies, deploy ISOs and images wait for the iLO and the agent, behind
//! expiring temp URLs (DESIGN.md §6, §7; ../shared/reference/ironic-protocols.md §4).
//!
//! # Design
//! One trait, [`ObjectStore`], two siblings with the same files: `builtin` (files in the state
//! directory, served by the conductor itself over HTTPS, temp URLs checked with
//! `vmdeploy_shared::tempurl`) and `swift` (OpenStack Swift, tempauth v1 or Keystone v3). The
//! flows see only the trait (`Arc<dyn ObjectStore>`), so they run the same on both.
//!
//! Objects are named by container and object name, as Swift names them; the built-in store
//! keeps one directory per container.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use time::OffsetDateTime;

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
    /// A `GET` temp URL for `path`, valid for `ttl`, at an address the BMCs and agents reach.
    async fn temp_url(&self, path: &ObjectPath, ttl: Duration) -> Result<String, ObjectError>;
    /// A short name for logs and errors (`builtin`, `swift`).
    fn kind(&self) -> &'static str;
}
