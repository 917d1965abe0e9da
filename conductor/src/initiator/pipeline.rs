//! Whole-LUN transfers with many commands in flight: [`write_image`] / [`write_file`] and
//! [`read_image`] / [`read_to_file`] keep a queue of WRITEs or READs on one [`Session`] and
//! consume the results in order, so the network, the target's disk and the local file all work
//! at once.
//!
//! # Design
//! A pipeline spawns each command as a task and awaits the oldest when `depth` are in flight;
//! dropping it early (an error) aborts the rest. The file variants read or write the local file
//! on a blocking thread, straight into or out of the buffers the PDUs use.

use std::collections::VecDeque;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::info;

use super::session::Session;
use super::InitiatorError;

/// Commands [`write_image`]/[`read_image`] keep in flight by default: enough to cover the
/// round trip of an R2T and the target's disk latency (tgtd queues 128 per session,
/// docs/iscsi-and-swift-peers.md §1).
pub const DEFAULT_QUEUE_DEPTH: usize = 16;

/// WRITE commands in flight, completed in submission order; the ones still queued are aborted
/// if the pipeline is dropped early (an error).
struct WritePipeline<'a> {
    session: &'a Session,
    queue: VecDeque<JoinHandle<Result<(), InitiatorError>>>,
    depth: usize,
    /// Where the next chunk goes, unless [`WritePipeline::push_at`] says otherwise.
    lba: u64,
    bytes: u64,
    started: std::time::Instant,
}

impl Drop for WritePipeline<'_> {
    fn drop(&mut self) {
        for handle in &self.queue {
            handle.abort();
        }
    }
}

async fn join<T>(handle: JoinHandle<Result<T, InitiatorError>>) -> Result<T, InitiatorError> {
    handle
        .await
        .map_err(|e| InitiatorError::Protocol(format!("a command task ended abnormally: {e}")))?
}

impl<'a> WritePipeline<'a> {
    fn new(session: &'a Session, depth: usize) -> Self {
        WritePipeline {
            session,
            queue: VecDeque::new(),
            depth: depth.max(1),
            lba: 0,
            bytes: 0,
            started: std::time::Instant::now(),
        }
    }

    /// Queues the next chunk (padded with zeroes to whole blocks); waits for the oldest WRITE
    /// when `depth` are in flight.
    async fn push(&mut self, chunk: BytesMut) -> Result<(), InitiatorError> {
        self.push_at(self.lba, chunk).await
    }

    /// Queues a chunk (padded with zeroes to whole blocks) at block `lba`; waits for the oldest
    /// WRITE when `depth` are in flight.
    async fn push_at(&mut self, lba: u64, mut chunk: BytesMut) -> Result<(), InitiatorError> {
        self.lba = lba;
        let bl = self.session.block_len();
        self.bytes += chunk.len() as u64;
        let padded = chunk.len().div_ceil(bl) * bl;
        chunk.resize(padded, 0);
        let data = chunk.freeze();
        let blocks = (data.len() / bl) as u64;
        let (s, lba) = (self.session.clone(), self.lba);
        self.queue
            .push_back(tokio::spawn(async move { s.write(lba, data).await }));
        self.lba += blocks;
        if self.queue.len() >= self.depth {
            let front = self.queue.pop_front().expect("queue is not empty");
            join(front).await?;
        }
        Ok(())
    }

    /// Waits for every WRITE, then SYNCHRONIZE CACHE.
    async fn finish(mut self) -> Result<u64, InitiatorError> {
        while let Some(front) = self.queue.pop_front() {
            join(front).await?;
        }
        self.session.synchronize_cache().await?;
        let secs = self.started.elapsed().as_secs_f64();
        info!(
            bytes = self.bytes,
            secs,
            mb_per_s = self.bytes as f64 / secs.max(1e-9) / 1e6,
            "image written"
        );
        Ok(self.bytes)
    }
}

fn early_end(done: u64, len: u64) -> InitiatorError {
    InitiatorError::Io(
        "reading the image",
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("the image ended after {done} of {len} bytes"),
        ),
    )
}

fn check_fits(session: &Session, len: u64) -> Result<(), InitiatorError> {
    if len > session.size_bytes() {
        return Err(InitiatorError::Range(format!(
            "the image ({len} bytes) is larger than the LUN ({} bytes)",
            session.size_bytes()
        )));
    }
    Ok(())
}

/// Writes `len` bytes from `src` to the LUN from offset 0, with `depth` WRITEs in flight, then
/// SYNCHRONIZE CACHE. A last partial block is padded with zeroes. Returns the bytes written.
pub async fn write_image<R: AsyncRead + Unpin>(
    session: &Session,
    mut src: R,
    len: u64,
    depth: usize,
) -> Result<u64, InitiatorError> {
    check_fits(session, len)?;
    let mut pipeline = WritePipeline::new(session, depth);
    let io = session.io_size();
    let mut done = 0u64;
    while done < len {
        let want = io.min((len - done) as usize);
        let mut buf = BytesMut::with_capacity(want);
        while buf.len() < want {
            let n = (&mut src)
                .take((want - buf.len()) as u64)
                .read_buf(&mut buf)
                .await
                .map_err(|e| InitiatorError::Io("reading the image", e))?;
            if n == 0 {
                return Err(early_end(done + buf.len() as u64, len));
            }
        }
        done += want as u64;
        pipeline.push(buf).await?;
    }
    pipeline.finish().await
}

