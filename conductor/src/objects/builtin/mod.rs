//! The built-in object store: files in the state directory, served by the conductor over
//! HTTPS on a port of its own (docs/architecture.md §6, §6a).
//!
//! # Design
//! [`BuiltinStore::start`] opens the directory ([`files`]), rebuilds the expiry schedule from
//! the sidecars (past-due objects go at once, [`expiry`]), binds the listener and spawns the
//! server ([`server`]) and the sweeper; both stop when the shutdown channel turns true. Temp
//! URLs are Swift's, for the fixed account `AUTH_vmdeploy`, signed with HMAC-SHA256 by
//! `vmdeploy_shared::tempurl` and checked by the same module; the URL starts with
//! `public_url`, the address BMCs and agents reach (by default the bound address).
//!
//! Always HTTPS (docs/architecture.md §6a): the floppy carries the agent token. iLOs do not check the
//! certificate, so a generated one serves.
//!
//! # Limitations
//! One conductor per directory: two stores on the same root would each sweep and each clear
//! the other's uploads in progress at start.

pub mod expiry;
pub mod files;
pub mod range;
pub mod server;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use tokio::io::AsyncRead;
use tokio::sync::watch;
use vmdeploy_shared::secret::Secret;
use vmdeploy_shared::tempurl::{self, TempUrlDigest, TempUrlKey};

use self::expiry::Schedule;
use self::files::{Files, Sidecar};
use super::{ObjectBody, ObjectError, ObjectInfo, ObjectPath, ObjectStore, PutOptions};

/// The account in the store's URLs (`/v1/AUTH_vmdeploy/...`), Swift's shape.
pub const ACCOUNT: &str = "AUTH_vmdeploy";

/// How to run the built-in store.
#[derive(Debug, Clone)]
pub struct BuiltinConfig {
    /// Directory of the objects (`<state dir>/objects`).
    pub root: PathBuf,
    /// Address to listen on; port 0 picks a free one.
    pub listen: SocketAddr,
    /// Base URL BMCs and agents reach the store at (`https://host:port`); `None` uses
    /// `https://<bound address>`.
    pub public_url: Option<String>,
    /// The key temp URLs are signed with.
    pub temp_url_key: Secret,
    /// The server's TLS configuration (certificate from the config, or generated).
    pub tls: Arc<rustls::ServerConfig>,
}

/// The built-in object store.
#[derive(Debug)]
pub struct BuiltinStore {
    files: Files,
    key: TempUrlKey,
    public_url: String,
    schedule: Schedule,
}

/// Now, Unix milliseconds.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl BuiltinStore {
    /// Opens the store at `config.root`, deletes what expired while it was down, binds
    /// `config.listen`, and serves until `shutdown` turns true. Returns the store and the bound
    /// address.
    pub async fn start(
        config: BuiltinConfig,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<(Arc<BuiltinStore>, SocketAddr)> {
        let files = Files::open(&config.root)
            .await
            .with_context(|| format!("opening the object directory {}", config.root.display()))?;
        let objects = files
            .scan()
            .await
            .with_context(|| format!("scanning the object directory {}", config.root.display()))?;
        let schedule = Schedule::default();
        let now = now_ms();
        let mut expired = 0usize;
        for sidecar in &objects {
            match sidecar.delete_at_ms {
                Some(at) if at <= now => {
                    let path = sidecar.path();
                    files
                        .remove(&path)
                        .await
                        .with_context(|| format!("deleting the expired object {path}"))?;
                    expired += 1;
                }
                Some(at) => schedule.add(at, &sidecar.path()),
                None => {}
            }
        }
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding the object store to {}", config.listen))?;
        let addr = listener
            .local_addr()
            .context("reading the object store's bound address")?;
        if config.public_url.is_none() && addr.ip().is_unspecified() {
            tracing::warn!(
                listen = %addr,
                "the object store listens on all addresses but has no public URL: temp URLs \
                 will name {addr}, which no BMC can reach; set the store's public URL"
            );
        }
        let public_url = config
            .public_url
            .clone()
            .unwrap_or_else(|| format!("https://{addr}"))
            .trim_end_matches('/')
            .to_string();
        tracing::info!(
            listen = %addr,
            public_url = %public_url,
            root = %config.root.display(),
            objects = objects.len() - expired,
            expired_at_start = expired,
            "built-in object store serving"
        );
        let store = Arc::new(BuiltinStore {
            files,
            key: TempUrlKey::new(config.temp_url_key.expose().as_bytes()),
            public_url,
            schedule,
        });
        let acceptor = tokio_rustls::TlsAcceptor::from(config.tls.clone());
        tokio::spawn(server::serve(
            store.clone(),
            listener,
            acceptor,
            shutdown.clone(),
        ));
        tokio::spawn(expiry::sweep(store.clone(), shutdown));
        Ok((store, addr))
    }

    /// The base URL temp URLs start with.
    pub fn public_url(&self) -> &str {
        &self.public_url
    }

    /// The object directory.
    pub fn root(&self) -> &std::path::Path {
        self.files.root()
    }

    /// The sidecar of a live object (`None` when missing or past its deadline).
    async fn live(&self, path: &ObjectPath) -> Result<Option<Sidecar>, ObjectError> {
        Ok(self
            .files
            .sidecar(path)
            .await?
            .filter(|s| !s.expired(now_ms())))
    }
}

