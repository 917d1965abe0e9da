//! cpio "newc" (SVR4 portable, magic `070701`) archive writer: the format the Linux kernel unpacks
//! an initramfs from (the kernel's Documentation/driver-api/early-userspace/buffer-format.rst).
//!
//! # Format
//! Each entry is a 110-byte ASCII header (`070701` then 13 fields of 8 hex digits: ino, mode,
//! uid, gid, nlink, mtime, filesize, devmajor, devminor, rdevmajor, rdevminor, namesize, check),
//! the NUL-terminated name, NUL padding to a multiple of 4 bytes (counted from the start of the
//! header), the data (for a symlink: its target, no NUL), and NUL padding to a multiple of 4
//! again. The archive ends with an entry named `TRAILER!!!`. Sizes are 32-bit, so a file is at
//! most 4 GiB - 1.
//!
//! # Design
//! A streaming writer over any `Write` sink (a file, a gzip encoder): nothing is buffered but the
//! header. Every entry gets its own inode number, `nlink` 1 (2 for directories), uid/gid 0 and one
//! mtime for the whole archive (0 unless set), so an archive depends only on what was added.
//! Names are stored relative (`/init` is written as `init`), as the kernel and GNU cpio expect.

use std::io::{Read, Write};

/// The newc magic.
pub const MAGIC: &[u8; 6] = b"070701";
/// Length of a newc header.
pub const HEADER_LEN: usize = 110;
/// The name of the end-of-archive entry.
pub const TRAILER: &str = "TRAILER!!!";

/// File type bits of `mode` (stat(2)).
const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFLNK: u32 = 0o120_000;
const S_IFCHR: u32 = 0o020_000;
const S_IFBLK: u32 = 0o060_000;

/// Why an entry could not be written.
#[derive(Debug, thiserror::Error)]
pub enum CpioError {
    /// The sink failed.
    #[error("writing the cpio archive: {0}")]
    Io(#[from] std::io::Error),
    /// The name is empty, has a NUL byte or a `..` component, or is the trailer's.
    #[error("invalid entry name {name:?}: {reason}")]
    InvalidName {
        /// The offending name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// newc sizes are 32-bit.
    #[error("{name}: {len} bytes is over newc's 4 GiB - 1 limit")]
    TooLarge {
        /// The entry.
        name: String,
        /// Its length.
        len: u64,
    },
    /// The reader ended before the announced length.
    #[error("{name}: the reader gave {got} bytes, {expected} were announced")]
    ShortRead {
        /// The entry.
        name: String,
        /// Announced length.
        expected: u64,
        /// Bytes actually read.
        got: u64,
    },
    /// Permission bits only (`0o7777`) are taken; the type comes from the method.
    #[error("{name}: mode {mode:#o} has bits outside 0o7777")]
    InvalidMode {
        /// The entry.
        name: String,
        /// The mode given.
        mode: u32,
    },
    /// An entry was added after [`CpioWriter::finish`].
    #[error("the archive is already finished")]
    Finished,
}

/// A newc archive being written to `W`.
pub struct CpioWriter<W: Write> {
    out: W,
    next_ino: u32,
    mtime: u32,
    /// Bytes written so far (for the 4-byte alignment).
    offset: u64,
}

/// The fields of one header that differ between entries.
struct Header<'a> {
    name: &'a str,
    mode: u32,
    nlink: u32,
    filesize: u32,
    rdev: (u32, u32),
}

impl<W: Write> CpioWriter<W> {
    /// A writer with mtime 0 for every entry.
    pub fn new(out: W) -> Self {
        CpioWriter {
            out,
            next_ino: 1,
            mtime: 0,
            offset: 0,
        }
    }

    /// Sets the mtime (seconds since the epoch) of the entries written from now on.
    pub fn with_mtime(mut self, mtime: u32) -> Self {
        self.mtime = mtime;
        self
    }

    /// A directory (`mode`: permission bits, e.g. `0o755`).
    pub fn dir(&mut self, name: &str, mode: u32) -> Result<(), CpioError> {
        let name = check_name(name)?;
        let mode = check_mode(name, mode)?;
        self.header(&Header {
            name,
            mode: S_IFDIR | mode,
            nlink: 2,
            filesize: 0,
            rdev: (0, 0),
        })
    }

    /// A regular file with `data` as its contents.
    pub fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> Result<(), CpioError> {
        self.file_from_reader(name, mode, data.len() as u64, data)
    }

    /// A regular file of `len` bytes read from `reader` (exactly `len` bytes are taken).
    pub fn file_from_reader(
        &mut self,
        name: &str,
        mode: u32,
        len: u64,
        reader: impl Read,
    ) -> Result<(), CpioError> {
        let name = check_name(name)?;
        let mode = check_mode(name, mode)?;
        let filesize = u32::try_from(len).map_err(|_| CpioError::TooLarge {
            name: name.to_owned(),
            len,
        })?;
        self.header(&Header {
            name,
            mode: S_IFREG | mode,
            nlink: 1,
            filesize,
            rdev: (0, 0),
        })?;
        let got = std::io::copy(&mut reader.take(len), &mut self.out)?;
        self.offset += got;
        if got != len {
            return Err(CpioError::ShortRead {
                name: name.to_owned(),
                expected: len,
                got,
            });
        }
        self.pad()
    }

