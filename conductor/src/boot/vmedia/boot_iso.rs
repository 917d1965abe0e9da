//! Instance boot ISOs for netboot (`iscsi_ilo`), shared between nodes and counted: the boot ISO
//! store the seed blueprint designed and Ironic never built (docs/architecture.md §6;
//! docs/ironic-protocols.md §4.4).
//!
//! # Which ISO a node boots ([`choose`])
//! Ironic's order (docs/ironic-protocols.md §4.4): `instance_info.ilo_boot_iso` (a URL the flow checks with a
//! `HEAD`), else the image's `boot_iso` property, else one built by the conductor from the
//! image's kernel and ramdisk with `root=UUID=<root uuid>` and the configured extra arguments.
//! Only a built ISO is stored here and counted; a user-given one is the user's, used as it is
//! and never deleted.
//!
//! # Design
//! A built ISO is the object `boot-<sha256>` in the deploy container, the hash taken over the
//! image, kernel and ramdisk references and the command line ([`BootIsoKey::object_name`]), so
//! nodes deploying the same image with the same root file system share one ISO, and a node
//! whose root UUID differs gets its own (the command line is in the name). The number of nodes
//! using it is its `usage-count` metadata (`X-Object-Meta-Usage-Count` in Swift, the same key
//! in the built-in store's sidecar). [`BootIsos::acquire`] counts one up, building and storing
//! the ISO when it is missing; [`BootIsos::release`] counts one down and deletes the ISO at
//! zero. Both read and write the count under a lock per object name, held across the whole
//! `HEAD`, build or `set_metadata`, so two nodes finishing at once cannot lose a count, and a
//! second node waits for the first one's build instead of building the ISO again.
//!
//! The ISO is written with `vmdeploy_shared::iso` (BIOS and UEFI in one image), off the async
//! threads, into a scratch file that is uploaded and removed. The boot loaders come from a
//! directory (`[deploy] boot_loaders_dir`, [`loaders`]) that the conductor makes itself on the
//! first build from this system's isolinux, syslinux and GRUB packages, or that
//! `vmdeploy-image-build loaders -o DIR` fills on a machine that has them. `validate` asks
//! [`BootIsos::check_loaders`], so a node is refused before anything is touched when neither
//! is there.
//!
//! # Limitations
//! - The lock is this process's: two conductors sharing one Swift container could still lose a
//!   count (Swift has no compare-and-swap on metadata; this is why Ironic did not share ISOs).
//!   docs/architecture.md §8 has one conductor per deployment.
//! - A lease is not tied to a node here: the flow records the object it acquired (in
//!   `driver_internal_info`) and releases it once, or the count stays high and the ISO stays.
//! - The kernel and ramdisk are read whole into memory while the ISO is written.
//! - Upgrading the loaders does not rebuild ISOs already stored; they are rebuilt once no node
//!   uses them.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use sha2::{Digest as _, Sha256};
use vmdeploy_shared::iso::loaders::LoaderSources;
use vmdeploy_shared::iso::{self, BootIsoSpec};

use crate::objects::{ObjectBody, ObjectError, ObjectPath, ObjectStore, PutOptions};

/// The metadata key of the count (`X-Object-Meta-Usage-Count` in Swift).
pub const USAGE_COUNT: &str = "usage-count";
/// How long a temp URL of an attached boot ISO lives unless configured: a day. The iLO reads
/// the CD at every boot, and only a power-on or reboot through the API attaches a fresh URL;
/// a reboot from inside the instance after the URL expired finds no CD. The ISO holds no
/// secret (a kernel, a ramdisk and a root UUID), so a long life costs little.
pub const DEFAULT_TEMP_URL_TTL: Duration = Duration::from_secs(24 * 3600);
/// Prefix of the objects this store owns.
pub const OBJECT_PREFIX: &str = "boot-";
pub use loaders::{read_loaders, LoadersDir, LOADERS_COMMAND};
pub use vmdeploy_shared::iso::loaders::{GRUB_EFI_FILE, ISOLINUX_BIN_FILE, LDLINUX_C32_FILE};

