//! The agent_ilo image stream: HTTP(S) body → checksum → decompress → (qcow2 spool) → disk.
//!
//! # Design
//! One function reads top to bottom ([`write_verified`], docs/style.md §2, after coreos-installer's
//! `write_image`): the download is peeked for compression magic, decoded, peeked again for the
//! image format, which fixes the [`Plan`] (raw onto the disk, or a qcow2 spooled behind its own
//! virtual size), and written by one [`ImageSink`] with the first MiB held back. The rest of the
//! download is drained to EOF (CVE-2021-20319: a decoder may stop before the end), the digest
//! compared, and only then the first MiB written (or the qcow2 converted) and the disk synced. Any
//! failure zeroes the first MiB, so a half-written or unverified image never boots.
//!
//! The digest covers the image file as downloaded (Ironic's `os_hash_value` and `image_checksum`,
//! docs/ironic-protocols.md §3.4). Where it is taken is decided once, from the
//! compression: uncompressed, the bytes the sink receives are the download itself, so the sink
//! owns the digest and takes it on its own thread beside the disk writes
//! ([`crate::disk::sink`]); compressed, the reading chain digests the download before decoding.
//!
//! Speed (bench/agent-stream.sh): `http://` bodies are read by [`source::plain`] straight into the
//! disk blocks: one copy (the kernel's `recv`) between socket and disk, SHA-256 on one core and
//! `recv` + TCP on the other.
//!
//! # Limitations
//! One image at a time; the HTTP side is [`source`] (resume with Range, bounded retries).
//! Compressed images are hashed on the reading thread, before decoding.

pub mod decompress;
pub mod progress;
pub mod qcow2;
pub mod source;

use std::io::Read;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{bail, Context};
use vmdeploy_shared::io::hash::{ExpectedDigest, HashReader, Hasher};
use vmdeploy_shared::io::limit::LimitReader;
use vmdeploy_shared::io::peek::PeekReader;
use vmdeploy_shared::io::BUFFER_SIZE;
use vmdeploy_shared::qcow2::{self as qcow2_header, Qcow2Header};

use crate::disk::sink::{self, ImageSink, SinkDone};
use crate::disk::{Disk, HEAD_LEN};

/// One MiB, for sizes in messages.
const MIB: u64 = 1 << 20;
use decompress::Compression;
use progress::Progress;

/// The container format of the decoded image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    /// Raw disk image, written as is.
    Raw,
    /// qcow2, converted to raw on the disk.
    Qcow2,
}

/// What a successful write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteOutcome {
    /// Compression of the download.
    pub compression: Compression,
    /// Format of the decompressed image.
    pub format: ImageFormat,
    /// Bytes downloaded (and hashed).
    pub downloaded: u64,
    /// Bytes of raw image on the disk.
    pub image_len: u64,
    /// The verified digest, `algo:hex`, when one was given.
    pub digest: Option<String>,
}

/// How the decoded image reaches the disk, chosen from its first bytes before anything is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Written as is from offset 0, the first MiB held back until verified.
    Raw,
    /// Spooled at `spool` (behind the image's virtual size), then converted to raw at offset 0.
    Qcow2 {
        /// Disk offset of the spool.
        spool: u64,
        /// Size of the raw image the conversion writes.
        virtual_size: u64,
    },
}

impl Plan {
    /// The plan for an image starting with `head` on a disk of `capacity` bytes (`None`: a file).
    pub fn choose(head: &[u8], capacity: Option<u64>) -> anyhow::Result<Plan> {
        if !qcow2_header::is_qcow2(head) {
            return Ok(Plan::Raw);
        }
        let header = Qcow2Header::parse(head)?;
        let spool = qcow2::spool_offset(&header)?;
        if let Some(cap) = capacity {
            if cap < spool + HEAD_LEN as u64 {
                bail!(
                    "the qcow2 image's virtual size ({} bytes) does not fit the disk ({cap} bytes) with room to spool it",
                    header.virtual_size
                );
            }
        }
        tracing::info!(
            virtual_size = header.virtual_size,
            spool,
            "qcow2 image: spooling beyond its end"
        );
        Ok(Plan::Qcow2 {
            spool,
            virtual_size: header.virtual_size,
        })
    }

    /// Where the sink starts writing.
    fn base(self) -> u64 {
        match self {
            Plan::Raw => 0,
            Plan::Qcow2 { spool, .. } => spool,
        }
    }