/// Writes a local file to the LUN from offset 0, like [`write_image`]. The file is read on a
/// blocking thread straight into the buffers the Data-Out PDUs are sent from (one copy, the
/// kernel's; tokio's async file would add two: docs/architecture.md §10 throughput target).
pub async fn write_file(
    session: &Session,
    path: &std::path::Path,
    depth: usize,
) -> Result<u64, InitiatorError> {
    let len = std::fs::metadata(path)
        .map_err(|e| InitiatorError::Io("reading the image's size", e))?
        .len();
    check_fits(session, len)?;
    write_file_ranges(session, path, 0, &[(0, len)], depth).await
}

/// Writes the byte ranges `ranges` (`(offset, length)` in the file, in order) of a local file
/// to the LUN at `disk_offset` + their offset, with `depth` WRITEs in flight, then SYNCHRONIZE
/// CACHE; what lies between the ranges is left as it is on the LUN. Each range is widened to
/// whole LUN blocks (the widening is read from the file too; past its end it is zeroes), and
/// ranges that then touch are merged. `disk_offset` must be a whole number of blocks. Returns the
/// bytes of the file that were sent (before padding). Reads run on a blocking thread straight
/// into the PDU buffers, as [`write_file`].
pub async fn write_file_ranges(
    session: &Session,
    path: &std::path::Path,
    disk_offset: u64,
    ranges: &[(u64, u64)],
    depth: usize,
) -> Result<u64, InitiatorError> {
    let bl = session.block_len() as u64;
    if !disk_offset.is_multiple_of(bl) {
        return Err(InitiatorError::Range(format!(
            "offset {disk_offset} is not a whole number of {bl}-byte blocks"
        )));
    }
    let spans = block_spans(ranges, bl)?;
    if let Some(&(start, len)) = spans.last() {
        let end = disk_offset.saturating_add(start).saturating_add(len);
        if end > session.size_bytes() {
            return Err(InitiatorError::Range(format!(
                "writing up to byte {end} is past the LUN's end ({} bytes)",
                session.size_bytes()
            )));
        }
    }
    let file = std::fs::File::open(path).map_err(|e| InitiatorError::Io("opening the image", e))?;
    let mut pipeline = WritePipeline::new(session, depth);
    let io = session.io_size() as u64;
    let (tx, mut rx) = mpsc::channel::<Result<(u64, BytesMut), InitiatorError>>(depth.max(1));
    let reader = tokio::task::spawn_blocking(move || {
        for (start, len) in spans {
            let mut done = 0u64;
            while done < len {
                let want = io.min(len - done) as usize;
                let mut buf = BytesMut::zeroed(want);
                let chunk = read_full_at(&file, &mut buf, start + done)
                    .map(|()| ((disk_offset + start + done) / bl, buf))
                    .map_err(|e| InitiatorError::Io("reading the image", e));
                let failed = chunk.is_err();
                if tx.blocking_send(chunk).is_err() || failed {
                    return;
                }
                done += want as u64;
            }
        }
    });
    while let Some(chunk) = rx.recv().await {
        let (lba, buf) = chunk?;
        pipeline.push_at(lba, buf).await?;
    }
    drop(rx);
    reader
        .await
        .map_err(|e| InitiatorError::Protocol(format!("the file reader ended abnormally: {e}")))?;
    pipeline.finish().await
}

/// `buf.len()` bytes of `file` from `offset`; what lies past the file's end stays as it is
/// (zeroes in a fresh buffer).
fn read_full_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt as _;
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `ranges` widened to whole `bl`-byte blocks and merged where they touch; empty ranges are
/// dropped. The ranges must be in order and not overlap.
pub fn block_spans(ranges: &[(u64, u64)], bl: u64) -> Result<Vec<(u64, u64)>, InitiatorError> {
    let mut spans: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    let mut prev_end = 0u64;
    for &(offset, len) in ranges {
        if len == 0 {
            continue;
        }
        let end = offset
            .checked_add(len)
            .ok_or_else(|| InitiatorError::Range(format!("range {offset}+{len} overflows")))?;
        if offset < prev_end {
            return Err(InitiatorError::Range(format!(
                "range {offset}+{len} is out of order or overlaps the one before"
            )));
        }
        prev_end = end;
        let start = offset / bl * bl;
        let end = end.div_ceil(bl) * bl;
        match spans.last_mut() {
            Some((s, l)) if *s + *l >= start => *l = end - *s,
            _ => spans.push((start, end - start)),
        }
    }
    Ok(spans)
}

