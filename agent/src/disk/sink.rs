//! [`ImageSink`]: the `Write` end of the image stream. Aligned blocks, a bounded queue to three
//! writer threads, and the first MiB held back.
//!
//! Given a hasher, the sink owns the stream's digest from its first byte to its last: the
//! held-back head on the caller's thread, every block after it on a hashing thread of its own
//! that reads each block while the writers write it (the block goes back to the pool when both
//! are done). SHA-256 (~1.8 GB/s on one core here) then runs beside the `recv` + TCP work of the
//! reading thread instead of after it, which is what lets the stream keep up with the disk on
//! two cores (bench/agent-stream.sh).
//!
//! The fast way in is [`ImageSink::fill_from`]: it reads the source straight into the aligned
//! block that will be handed to `pwrite`, so the bytes of a raw image are copied once, by the
//! kernel's `recv`, on their way from the socket to the disk (the `Write` impl copies once more,
//! for decoders that produce their own buffers).

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vmdeploy_shared::io::hash::Hasher;

use super::{AlignedBuf, Disk, HEAD_LEN};

/// Size of one disk write: 4 MiB, the block size of the `dd bs=4M oflag=direct` peer that
/// docs/architecture.md §10 measures against; large writes keep per-request overhead of a loop device or a
/// USB/SAS disk small.
pub const BLOCK_LEN: usize = 4 * 1024 * 1024;

/// Writer threads, hence disk writes in flight. A single synchronous writer leaves the disk idle
/// between writes, which is exactly `dd`'s pace and no better; three keep the loop device and
/// the disk under it busier than two did (bench/agent-stream.sh without a checksum, under load:
/// medians 1684-1686 MiB/s with three against 1448 with two, dd at 995 and 966).
pub const WRITERS: usize = 3;

/// Full blocks queued for the writer threads besides those being written. The queue is what
/// absorbs the moments the hashing thread or the reading thread is off the CPU: with one queued
/// block the profile (`perf trace -s`, 1 GiB with sha256 under load) showed the reading thread
/// waiting 240 ms for a free block while each writer sat idle 560-600 ms, the blocks held by a
/// hasher that had fallen behind; three queued blocks took the agent from 590 to 828 MiB/s and
/// from 778 to 1015 MiB/s in two interleaved runs (dd at 1047 and 995).
pub const QUEUE_DEPTH: usize = 3;

/// Blocks in the pool: one per writer, the queued ones, and the one being filled
/// (7 × 4 MiB = 28 MiB, inside the agent's 64 MiB memory bound, docs/architecture.md §10). A
/// block being hashed is also being written or queued, so hashing needs no blocks of its own.
pub const POOL_BLOCKS: usize = WRITERS + QUEUE_DEPTH + 1;

/// Largest single read into a block: a whole block. Fewer, larger `recv` calls cost less kernel
/// time per byte on the reading thread (fewer TCP window updates; three 1 GiB runs from loopback
/// nginx: 0.21–0.30 s of system time vs 0.19–0.47 s with 512 KiB reads); the digest is taken
/// on the hashing thread, so keeping a read within L2 no longer matters.
pub const READ_LEN: usize = BLOCK_LEN;

/// A full block and the disk offset it goes to.
type Job = (Arc<AlignedBuf>, u64);

/// Hands a block back to the pool once its last user (writer or hasher) is done with it.
fn release(block: Arc<AlignedBuf>, free: &SyncSender<AlignedBuf>) {
    if let Some(buf) = Arc::into_inner(block) {
        // The sink may be gone already (finish joins after the last job).
        let _ = free.send(buf);
    }
}

/// Where the sink's digest is.
enum HashStage {
    /// The sink does not hash.
    Off,
    /// No block submitted yet: the head (if any) is still to be digested.
    Pending(Hasher),
    /// The hashing thread: blocks go in, in stream order; the hasher comes back.
    Running {
        blocks: SyncSender<Arc<AlignedBuf>>,
        thread: JoinHandle<Hasher>,
    },
}

