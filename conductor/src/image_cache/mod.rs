//! The conductor's cache of instance images for the iscsi_ilo flow, which writes the image over
//! iSCSI itself and so needs it locally, raw.
//!
//! # Design
//! - [`ImageCache::get`] fetches an image once per [`ImageSource::key`]. Concurrent `get`s of a
//!   key share one download (single flight): the first starts a task, the others await the same
//!   shared future, then all take the same entry. The download runs in its own task, so a caller
//!   that gives up does not cancel it for the others. A failed download fails every waiter and
//!   leaves nothing behind; the next `get` tries again.
//! - A download goes through [`fetch`]: the async side reads the source, a blocking thread
//!   digests every byte as it arrives and writes it sparse into `tmp/`. The digest is compared
//!   when the download ends; on a mismatch the file is deleted and the error names both sums.
//!   Only then is a qcow2 converted to raw ([`format`], imago) and the entry renamed into place:
//!   nothing unverified ever enters the cache (docs/style.md §8, verify then commit).
//! - Every entry is a raw file with all-zero blocks left as holes ([`sparse`]), and
//!   [`CachedImage::data_ranges`] lists its data so the iSCSI writer can skip the rest.
//! - A [`CachedImage`] holds a lease: an entry with a lease is never evicted. Entries are evicted
//!   least recently used first, when a new entry would take the total (of raw sizes) past the
//!   limit.
//! - On disk, `<dir>/<sha256 of key>.raw` and `.json` (the entry's record, written last, so an
//!   entry is complete exactly when its record exists). [`ImageCache::open`] keeps complete
//!   entries, deletes everything else (partial downloads in `tmp/`, a `.raw` without its record),
//!   and orders the survivors by the record's modification time, which each use refreshes.
//!
//! # Limitations
//! - `swift://` references are not fetched here: the caller resolves them to a temp URL first
//!   (`context::image::resolve`) and sets [`FetchPolicy::extra_ca_pem`] when the store's
//!   certificate is the built-in one's. Glance ids likewise.
//! - The limit counts raw (virtual) sizes, not allocated blocks. While an image downloads, its
//!   spool (and, for qcow2, the converted copy) sit in `tmp/` beside the entries; eviction makes
//!   room when the entry is added. When leased entries leave no room, the entry is still added
//!   (a deploy is not refused for an image that fits the limit) and the cache runs over the limit
//!   until a later addition finds unleased entries to evict; a warning says so.
//! - A download is retried from its start, not resumed.

pub mod error;
pub mod fetch;
pub mod format;
pub mod sparse;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use vmdeploy_shared::error::Chain;
use vmdeploy_shared::io::hash::{ExpectedDigest, HashAlgo};

pub use error::ImageCacheError;
pub use fetch::FetchPolicy;
pub use format::ImageFormat;

/// Subdirectory of downloads in progress; emptied at open.
const TMP_DIR: &str = "tmp";
/// Extension of a cached raw image.
const RAW_EXT: &str = "raw";
/// Extension of an entry's record.
const RECORD_EXT: &str = "json";

/// Default cache size limit: 20 GiB.
pub const DEFAULT_LIMIT: u64 = 20 * 1024 * 1024 * 1024;

/// An image to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSource {
    /// `http://`, `https://` or `file://`. A `swift://` reference must be resolved to a temp
    /// URL by the caller first (the URL may change between calls; the key does not).
    pub url: String,
    /// The digest the download must have; `None` means none is checked (a sha256 is still
    /// taken and reported).
    pub checksum: Option<ExpectedDigest>,
    /// The cache key: one entry per key. Use [`ImageSource::new`], which derives it from the
    /// image reference and the checksum.
    pub key: String,
    /// Kept byte for byte, whatever its first bytes look like: a kernel or a ramdisk (often
    /// gzip or zstd inside) rather than a disk image. Set by [`ImageSource::as_is`].
    pub as_is: bool,
}

impl ImageSource {
    /// A source whose key is `reference` (as the node gives it, e.g. `swift://c/o`, before
    /// resolving it to `url`) and the checksum, so a new image under an old name is a new
    /// entry.
    pub fn new(reference: &str, url: impl Into<String>, checksum: Option<ExpectedDigest>) -> Self {
        let key = match &checksum {
            Some(c) => format!("{reference} {c}"),
            None => reference.to_owned(),
        };
        ImageSource {
            url: url.into(),
            checksum,
            key,
            as_is: false,
        }
    }

