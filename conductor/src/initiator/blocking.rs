//! A blocking `Read + Write + Seek` view of a LUN, for the synchronous partitioning code
//! (docs/architecture.md §2 `layout`: partition plans on any Read+Write+Seek).
//!
//! # Design
//! Each call runs one or a few SCSI commands on the session through a runtime handle. Unaligned
//! reads read the covering blocks; unaligned writes read, merge and write back the covering
//! blocks. Calls move at most [`Session::io_size`] bytes each, so `std::io::copy` and friends
//! loop naturally.
//!
//! # Limitations
//! Call it from a thread that is not running async tasks (a `spawn_blocking` closure or a plain
//! thread): it blocks on the runtime. `flush` is SYNCHRONIZE CACHE.

use std::io::{self, Read, Seek, SeekFrom, Write};

use bytes::Bytes;
use tokio::runtime::Handle;

use super::{InitiatorError, Session};

/// A LUN as a file-like object.
pub struct BlockingLun {
    session: Session,
    handle: Handle,
    pos: u64,
}

fn io_err(e: InitiatorError) -> io::Error {
    io::Error::other(e)
}

impl BlockingLun {
    /// A view of `session`'s LUN, running commands on `handle`.
    pub fn new(session: Session, handle: Handle) -> BlockingLun {
        BlockingLun {
            session,
            handle,
            pos: 0,
        }
    }

    /// The session underneath.
    pub fn session(&self) -> &Session {
        &self.session
    }

    fn size(&self) -> u64 {
        self.session.size_bytes()
    }

    /// The byte span [`start`, `end`) widened to whole blocks: (first LBA, block count).
    fn cover(&self, start: u64, end: u64) -> (u64, u32) {
        let bl = self.session.block_len() as u64;
        let first = start / bl;
        let last = end.div_ceil(bl);
        (first, (last - first) as u32)
    }
}

impl Read for BlockingLun {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let size = self.size();
        if self.pos >= size || buf.is_empty() {
            return Ok(0);
        }
        let n = (buf.len() as u64)
            .min(size - self.pos)
            .min(self.session.io_size() as u64) as usize;
        let (lba, blocks) = self.cover(self.pos, self.pos + n as u64);
        let data = self
            .handle
            .block_on(self.session.read(lba, blocks))
            .map_err(io_err)?;
        let skip = (self.pos - lba * self.session.block_len() as u64) as usize;
        let available = data.len().saturating_sub(skip).min(n);
        buf[..available].copy_from_slice(&data[skip..skip + available]);
        self.pos += available as u64;
        Ok(available)
    }
}

impl Write for BlockingLun {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let size = self.size();
        if self.pos >= size {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!(
                    "write at byte {} is past the end of the LUN ({size} bytes)",
                    self.pos
                ),
            ));
        }
        let bl = self.session.block_len() as u64;
        let n = (buf.len() as u64)
            .min(size - self.pos)
            .min(self.session.io_size() as u64) as usize;
        let (lba, blocks) = self.cover(self.pos, self.pos + n as u64);
        let data = if self.pos.is_multiple_of(bl) && (n as u64).is_multiple_of(bl) {
            Bytes::copy_from_slice(&buf[..n])
        } else {
            let mut merged = self
                .handle
                .block_on(self.session.read(lba, blocks))
                .map_err(io_err)?;
            let skip = (self.pos - lba * bl) as usize;
            merged[skip..skip + n].copy_from_slice(&buf[..n]);
            Bytes::from(merged)
        };
        self.handle
            .block_on(self.session.write(lba, data))
            .map_err(io_err)?;
        self.pos += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.handle
            .block_on(self.session.synchronize_cache())
            .map_err(io_err)
    }
}

impl Seek for BlockingLun {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => self.size().checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        match target {
            Some(pos) => {
                self.pos = pos;
                Ok(pos)
            }
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek before the start of the LUN",
            )),
        }
    }
}