/// Accepts the decoded image as a byte stream and writes it to `disk` starting at `base`.
///
/// With `hold_head`, the first [`HEAD_LEN`] bytes are kept in memory and not written:
/// [`ImageSink::finish`] hands them back, and the caller writes them with [`write_head`] only
/// once the image is verified.
pub struct ImageSink {
    base: u64,
    hash: HashStage,
    free_tx: SyncSender<AlignedBuf>,
    head: Option<AlignedBuf>,
    pos: u64,
    cur: Option<AlignedBuf>,
    cur_offset: u64,
    jobs: Option<SyncSender<Job>>,
    free: Receiver<AlignedBuf>,
    workers: Vec<JoinHandle<io::Result<()>>>,
}

/// What [`ImageSink::finish`] returns: the bytes held back and the stream length.
#[derive(Debug)]
pub struct SinkDone {
    /// The first bytes of the stream (at most [`HEAD_LEN`]), not yet on disk; empty without
    /// `hold_head`.
    pub head: AlignedBuf,
    /// Bytes the stream had.
    pub len: u64,
    /// The hasher given to [`ImageSink::new`], having digested the whole stream.
    pub digest: Option<Hasher>,
}

/// One writer thread: takes jobs until the queue closes or another writer failed.
fn writer_loop(
    disk: &Disk,
    jobs: &Mutex<Receiver<Job>>,
    free: &SyncSender<AlignedBuf>,
    written: &AtomicU64,
    failed: &AtomicBool,
) -> io::Result<()> {
    loop {
        if failed.load(Ordering::Relaxed) {
            return Ok(());
        }
        // The lock is held only while waiting for the next job, not while writing.
        let job = jobs.lock().unwrap_or_else(|p| p.into_inner()).recv();
        let Ok((buf, offset)) = job else {
            return Ok(());
        };
        let len = buf.len();
        let result = disk.write_at(&buf, offset);
        // Back to the pool even after a failure, so the sink never waits for a lost block.
        release(buf, free);
        if let Err(e) = result {
            failed.store(true, Ordering::Relaxed);
            return Err(io::Error::new(
                e.kind(),
                format!("writing {len} bytes at offset {offset}: {e}"),
            ));
        }
        written.fetch_add(len as u64, Ordering::Relaxed);
    }
}