    /// A file that is not a disk image (a kernel, a ramdisk for a boot ISO): no format check,
    /// no conversion. Its key differs from a disk image's of the same reference.
    pub fn as_is(
        reference: &str,
        url: impl Into<String>,
        checksum: Option<ExpectedDigest>,
    ) -> Self {
        let mut source = ImageSource::new(reference, url, checksum);
        source.key = format!("{} (as is)", source.key);
        source.as_is = true;
        source
    }
}

/// An entry's record, `<name>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    key: String,
    size: u64,
    format_in: ImageFormat,
    /// Digest of the download, `algo:hex`.
    digest: String,
    /// Whether `digest` was checked against an expected one.
    verified: bool,
}

#[derive(Debug)]
struct Entry {
    name: String,
    record: Record,
    last_used: u64,
    leases: usize,
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    inflight: HashMap<String, Shared<BoxFuture<'static, Result<(), ImageCacheError>>>>,
    /// Logical clock of uses (LRU order).
    clock: u64,
}

struct Inner {
    dir: PathBuf,
    limit: u64,
    policy: FetchPolicy,
    client: reqwest::Client,
    state: Mutex<State>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves counters that are still consistent (each update
        // is one statement): carry on rather than poison every later deploy.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn raw_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.{RAW_EXT}"))
    }

    fn record_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.{RECORD_EXT}"))
    }
}

/// The cache. Cheap to share (`Arc`); all methods take `&self`.
pub struct ImageCache {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ImageCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageCache")
            .field("dir", &self.inner.dir)
            .field("limit", &self.inner.limit)
            .finish_non_exhaustive()
    }
}

/// A cached image, raw, with a lease that keeps it from eviction until dropped.
#[derive(Debug)]
pub struct CachedImage {
    /// The raw file. Read it only; it is shared with other deploys.
    pub path: PathBuf,
    /// Raw (virtual) size in bytes.
    pub size: u64,
    /// The format it was downloaded in.
    pub format_in: ImageFormat,
    /// The digest of the download: the verified checksum when one was given, else its sha256.
    pub digest: ExpectedDigest,
    /// Whether `digest` was checked against an expected one.
    pub verified: bool,
    _lease: Lease,
}

impl CachedImage {
    /// The file's data extents `(offset, length)`, holes left out; everything outside them
    /// reads as zero.
    pub fn data_ranges(&self) -> std::io::Result<Vec<(u64, u64)>> {
        sparse::data_ranges(&File::open(&self.path)?)
    }
}

struct Lease {
    inner: Arc<Inner>,
    key: String,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lease({:?})", self.key)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(e) = self.inner.lock().entries.get_mut(&self.key) {
            e.leases = e.leases.saturating_sub(1);
        }
    }
}

