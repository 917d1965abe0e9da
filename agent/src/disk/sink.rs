//! [`ImageSink`]: the `Write` end of the image stream. Aligned blocks, a bounded queue to one
//! writer thread, and the first MiB held back.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::{AlignedBuf, DiskWriter, HEAD_LEN};

/// Size of one disk write: 4 MiB, the block size of the `dd bs=4M oflag=direct` peer that
/// DESIGN.md §10 measures against; large writes keep per-request overhead of a loop device or a
/// USB/SAS disk small.
pub const BLOCK_LEN: usize = 4 * 1024 * 1024;

/// Blocks queued for (or being written by) the writer thread besides the one being filled. Three
/// lets the disk always have the next write ready while the network side fills the next; the
/// pool is then 4 × 4 MiB = 16 MiB, inside the agent's 32 MiB memory aim (DESIGN.md §10).
pub const QUEUE_DEPTH: usize = 3;

type Job = (AlignedBuf, u64);

/// Accepts the decoded image as a byte stream and writes it to `disk` starting at `base`.
///
/// With `hold_head`, the first [`HEAD_LEN`] bytes are kept in memory and not written:
/// [`ImageSink::finish`] hands them back, and the caller writes them with [`write_head`] only
/// once the image is verified.
pub struct ImageSink {
    disk: Arc<DiskWriter>,
    base: u64,
    head: Option<Vec<u8>>,
    pos: u64,
    cur: Option<AlignedBuf>,
    cur_offset: u64,
    jobs: Option<SyncSender<Job>>,
    free: Receiver<AlignedBuf>,
    worker: Option<JoinHandle<io::Result<()>>>,
}

/// What [`ImageSink::finish`] returns: the bytes held back and the stream length.
#[derive(Debug)]
pub struct SinkDone {
    /// The first bytes of the stream (at most [`HEAD_LEN`]), not yet on disk; empty without
    /// `hold_head`.
    pub head: Vec<u8>,
    /// Bytes the stream had.
    pub len: u64,
}

impl ImageSink {
    /// A sink writing at `base` (block-aligned), counting bytes written into `written`.
    pub fn new(
        disk: Arc<DiskWriter>,
        base: u64,
        hold_head: bool,
        written: Arc<AtomicU64>,
    ) -> io::Result<ImageSink> {
        if !base.is_multiple_of(super::MEM_ALIGN as u64) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("sink base offset {base} is not aligned"),
            ));
        }
        let (jobs_tx, jobs_rx) = mpsc::sync_channel::<Job>(QUEUE_DEPTH);
        let (free_tx, free_rx) = mpsc::sync_channel::<AlignedBuf>(QUEUE_DEPTH + 1);
        for _ in 0..=QUEUE_DEPTH {
            free_tx
                .send(AlignedBuf::new(BLOCK_LEN))
                .expect("the pool channel has room for every buffer");
        }
        let worker_disk = Arc::clone(&disk);
        let worker = std::thread::Builder::new()
            .name("disk-writer".into())
            .spawn(move || -> io::Result<()> {
                for (buf, offset) in jobs_rx {
                    worker_disk.write_all_at(&buf, offset).map_err(|e| {
                        io::Error::new(
                            e.kind(),
                            format!("writing {} bytes at offset {offset}: {e}", buf.len()),
                        )
                    })?;
                    written.fetch_add(buf.len() as u64, Ordering::Relaxed);
                    // The sink may be gone already (finish joins after the last job).
                    let _ = free_tx.send(buf);
                }
                Ok(())
            })?;
        Ok(ImageSink {
            disk,
            base,
            head: hold_head.then(|| Vec::with_capacity(HEAD_LEN)),
            pos: 0,
            cur: None,
            cur_offset: 0,
            jobs: Some(jobs_tx),
            free: free_rx,
            worker: Some(worker),
        })
    }

    /// Bytes accepted so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The worker stopped early: collect its error.
    fn worker_error(&mut self) -> io::Error {
        self.jobs = None;
        match self.worker.take().map(|w| w.join()) {
            Some(Ok(Err(e))) => e,
            Some(Err(_)) => io::Error::other("the disk writer thread panicked"),
            _ => io::Error::other("the disk writer stopped"),
        }
    }

    fn submit(&mut self) -> io::Result<()> {
        let Some(buf) = self.cur.take() else {
            return Ok(());
        };
        if buf.is_empty() {
            return Ok(());
        }
        let sent = match &self.jobs {
            Some(jobs) => jobs.send((buf, self.cur_offset)).is_ok(),
            None => false,
        };
        if sent {
            Ok(())
        } else {
            Err(self.worker_error())
        }
    }

    /// Writes out what is buffered, waits for the writer thread, and returns the held-back head.
    pub fn finish(mut self) -> io::Result<SinkDone> {
        self.submit()?;
        self.jobs = None;
        match self.worker.take().map(|w| w.join()) {
            Some(Ok(Ok(()))) => {}
            Some(Ok(Err(e))) => return Err(e),
            Some(Err(_)) => return Err(io::Error::other("the disk writer thread panicked")),
            None => return Err(io::Error::other("the disk writer stopped")),
        }
        Ok(SinkDone {
            head: self.head.take().unwrap_or_default(),
            len: self.pos,
        })
    }
}