pub mod loaders;

/// What a built boot ISO is made of; equal keys share one ISO.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BootIsoKey {
    /// The instance image's reference (as the node gives it).
    pub image_ref: String,
    /// The kernel's reference.
    pub kernel_ref: String,
    /// The ramdisk's reference.
    pub ramdisk_ref: String,
    /// The kernel command line (`root=UUID=<root uuid>` and the extra arguments).
    pub cmdline: String,
    /// Booted under UEFI Secure Boot: Debian's signed shim and GRUB
    /// ([`LoadersDir::load_secure_boot`]) instead of our GRUB.
    pub secure_boot: bool,
}

impl BootIsoKey {
    /// `boot-<sha256 hex>` over the four fields, each framed by its length (8 bytes, big
    /// endian) so that no two different keys hash the same bytes (`"ab" + "c"` is not
    /// `"a" + "bc"`), after a versioned tag so a change of the scheme cannot reuse old names.
    pub fn object_name(&self) -> String {
        let mut hash = Sha256::new();
        hash.update(b"vmdeploy boot ISO v1\0");
        for field in [
            &self.image_ref,
            &self.kernel_ref,
            &self.ramdisk_ref,
            &self.cmdline,
        ] {
            hash.update((field.len() as u64).to_be_bytes());
            hash.update(field.as_bytes());
        }
        // After the framed fields, so no key without it hashes the same bytes; absent for the
        // ISOs without Secure Boot, whose names stay what they were.
        if self.secure_boot {
            hash.update(b"secure boot");
        }
        format!("{OBJECT_PREFIX}{}", hex::encode(hash.finalize()))
    }
}

/// A node's use of a stored boot ISO: release it once with [`BootIsos::release`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootIsoLease {
    /// The ISO's object.
    pub object: ObjectPath,
    /// Nodes using it, this one included.
    pub usage_count: u64,
}

/// Where a node's boot ISO comes from (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootIsoSource<'a> {
    /// A user-given ISO: not stored, not counted.
    Given {
        /// The field it came from (for messages).
        field: &'static str,
        /// Its reference, trimmed.
        reference: &'a str,
    },
    /// Build one (or share the one built for the same [`BootIsoKey`]).
    Build,
}

/// The boot ISO a node boots, from `instance_info.ilo_boot_iso` and the image's `boot_iso`
/// property, in Ironic's order; empty strings count as absent.
pub fn choose<'a>(
    instance_ilo_boot_iso: Option<&'a str>,
    image_boot_iso: Option<&'a str>,
) -> BootIsoSource<'a> {
    let given = |v: Option<&'a str>| v.map(str::trim).filter(|s| !s.is_empty());
    if let Some(reference) = given(instance_ilo_boot_iso) {
        BootIsoSource::Given {
            field: "instance_info.ilo_boot_iso",
            reference,
        }
    } else if let Some(reference) = given(image_boot_iso) {
        BootIsoSource::Given {
            field: "the image's boot_iso property",
            reference,
        }
    } else {
        BootIsoSource::Build
    }
}

/// Locks by name: one async mutex per name in use, dropped when nobody holds or waits for it.
#[derive(Debug, Default)]
struct KeyedLocks {
    locks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// Holds one name's lock; dropping it unlocks.
struct KeyedGuard<'a> {
    owner: &'a KeyedLocks,
    key: String,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl KeyedLocks {
    async fn lock(&self, key: &str) -> KeyedGuard<'_> {
        let mutex = {
            let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
            locks.entry(key.to_string()).or_default().clone()
        };
        KeyedGuard {
            owner: self,
            key: key.to_string(),
            _guard: mutex.lock_owned().await,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Drop for KeyedGuard<'_> {
    fn drop(&mut self) {
        let mut locks = self.owner.locks.lock().unwrap_or_else(|e| e.into_inner());
        // Two references, the map's and this guard's: nobody waits, so the entry can go. A
        // waiter holds a third, taken under the map's lock, which this check also holds.
        if locks
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 2)
        {
            locks.remove(&self.key);
        }
    }
}

/// A scratch file removed when dropped (the ISO once uploaded, or after a failed build).
struct ScratchFile(PathBuf);

impl Drop for ScratchFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.0) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(file = %self.0.display(), error = %e, "removing a scratch boot ISO failed");
            }
        }
    }
}