    /// Most bytes the decoded stream may have on a disk of `capacity` bytes.
    fn room(self, capacity: Option<u64>) -> u64 {
        capacity.map_or(u64::MAX, |cap| cap.saturating_sub(self.base()))
    }
}

/// A byte range of the disk an image is confined to (a partition image's root partition).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Byte offset of the range on the disk (4 KiB-aligned).
    pub offset: u64,
    /// Length of the range in bytes.
    pub len: u64,
}

/// Writes the raw image read from `source` into `window` of `disk`, verifying `expected` when
/// given: the same chain as [`write_image_from`], its first MiB held back until verified and
/// written at `window.offset`. A qcow2 image is refused (a partition image is written as the
/// raw file system it is); an image longer than the window fails before anything is written
/// when the server sent its length and it is not compressed, else at the window's end, with
/// nothing written outside the window. On failure nothing is cleaned up: the caller, which
/// owns the rest of the disk, does.
pub fn write_into_window(
    source: impl Read,
    disk: &Arc<Disk>,
    window: Window,
    expected: Option<&ExpectedDigest>,
    progress: &Progress,
) -> anyhow::Result<WriteOutcome> {
    write_verified(source, disk, Some(window), expected, progress)
}

/// Writes the image read from `source` to `disk`, verifying `expected` when given.
///
/// On failure the first MiB of the disk is zeroed and the error says so; when zeroing fails too,
/// the error says that instead. A checksum failure's error is a
/// [`vmdeploy_shared::io::hash::HashError::Mismatch`] (downcast to tell it apart).
pub fn write_image_from(
    source: impl Read,
    disk: Arc<Disk>,
    expected: Option<&ExpectedDigest>,
    progress: &Progress,
) -> anyhow::Result<WriteOutcome> {
    let err = match write_verified(source, &disk, None, expected, progress) {
        Ok(outcome) => return Ok(outcome),
        Err(err) => err,
    };
    tracing::error!(disk = %disk.path().display(), "image write failed: {err:#}");
    let len = disk
        .capacity()
        .map_or(HEAD_LEN, |cap| cap.min(HEAD_LEN as u64) as usize);
    match sink::zero_head(&disk, 0, len) {
        Ok(()) => Err(err.context("image write failed, so the first MiB of the disk was zeroed")),
        Err(zero) => Err(err.context(format!(
            "image write failed, and zeroing the first MiB of the disk failed too ({zero}): \
             the disk may hold a partial image"
        ))),
    }
}