/// Reads into `buf`, retrying on `Interrupted`.
fn read_retrying(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

impl ImageSink {
    /// A sink writing at `base` (block-aligned), counting bytes written into `written`, and
    /// digesting the whole stream with `digest` when given ([`SinkDone::digest`] returns it).
    pub fn new(
        disk: Arc<Disk>,
        base: u64,
        hold_head: bool,
        written: Arc<AtomicU64>,
        digest: Option<Hasher>,
    ) -> io::Result<ImageSink> {
        if !base.is_multiple_of(super::MEM_ALIGN as u64) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("sink base offset {base} is not aligned"),
            ));
        }
        let (jobs_tx, jobs_rx) = mpsc::sync_channel::<Job>(QUEUE_DEPTH);
        let (free_tx, free_rx) = mpsc::sync_channel::<AlignedBuf>(POOL_BLOCKS);
        for _ in 0..POOL_BLOCKS {
            free_tx
                .send(AlignedBuf::with_capacity(BLOCK_LEN))
                .expect("the pool channel has room for every buffer");
        }
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let failed = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::with_capacity(WRITERS);
        for i in 0..WRITERS {
            let disk = Arc::clone(&disk);
            let jobs = Arc::clone(&jobs_rx);
            let free = free_tx.clone();
            let written = Arc::clone(&written);
            let failed = Arc::clone(&failed);
            let spawned = std::thread::Builder::new()
                .name(format!("disk-writer-{i}"))
                .spawn(move || writer_loop(&disk, &jobs, &free, &written, &failed));
            match spawned {
                Ok(w) => workers.push(w),
                Err(e) => {
                    // Closing the queue stops the writers already started.
                    drop(jobs_tx);
                    for w in workers {
                        let _ = w.join();
                    }
                    return Err(e);
                }
            }
        }
        Ok(ImageSink {
            base,
            hash: digest.map_or(HashStage::Off, HashStage::Pending),
            free_tx,
            head: hold_head.then(|| AlignedBuf::with_capacity(HEAD_LEN)),
            pos: 0,
            cur: None,
            cur_offset: 0,
            jobs: Some(jobs_tx),
            free: free_rx,
            workers,
        })
    }

    /// Bytes accepted so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Digests the head and starts the hashing thread (at the first block).
    fn start_hashing(&mut self) -> io::Result<()> {
        if !matches!(self.hash, HashStage::Pending(_)) {
            return Ok(());
        }
        let HashStage::Pending(mut hasher) = std::mem::replace(&mut self.hash, HashStage::Off)
        else {
            return Ok(());
        };
        if let Some(head) = &self.head {
            hasher.update(head);
        }
        let (tx, rx) = mpsc::sync_channel::<Arc<AlignedBuf>>(POOL_BLOCKS);
        let free = self.free_tx.clone();
        let thread = std::thread::Builder::new()
            .name("hasher".into())
            .spawn(move || {
                for block in rx {
                    // The reading thread filled the block on its own core: cold here.
                    hasher.update_cold(&block);
                    release(block, &free);
                }
                hasher
            })?;
        self.hash = HashStage::Running { blocks: tx, thread };
        Ok(())
    }

    /// Stops the hashing thread (when running) and returns the hasher.
    fn stop_hashing(&mut self) -> io::Result<Option<Hasher>> {
        match std::mem::replace(&mut self.hash, HashStage::Off) {
            HashStage::Off => Ok(None),
            HashStage::Pending(mut hasher) => {
                // No block was ever submitted: only the head holds data.
                if let Some(head) = &self.head {
                    hasher.update(head);
                }
                Ok(Some(hasher))
            }
            HashStage::Running { blocks, thread } => {
                drop(blocks);
                thread
                    .join()
                    .map(Some)
                    .map_err(|_| io::Error::other("the hashing thread panicked"))
            }
        }
    }

    /// Closes the queue and waits for every writer; the first writer error, if any.
    fn join_workers(&mut self) -> io::Result<()> {
        self.jobs = None;
        let mut result = Ok(());
        for w in self.workers.drain(..) {
            let r = match w.join() {
                Ok(r) => r,
                Err(_) => Err(io::Error::other("a disk writer thread panicked")),
            };
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    /// The writers stopped early: collect their error.
    fn worker_error(&mut self) -> io::Error {
        match self.join_workers() {
            Err(e) => e,
            Ok(()) => io::Error::other("the disk writers stopped"),
        }
    }

    /// Makes sure a block is being filled, waiting for a free one.
    fn take_block(&mut self) -> io::Result<()> {
        if self.cur.is_none() {
            let mut buf = loop {
                match self
                    .free
                    .recv_timeout(std::time::Duration::from_millis(200))
                {
                    Ok(buf) => break buf,
                    // Blocks come back from the writers and the hasher; when every writer has
                    // stopped (a write failed), none may come any more.
                    Err(RecvTimeoutError::Timeout) => {
                        if self.workers.iter().all(|w| w.is_finished()) {
                            return Err(self.worker_error());
                        }
                    }
                    Err(RecvTimeoutError::Disconnected) => return Err(self.worker_error()),
                }
            };
            buf.clear();
            self.cur = Some(buf);
            self.cur_offset = self.base + self.pos;
        }
        Ok(())
    }

    fn submit(&mut self) -> io::Result<()> {
        let Some(buf) = self.cur.take() else {
            return Ok(());
        };
        if buf.is_empty() {
            self.cur = Some(buf);
            return Ok(());
        }
        self.start_hashing()?;
        let block = Arc::new(buf);
        if let HashStage::Running { blocks, .. } = &self.hash {
            if blocks.send(Arc::clone(&block)).is_err() {
                return Err(io::Error::other("the hashing thread stopped"));
            }
        }
        let sent = match &self.jobs {
            Some(jobs) => jobs.send((block, self.cur_offset)).is_ok(),
            None => false,
        };
        if sent {
            Ok(())
        } else {
            Err(self.worker_error())
        }
    }

    /// Reads `r` to its end straight into the held-back head and the aligned blocks (no copy in
    /// between), at most [`READ_LEN`] bytes per read; returns the bytes read.
    pub fn fill_from(&mut self, r: &mut impl Read) -> io::Result<u64> {
        let start = self.pos;
        loop {
            let n = match self.head.as_mut().filter(|h| h.remaining() > 0) {
                Some(head) => {
                    let len = head.len();
                    let room = head.remaining().min(READ_LEN);
                    let n = read_retrying(r, &mut head.full_mut()[len..len + room])?;
                    let filled = head.set_len_within(len + n);
                    debug_assert!(filled, "a read fills at most the room it was given");
                    n
                }
                None => {
                    self.take_block()?;
                    let cur = self.cur.as_mut().expect("take_block leaves a block");
                    let len = cur.len();
                    let room = cur.remaining().min(READ_LEN);
                    let n = read_retrying(r, &mut cur.full_mut()[len..len + room])?;
                    let filled = cur.set_len_within(len + n);
                    debug_assert!(filled, "a read fills at most the room it was given");
                    if cur.remaining() == 0 {
                        self.pos += n as u64;
                        self.submit()?;
                        continue;
                    }
                    n
                }
            };
            if n == 0 {
                return Ok(self.pos - start);
            }
            self.pos += n as u64;
        }
    }

    /// Writes out what is buffered, waits for the writer threads, and returns the held-back head.
    pub fn finish(mut self) -> io::Result<SinkDone> {
        self.submit()?;
        let digest = self.stop_hashing()?;
        self.join_workers()?;
        Ok(SinkDone {
            head: self.head.take().unwrap_or_else(|| AlignedBuf::zeroed(0)),
            len: self.pos,
            digest,
        })
    }
}

impl Write for ImageSink {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut n = 0;
        if let Some(head) = &mut self.head {
            let take = head.extend_from(data);
            self.pos += take as u64;
            n = take;
        }
        while n < data.len() {
            self.take_block()?;
            let cur = self.cur.as_mut().expect("take_block leaves a block");
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
        // Stop the threads on early exit (error paths); their result no longer matters then.
        let _ = self.stop_hashing();
        let _ = self.join_workers();
    }
}

/// Writes the held-back head at `base` (through an aligned copy when `head` is not aligned, so
/// O_DIRECT accepts it).
pub fn write_head(disk: &Disk, base: u64, head: &[u8]) -> io::Result<()> {
    if head.is_empty() {
        return Ok(());
    }
    if (head.as_ptr() as usize).is_multiple_of(super::MEM_ALIGN) {
        return disk.write_at(head, base);
    }
    let mut buf = AlignedBuf::with_capacity(head.len());
    buf.extend_from(head);
    disk.write_at(&buf, base)
}

/// Overwrites the first `len` bytes at `base` with zeros and syncs: a failed deploy must not
/// leave a disk that boots half an image (docs/style.md §3 "log, clean up, then fail").
pub fn zero_head(disk: &Disk, base: u64, len: usize) -> io::Result<()> {
    let buf = AlignedBuf::zeroed(len.min(HEAD_LEN));
    disk.write_at(&buf, base)?;
    disk.sync()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmdeploy_shared::io::hash::{digest_reader, HashAlgo};

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
            let disk = Arc::new(Disk::open(&path).expect("open"));
            let written = Arc::new(AtomicU64::new(0));
            let mut sink = ImageSink::new(Arc::clone(&disk), 0, true, Arc::clone(&written), None)
                .expect("sink");
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
            assert_eq!(&done.head[..], &data[..len.min(HEAD_LEN)]);
            disk.sync().expect("sync");
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
        let disk = Arc::new(Disk::open_read_only(&path).expect("ro open"));
        let mut sink =
            ImageSink::new(disk, 0, false, Arc::new(AtomicU64::new(0)), None).expect("sink");
        let data = vec![1u8; BLOCK_LEN * (POOL_BLOCKS + 2)];
        let result = sink
            .write_all(&data)
            .and_then(|()| sink.finish().map(|_| ()));
        let err = result.expect_err("writes to a read-only fd fail");
        assert!(err.to_string().contains("writing"), "{err}");
    }

    /// Hands out the stream in the sizes it is given (cycled), like `recv` on a socket.
    struct Chunked<'a> {
        data: &'a [u8],
        sizes: Vec<usize>,
        next: usize,
    }
    impl Read for Chunked<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let want = self.sizes[self.next % self.sizes.len()];
            self.next += 1;
            let n = want.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    /// Runs `data` through `fill_from` in the given read sizes; checks disk, head and counters.
    /// With `digest`, the sink also digests the stream.
    fn fill_and_check(data: &[u8], sizes: Vec<usize>, hold_head: bool, base: u64, digest: bool) {
        let len = data.len();
        let (_dir, path) = scratch_disk(base as usize + len + 8192);
        let disk = Arc::new(Disk::open(&path).expect("open"));
        let written = Arc::new(AtomicU64::new(0));
        let mut sink = ImageSink::new(
            Arc::clone(&disk),
            base,
            hold_head,
            Arc::clone(&written),
            digest.then(|| Hasher::new(HashAlgo::Sha256)),
        )
        .expect("sink");
        let mut src = Chunked {
            data,
            sizes,
            next: 0,
        };
        assert_eq!(sink.fill_from(&mut src).expect("filling"), len as u64);
        let done = sink.finish().expect("finishing");
        assert_eq!(done.len, len as u64);
        let held = if hold_head { len.min(HEAD_LEN) } else { 0 };
        assert_eq!(&done.head[..], &data[..held]);
        match (digest, done.digest) {
            (true, Some(h)) => {
                let want = digest_reader(HashAlgo::Sha256, data).expect("in memory");
                assert_eq!(h.finalize_hex(), want, "digest of the whole stream");
            }
            (false, None) => {}
            (d, h) => panic!("digest asked {d}, returned {h:?}"),
        }
        assert_eq!(written.load(Ordering::Relaxed), (len - held) as u64);
        let back = std::fs::read(&path).expect("read back");
        let b = base as usize;
        assert!(
            back[..b + held].iter().all(|&x| x == 0xEE),
            "head held back"
        );
        assert_eq!(&back[b + held..b + len], &data[held..], "body on disk");
        assert!(
            back[b + len..].iter().all(|&x| x == 0xEE),
            "nothing past it"
        );
    }

    #[test]
    fn fill_from_block_and_head_boundaries() {
        let sizes = [
            0,
            1,
            HEAD_LEN - 1,
            HEAD_LEN,
            HEAD_LEN + 1,
            HEAD_LEN + BLOCK_LEN,
            HEAD_LEN + BLOCK_LEN + 4095,
            HEAD_LEN + POOL_BLOCKS * BLOCK_LEN + 1,
        ];
        for len in sizes {
            let data = pattern(len);
            fill_and_check(&data, vec![READ_LEN], true, 0, false);
            fill_and_check(&data, vec![65_537, 3, 1 << 20], false, 8192, true);
            fill_and_check(&data, vec![READ_LEN], true, 0, true);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        #[test]
        fn fill_from_any_read_sizes_gives_the_stream_back(
            len in 0usize..(HEAD_LEN + 2 * BLOCK_LEN + 5000),
            sizes in proptest::collection::vec(1usize..(READ_LEN + 100), 1..8),
            hold_head in proptest::bool::ANY,
            digest in proptest::bool::ANY,
        ) {
            fill_and_check(&pattern(len), sizes, hold_head, 0, digest);
        }
    }
}
