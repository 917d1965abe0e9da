//! The agent_ilo image stream: HTTP(S) body → checksum → decompress → (qcow2 spool) → disk.
//!
//! # Design
//! One function reads top to bottom ([`write_image_from`], STYLE.md §2, after coreos-installer's
//! `write_image`): the source is hashed exactly as downloaded (Ironic's `os_hash_value` and
//! `image_checksum` are digests of the image file, ../shared/reference/ironic-protocols.md §3.4),
//! then peeked for compression magic, decompressed, limited to the disk's size and written by
//! [`ImageSink`] with the first MiB held back. The rest of the source is drained to EOF
//! (CVE-2021-20319: a decoder may stop before the end), the digest compared, and only then the
//! first MiB written and the disk synced. Any failure zeroes the first MiB, so a half-written or
//! unverified image never boots.
//!
//! Speed (bench/agent-stream.sh): for an uncompressed image the bytes the sink receives are the
//! download itself, so the digest moves from the reading chain to the sink's hashing thread
//! ([`ImageSink::hash_blocks`]), and `http://` bodies are read by [`plain`] straight into the
//! disk blocks: one copy (the kernel's `recv`) between socket and disk, SHA-256 on one core and
//! `recv` + TCP on the other.
//!
//! # Limitations
//! One image at a time; the HTTP side is [`http`] / [`plain`] (resume with Range, bounded
//! retries). Compressed images are hashed on the reading thread, before decoding.

pub mod decompress;
pub mod http;
pub mod plain;
pub mod progress;
pub mod qcow2;

use std::io::Read;
use std::sync::Arc;

use anyhow::{bail, Context};
use vmdeploy_shared::io::hash::{ExpectedDigest, HashReader, Hasher};
use vmdeploy_shared::io::limit::LimitReader;
use vmdeploy_shared::io::peek::PeekReader;
use vmdeploy_shared::io::BUFFER_SIZE;

use crate::disk::sink::{self, ImageSink};
use crate::disk::{DiskWriter, HEAD_LEN};
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

/// Writes the image read from `source` to `disk`, verifying `expected` when given.
///
/// On failure the first MiB of the disk is zeroed (best effort, logged) before the error is
/// returned; a checksum failure's error is a [`vmdeploy_shared::io::hash::HashError::Mismatch`]
/// (downcast to tell it apart).
pub fn write_image_from(
    source: impl Read,
    disk: Arc<DiskWriter>,
    expected: Option<&ExpectedDigest>,
    progress: &Progress,
) -> anyhow::Result<WriteOutcome> {
    let result = write_verified(source, &disk, expected, progress);
    if let Err(err) = &result {
        tracing::error!(disk = %disk.path().display(), "image write failed: {err:#}");
        let len = match disk.capacity() {
            Ok(Some(cap)) => (cap.min(HEAD_LEN as u64)) as usize,
            _ => HEAD_LEN,
        };
        match sink::zero_head(&disk, 0, len) {
            Ok(()) => tracing::info!("zeroed the first MiB of the disk after the failure"),
            Err(e) => tracing::error!("zeroing the first MiB after the failure also failed: {e}"),
        }
    }
    result
}