/// The chain: peek the compression, decode, peek the format and [`Plan`], sink, drain, verify,
/// commit. With a `window`, the image goes into it instead of at offset 0 of the whole disk.
fn write_verified(
    source: impl Read,
    disk: &Arc<Disk>,
    window: Option<Window>,
    expected: Option<&ExpectedDigest>,
    progress: &Progress,
) -> anyhow::Result<WriteOutcome> {
    let capacity = match window {
        Some(w) => Some(w.len),
        None => disk.capacity(),
    };
    let offset = window.map_or(0, |w| w.offset);
    let mut magic = PeekReader::with_capacity(decompress::MAGIC_LEN, source);
    let compression = Compression::detect(
        magic
            .peek(decompress::MAGIC_LEN)
            .context("reading the image")?,
    );
    tracing::info!(?compression, "image stream started");
    if let (Some(w), Compression::None) = (window, compression) {
        // The response headers are in: an uncompressed image's size is its Content-Length.
        let total = progress.download_total.load(Ordering::Relaxed);
        if total > w.len {
            bail!(
                "the image is {total} bytes ({} MiB), larger than its partition of {} bytes \
                 ({} MiB): nothing was written",
                total.div_ceil(MIB),
                w.len,
                w.len / MIB
            );
        }
    }
    let hasher = || expected.map(|d| Hasher::new(d.algo));
    let (chain_digest, sink_digest) = match compression {
        Compression::None => (None, hasher()),
        _ => (hasher(), None),
    };
    // The peeked magic is still unread: the digest (on either side) starts at byte 0.
    let mut download = PeekReader::with_capacity(BUFFER_SIZE, HashReader::new(magic, chain_digest));

    let (plan, done) = {
        let mut image = PeekReader::with_capacity(BUFFER_SIZE, compression.decoder(&mut download));
        let head = image
            .peek(qcow2_header::HEADER_LEN)
            .with_context(|| format!("decoding the {compression:?} image"))?;
        let plan = Plan::choose(head, capacity)?;
        if window.is_some() && plan != Plan::Raw {
            bail!(
                "the partition image is qcow2: this agent writes partition images as raw file \
                 systems (optionally gzip, xz or zstd compressed); convert it with \
                 `qemu-img convert -O raw`"
            );
        }
        // What heartbeats report `written` against: the raw image's size, when known before
        // the end. A compressed raw stream's size is known only once it has been decoded.
        let image_total = match plan {
            Plan::Qcow2 { virtual_size, .. } => virtual_size,
            Plan::Raw if compression == Compression::None => {
                progress.download_total.load(Ordering::Relaxed)
            }
            Plan::Raw => 0,
        };
        progress.image_total.store(image_total, Ordering::Relaxed);
        // A qcow2 download is not the image yet: its bytes count as spooled, not written.
        let counter = match plan {
            Plan::Raw => &progress.written,
            Plan::Qcow2 { .. } => &progress.spooled,
        };
        let mut sink = ImageSink::new(
            Arc::clone(disk),
            offset + plan.base(),
            plan == Plan::Raw,
            Arc::clone(counter),
            sink_digest,
        )
        .context("starting the disk writer")?;
        sink.fill_from(&mut LimitReader::new(image, plan.room(capacity)))
            .with_context(|| match (plan, capacity) {
                (Plan::Qcow2 { .. }, _) => {
                    "spooling the qcow2 image (it must fit behind its own virtual size)".to_owned()
                }
                (Plan::Raw, Some(cap)) if window.is_some() => {
                    format!("streaming the image into its partition ({cap} bytes at byte {offset})")
                }
                (Plan::Raw, Some(cap)) => format!("streaming the image to the disk ({cap} bytes)"),
                (Plan::Raw, None) => "streaming the image to the disk".to_owned(),
            })?;
        (plan, sink.finish().context("writing the image")?)
    };

    // Everything after the compressed stream still belongs to the download and its digest.
    let (trailing, nonzero) = vmdeploy_shared::io::drain_to_eof(&mut download)
        .context("reading the end of the download")?;
    if trailing > 0 {
        if compression == Compression::None {
            // The sink read the download to its end; nothing can follow it undigested.
            bail!("internal error: {trailing} bytes after the end of an uncompressed image");
        }
        if nonzero {
            bail!(
                "{trailing} bytes of unexpected data after the end of the {compression:?} stream"
            );
        }
        tracing::warn!(
            trailing,
            "ignoring zero padding after the compressed stream"
        );
    }
    let (download, _) = download.into_inner();
    let (_, chain_hasher, downloaded) = download.into_parts();
    let digest = verify(expected, done.digest.or(chain_hasher))?;

    let (format, image_len) = match plan {
        Plan::Raw => {
            sink::write_head(disk, offset, &done.head).context("writing the first MiB")?;
            (ImageFormat::Raw, done.len)
        }
        Plan::Qcow2 { spool, .. } => {
            let size = convert_spool(disk, spool, done.len, capacity, progress)?;
            (ImageFormat::Qcow2, size)
        }
    };
    // The sinks count the blocks as they go, which leaves out the held-back first MiB; once the
    // head is down, the disk holds exactly the image, and its size is known whatever the format.
    progress.image_total.store(image_len, Ordering::Relaxed);
    progress.written.store(image_len, Ordering::Relaxed);
    disk.sync().context("syncing the disk")?;
    if window.is_none() {
        disk.reread_partition_table();
    }
    Ok(WriteOutcome {
        compression,
        format,
        downloaded,
        image_len,
        digest,
    })
}

/// Compares the digest of the download with `expected`; the verified `algo:hex`.
fn verify(
    expected: Option<&ExpectedDigest>,
    hasher: Option<Hasher>,
) -> anyhow::Result<Option<String>> {
    match (expected, hasher) {
        (Some(want), Some(h)) => {
            want.verify(&h.finalize_hex())?;
            tracing::info!(digest = %want, "image checksum verified");
            Ok(Some(want.to_string()))
        }
        (Some(_), None) => bail!("internal error: the image digest was lost before verification"),
        (None, _) => Ok(None),
    }
}

