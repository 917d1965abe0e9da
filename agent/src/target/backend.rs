//! The block device behind LUN 1 (a disk, a loop device or a plain file): the agent's one disk
//! type, [`Disk`], seen as a LUN.
//!
//! Aligned requests go through an `O_DIRECT` handle, so a deploy does not fill the ramdisk's page
//! cache and `SYNCHRONIZE CACHE` (fdatasync) has little left to flush; what direct I/O cannot or
//! will not take goes through a buffered handle (the rule is [`Disk`]'s).

use std::path::Path;

use anyhow::Context as _;

pub use crate::disk::{AlignedBuf, BufferPool, Disk};

/// The opened backing store of the LUN: a [`Disk`] of at least one block. Its I/O (`read_at`,
/// `write_at`, `sync`, `discard`, `extent_at`, `write_pattern`) and geometry (`block_len`,
/// `physical_exponent`, `blocks`) are the disk's.
#[derive(Debug)]
pub struct BlockBackend(Disk);

impl BlockBackend {
    /// Opens `path` read-write, with `O_DIRECT` unless `buffered_only` or the filesystem refuses it.
    pub fn open(path: &Path, buffered_only: bool) -> anyhow::Result<Self> {
        let disk = if buffered_only {
            Disk::open_buffered(path)
        } else {
            Disk::open(path)
        }
        .with_context(|| format!("opening {}", path.display()))?;
        anyhow::ensure!(
            disk.blocks() > 0,
            "{} is smaller than one block",
            path.display()
        );
        tracing::info!(
            path = %path.display(),
            blocks = disk.blocks(),
            block_len = disk.block_len(),
            direct = disk.is_direct(),
            "backing store opened"
        );
        Ok(Self(disk))
    }
}

impl std::ops::Deref for BlockBackend {
    type Target = Disk;
    fn deref(&self) -> &Disk {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lun_needs_one_block_and_reads_back_writes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("lun.img");
        std::fs::write(&path, vec![0u8; 511]).expect("create backing file");
        let err = BlockBackend::open(&path, false).expect_err("less than a block");
        assert!(err.to_string().contains("smaller than one block"), "{err}");
        std::fs::write(&path, vec![0u8; 1 << 20]).expect("create backing file");
        for buffered_only in [false, true] {
            let b = BlockBackend::open(&path, buffered_only).expect("open backend");
            assert_eq!((b.blocks(), b.block_len()), (2048, 512));
            let mut data = AlignedBuf::zeroed(4096);
            data.fill(0xab);
            b.write_at(&data, 8192).expect("write");
            b.sync().expect("sync");
            let mut back = AlignedBuf::zeroed(4096);
            b.read_at(&mut back, 8192).expect("read");
            assert_eq!(&back[..], &data[..]);
        }
        let missing = dir.path().join("missing.img");
        let err = BlockBackend::open(&missing, false).expect_err("no such file");
        assert!(err.to_string().contains("missing.img"), "{err}");
    }
}