/// The file name of a key's entry: its sha256 (keys are URLs and digests, not file names).
fn entry_name(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

impl ImageCache {
    /// Opens (creating) the cache in `dir` with a limit of `limit_bytes`, with the default
    /// [`FetchPolicy`].
    pub fn open(dir: PathBuf, limit_bytes: u64) -> Result<Arc<ImageCache>, ImageCacheError> {
        ImageCache::open_with(dir, limit_bytes, FetchPolicy::default())
    }

    /// [`ImageCache::open`] with a fetch policy (timeouts, retries, extra CA). Blocking (it
    /// reads the directory); call it at start-up.
    pub fn open_with(
        dir: PathBuf,
        limit_bytes: u64,
        policy: FetchPolicy,
    ) -> Result<Arc<ImageCache>, ImageCacheError> {
        let io = |what: &str, path: &Path, e| {
            ImageCacheError::io(format!("{what} {}", path.display()), e)
        };
        std::fs::create_dir_all(&dir).map_err(|e| io("creating", &dir, e))?;
        let tmp = dir.join(TMP_DIR);
        match std::fs::remove_dir_all(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("removing partial downloads in", &tmp, e)),
        }
        std::fs::create_dir_all(&tmp).map_err(|e| io("creating", &tmp, e))?;
        let client = fetch::build_client(&policy)?;
        let inner = Inner {
            dir,
            limit: limit_bytes,
            policy,
            client,
            state: Mutex::new(State::default()),
        };
        let entries = load_entries(&inner)?;
        {
            let mut state = inner.lock();
            for (_, entry) in entries {
                state.clock += 1;
                let key = entry.record.key.clone();
                let last_used = state.clock;
                state.entries.insert(key, Entry { last_used, ..entry });
            }
        }
        Ok(Arc::new(ImageCache {
            inner: Arc::new(inner),
        }))
    }

    /// The cache's directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The size limit in bytes.
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// The sum of the entries' raw sizes.
    pub fn total_size(&self) -> u64 {
        self.inner
            .lock()
            .entries
            .values()
            .map(|e| e.record.size)
            .sum()
    }

    /// Whether `key` has a complete entry (no download is started).
    pub fn contains(&self, key: &str) -> bool {
        self.inner.lock().entries.contains_key(key)
    }

    /// The image of `source`, raw, fetching it first unless cached. See the module docs for
    /// single flight, verification and eviction.
    pub async fn get(&self, source: &ImageSource) -> Result<CachedImage, ImageCacheError> {
        // A finished download's entry could in principle be evicted by another addition before
        // this caller takes its lease; then fetch again, a bounded number of times.
        for _ in 0..3 {
            let download = {
                let mut state = self.inner.lock();
                if let Some(image) = take_lease(&self.inner, &mut state, &source.key) {
                    drop(state);
                    touch_record(&self.inner.record_path(&entry_name(&source.key)));
                    return Ok(image);
                }
                match state.inflight.get(&source.key) {
                    Some(download) => download.clone(),
                    None => {
                        let task = tokio::spawn(fill(self.inner.clone(), source.clone()));
                        let url = error::shown_url(&source.url);
                        let download = async move {
                            task.await.unwrap_or_else(|e| {
                                Err(ImageCacheError::Aborted {
                                    url,
                                    reason: e.to_string(),
                                })
                            })
                        }
                        .boxed()
                        .shared();
                        state.inflight.insert(source.key.clone(), download.clone());
                        download
                    }
                }
            };
            download.await?;
        }
        Err(ImageCacheError::Aborted {
            url: error::shown_url(&source.url),
            reason: "the entry was evicted before it could be used, three times".into(),
        })
    }
}

fn take_lease(inner: &Arc<Inner>, state: &mut State, key: &str) -> Option<CachedImage> {
    state.clock += 1;
    let clock = state.clock;
    let entry = state.entries.get_mut(key)?;
    entry.last_used = clock;
    entry.leases += 1;
    let digest = entry
        .record
        .digest
        .parse::<ExpectedDigest>()
        .expect("records hold digests this cache wrote");
    Some(CachedImage {
        path: inner.raw_path(&entry.name),
        size: entry.record.size,
        format_in: entry.record.format_in,
        digest,
        verified: entry.record.verified,
        _lease: Lease {
            inner: inner.clone(),
            key: key.to_owned(),
        },
    })
}

/// Refreshes a record's modification time: the LRU order after a restart.
fn touch_record(path: &Path) {
    let result = File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(SystemTime::now()));
    if let Err(e) = result {
        tracing::debug!(path = %path.display(), error = %Chain(&e), "refreshing an image cache record's time");
    }
}

/// Reads the complete entries of the directory, deleting anything else, oldest first.
fn load_entries(inner: &Inner) -> Result<Vec<(SystemTime, Entry)>, ImageCacheError> {
    let dir = &inner.dir;
    let read = std::fs::read_dir(dir)
        .map_err(|e| ImageCacheError::io(format!("reading {}", dir.display()), e))?;
    let mut names: Vec<PathBuf> = Vec::new();
    for item in read {
        let item =
            item.map_err(|e| ImageCacheError::io(format!("reading {}", dir.display()), e))?;
        names.push(item.path());
    }
    let mut entries = Vec::new();
    let mut keep: Vec<PathBuf> = Vec::new();
    for path in &names {
        if path.extension().and_then(|e| e.to_str()) != Some(RECORD_EXT) {
            continue;
        }
        let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        match load_entry(inner, name, path) {
            Ok((mtime, entry)) => {
                keep.push(path.clone());
                keep.push(inner.raw_path(name));
                entries.push((mtime, entry));
            }
            Err(reason) => {
                tracing::warn!(record = %path.display(), %reason, "dropping an incomplete image cache entry");
            }
        }
    }
    for path in names {
        if path.file_name().and_then(|n| n.to_str()) == Some(TMP_DIR) || keep.contains(&path) {
            continue;
        }
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(|e| ImageCacheError::io(format!("removing {}", path.display()), e))?;
    }
    entries.sort_by_key(|(mtime, _)| *mtime);
    Ok(entries)
}