/// Converts the verified qcow2 spool (`len` bytes at `spool`) to raw at offset 0, first MiB last,
/// and wipes the spool's header; the raw image's size.
fn convert_spool(
    disk: &Arc<Disk>,
    spool: u64,
    len: u64,
    capacity: Option<u64>,
    progress: &Progress,
) -> anyhow::Result<u64> {
    disk.sync().context("syncing the qcow2 spool")?;
    let region = qcow2::DiskRegion::open(disk.path().to_owned(), spool, len)
        .context("opening the qcow2 spool")?;
    let mut sink = ImageSink::new(
        Arc::clone(disk),
        0,
        true,
        Arc::clone(&progress.written),
        None,
    )
    .context("starting the disk writer")?;
    let size = qcow2::convert(region, &mut sink)?;
    let SinkDone { head, .. } = sink.finish().context("writing the converted image")?;
    sink::write_head(disk, 0, &head).context("writing the first MiB")?;
    // Wipe the spool's header so the leftover is not mistaken for an image later.
    let wipe = match capacity {
        Some(cap) => (cap - spool).min(HEAD_LEN as u64) as usize,
        None => HEAD_LEN.min(len as usize),
    };
    sink::zero_head(disk, spool, wipe).context("wiping the qcow2 spool header")?;
    Ok(size)
}

/// Options of the `write-image` command.
#[derive(Debug, Clone, clap::Args)]
pub struct WriteImageArgs {
    /// Image URL (http:// or https://).
    #[arg(long)]
    pub url: String,
    /// Target disk: a block device (or an image file).
    #[arg(long)]
    pub disk: std::path::PathBuf,
    /// Expected digest of the download: ALGO:HEX (md5, sha256, sha512) or bare hex.
    #[arg(long)]
    pub checksum: Option<ExpectedDigest>,
    /// PEM file with the only CA to trust for https:// URLs.
    #[arg(long)]
    pub ca: Option<std::path::PathBuf>,
    /// Pause before the first download retry, in milliseconds (doubles per retry, capped at 10 s;
    /// default `VMDEPLOY_RETRY_BACKOFF_MS` or 500). A test aid, read by hand: clap's `env`
    /// feature is left out of the agent for the deploy ISO's size budget.
    #[arg(long, hide = true)]
    pub retry_backoff_ms: Option<u64>,
}