    /// A symbolic link `name` → `target`.
    pub fn symlink(&mut self, name: &str, target: &str) -> Result<(), CpioError> {
        let name = check_name(name)?;
        if target.is_empty() || target.contains('\0') {
            return Err(CpioError::InvalidName {
                name: target.to_owned(),
                reason: "a symlink target must be non-empty and free of NUL bytes",
            });
        }
        let filesize = u32::try_from(target.len()).map_err(|_| CpioError::TooLarge {
            name: name.to_owned(),
            len: target.len() as u64,
        })?;
        self.header(&Header {
            name,
            mode: S_IFLNK | 0o777,
            nlink: 1,
            filesize,
            rdev: (0, 0),
        })?;
        self.write(target.as_bytes())?;
        self.pad()
    }

    /// A character device node (e.g. `dev/console`, 5:1).
    pub fn char_device(
        &mut self,
        name: &str,
        mode: u32,
        major: u32,
        minor: u32,
    ) -> Result<(), CpioError> {
        self.device(name, S_IFCHR, mode, major, minor)
    }

    /// A block device node.
    pub fn block_device(
        &mut self,
        name: &str,
        mode: u32,
        major: u32,
        minor: u32,
    ) -> Result<(), CpioError> {
        self.device(name, S_IFBLK, mode, major, minor)
    }

    fn device(
        &mut self,
        name: &str,
        kind: u32,
        mode: u32,
        major: u32,
        minor: u32,
    ) -> Result<(), CpioError> {
        let name = check_name(name)?;
        let mode = check_mode(name, mode)?;
        self.header(&Header {
            name,
            mode: kind | mode,
            nlink: 1,
            filesize: 0,
            rdev: (major, minor),
        })
    }