fn load_entry(
    inner: &Inner,
    name: &str,
    record_path: &Path,
) -> Result<(SystemTime, Entry), String> {
    let text = std::fs::read(record_path).map_err(|e| e.to_string())?;
    let record: Record = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    if entry_name(&record.key) != name {
        return Err("record's key does not match its file name".into());
    }
    record
        .digest
        .parse::<ExpectedDigest>()
        .map_err(|e| e.to_string())?;
    let raw = std::fs::metadata(inner.raw_path(name)).map_err(|e| format!("image file: {e}"))?;
    if raw.len() != record.size {
        return Err(format!(
            "image file is {} bytes, the record says {}",
            raw.len(),
            record.size
        ));
    }
    let mtime = std::fs::metadata(record_path)
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    Ok((
        mtime,
        Entry {
            name: name.to_owned(),
            record,
            last_used: 0,
            leases: 0,
        },
    ))
}

/// The download task of one key: fetch, verify, convert, make room, add. Whatever happens, the
/// key leaves `inflight` (in the same lock as the entry arrives, so no `get` sees neither).
async fn fill(inner: Arc<Inner>, source: ImageSource) -> Result<(), ImageCacheError> {
    let name = entry_name(&source.key);
    let tmp = inner.dir.join(TMP_DIR);
    let download = tmp.join(format!("{name}.download"));
    let converted = tmp.join(format!("{name}.{RAW_EXT}"));
    let result = download_verify_convert(&inner, &source, &download, &converted).await;
    let result = match result {
        Ok((path, record)) => add_entry(&inner, &name, &path, record).await,
        Err(e) => Err(e),
    };
    for path in [&download, &converted] {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %Chain(&e), "removing a partial image download")
            }
        }
    }
    // Errors and logs name the URL without its query (a temp URL's signature).
    let result = result.map_err(ImageCacheError::mask_url);
    if let Err(e) = &result {
        tracing::warn!(error = %Chain(e), "image download failed; nothing cached");
        inner.lock().inflight.remove(&source.key);
    }
    result
}

/// Fetches into `download` while digesting, compares the digest, converts a qcow2 into
/// `converted`; returns the raw file and its record.
async fn download_verify_convert(
    inner: &Arc<Inner>,
    source: &ImageSource,
    download: &Path,
    converted: &Path,
) -> Result<(PathBuf, Record), ImageCacheError> {
    let url = source.url.clone();
    let algo = source
        .checksum
        .as_ref()
        .map_or(HashAlgo::Sha256, |c| c.algo);
    let (tx, rx) = mpsc::channel(fetch::CHANNEL_DEPTH);
    let writer = {
        let (path, url, limit, as_is) = (
            download.to_path_buf(),
            url.clone(),
            inner.limit,
            source.as_is,
        );
        tokio::task::spawn_blocking(move || {
            fetch::write_download(rx, &path, algo, limit, &url, as_is)
        })
    };
    let fed = fetch::feed(&inner.client, &inner.policy, &url, &tx).await;
    drop(tx);
    let written = writer.await.unwrap_or_else(|e| {
        Err(ImageCacheError::Aborted {
            url: url.clone(),
            reason: e.to_string(),
        })
    });
    // The reader's error comes first (the writer then only saw a short stream), unless the
    // reader stopped because the writer had failed.
    let downloaded = match fed {
        Err(e) => return Err(e),
        Ok(fetch::Fed::WriterGone | fetch::Fed::Complete) => written?,
    };
    let digest = match &source.checksum {
        Some(expected) => {
            if !expected.hex.eq_ignore_ascii_case(&downloaded.digest_hex) {
                return Err(ImageCacheError::ChecksumMismatch {
                    url,
                    algo: expected.algo,
                    expected: expected.hex.to_ascii_lowercase(),
                    actual: downloaded.digest_hex,
                });
            }
            expected.to_string()
        }
        None => format!("{algo}:{}", downloaded.digest_hex),
    };
    let (path, size) = match downloaded.format {
        ImageFormat::Raw => (download.to_path_buf(), downloaded.len),
        ImageFormat::Qcow2 => {
            let (src, dst, url) = (download.to_path_buf(), converted.to_path_buf(), url.clone());
            let size = tokio::task::spawn_blocking(move || format::qcow2_to_raw(&url, &src, &dst))
                .await
                .unwrap_or_else(|e| {
                    Err(ImageCacheError::Aborted {
                        url: source.url.clone(),
                        reason: e.to_string(),
                    })
                })?;
            (converted.to_path_buf(), size)
        }
    };
    if size > inner.limit {
        return Err(ImageCacheError::TooLarge {
            url,
            size,
            limit: inner.limit,
        });
    }
    Ok((
        path,
        Record {
            key: source.key.clone(),
            size,
            format_in: downloaded.format,
            digest,
            verified: source.checksum.is_some(),
        },
    ))
}