/// Writes `data` to the LUN at byte `offset` (a whole number of blocks), padded with zeroes to
/// whole blocks, with `depth` WRITEs in flight, then SYNCHRONIZE CACHE.
pub async fn write_bytes_at(
    session: &Session,
    offset: u64,
    data: &[u8],
    depth: usize,
) -> Result<u64, InitiatorError> {
    let bl = session.block_len() as u64;
    let end = offset.saturating_add((data.len() as u64).div_ceil(bl) * bl);
    if !offset.is_multiple_of(bl) || end > session.size_bytes() {
        return Err(InitiatorError::Range(format!(
            "{} bytes at offset {offset} are not block-aligned or run past the LUN's end ({} \
             bytes)",
            data.len(),
            session.size_bytes()
        )));
    }
    let mut pipeline = WritePipeline::new(session, depth);
    for (i, chunk) in data.chunks(session.io_size()).enumerate() {
        let lba = (offset + (i * session.io_size()) as u64) / bl;
        pipeline.push_at(lba, BytesMut::from(chunk)).await?;
    }
    pipeline.finish().await
}

/// READ commands in flight, consumed in order; aborted if dropped early.
struct ReadPipeline<'a> {
    session: &'a Session,
    queue: VecDeque<JoinHandle<Result<Vec<u8>, InitiatorError>>>,
    depth: usize,
    next: u64,
}

impl Drop for ReadPipeline<'_> {
    fn drop(&mut self) {
        for handle in &self.queue {
            handle.abort();
        }
    }
}

impl ReadPipeline<'_> {
    /// The next chunk of the LUN in order, `None` at the end.
    async fn next(&mut self) -> Result<Option<Vec<u8>>, InitiatorError> {
        let per_io = (self.session.io_size() / self.session.block_len()) as u64;
        let total = self.session.capacity().blocks;
        while self.next < total && self.queue.len() < self.depth {
            let blocks = per_io.min(total - self.next) as u32;
            let (s, lba) = (self.session.clone(), self.next);
            self.queue
                .push_back(tokio::spawn(async move { s.read(lba, blocks).await }));
            self.next += u64::from(blocks);
        }
        match self.queue.pop_front() {
            Some(front) => join(front).await.map(Some),
            None => Ok(None),
        }
    }
}

/// Reads the whole LUN into `dst`, with `depth` READs in flight. Returns the bytes read.
pub async fn read_image<W: AsyncWrite + Unpin>(
    session: &Session,
    mut dst: W,
    depth: usize,
) -> Result<u64, InitiatorError> {
    let mut pipeline = ReadPipeline {
        session,
        queue: VecDeque::new(),
        depth: depth.max(1),
        next: 0,
    };
    let mut written = 0u64;
    while let Some(data) = pipeline.next().await? {
        dst.write_all(&data)
            .await
            .map_err(|e| InitiatorError::Io("writing the output", e))?;
        written += data.len() as u64;
    }
    dst.flush()
        .await
        .map_err(|e| InitiatorError::Io("writing the output", e))?;
    Ok(written)
}

/// Reads the whole LUN into a new local file, like [`read_image`], writing it on a blocking
/// thread (no extra copies through tokio's async file).
pub async fn read_to_file(
    session: &Session,
    path: &std::path::Path,
    depth: usize,
) -> Result<u64, InitiatorError> {
    use std::io::Write as _;
    let mut file =
        std::fs::File::create(path).map_err(|e| InitiatorError::Io("creating the output", e))?;
    let mut pipeline = ReadPipeline {
        session,
        queue: VecDeque::new(),
        depth: depth.max(1),
        next: 0,
    };
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(depth.max(1));
    let writer = tokio::task::spawn_blocking(move || -> std::io::Result<u64> {
        let mut written = 0u64;
        while let Some(data) = rx.blocking_recv() {
            file.write_all(&data)?;
            written += data.len() as u64;
        }
        file.flush()?;
        Ok(written)
    });
    let mut sent = Ok(());
    while let Some(data) = pipeline.next().await? {
        if tx.send(data).await.is_err() {
            sent = Err(());
            break;
        }
    }
    drop(tx);
    let written = writer
        .await
        .map_err(|e| InitiatorError::Protocol(format!("the file writer ended abnormally: {e}")))?
        .map_err(|e| InitiatorError::Io("writing the output", e))?;
    if sent.is_err() {
        return Err(InitiatorError::Io(
            "writing the output",
            std::io::Error::other("the file writer stopped early"),
        ));
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::block_spans;

    #[test]
    fn spans_widen_to_blocks_and_merge() {
        let spans = block_spans(
            &[(0, 100), (600, 10), (1030, 0), (2000, 100), (5000, 1)],
            512,
        )
        .expect("spans");
        assert_eq!(spans, vec![(0, 1024), (1536, 1024), (4608, 512)]);
        assert!(block_spans(&[(100, 10), (50, 10)], 512).is_err());
        assert!(block_spans(&[(u64::MAX, 10)], 512).is_err());
        assert_eq!(block_spans(&[], 4096).expect("none"), vec![]);
    }
}