/// The shared boot ISOs of one object store container.
pub struct BootIsos {
    objects: Arc<dyn ObjectStore>,
    container: String,
    loaders: Arc<LoadersDir>,
    scratch_dir: PathBuf,
    cmdline_append: String,
    temp_url_ttl: Duration,
    locks: KeyedLocks,
}

impl std::fmt::Debug for BootIsos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BootIsos")
            .field("store", &self.objects.kind())
            .field("container", &self.container)
            .field("loaders_dir", &self.loaders.dir())
            .finish_non_exhaustive()
    }
}

/// The count in `metadata`, or an error naming the object and what it found.
fn usage_count(object: &ObjectPath, metadata: &BTreeMap<String, String>) -> anyhow::Result<u64> {
    let value = metadata.get(USAGE_COUNT).with_context(|| {
        format!("the boot ISO {object} has no {USAGE_COUNT} metadata: it was not stored by this conductor's boot ISO store")
    })?;
    value.trim().parse().map_err(|_| {
        anyhow::anyhow!("the boot ISO {object} has {USAGE_COUNT} {value:?}, which is not a count")
    })
}

/// Builds the ISO of `cmdline` from the files into `out`, with the signed loaders when
/// `secure_boot` (blocking). [`BootIsos`] builds with it; tests boot what it writes.
pub fn build_iso(
    loaders: &LoadersDir,
    kernel: &Path,
    ramdisk: &Path,
    cmdline: &str,
    secure_boot: bool,
    out: &Path,
) -> anyhow::Result<iso::IsoSummary> {
    let loaders = if secure_boot {
        loaders.load_secure_boot()?
    } else {
        loaders.load()?
    };
    let kernel_bytes = std::fs::read(kernel)
        .with_context(|| format!("reading the kernel {}", kernel.display()))?;
    let ramdisk_bytes = std::fs::read(ramdisk)
        .with_context(|| format!("reading the ramdisk {}", ramdisk.display()))?;
    let spec = BootIsoSpec {
        kernel: &kernel_bytes,
        initramfs: &ramdisk_bytes,
        cmdline,
        loaders: &loaders,
    };
    let file = std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let (_, summary) = iso::write_boot_iso_at(&spec, iso::DEFAULT_EPOCH, file)
        .with_context(|| format!("writing the boot ISO {}", out.display()))?;
    Ok(summary)
}

impl BootIsos {
    /// Boot ISOs in `container` of `objects`, built with the loaders in `loaders_dir` (made
    /// there from Debian's packages when missing, [`BootIsos::with_loader_sources`]); scratch
    /// files go to the system's temporary directory ([`BootIsos::with_scratch_dir`]).
    pub fn new(objects: Arc<dyn ObjectStore>, container: String, loaders_dir: PathBuf) -> Self {
        BootIsos {
            objects,
            container,
            loaders: Arc::new(LoadersDir::new(loaders_dir, LoaderSources::default())),
            scratch_dir: std::env::temp_dir(),
            cmdline_append: String::new(),
            temp_url_ttl: DEFAULT_TEMP_URL_TTL,
            locks: KeyedLocks::default(),
        }
    }

    /// Extra kernel arguments after `root=UUID=...` on built ISOs (`[deploy] boot_iso_append`;
    /// Ironic's `pxe_append_params`). Surrounding blanks are dropped.
    pub fn with_cmdline_append(mut self, append: &str) -> Self {
        self.cmdline_append = append.trim().to_string();
        self
    }