impl Write for ImageSink {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut n = 0;
        if let Some(head) = &mut self.head {
            if head.len() < HEAD_LEN {
                let take = data.len().min(HEAD_LEN - head.len());
                head.extend_from_slice(&data[..take]);
                self.pos += take as u64;
                n = take;
            }
        }
        while n < data.len() {
            if self.cur.is_none() {
                match self.free.recv() {
                    Ok(mut buf) => {
                        buf.clear();
                        self.cur = Some(buf);
                        self.cur_offset = self.base + self.pos;
                    }
                    Err(_) => return Err(self.worker_error()),
                }
            }
            let cur = self.cur.as_mut().expect("filled just above");
            let k = cur.extend_from(&data[n..]);
            n += k;
            self.pos += k as u64;
            if cur.remaining() == 0 {
                self.submit()?;
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for ImageSink {
    fn drop(&mut self) {
        // Stop the worker on early exit (error paths); its result no longer matters then.
        self.jobs = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        let _ = &self.disk;
    }
}

/// Writes the held-back head at `base` (aligned copy, so O_DIRECT accepts it).
pub fn write_head(disk: &DiskWriter, base: u64, head: &[u8]) -> io::Result<()> {
    if head.is_empty() {
        return Ok(());
    }
    let mut buf = AlignedBuf::new(HEAD_LEN);
    buf.extend_from(head);
    disk.write_all_at(&buf, base)
}

/// Overwrites the first `len` bytes at `base` with zeros and syncs: a failed deploy must not
/// leave a disk that boots half an image (STYLE.md §3 "log, clean up, then fail").
pub fn zero_head(disk: &DiskWriter, base: u64, len: usize) -> io::Result<()> {
    let mut buf = AlignedBuf::new(HEAD_LEN);
    buf.set_len(len.min(HEAD_LEN));
    disk.write_all_at(&buf, base)?;
    disk.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_disk(len: usize) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::Builder::new()
            .prefix("vmdeploy-sink-test")
            .tempdir_in("/var/tmp")
            .expect("scratch dir");
        let path = dir.path().join("disk.img");
        std::fs::write(&path, vec![0xEEu8; len]).expect("disk file");
        (dir, path)
    }

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn head_is_held_back_and_tail_handled_for_odd_sizes_and_chunks() {
        let cases: &[(usize, usize)] = &[
            (1, 1),
            (HEAD_LEN - 1, 4096),
            (HEAD_LEN + 1, 1),
            (HEAD_LEN + BLOCK_LEN + 777, 65_537),
            (3 * BLOCK_LEN + 4096, 1 << 20),
        ];
        for &(len, chunk) in cases {
            let (_dir, path) = scratch_disk(len + 8192);
            let disk = Arc::new(DiskWriter::open(&path).expect("open"));
            let written = Arc::new(AtomicU64::new(0));
            let mut sink =
                ImageSink::new(Arc::clone(&disk), 0, true, Arc::clone(&written)).expect("sink");
            let data = pattern(len);
            // 1-byte writes are slow; use them only for the small cases.
            let chunk = if len > 4 * HEAD_LEN {
                chunk
            } else {
                chunk.max(1)
            };
            for piece in data.chunks(chunk) {
                sink.write_all(piece).expect("writing");
            }
            let done = sink.finish().expect("finishing");
            assert_eq!(done.len, len as u64);
            assert_eq!(done.head, data[..len.min(HEAD_LEN)]);
            disk.sync_data().expect("sync");
            let back = std::fs::read(&path).expect("read back");
            assert!(
                back[..len.min(HEAD_LEN)].iter().all(|&b| b == 0xEE),
                "head not written before verification (len {len})"
            );
            assert_eq!(
                &back[HEAD_LEN.min(len)..len],
                &data[HEAD_LEN.min(len)..],
                "len {len}"
            );
            assert!(
                back[len..].iter().all(|&b| b == 0xEE),
                "nothing past the image"
            );
            assert_eq!(
                written.load(Ordering::Relaxed),
                (len.saturating_sub(HEAD_LEN)) as u64
            );
            write_head(&disk, 0, &done.head).expect("head");
            let back = std::fs::read(&path).expect("read back");
            assert_eq!(&back[..len], &data[..], "len {len}");
            zero_head(&disk, 0, HEAD_LEN.min(len)).expect("zero");
            let back = std::fs::read(&path).expect("read back");
            assert!(back[..HEAD_LEN.min(len)].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn write_error_surfaces_from_the_worker() {
        // A block device-less way to make writes fail: a read-only descriptor.
        let (_dir, path) = scratch_disk(4096);
        let file = std::fs::File::open(&path).expect("ro open");
        let disk = Arc::new(DiskWriter::Buffered(super::super::BufferedWriter {
            file,
            path: path.clone(),
            block_device: false,
        }));
        let mut sink = ImageSink::new(disk, 0, false, Arc::new(AtomicU64::new(0))).expect("sink");
        let data = vec![1u8; BLOCK_LEN * (QUEUE_DEPTH + 3)];
        let result = sink
            .write_all(&data)
            .and_then(|()| sink.finish().map(|_| ()));
        let err = result.expect_err("writes to a read-only fd fail");
        assert!(err.to_string().contains("writing"), "{err}");
    }
}