    /// Writes the trailer and returns the sink (not flushed beyond `Write::flush`).
    pub fn finish(mut self) -> Result<W, CpioError> {
        // The trailer is written with inode 0 and nlink 1, as GNU cpio does.
        self.next_ino = 0;
        self.header(&Header {
            name: TRAILER,
            mode: 0,
            nlink: 1,
            filesize: 0,
            rdev: (0, 0),
        })?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn header(&mut self, h: &Header<'_>) -> Result<(), CpioError> {
        let ino = self.next_ino;
        if ino != 0 {
            self.next_ino = self.next_ino.wrapping_add(1).max(1);
        }
        let namesize = u32::try_from(h.name.len() + 1).map_err(|_| CpioError::TooLarge {
            name: h.name.to_owned(),
            len: h.name.len() as u64,
        })?;
        let fields: [u32; 13] = [
            ino, h.mode, 0, 0, h.nlink, self.mtime, h.filesize, 0, 0, h.rdev.0, h.rdev.1, namesize,
            0,
        ];
        let mut header = Vec::with_capacity(HEADER_LEN + h.name.len() + 4);
        header.extend_from_slice(MAGIC);
        for field in fields {
            header.extend_from_slice(format!("{field:08X}").as_bytes());
        }
        header.extend_from_slice(h.name.as_bytes());
        header.push(0);
        self.write(&header)?;
        self.pad()
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), CpioError> {
        self.out.write_all(bytes)?;
        self.offset += bytes.len() as u64;
        Ok(())
    }

    /// NUL bytes up to the next multiple of 4.
    fn pad(&mut self) -> Result<(), CpioError> {
        let rem = (self.offset % 4) as usize;
        if rem != 0 {
            self.write(&[0u8; 4][..4 - rem])?;
        }
        Ok(())
    }
}

/// Strips leading `/` and checks the rest.
fn check_name(name: &str) -> Result<&str, CpioError> {
    let bad = |reason| CpioError::InvalidName {
        name: name.to_owned(),
        reason,
    };
    let rel = name.trim_start_matches('/');
    if rel.is_empty() {
        return Err(bad("empty"));
    }
    if rel.contains('\0') {
        return Err(bad("contains a NUL byte"));
    }
    if rel.split('/').any(|part| part == "..") {
        return Err(bad("contains a '..' component"));
    }
    if rel == TRAILER {
        return Err(bad("is the end-of-archive marker"));
    }
    Ok(rel)
}

fn check_mode(name: &str, mode: u32) -> Result<u32, CpioError> {
    if mode & !0o7777 != 0 {
        return Err(CpioError::InvalidMode {
            name: name.to_owned(),
            mode,
        });
    }
    Ok(mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One parsed entry: (name, mode, rdev, data).
    type Entry = (String, u32, (u32, u32), Vec<u8>);

    /// A strict newc reader for the tests: checks magic, padding and the trailer.
    fn parse(archive: &[u8]) -> Vec<Entry> {
        let mut pos = 0usize;
        let mut out = Vec::new();
        loop {
            assert_eq!(pos % 4, 0, "entry at {pos} is not 4-aligned");
            let h = &archive[pos..pos + HEADER_LEN];
            assert_eq!(&h[..6], MAGIC);
            let field = |i: usize| {
                let s = std::str::from_utf8(&h[6 + 8 * i..14 + 8 * i]).expect("ascii");
                u32::from_str_radix(s, 16).expect("hex")
            };
            let (mode, filesize, namesize) = (field(1), field(6) as usize, field(11) as usize);
            let name_start = pos + HEADER_LEN;
            let name =
                std::str::from_utf8(&archive[name_start..name_start + namesize - 1]).expect("utf8");
            assert_eq!(archive[name_start + namesize - 1], 0, "name NUL");
            let data_start = (name_start + namesize).next_multiple_of(4);
            assert!(archive[name_start + namesize..data_start]
                .iter()
                .all(|&b| b == 0));
            let data = archive[data_start..data_start + filesize].to_vec();
            let next = (data_start + filesize).next_multiple_of(4);
            assert!(archive[data_start + filesize..next].iter().all(|&b| b == 0));
            pos = next;
            if name == TRAILER {
                assert_eq!(pos, archive.len(), "bytes after the trailer");
                return out;
            }
            out.push((name.to_owned(), mode, (field(9), field(10)), data));
        }
    }

    #[test]
    fn header_layout_is_exact() {
        let mut w = CpioWriter::new(Vec::new()).with_mtime(0x1234);
        w.file("/init", 0o755, b"abc").expect("file");
        let bytes = w.finish().expect("finish");
        // 110 + "init\0" = 115 -> pad to 116; 3 data bytes -> pad to 120.
        let expected_header = "070701\
            00000001000081ED000000000000000000000001\
            0000123400000003000000000000000000000000\
            000000000000000500000000";
        assert_eq!(&bytes[..HEADER_LEN], expected_header.as_bytes());
        assert_eq!(&bytes[HEADER_LEN..116], b"init\0\0");
        assert_eq!(&bytes[116..120], b"abc\0");
        assert_eq!(&bytes[120..126], MAGIC);
        assert_eq!(bytes.len() % 4, 0);
        let trailer_name = &bytes[120 + HEADER_LEN..120 + HEADER_LEN + TRAILER.len()];
        assert_eq!(trailer_name, TRAILER.as_bytes());
    }

    #[test]
    fn all_entry_kinds_round_trip() {
        let mut w = CpioWriter::new(Vec::new());
        w.dir("dev", 0o755).expect("dir");
        w.char_device("dev/console", 0o600, 5, 1).expect("console");
        w.block_device("dev/vda", 0o660, 254, 0).expect("vda");
        w.symlink("bin/sh", "/init").expect("symlink");
        w.file_from_reader("big", 0o644, 5, &b"12345678"[..])
            .expect("reader");
        let entries = parse(&w.finish().expect("finish"));
        let names: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(names, ["dev", "dev/console", "dev/vda", "bin/sh", "big"]);
        assert_eq!(entries[0].1, 0o040_755);
        assert_eq!((entries[1].1, entries[1].2), (0o020_600, (5, 1)));
        assert_eq!((entries[2].1, entries[2].2), (0o060_660, (254, 0)));
        assert_eq!(
            (entries[3].1, entries[3].3.as_slice()),
            (0o120_777, &b"/init"[..])
        );
        assert_eq!(entries[4].3, b"12345");
    }

    #[test]
    fn short_reader_and_bad_names_are_refused() {
        let mut w = CpioWriter::new(Vec::new());
        assert!(matches!(
            w.file_from_reader("f", 0o644, 10, &b"abc"[..]),
            Err(CpioError::ShortRead {
                expected: 10,
                got: 3,
                ..
            })
        ));
        let mut w = CpioWriter::new(Vec::new());
        for name in ["", "/", "a/../b", "a\0b", TRAILER] {
            assert!(
                matches!(w.dir(name, 0o755), Err(CpioError::InvalidName { .. })),
                "{name:?}"
            );
        }
        assert!(matches!(
            w.file("x", 0o100_644, b""),
            Err(CpioError::InvalidMode { .. })
        ));
        assert!(matches!(
            w.file_from_reader("huge", 0o644, 1 << 32, std::io::empty()),
            Err(CpioError::TooLarge { .. })
        ));
    }

    proptest! {
        #[test]
        fn any_files_round_trip(files in proptest::collection::vec(
            ("[a-z]{1,12}(/[a-z0-9_-][a-z0-9._-]{0,8}){0,2}", proptest::collection::vec(any::<u8>(), 0..70)),
            0..8,
        )) {
            let mut w = CpioWriter::new(Vec::new());
            for (name, data) in &files {
                w.file(name, 0o644, data).expect("file");
            }
            let bytes = w.finish().expect("finish");
            prop_assert_eq!(bytes.len() % 4, 0);
            let entries = parse(&bytes);
            prop_assert_eq!(entries.len(), files.len());
            for ((name, data), entry) in files.iter().zip(&entries) {
                prop_assert_eq!(name, &entry.0);
                prop_assert_eq!(data, &entry.3);
                prop_assert_eq!(entry.1, 0o100_644);
            }
        }
    }
}