    /// How long the temp URL of an attached ISO lives (`[deploy] boot_iso_ttl`).
    pub fn with_temp_url_ttl(mut self, ttl: Duration) -> Self {
        self.temp_url_ttl = ttl;
        self
    }

    /// Where a missing loaders directory is made from, when not Debian's paths (another
    /// distribution's, or none in tests).
    pub fn with_loader_sources(mut self, sources: LoaderSources) -> Self {
        self.loaders = Arc::new(LoadersDir::new(self.loaders.dir().to_path_buf(), sources));
        self
    }

    /// Ok when an ISO can be built as far as configuration decides: the loaders directory is
    /// there, or this system has what to make it from ([`LoadersDir::check`]); for a node that
    /// boots under Secure Boot, the signed loaders are there too
    /// ([`LoadersDir::check_secure_boot`]).
    pub fn check_loaders(&self, secure_boot: bool) -> anyhow::Result<()> {
        if secure_boot {
            self.loaders.check_secure_boot()
        } else {
            self.loaders.check()
        }
    }

    /// The kernel command line of a built ISO whose root file system is `root_uuid`.
    pub fn cmdline(&self, root_uuid: &str) -> String {
        if self.cmdline_append.is_empty() {
            format!("root=UUID={root_uuid}")
        } else {
            format!("root=UUID={root_uuid} {}", self.cmdline_append)
        }
    }

    /// The lifetime of the temp URLs the virtual CD is given.
    pub fn temp_url_ttl(&self) -> Duration {
        self.temp_url_ttl
    }

    /// The container the ISOs are stored in.
    pub fn container(&self) -> &str {
        &self.container
    }

    /// Writes ISOs being built into `dir` (e.g. the state directory, when /tmp is small).
    pub fn with_scratch_dir(mut self, dir: PathBuf) -> Self {
        self.scratch_dir = dir;
        self
    }

    /// The object the ISO of `key` is stored as.
    pub fn object_path(&self, key: &BootIsoKey) -> ObjectPath {
        ObjectPath::new(self.container.clone(), key.object_name())
    }

    /// Counts one more node using the ISO of `key`, building it from `kernel` and `ramdisk`
    /// and storing it (count 1, no expiry) when it is not stored yet.
    pub async fn acquire(
        &self,
        key: &BootIsoKey,
        kernel: &Path,
        ramdisk: &Path,
    ) -> anyhow::Result<BootIsoLease> {
        let object = self.object_path(key);
        let _lock = self.locks.lock(&object.to_string()).await;
        match self.objects.head(&object).await {
            Ok(info) => {
                let count = usage_count(&object, &info.metadata)?
                    .checked_add(1)
                    .with_context(|| format!("the usage count of {object} overflows"))?;
                let mut metadata = info.metadata;
                // The whole set goes back: set_metadata replaces it, as a Swift POST does.
                metadata.insert(USAGE_COUNT.to_string(), count.to_string());
                self.objects
                    .set_metadata(&object, &metadata)
                    .await
                    .with_context(|| format!("counting one more user of the boot ISO {object}"))?;
                tracing::info!(%object, usage_count = count, "sharing a stored boot ISO");
                Ok(BootIsoLease {
                    object,
                    usage_count: count,
                })
            }
            Err(ObjectError::NotFound(_)) => {
                self.build_and_store(key, &object, kernel, ramdisk).await?;
                Ok(BootIsoLease {
                    object,
                    usage_count: 1,
                })
            }
            Err(e) => {
                Err(e).with_context(|| format!("looking for the boot ISO {object} in the store"))
            }
        }
    }