#[async_trait::async_trait]
impl ObjectStore for BuiltinStore {
    async fn put(
        &self,
        path: &ObjectPath,
        body: ObjectBody,
        options: &PutOptions,
    ) -> Result<(), ObjectError> {
        path.validate()?;
        let delete_at_ms = options
            .delete_after
            .map(|ttl| now_ms().saturating_add(millis(ttl)));
        let sidecar = Sidecar {
            container: path.container.clone(),
            object: path.object.clone(),
            size: 0,
            sha256: String::new(),
            metadata: options
                .metadata
                .iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
                .collect::<BTreeMap<_, _>>(),
            delete_at_ms,
            modified: now_ms() / 1000,
        };
        let written = match body {
            ObjectBody::Bytes(bytes) => {
                let mut reader: &[u8] = &bytes;
                self.files.write(path, &mut reader, sidecar).await?
            }
            ObjectBody::File(file) => {
                let mut reader: Box<dyn AsyncRead + Unpin + Send> =
                    Box::new(tokio::fs::File::open(&file).await.map_err(|e| {
                        ObjectError::Io(std::io::Error::new(
                            e.kind(),
                            format!("opening {} to store it as {path}: {e}", file.display()),
                        ))
                    })?);
                self.files.write(path, &mut reader, sidecar).await?
            }
        };
        if let Some(at) = written.delete_at_ms {
            self.schedule.add(at, path);
        }
        tracing::debug!(object = %path, size = written.size, delete_at_ms = ?written.delete_at_ms, "stored object");
        Ok(())
    }

    async fn delete(&self, path: &ObjectPath) -> Result<bool, ObjectError> {
        let live = self.live(path).await?.is_some();
        let removed = self.files.remove(path).await?;
        // An object past its deadline was already gone for every reader (Swift: 404).
        Ok(live && removed)
    }

    async fn head(&self, path: &ObjectPath) -> Result<ObjectInfo, ObjectError> {
        let sidecar = self
            .live(path)
            .await?
            .ok_or_else(|| ObjectError::NotFound(path.clone()))?;
        let delete_at = match sidecar.delete_at_ms {
            Some(ms) => Some(
                time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
                    .map_err(|e| {
                        ObjectError::Other(format!("deletion time of {path} out of range: {e}"))
                    })?,
            ),
            None => None,
        };
        Ok(ObjectInfo {
            size: sidecar.size,
            metadata: sidecar.metadata,
            delete_at,
        })
    }

    async fn set_metadata(
        &self,
        path: &ObjectPath,
        metadata: &BTreeMap<String, String>,
    ) -> Result<(), ObjectError> {
        let metadata = metadata
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .collect();
        let now = now_ms();
        match self
            .files
            .replace_metadata(path, metadata, |s| !s.expired(now))
            .await?
        {
            Some(sidecar) => {
                tracing::debug!(object = %path, metadata = ?sidecar.metadata, "replaced object metadata");
                Ok(())
            }
            None => Err(ObjectError::NotFound(path.clone())),
        }
    }

    async fn temp_url(&self, path: &ObjectPath, ttl: Duration) -> Result<String, ObjectError> {
        // Also refuses names the directory cannot hold, so no URL names an impossible object.
        self.files.locate(path)?;
        let expires = (now_ms() / 1000).saturating_add(ttl.as_secs().max(1));
        let signed = format!("/v1/{ACCOUNT}/{}/{}", path.container, path.object);
        let query = tempurl::query(&self.key, TempUrlDigest::Sha256, "GET", expires, &signed)
            .map_err(|e| ObjectError::Other(format!("signing a temp URL for {path}: {e}")))?;
        Ok(format!(
            "{}/v1/{ACCOUNT}{}?{query}",
            self.public_url,
            path.url_path()
        ))
    }

    fn kind(&self) -> &'static str {
        "builtin"
    }
}

/// A store on `root` for unit tests: loopback, a free port, a certificate generated in a
/// `tls` directory beside `root`. Dropping the sender stops it.
#[cfg(test)]
pub(crate) async fn start_for_tests(
    root: &std::path::Path,
) -> (Arc<BuiltinStore>, watch::Sender<bool>) {
    let beside = root.parent().expect("the test store's root has a parent");
    let names = std::collections::BTreeSet::from(["127.0.0.1".to_string()]);
    let (cert, _) = crate::service::tls::AutoTls::new(beside)
        .ensure(&names)
        .expect("a generated test certificate");
    let (stop, shutdown) = watch::channel(false);
    let (store, _) = BuiltinStore::start(
        BuiltinConfig {
            root: root.to_path_buf(),
            listen: "127.0.0.1:0".parse().expect("an address"),
            public_url: None,
            temp_url_key: Secret::new("unit-test-temp-url-key"),
            tls: cert.server_config().expect("a TLS configuration"),
        },
        shutdown,
    )
    .await
    .expect("the built-in store starts");
    (store, stop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_object_store_contract() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, stop) = start_for_tests(&dir.path().join("objects")).await;
        crate::objects::testing::object_store_contract_suite(store.as_ref(), "vmdeploy").await;
        // The metadata change is on disk: a restarted store on the same directory reads it.
        let path = ObjectPath::new("vmdeploy", "kept");
        store
            .put(
                &path,
                ObjectBody::Bytes(bytes::Bytes::from_static(b"x")),
                &PutOptions::default(),
            )
            .await
            .expect("put");
        let count = BTreeMap::from([("usage-count".to_string(), "5".to_string())]);
        store.set_metadata(&path, &count).await.expect("set");
        drop(stop);
        let (again, _stop) = start_for_tests(&dir.path().join("objects")).await;
        assert_eq!(again.head(&path).await.expect("head").metadata, count);
    }
}