/// Evicts least recently used, unleased entries until `record` fits, then moves the raw file
/// into place and writes the record (last: it is what makes the entry complete on disk).
async fn add_entry(
    inner: &Arc<Inner>,
    name: &str,
    raw: &Path,
    record: Record,
) -> Result<(), ImageCacheError> {
    let victims = {
        let mut state = inner.lock();
        let mut total: u64 = state.entries.values().map(|e| e.record.size).sum();
        let mut victims = Vec::new();
        while total.saturating_add(record.size) > inner.limit {
            let oldest = state
                .entries
                .iter()
                .filter(|(_, e)| e.leases == 0)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            let Some(key) = oldest else {
                tracing::warn!(
                    total,
                    adding = record.size,
                    limit = inner.limit,
                    "image cache over its limit: every other entry is in use"
                );
                break;
            };
            let entry = state.entries.remove(&key).expect("key just found");
            total -= entry.record.size;
            victims.push(entry);
        }
        victims
    };
    for victim in victims {
        tracing::info!(key = %victim.record.key, size = victim.record.size, "evicting a cached image");
        // The record first: without it the entry is gone even if the image's removal fails.
        for path in [
            inner.record_path(&victim.name),
            inner.raw_path(&victim.name),
        ] {
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(path = %path.display(), error = %Chain(&e), "removing an evicted image");
            }
        }
    }
    let (raw_path, record_path) = (inner.raw_path(name), inner.record_path(name));
    let record_tmp = inner.dir.join(TMP_DIR).join(format!("{name}.{RECORD_EXT}"));
    let text = serde_json::to_vec_pretty(&record).expect("a record serialises");
    let raw_src = raw.to_path_buf();
    let (rp, rtp, rcp) = (raw_path.clone(), record_tmp.clone(), record_path.clone());
    tokio::task::spawn_blocking(move || -> Result<(), ImageCacheError> {
        let io =
            |what: &str, p: &Path, e| ImageCacheError::io(format!("{what} {}", p.display()), e);
        std::fs::rename(&raw_src, &rp).map_err(|e| io("moving the image into", &rp, e))?;
        std::fs::write(&rtp, &text).map_err(|e| io("writing", &rtp, e))?;
        File::open(&rtp)
            .and_then(|f| f.sync_all())
            .map_err(|e| io("syncing", &rtp, e))?;
        std::fs::rename(&rtp, &rcp).map_err(|e| io("moving the record into", &rcp, e))?;
        // The directory entry of both renames must be durable before the entry is used.
        if let Some(dir) = rcp.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io("syncing", dir, e))?;
        }
        Ok(())
    })
    .await
    .unwrap_or_else(|e| {
        Err(ImageCacheError::Aborted {
            url: record.key.clone(),
            reason: e.to_string(),
        })
    })?;
    let mut state = inner.lock();
    state.inflight.remove(&record.key);
    // Most recently used: the callers waiting for it are about to take their leases.
    state.clock += 1;
    let last_used = state.clock;
    state.entries.insert(
        record.key.clone(),
        Entry {
            name: name.to_owned(),
            record,
            last_used,
            leases: 0,
        },
    );
    Ok(())
}
