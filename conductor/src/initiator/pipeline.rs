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
/// reference/iscsi-and-swift-peers.md §1).
pub const DEFAULT_QUEUE_DEPTH: usize = 16;

/// WRITE commands in flight, completed in submission order; the ones still queued are aborted
/// if the pipeline is dropped early (an error).
struct WritePipeline<'a> {
    session: &'a Session,
    queue: VecDeque<JoinHandle<Result<(), InitiatorError>>>,
    depth: usize,
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
    fn new(session: &'a Session, len: u64, depth: usize) -> Result<Self, InitiatorError> {
        if len > session.size_bytes() {
            return Err(InitiatorError::Range(format!(
                "the image ({len} bytes) is larger than the LUN ({} bytes)",
                session.size_bytes()
            )));
        }
        Ok(WritePipeline {
            session,
            queue: VecDeque::new(),
            depth: depth.max(1),
            lba: 0,
            bytes: 0,
            started: std::time::Instant::now(),
        })
    }

    /// Queues the next chunk (padded with zeroes to whole blocks); waits for the oldest WRITE
    /// when `depth` are in flight.
    async fn push(&mut self, mut chunk: BytesMut) -> Result<(), InitiatorError> {
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

/// Writes `len` bytes from `src` to the LUN from offset 0, with `depth` WRITEs in flight, then
/// SYNCHRONIZE CACHE. A last partial block is padded with zeroes. Returns the bytes written.
pub async fn write_image<R: AsyncRead + Unpin>(
    session: &Session,
    mut src: R,
    len: u64,
    depth: usize,
) -> Result<u64, InitiatorError> {
    let mut pipeline = WritePipeline::new(session, len, depth)?;
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
/// kernel's; tokio's async file would add two: DESIGN.md §10 throughput target).
pub async fn write_file(
    session: &Session,
    path: &std::path::Path,
    depth: usize,
) -> Result<u64, InitiatorError> {
    use std::io::Read as _;
    let mut file =
        std::fs::File::open(path).map_err(|e| InitiatorError::Io("opening the image", e))?;
    let len = file
        .metadata()
        .map_err(|e| InitiatorError::Io("reading the image's size", e))?
        .len();
    let mut pipeline = WritePipeline::new(session, len, depth)?;
    let io = session.io_size();
    let (tx, mut rx) = mpsc::channel::<Result<BytesMut, InitiatorError>>(depth.max(1));
    let reader = tokio::task::spawn_blocking(move || {
        let mut done = 0u64;
        while done < len {
            let want = io.min((len - done) as usize);
            let mut buf = BytesMut::zeroed(want);
            let chunk = match file.read_exact(&mut buf) {
                Ok(()) => Ok(buf),
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    Err(early_end(done, len))
                }
                Err(e) => Err(InitiatorError::Io("reading the image", e)),
            };
            let failed = chunk.is_err();
            if tx.blocking_send(chunk).is_err() || failed {
                return;
            }
            done += want as u64;
        }
    });
    while let Some(chunk) = rx.recv().await {
        pipeline.push(chunk?).await?;
    }
    drop(rx);
    let _ = reader.await;
    if pipeline.bytes != len {
        return Err(early_end(pipeline.bytes, len));
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