/// The retry pause when `--retry-backoff-ms` is not given.
fn default_retry_backoff_ms() -> u64 {
    std::env::var("VMDEPLOY_RETRY_BACKOFF_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
}

/// `vmdeploy-agent write-image`: stream, verify and write; progress on stderr.
pub fn run_write_image(args: WriteImageArgs) -> anyhow::Result<()> {
    // clap parsed --checksum (a bad one is a usage error, exit 64); a CA file that cannot be
    // read is one too: running again unchanged cannot help.
    let expected = args.checksum;
    let ca_pem = args
        .ca
        .as_ref()
        .map(|p| {
            std::fs::read(p)
                .map_err(vmdeploy_shared::exit::UsageError::wrap)
                .with_context(|| format!("reading the CA file {}", p.display()))
        })
        .transpose()?;
    let disk = Arc::new(
        Disk::open(&args.disk)
            .with_context(|| format!("opening the disk {}", args.disk.display()))?,
    );
    tracing::info!(disk = %args.disk.display(), direct = disk.is_direct(), "disk opened");
    let progress = Arc::new(Progress::default());
    let opts = source::HttpOptions {
        ca_pem,
        retry_backoff: std::time::Duration::from_millis(
            args.retry_backoff_ms
                .unwrap_or_else(default_retry_backoff_ms),
        ),
        ..Default::default()
    };
    let source = source::spawn_download(&args.url, &opts, Arc::clone(&progress))?;
    let reporter =
        progress::ConsoleReporter::start(Arc::clone(&progress), std::time::Duration::from_secs(2));
    let outcome = write_image_from(source, Arc::clone(&disk), expected.as_ref(), &progress);
    drop(reporter);
    let outcome = outcome?;
    eprintln!("progress: {}", progress.line());
    eprintln!(
        "image written: {} bytes ({:?}, {:?}) from {} bytes downloaded{}",
        outcome.image_len,
        outcome.format,
        outcome.compression,
        outcome.downloaded,
        outcome
            .digest
            .as_deref()
            .map(|d| format!(", checksum {d} verified"))
            .unwrap_or_default()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Cursor, Write};

    fn disk_file(len: usize) -> (tempfile::TempDir, Arc<Disk>) {
        let dir = tempfile::Builder::new()
            .prefix("vmdeploy-stream-test")
            .tempdir_in("/var/tmp")
            .expect("scratch dir");
        let path = dir.path().join("disk.img");
        std::fs::write(&path, vec![0xEEu8; len]).expect("disk file");
        let disk = Arc::new(Disk::open(&path).expect("open"));
        (dir, disk)
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).expect("in memory");
        e.finish().expect("in memory")
    }

    #[test]
    fn gzip_stream_with_digest_over_the_compressed_bytes() {
        let image: Vec<u8> = (0..3 * HEAD_LEN + 123).map(|i| (i % 253) as u8).collect();
        let packed = gzip(&image);
        let want = ExpectedDigest::new(
            vmdeploy_shared::io::hash::HashAlgo::Sha256,
            &vmdeploy_shared::io::hash::digest_reader(
                vmdeploy_shared::io::hash::HashAlgo::Sha256,
                &packed[..],
            )
            .expect("digest"),
        )
        .expect("valid");
        let (_dir, disk) = disk_file(4 * HEAD_LEN);
        let progress = Progress::default();
        let out = write_image_from(
            Cursor::new(packed.clone()),
            Arc::clone(&disk),
            Some(&want),
            &progress,
        )
        .expect("written");
        assert_eq!(out.compression, Compression::Gzip);
        assert_eq!(out.image_len, image.len() as u64);
        assert_eq!(out.downloaded, packed.len() as u64);
        let back = std::fs::read(disk.path()).expect("read back");
        assert_eq!(&back[..image.len()], &image[..]);
        assert!(back[image.len()..].iter().all(|&b| b == 0xEE));
    }

    #[test]
    fn trailing_garbage_after_a_compressed_stream_fails_and_zeroes_the_head() {
        let image = vec![7u8; 2 * HEAD_LEN];
        let mut packed = gzip(&image);
        // Not a gzip member: MultiGzDecoder reports it, or the drain finds it.
        packed.extend_from_slice(b"garbage");
        let (_dir, disk) = disk_file(3 * HEAD_LEN);
        let err = write_image_from(
            Cursor::new(packed),
            Arc::clone(&disk),
            None,
            &Progress::default(),
        )
        .expect_err("trailing data");
        assert!(
            format!("{err:#}").contains("streaming the image"),
            "{err:#}"
        );
        let back = std::fs::read(disk.path()).expect("read back");
        assert!(back[..HEAD_LEN].iter().all(|&b| b == 0), "first MiB zeroed");
    }

    fn sha256(data: &[u8]) -> ExpectedDigest {
        use vmdeploy_shared::io::hash::{digest_reader, HashAlgo};
        let hex = digest_reader(HashAlgo::Sha256, data).expect("in memory");
        ExpectedDigest::new(HashAlgo::Sha256, &hex).expect("valid")
    }

    #[test]
    fn raw_image_digest_is_the_sinks_from_the_first_byte() {
        let image: Vec<u8> = (0..3 * HEAD_LEN + 4321).map(|i| (i % 241) as u8).collect();
        let (_dir, disk) = disk_file(4 * HEAD_LEN);
        let out = write_image_from(
            Cursor::new(image.clone()),
            Arc::clone(&disk),
            Some(&sha256(&image)),
            &Progress::default(),
        )
        .expect("written");
        assert_eq!(
            (out.compression, out.format),
            (Compression::None, ImageFormat::Raw)
        );
        assert_eq!(out.downloaded, image.len() as u64);
        let back = std::fs::read(disk.path()).expect("read back");
        assert_eq!(&back[..image.len()], &image[..]);

        // One byte off: a mismatch, told apart by type, and the disk does not boot.
        let mut other = image.clone();
        other[HEAD_LEN + 7] ^= 1;
        let (_dir, disk) = disk_file(4 * HEAD_LEN);
        let err = write_image_from(
            Cursor::new(other),
            Arc::clone(&disk),
            Some(&sha256(&image)),
            &Progress::default(),
        )
        .expect_err("mismatch");
        assert!(
            err.chain()
                .any(|c| c.is::<vmdeploy_shared::io::hash::HashError>()),
            "{err:#}"
        );
        assert!(
            format!("{err:#}").contains("so the first MiB of the disk was zeroed"),
            "{err:#}"
        );
        let back = std::fs::read(disk.path()).expect("read back");
        assert!(back[..HEAD_LEN].iter().all(|&b| b == 0), "first MiB zeroed");
    }

    #[test]
    fn when_zeroing_fails_too_the_error_says_so() {
        let (dir, _) = disk_file(2 * HEAD_LEN);
        let disk = Arc::new(Disk::open_read_only(&dir.path().join("disk.img")).expect("ro"));
        let err = write_image_from(
            Cursor::new(vec![1u8; 3 * HEAD_LEN]),
            disk,
            None,
            &Progress::default(),
        )
        .expect_err("a read-only disk");
        let msg = format!("{err:#}");
        assert!(
            msg.contains("zeroing the first MiB of the disk failed too"),
            "{msg}"
        );
        assert!(!msg.contains("was zeroed"), "{msg}");
    }

    #[test]
    fn the_plan_comes_from_the_header() {
        let virtual_size = 10 * HEAD_LEN as u64 + 1;
        let qcow = Qcow2Header {
            version: 3,
            virtual_size,
        }
        .to_bytes();
        let spool = 11 * HEAD_LEN as u64;
        assert_eq!(Plan::choose(b"raw bytes", Some(1)).expect("raw"), Plan::Raw);
        assert_eq!(Plan::choose(&[], None).expect("empty"), Plan::Raw);
        assert_eq!(
            Plan::choose(&qcow, None).expect("a file grows"),
            Plan::Qcow2 {
                spool,
                virtual_size
            }
        );
        assert_eq!(
            Plan::choose(&qcow, Some(spool + HEAD_LEN as u64)).expect("fits"),
            Plan::Qcow2 {
                spool,
                virtual_size
            }
        );
        let err = Plan::choose(&qcow, Some(spool + HEAD_LEN as u64 - 1)).expect_err("no room");
        assert!(err.to_string().contains("does not fit the disk"), "{err}");
        assert_eq!(
            Plan::Qcow2 {
                spool,
                virtual_size
            }
            .room(Some(spool + 5)),
            5
        );
        assert_eq!(Plan::Raw.room(None), u64::MAX);
    }

    /// A qcow2 file made by `qemu-img` from `raw` (its virtual size is `raw.len()`).
    fn qemu_img_qcow2(dir: &std::path::Path, raw: &[u8]) -> Vec<u8> {
        let src = dir.join("src.raw");
        let dst = dir.join("src.qcow2");
        std::fs::write(&src, raw).expect("raw source");
        let out = std::process::Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "qcow2"])
            .arg(&src)
            .arg(&dst)
            .output()
            .expect("qemu-img runs (install qemu-utils, or run scripts/setup)");
        assert!(out.status.success(), "qemu-img convert: {out:?}");
        std::fs::read(&dst).expect("qcow2 file")
    }

    /// Runs `write_image_from` while sampling the heartbeat's progress every millisecond, as
    /// the heartbeat loop would; the outcome, every sample, and the last one.
    fn write_sampling_progress(
        download: Vec<u8>,
        disk: Arc<Disk>,
    ) -> (
        WriteOutcome,
        Vec<vmdeploy_shared::api::ipa::WriteProgress>,
        vmdeploy_shared::api::ipa::WriteProgress,
    ) {
        use crate::api::heartbeat::{progress_of, ProgressSlot};
        use std::sync::atomic::AtomicBool;
        use std::time::{Duration, Instant};
        let progress = Arc::new(Progress::default());
        // What the HTTP sources store once the response headers are in (Content-Length).
        progress
            .download_total
            .store(download.len() as u64, Ordering::Relaxed);
        let slot = ProgressSlot {
            progress: Arc::clone(&progress),
            started: Instant::now(),
            ended: None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let (slot, stop) = (slot.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    seen.push(progress_of(&slot, Instant::now()));
                    std::thread::sleep(Duration::from_millis(1));
                }
                seen
            })
        };
        let out = write_image_from(Cursor::new(download), disk, None, &progress);
        stop.store(true, Ordering::Relaxed);
        let seen = sampler.join().expect("sampler thread");
        let last = progress_of(&slot, Instant::now());
        (out.expect("written"), seen, last)
    }

    #[test]
    fn qcow2_progress_is_against_the_virtual_size_and_never_past_100_percent() {
        // 8 MiB virtual, 3 MiB of data: the qcow2 file is much smaller than the image.
        let virtual_size = 8 * HEAD_LEN;
        let mut raw = vec![0u8; virtual_size];
        for (i, b) in raw[..3 * HEAD_LEN].iter_mut().enumerate() {
            *b = (i % 251) as u8 | 1;
        }
        let (dir, disk) = disk_file(16 * HEAD_LEN);
        let qcow = qemu_img_qcow2(dir.path(), &raw);
        assert!(qcow.len() < virtual_size / 2, "{} bytes", qcow.len());
        let (out, seen, last) = write_sampling_progress(qcow, Arc::clone(&disk));
        assert_eq!(out.format, ImageFormat::Qcow2);
        assert_eq!(out.image_len, virtual_size as u64);
        let back = std::fs::read(disk.path()).expect("read back");
        assert!(back[..virtual_size] == raw[..], "the disk holds the image");
        assert_eq!(last.total, Some(virtual_size as u64), "{last:?}");
        assert_eq!(last.written, virtual_size as u64, "{last:?}");
        for p in &seen {
            assert!(p.total.is_none_or(|t| p.written <= t), "past 100%: {p:?}");
        }
    }

    #[test]
    fn a_qcow2_whose_l1_table_lies_past_its_end_is_refused_before_conversion() {
        let raw: Vec<u8> = (0..2 * HEAD_LEN).map(|i| (i % 253) as u8).collect();
        let (dir, disk) = disk_file(8 * HEAD_LEN);
        let mut qcow = qemu_img_qcow2(dir.path(), &raw);
        // l1_size (header offset 36) forged to a million entries: an 8 MB table in a small file.
        qcow[36..40].copy_from_slice(&1_000_000u32.to_be_bytes());
        let err = write_image_from(Cursor::new(qcow), disk, None, &Progress::default())
            .expect_err("a corrupt qcow2");
        assert!(
            format!("{err:#}").contains("past the image's end"),
            "{err:#}"
        );
    }

    #[test]
    fn compressed_raw_progress_never_claims_the_download_size_as_the_image_size() {
        let image: Vec<u8> = (0..4 * HEAD_LEN).map(|i| (i % 13) as u8).collect();
        let packed = gzip(&image);
        let (_dir, disk) = disk_file(5 * HEAD_LEN);
        let (out, seen, last) = write_sampling_progress(packed, Arc::clone(&disk));
        assert_eq!(out.image_len, image.len() as u64);
        // The raw size of a compressed stream is known only at its end.
        assert_eq!(last.written, image.len() as u64, "{last:?}");
        assert_eq!(last.total, Some(image.len() as u64), "{last:?}");
        for p in seen.iter().chain([&last]) {
            assert!(p.total.is_none_or(|t| p.written <= t), "past 100%: {p:?}");
        }
    }

    #[test]
    fn raw_progress_is_against_the_download_size() {
        let image: Vec<u8> = (0..3 * HEAD_LEN + 99).map(|i| (i % 7) as u8).collect();
        let (_dir, disk) = disk_file(4 * HEAD_LEN);
        let (_, seen, last) = write_sampling_progress(image.clone(), Arc::clone(&disk));
        assert_eq!(last.total, Some(image.len() as u64), "{last:?}");
        assert_eq!(last.written, image.len() as u64, "{last:?}");
        for p in &seen {
            assert!(p.total.is_none_or(|t| p.written <= t), "past 100%: {p:?}");
        }
    }

    #[test]
    fn empty_and_tiny_images() {
        for len in [0usize, 1, 511, 4097] {
            let image: Vec<u8> = (0..len).map(|i| i as u8 | 1).collect();
            let (_dir, disk) = disk_file(2 * HEAD_LEN);
            let out = write_image_from(
                Cursor::new(image.clone()),
                Arc::clone(&disk),
                None,
                &Progress::default(),
            )
            .expect("written");
            assert_eq!(out.image_len, len as u64);
            let back = std::fs::read(disk.path()).expect("read back");
            assert_eq!(&back[..len], &image[..], "len {len}");
            assert!(back[len..].iter().all(|&b| b == 0xEE), "len {len}");
        }
    }
}