    async fn build_and_store(
        &self,
        key: &BootIsoKey,
        object: &ObjectPath,
        kernel: &Path,
        ramdisk: &Path,
    ) -> anyhow::Result<()> {
        let scratch = ScratchFile(self.scratch_dir.join(format!(
            "{}.{}.iso",
            object.object,
            uuid::Uuid::new_v4().simple()
        )));
        let (loaders, kernel_path, ramdisk_path, cmdline, secure_boot, out) = (
            Arc::clone(&self.loaders),
            kernel.to_path_buf(),
            ramdisk.to_path_buf(),
            key.cmdline.clone(),
            key.secure_boot,
            scratch.0.clone(),
        );
        let started = std::time::Instant::now();
        // Reading a kernel and ramdisk of tens of MB and writing the ISO is blocking work.
        let summary = tokio::task::spawn_blocking(move || {
            build_iso(
                &loaders,
                &kernel_path,
                &ramdisk_path,
                &cmdline,
                secure_boot,
                &out,
            )
        })
        .await
        .context("the boot ISO build task failed")?
        .with_context(|| format!("building the boot ISO {object}"))?;
        let metadata = BTreeMap::from([(USAGE_COUNT.to_string(), "1".to_string())]);
        self.objects
            .put(
                object,
                ObjectBody::File(scratch.0.clone()),
                &PutOptions {
                    // Kept until the last node releases it: it boots the instance at every boot.
                    delete_after: None,
                    metadata,
                },
            )
            .await
            .with_context(|| format!("storing the boot ISO {object}"))?;
        tracing::info!(
            %object,
            bytes = summary.iso_bytes,
            image = %key.image_ref,
            cmdline = %key.cmdline,
            secure_boot = key.secure_boot,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "built and stored a boot ISO"
        );
        Ok(())
    }

    /// Counts one node fewer using `object`, deleting it at zero; returns the new count.
    /// Releasing an ISO that is gone is a logged no-op (0), so a tear-down can be repeated.
    pub async fn release(&self, object: &ObjectPath) -> anyhow::Result<u64> {
        if object.container != self.container || !object.object.starts_with(OBJECT_PREFIX) {
            bail!(
                "{object} is not a boot ISO of this store (container {}, names {OBJECT_PREFIX}...)",
                self.container
            );
        }
        let _lock = self.locks.lock(&object.to_string()).await;
        let info = match self.objects.head(object).await {
            Ok(info) => info,
            Err(ObjectError::NotFound(_)) => {
                tracing::info!(%object, "releasing a boot ISO that is already gone");
                return Ok(0);
            }
            Err(e) => {
                return Err(e).with_context(|| format!("reading the boot ISO {object}"));
            }
        };
        let count = usage_count(object, &info.metadata)?;
        if count <= 1 {
            if count == 0 {
                tracing::warn!(%object, "a boot ISO with a usage count of 0 was still stored");
            }
            self.objects
                .delete(object)
                .await
                .with_context(|| format!("deleting the boot ISO {object}, no longer used"))?;
            tracing::info!(%object, "deleted a boot ISO no node uses");
            return Ok(0);
        }
        let count = count - 1;
        let mut metadata = info.metadata;
        metadata.insert(USAGE_COUNT.to_string(), count.to_string());
        self.objects
            .set_metadata(object, &metadata)
            .await
            .with_context(|| format!("counting one user fewer of the boot ISO {object}"))?;
        tracing::info!(%object, usage_count = count, "released a shared boot ISO");
        Ok(count)
    }

    /// The stored count of `object`, `None` when it is not stored.
    pub async fn usage_count(&self, object: &ObjectPath) -> anyhow::Result<Option<u64>> {
        match self.objects.head(object).await {
            Ok(info) => usage_count(object, &info.metadata).map(Some),
            Err(ObjectError::NotFound(_)) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading the boot ISO {object}")),
        }
    }

    /// A temp URL of `object` for the iLO's virtual CD, valid for `ttl`.
    pub async fn temp_url(&self, object: &ObjectPath, ttl: Duration) -> anyhow::Result<String> {
        self.objects
            .temp_url(object, ttl)
            .await
            .with_context(|| format!("making a temp URL for the boot ISO {object}"))
    }
}

#[cfg(test)]
mod tests;
