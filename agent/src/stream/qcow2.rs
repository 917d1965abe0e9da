//! qcow2 images: spooled to the disk beyond the image's end, verified, then converted to raw.
//!
//! # Design
//! qcow2 cannot be converted while streaming: L1/L2 tables and data clusters may sit anywhere in
//! the file (docs/crates.md §3.6). The agent therefore writes the qcow2 file, as
//! it arrives (and is hashed), to the target disk itself at [`spool_offset`] = the image's virtual
//! size rounded up to 1 MiB: the conversion writes only `[0, virtual size)`, so it never
//! overwrites the spool it reads from, and no RAM or second disk is needed. After the checksum
//! matches, imago reads the spool through [`DiskRegion`] and the raw image streams to the front of
//! the disk through the same aligned sink, first MiB last. The spool's header is wiped afterwards
//! so nothing later mistakes the leftover for an image.
//!
//! # Limitations
//! The disk must hold virtual size + qcow2 file size. Backing files are refused by the header
//! reader, [`vmdeploy_shared::qcow2`] (a deploy image must be self-contained); zstd-compressed
//! clusters are refused by imago.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use anyhow::Context;
use imago::io_buffers::{IoVector, IoVectorMut};
use imago::storage::drivers::CommonStorageHelper;
use imago::{DenyImplicitOpenGate, FormatAccess, FormatDriverBuilder, Storage};
use vmdeploy_shared::qcow2::{self, Qcow2Header};

use crate::disk::HEAD_LEN;

/// Where the qcow2 file is spooled: its virtual size rounded up to 1 MiB.
pub fn spool_offset(h: &Qcow2Header) -> anyhow::Result<u64> {
    let mib = HEAD_LEN as u64;
    h.virtual_size
        .checked_add(mib - 1)
        .map(|v| v / mib * mib)
        .context("qcow2 virtual size overflows")
}

/// A read-only window `[base, base + len)` of the disk, as an imago storage object.
pub struct DiskRegion {
    file: File,
    path: PathBuf,
    base: u64,
    len: u64,
    helper: CommonStorageHelper,
}

impl DiskRegion {
    /// Opens `path` read-only (buffered) and exposes `len` bytes from `base`.
    pub fn open(path: PathBuf, base: u64, len: u64) -> io::Result<DiskRegion> {
        Ok(DiskRegion {
            file: File::open(&path)?,
            path,
            base,
            len,
            helper: CommonStorageHelper::default(),
        })
    }
}

impl fmt::Debug for DiskRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DiskRegion({}@{}+{})",
            self.path.display(),
            self.base,
            self.len
        )
    }
}

impl fmt::Display for DiskRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.path.display(), self.base)
    }
}

impl Storage for DiskRegion {
    fn size(&self) -> io::Result<u64> {
        Ok(self.len)
    }

    unsafe fn pure_readv(&self, bufv: IoVectorMut<'_>, offset: u64) -> io::Result<()> {
        let mut offset = offset;
        for mut buffer in bufv.into_inner() {
            let buffer: &mut [u8] = &mut buffer;
            // Past the end of the region reads as zeros (the trait's contract).
            let in_region = self.len.saturating_sub(offset).min(buffer.len() as u64) as usize;
            if in_region > 0 {
                self.file
                    .read_exact_at(&mut buffer[..in_region], self.base + offset)?;
            }
            buffer[in_region..].fill(0);
            offset += buffer.len() as u64;
        }
        Ok(())
    }

    unsafe fn pure_writev(&self, _bufv: IoVector<'_>, _offset: u64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the qcow2 spool is read-only",
        ))
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        Ok(())
    }

    unsafe fn invalidate_cache(&self) -> io::Result<()> {
        Ok(())
    }

    fn get_storage_helper(&self) -> &CommonStorageHelper {
        &self.helper
    }
}

/// Opens the spooled qcow2 for reading, after the structural checks imago does not make
/// ([`qcow2::check_layout`]).
pub fn open(region: DiskRegion) -> anyhow::Result<FormatAccess<DiskRegion>> {
    let mut head = vec![0u8; region.len.min(qcow2::LAYOUT_HEAD_MAX as u64) as usize];
    region
        .file
        .read_exact_at(&mut head, region.base)
        .context("reading the spooled qcow2 header")?;
    qcow2::check_layout(&head, region.len)?;
    let qcow2 = imago::qcow2::Qcow2::<DiskRegion>::builder(region)
        .write(false)
        .open(DenyImplicitOpenGate::default())
        .context("opening the spooled qcow2 image")?;
    Ok(FormatAccess::new(qcow2))
}

/// Reads the guest data of the spooled qcow2 in order and writes it to `out` (raw).
pub fn convert(region: DiskRegion, out: &mut impl io::Write) -> anyhow::Result<u64> {
    let access = open(region)?;
    let size = access.size();
    // 1 MiB reads: a multiple of every qcow2 cluster size (512 B .. 2 MiB is allowed, 64 KiB
    // typical); imago splits reads at cluster boundaries itself.
    let mut buf = vec![0u8; HEAD_LEN];
    let mut offset = 0u64;
    while offset < size {
        let n = (size - offset).min(buf.len() as u64) as usize;
        access
            .read(&mut buf[..n], offset)
            .with_context(|| format!("reading qcow2 guest data at offset {offset}"))?;
        out.write_all(&buf[..n])
            .with_context(|| format!("writing raw data at offset {offset}"))?;
        offset += n as u64;
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(virtual_size: u64) -> Qcow2Header {
        Qcow2Header {
            version: 3,
            virtual_size,
        }
    }

    #[test]
    fn spool_offset_is_the_virtual_size_rounded_up_to_a_mib() {
        let mib = HEAD_LEN as u64;
        assert_eq!(spool_offset(&header(10 * mib + 1)).expect("fits"), 11 * mib);
        assert_eq!(spool_offset(&header(4 * mib)).expect("fits"), 4 * mib);
        assert_eq!(spool_offset(&header(0)).expect("fits"), 0);
        assert!(spool_offset(&header(u64::MAX)).is_err());
    }
}