fn write_verified(
    source: impl Read,
    disk: &Arc<DiskWriter>,
    expected: Option<&ExpectedDigest>,
    progress: &Progress,
) -> anyhow::Result<WriteOutcome> {
    let capacity = disk.capacity().context("reading the disk size")?;
    let mut hashed = HashReader::new(source, expected.map(|d| Hasher::new(d.algo)));
    let mut outer = PeekReader::with_capacity(BUFFER_SIZE, &mut hashed);
    let compression = Compression::detect(
        outer
            .peek(decompress::MAGIC_LEN)
            .context("reading the image")?,
    );
    tracing::info!(?compression, "image stream started");
    // Uncompressed, the bytes the sink receives are the download itself, in order: the sink
    // digests them on its own thread (disk/sink.rs), beside the reading thread's recv work.
    // What was read so far (the peeked bytes) is already in the digest.
    let offload = match compression {
        Compression::None => {
            let already = outer.get_mut().count();
            outer.get_mut().take_hasher().map(|h| (h, already))
        }
        _ => None,
    };

    // Decode into the disk; what is written depends on the inner format.
    enum Written {
        Raw(sink::SinkDone),
        Qcow2 {
            spool: u64,
            len: u64,
            hasher: Option<Hasher>,
        },
    }
    let mut written = {
        let decoded = compression.decoder(&mut outer);
        let mut inner = PeekReader::with_capacity(BUFFER_SIZE, decoded);
        let head = inner
            .peek(qcow2::HEADER_LEN)
            .with_context(|| format!("decoding the {compression:?} image"))?;
        if qcow2::is_qcow2(head) {
            let header = qcow2::parse_header(head)?;
            let spool = qcow2::spool_offset(&header)?;
            let room = match capacity {
                Some(cap) if cap < spool + HEAD_LEN as u64 => bail!(
                    "the qcow2 image's virtual size ({} bytes) does not fit the disk ({cap} bytes) with room to spool it",
                    header.virtual_size
                ),
                Some(cap) => cap - spool,
                None => u64::MAX,
            };
            tracing::info!(
                virtual_size = header.virtual_size,
                spool,
                "qcow2 image: spooling beyond its end"
            );
            let mut sink = ImageSink::new(
                Arc::clone(disk),
                spool,
                false,
                Arc::clone(&progress.written),
            )
            .context("starting the disk writer")?;
            if let Some((hasher, already)) = offload {
                sink.hash_blocks(hasher, already);
            }
            sink.fill_from(&mut LimitReader::new(inner, room))
                .context("spooling the qcow2 image (it must fit behind its own virtual size)")?;
            let done = sink.finish().context("writing the qcow2 spool")?;
            Written::Qcow2 {
                spool,
                len: done.len,
                hasher: done.hasher,
            }
        } else {
            let limit = capacity.unwrap_or(u64::MAX);
            let mut sink = ImageSink::new(Arc::clone(disk), 0, true, Arc::clone(&progress.written))
                .context("starting the disk writer")?;
            if let Some((hasher, already)) = offload {
                sink.hash_blocks(hasher, already);
            }
            sink.fill_from(&mut LimitReader::new(inner, limit))
                .with_context(|| match capacity {
                    Some(cap) => format!("streaming the image to the disk ({cap} bytes)"),
                    None => "streaming the image to the disk".to_owned(),
                })?;
            Written::Raw(sink.finish().context("writing the image")?)
        }
    };

    // The sink's digest (if it took one) continues over anything after the image.
    match &mut written {
        Written::Raw(done) => {
            if let Some(h) = done.hasher.take() {
                outer.get_mut().put_hasher(Some(h));
            }
        }
        Written::Qcow2 { hasher, .. } => {
            if let Some(h) = hasher.take() {
                outer.get_mut().put_hasher(Some(h));
            }
        }
    }
    // Everything after the compressed stream still belongs to the download and its digest.
    let (trailing, nonzero) =
        vmdeploy_shared::io::drain_to_eof(&mut outer).context("reading the end of the download")?;
    drop(outer);
    if trailing > 0 {
        if nonzero && compression != Compression::None {
            bail!(
                "{trailing} bytes of unexpected data after the end of the {compression:?} stream"
            );
        }
        tracing::warn!(
            trailing,
            "ignoring zero padding after the compressed stream"
        );
    }
    let (_, hasher, downloaded) = hashed.into_parts();
    let digest = match (expected, hasher) {
        (Some(want), Some(h)) => {
            let got = h.finalize_hex();
            want.verify(&got)?;
            tracing::info!(digest = %want, "image checksum verified");
            Some(want.to_string())
        }
        (Some(_), None) => bail!("internal error: the image digest was lost before verification"),
        (None, _) => None,
    };

    let (format, image_len) = match written {
        Written::Raw(done) => {
            sink::write_head(disk, 0, &done.head).context("writing the first MiB")?;
            (ImageFormat::Raw, done.len)
        }
        Written::Qcow2 { spool, len, .. } => {
            disk.sync_data().context("syncing the qcow2 spool")?;
            let region = qcow2::DiskRegion::open(disk.path().to_owned(), spool, len)
                .context("opening the qcow2 spool")?;
            let mut sink = ImageSink::new(Arc::clone(disk), 0, true, Arc::clone(&progress.written))
                .context("starting the disk writer")?;
            let size = qcow2::convert(region, &mut sink)?;
            let done = sink.finish().context("writing the converted image")?;
            sink::write_head(disk, 0, &done.head).context("writing the first MiB")?;
            // Wipe the spool's header so the leftover is not mistaken for an image later.
            let wipe = match capacity {
                Some(cap) => (cap - spool).min(HEAD_LEN as u64) as usize,
                None => HEAD_LEN.min(len as usize),
            };
            sink::zero_head(disk, spool, wipe).context("wiping the qcow2 spool header")?;
            (ImageFormat::Qcow2, size)
        }
    };
    // The sinks count the blocks as they go, which leaves out the held-back first MiB and, for
    // qcow2, counts the spool too; once the head is down, the disk holds exactly the image.
    progress
        .written
        .store(image_len, std::sync::atomic::Ordering::Relaxed);
    disk.sync_data().context("syncing the disk")?;
    disk.reread_partition_table();
    Ok(WriteOutcome {
        compression,
        format,
        downloaded,
        image_len,
        digest,
    })
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
    pub checksum: Option<String>,
    /// PEM file with the only CA to trust for https:// URLs.
    #[arg(long)]
    pub ca: Option<std::path::PathBuf>,
    /// Pause before the first download retry, in milliseconds (doubles per retry, capped at 10 s).
    #[arg(
        long,
        hide = true,
        env = "VMDEPLOY_RETRY_BACKOFF_MS",
        default_value_t = 500
    )]
    pub retry_backoff_ms: u64,
}

/// `vmdeploy-agent write-image`: stream, verify and write; progress on stderr.
pub fn run_write_image(args: WriteImageArgs) -> anyhow::Result<()> {
    let expected = args
        .checksum
        .as_deref()
        .map(str::parse::<ExpectedDigest>)
        .transpose()
        .context("parsing --checksum")?;
    let ca_pem = args
        .ca
        .as_ref()
        .map(|p| std::fs::read(p).with_context(|| format!("reading the CA file {}", p.display())))
        .transpose()?;
    let disk = Arc::new(
        DiskWriter::open(&args.disk)
            .with_context(|| format!("opening the disk {}", args.disk.display()))?,
    );
    tracing::info!(disk = %args.disk.display(), direct = disk.is_direct(), "disk opened");
    let progress = Arc::new(Progress::default());
    let opts = http::HttpOptions {
        ca_pem,
        retry_backoff: std::time::Duration::from_millis(args.retry_backoff_ms),
        ..Default::default()
    };
    let source = http::spawn_download(&args.url, &opts, Arc::clone(&progress))?;
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

    fn disk_file(len: usize) -> (tempfile::TempDir, Arc<DiskWriter>) {
        let dir = tempfile::Builder::new()
            .prefix("vmdeploy-stream-test")
            .tempdir_in("/var/tmp")
            .expect("scratch dir");
        let path = dir.path().join("disk.img");
        std::fs::write(&path, vec![0xEEu8; len]).expect("disk file");
        let disk = Arc::new(DiskWriter::open(&path).expect("open"));
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
