//! Reading files from an ext2/3/4 file system without mounting it: the agent takes a partition
//! image's own signed boot chain (shim and GRUB, at the paths the distribution installs them)
//! from the root file system it has just written, for local boot under UEFI Secure Boot. The
//! deploy ramdisk has no `ext4` module loaded and needs none, as it reads the CD's ISO 9660 and
//! the floppy's FAT itself.
//!
//! Only what reading a regular file by path needs is here: the superblock, group descriptors,
//! inodes, extent trees and the ext2/3 block map, directories (linear, and hashed ones read
//! as linear, which their layout allows), and symbolic links. Inline data, encryption,
//! `meta_bg` and an external journal are refused with an error that names them.
//!
//! # Layout read (the kernel's Documentation/filesystems/ext4)
//! ```text
//! byte 1024     superblock: +0 inodes count, +4 blocks count (lo), +20 first data block,
//!               +24 log2(block size) - 10, +32 blocks per group, +40 inodes per group,
//!               +56 magic 0xEF53, +76 revision, +88 inode size, +96 incompatible features,
//!               +104 UUID, +254 descriptor size (64bit), +336 blocks count (hi)
//! block fdb+1   group descriptors: +8 inode table (lo), +40 inode table (hi, 64-byte ones)
//! inode         +0 mode, +4 size (lo), +32 flags, +40 i_block (60 bytes), +108 size (hi)
//! i_block       extents (flag 0x80000): header magic 0xF30A, entries, max, depth; then
//!               12-byte leaves (logical block, length, start hi, start lo) or indexes
//!               (logical block, child lo, child hi); else 12 direct block numbers and the
//!               single, double and triple indirect blocks
//! directory     entries: inode u32, record length u16, name length u8, file type u8, name
//! ```
//! The file system is untrusted input (an image anyone may upload): every block number is
//! checked against the file system's size, sizes against the caller's limit, the walk of an
//! extent tree or a block map against a budget, and symbolic links against a hop count;
//! nothing here panics on any bytes.

use std::io::{self, Read, Seek, SeekFrom};

/// The root directory's inode number.
const ROOT_INODE: u32 = 2;
/// The largest directory read.
const MAX_DIRECTORY_BYTES: u64 = 16 << 20;
/// Symbolic links followed in one lookup (the kernel's own limit is 40; boot files need few).
const MAX_SYMLINKS: usize = 8;
/// Extent tree depth the kernel allows (`EXT4_MAX_EXTENT_DEPTH`).
const MAX_EXTENT_DEPTH: u16 = 5;
/// Tree nodes and indirect blocks read for one file: ample for any file this reader is for,
/// and a bound on the work a crafted tree can cause.
const MAP_BUDGET: usize = 4096;

const SUPERBLOCK_OFFSET: u64 = 1024;
const MAGIC: u16 = 0xEF53;

const INCOMPAT_COMPRESSION: u32 = 0x1;
const INCOMPAT_FILETYPE: u32 = 0x2;
const INCOMPAT_JOURNAL_DEV: u32 = 0x8;
const INCOMPAT_META_BG: u32 = 0x10;
const INCOMPAT_64BIT: u32 = 0x80;
const INCOMPAT_DIRDATA: u32 = 0x1000;
/// Incompatible features this reader reads past: recover, extents, 64bit, mmp, flex_bg,
/// ea_inode, csum_seed, largedir, inline_data (refused per inode), encrypt (refused per inode),
/// casefold (names are compared as stored).
const INCOMPAT_KNOWN: u32 = INCOMPAT_FILETYPE
    | 0x4
    | 0x40
    | INCOMPAT_64BIT
    | 0x100
    | 0x200
    | 0x400
    | 0x2000
    | 0x4000
    | 0x8000
    | 0x10000
    | 0x20000;

const FLAG_ENCRYPT: u32 = 0x800;
const FLAG_EXTENTS: u32 = 0x80000;
const FLAG_INLINE_DATA: u32 = 0x1000_0000;

const MODE_TYPE: u16 = 0xF000;
const MODE_DIR: u16 = 0x4000;
const MODE_FILE: u16 = 0x8000;
const MODE_SYMLINK: u16 = 0xA000;

const EXTENT_MAGIC: u16 = 0xF30A;

/// Why a file could not be read from the file system.
#[derive(Debug, thiserror::Error)]
pub enum Ext4ReadError {
    /// Reading the device failed.
    #[error("reading the ext2/3/4 file system: {0}")]
    Io(#[from] io::Error),
    /// No ext2/3/4 superblock, or one that cannot be right.
    #[error("not an ext2/3/4 file system: {0}")]
    NotExt(String),
    /// Something this reader does not read.
    #[error("{0}, which this reader does not read")]
    Unsupported(String),
    /// A structure that cannot be right.
    #[error("the file system is damaged: {0}")]
    Corrupt(String),
    /// A path component that is not there.
    #[error("{0} is not in the file system")]
    NotFound(String),
    /// A path that goes through something that is not a directory.
    #[error("{0} is not a directory")]
    NotADirectory(String),
    /// A path that names a directory or a device rather than a regular file.
    #[error("{0} is not a regular file")]
    NotAFile(String),
    /// Bigger than the caller allows.
    #[error("{what} is {len} bytes, over the limit of {limit}")]
    TooLarge {
        /// The file or directory.
        what: String,
        /// Its size.
        len: u64,
        /// The limit.
        limit: u64,
    },
    /// More symbolic links than [`MAX_SYMLINKS`] on the way.
    #[error("{0}: too many symbolic links on the way")]
    SymlinkLoop(String),
}

type Result<T> = std::result::Result<T, Ext4ReadError>;

fn corrupt(what: impl Into<String>) -> Ext4ReadError {
    Ext4ReadError::Corrupt(what.into())
}

fn le16(bytes: &[u8], at: usize) -> u16 {
    bytes
        .get(at..at + 2)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u16::from_le_bytes)
}

fn le32(bytes: &[u8], at: usize) -> u32 {
    bytes
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// What the reader keeps of the superblock.
#[derive(Debug, Clone)]
struct Superblock {
    block_size: u64,
    blocks: u64,
    first_data_block: u64,
    inodes: u32,
    inodes_per_group: u32,
    groups: u64,
    inode_size: u64,
    desc_size: u64,
    wide_descriptors: bool,
    filetype: bool,
    uuid: [u8; 16],
}

impl Superblock {
    fn parse(sb: &[u8], len: u64) -> Result<Superblock> {
        if le16(sb, 56) != MAGIC {
            return Err(Ext4ReadError::NotExt("no superblock magic 0xEF53".into()));
        }
        let log = le32(sb, 24);
        if log > 6 {
            return Err(Ext4ReadError::NotExt(format!("block size 2^{}", log + 10)));
        }
        let block_size = 1024u64 << log;
        let incompat = le32(sb, 96);
        for (bit, name) in [
            (INCOMPAT_COMPRESSION, "compression"),
            (INCOMPAT_JOURNAL_DEV, "an external journal device"),
            (INCOMPAT_META_BG, "meta_bg"),
            (INCOMPAT_DIRDATA, "dirdata"),
        ] {
            if incompat & bit != 0 {
                return Err(Ext4ReadError::Unsupported(format!(
                    "the file system uses {name}"
                )));
            }
        }
        let unknown = incompat & !INCOMPAT_KNOWN;
        if unknown != 0 {
            return Err(Ext4ReadError::Unsupported(format!(
                "the file system has incompatible features {unknown:#x}"
            )));
        }
        let wide = incompat & INCOMPAT_64BIT != 0;
        let blocks = u64::from(le32(sb, 4))
            | if wide {
                u64::from(le32(sb, 336)) << 32
            } else {
                0
            };
        let first_data_block = u64::from(le32(sb, 20));
        let blocks_per_group = u64::from(le32(sb, 32));
        let inodes = le32(sb, 0);
        let inodes_per_group = le32(sb, 40);
        let (inode_size, desc_size) = (
            if le32(sb, 76) == 0 {
                128
            } else {
                u64::from(le16(sb, 88))
            },
            if wide { u64::from(le16(sb, 254)) } else { 32 },
        );
        let bad = |what: String| Err(Ext4ReadError::NotExt(what));
        if blocks == 0 || blocks_per_group == 0 || inodes_per_group == 0 {
            return bad("no blocks, or no blocks or inodes per group".into());
        }
        if first_data_block >= blocks {
            return bad(format!("first data block {first_data_block} of {blocks}"));
        }
        if !(128..=block_size).contains(&inode_size) || !inode_size.is_power_of_two() {
            return bad(format!("inode size {inode_size}"));
        }
        if !(32..=1024).contains(&desc_size) || !desc_size.is_power_of_two() {
            return bad(format!("group descriptor size {desc_size}"));
        }
        let bytes = blocks.checked_mul(block_size);
        if bytes.is_none_or(|b| b > len) {
            return bad(format!(
                "{blocks} blocks of {block_size} bytes do not fit its {len}-byte partition"
            ));
        }
        let groups = (blocks - first_data_block).div_ceil(blocks_per_group);
        let mut uuid = [0u8; 16];
        if let Some(raw) = sb.get(104..120) {
            uuid.copy_from_slice(raw);
        }
        Ok(Superblock {
            block_size,
            blocks,
            first_data_block,
            inodes,
            inodes_per_group,
            groups,
            inode_size,
            desc_size,
            wide_descriptors: desc_size >= 64,
            filetype: incompat & INCOMPAT_FILETYPE != 0,
            uuid,
        })
    }
}

/// What the reader keeps of an inode.
#[derive(Debug, Clone)]
struct Inode {
    number: u32,
    mode: u16,
    size: u64,
    flags: u32,
    block: [u8; 60],
}

impl Inode {
    fn kind(&self) -> u16 {
        self.mode & MODE_TYPE
    }
}

/// One run of a file's blocks: `count` blocks from logical block `logical` are at physical
/// block `physical`.
#[derive(Debug, Clone, Copy)]
struct Run {
    logical: u64,
    physical: u64,
    count: u64,
}

/// An ext2/3/4 file system at a byte offset of a device, read by path.
#[derive(Debug)]
pub struct Ext4Volume<R> {
    device: R,
    offset: u64,
    sb: Superblock,
}

impl<R: Read + Seek> Ext4Volume<R> {
    /// Reads the superblock of the file system in the `len` bytes at `offset` of `device`.
    pub fn open(mut device: R, offset: u64, len: u64) -> Result<Ext4Volume<R>> {
        let mut sb = vec![0u8; 1024];
        let at = offset
            .checked_add(SUPERBLOCK_OFFSET)
            .ok_or_else(|| Ext4ReadError::NotExt("offset past the end".into()))?;
        device.seek(SeekFrom::Start(at))?;
        device.read_exact(&mut sb)?;
        let sb = Superblock::parse(&sb, len)?;
        Ok(Ext4Volume { device, offset, sb })
    }

    /// The file system's UUID as blkid prints it.
    pub fn uuid(&self) -> String {
        let u = &self.sb.uuid;
        let hex =
            |r: std::ops::Range<usize>| u[r].iter().map(|b| format!("{b:02x}")).collect::<String>();
        format!(
            "{}-{}-{}-{}-{}",
            hex(0..4),
            hex(4..6),
            hex(6..8),
            hex(8..10),
            hex(10..16)
        )
    }

    /// The regular file at `path` (absolute, `/` separated; symbolic links followed), read
    /// whole when it is at most `limit` bytes.
    pub fn read_file(&mut self, path: &str, limit: u64) -> Result<Vec<u8>> {
        let inode = self.resolve(path)?;
        if inode.kind() != MODE_FILE {
            return Err(Ext4ReadError::NotAFile(path.to_owned()));
        }
        self.read_data(&inode, path, limit)
    }

    fn read_at(&mut self, at: u64, buf: &mut [u8]) -> Result<()> {
        let at = self
            .offset
            .checked_add(at)
            .ok_or_else(|| corrupt("a position past 2^64"))?;
        self.device.seek(SeekFrom::Start(at))?;
        self.device.read_exact(buf)?;
        Ok(())
    }

    /// Block `n`, checked to be inside the file system.
    fn read_block(&mut self, n: u64) -> Result<Vec<u8>> {
        if n >= self.sb.blocks {
            return Err(corrupt(format!(
                "block {n} lies past the end ({} blocks)",
                self.sb.blocks
            )));
        }
        let mut block = vec![0u8; self.sb.block_size as usize];
        self.read_at(n * self.sb.block_size, &mut block)?;
        Ok(block)
    }

    fn inode(&mut self, number: u32) -> Result<Inode> {
        if number == 0 || number > self.sb.inodes {
            return Err(corrupt(format!(
                "inode {number} is out of range (1..={})",
                self.sb.inodes
            )));
        }
        let index = u64::from(number - 1);
        let group = index / u64::from(self.sb.inodes_per_group);
        let slot = index % u64::from(self.sb.inodes_per_group);
        if group >= self.sb.groups {
            return Err(corrupt(format!("inode {number} is in no block group")));
        }
        let table_block = self.sb.first_data_block + 1;
        let desc_at = table_block * self.sb.block_size + group * self.sb.desc_size;
        let mut desc = vec![0u8; self.sb.desc_size as usize];
        self.read_at(desc_at, &mut desc)?;
        let mut table = u64::from(le32(&desc, 8));
        if self.sb.wide_descriptors {
            table |= u64::from(le32(&desc, 40)) << 32;
        }
        let at = table
            .checked_mul(self.sb.block_size)
            .and_then(|t| t.checked_add(slot * self.sb.inode_size))
            .filter(|at| {
                at.checked_add(self.sb.inode_size)
                    .is_some_and(|end| end <= self.sb.blocks * self.sb.block_size)
            })
            .ok_or_else(|| corrupt(format!("inode {number}'s table lies past the end")))?;
        let mut raw = vec![0u8; 128];
        self.read_at(at, &mut raw)?;
        let mut block = [0u8; 60];
        block.copy_from_slice(&raw[40..100]);
        Ok(Inode {
            number,
            mode: le16(&raw, 0),
            size: u64::from(le32(&raw, 4)) | u64::from(le32(&raw, 108)) << 32,
            flags: le32(&raw, 32),
            block,
        })
    }

    /// The inode at `path`, symbolic links followed.
    fn resolve(&mut self, path: &str) -> Result<Inode> {
        let mut pending: Vec<Vec<u8>> = components(path.as_bytes());
        let root = self.inode(ROOT_INODE)?;
        let mut current = root.clone();
        let mut walked = String::new();
        let mut hops = 0;
        while let Some(name) = pending.pop() {
            let shown = format!("{walked}/{}", String::from_utf8_lossy(&name));
            if current.kind() != MODE_DIR {
                return Err(Ext4ReadError::NotADirectory(if walked.is_empty() {
                    "/".into()
                } else {
                    walked
                }));
            }
            let number = self
                .find_entry(&current, &name, &shown)?
                .ok_or_else(|| Ext4ReadError::NotFound(shown.clone()))?;
            let child = self.inode(number)?;
            if child.kind() == MODE_SYMLINK {
                hops += 1;
                if hops > MAX_SYMLINKS {
                    return Err(Ext4ReadError::SymlinkLoop(path.to_owned()));
                }
                let target = self.symlink_target(&child, &shown)?;
                pending.extend(components(&target));
                if target.first() == Some(&b'/') {
                    current = root.clone();
                    walked.clear();
                }
                continue;
            }
            current = child;
            walked = shown;
        }
        Ok(current)
    }

    fn symlink_target(&mut self, link: &Inode, shown: &str) -> Result<Vec<u8>> {
        // A fast symlink keeps its target in i_block when it fits there.
        if link.size < 60 && link.flags & (FLAG_EXTENTS | FLAG_INLINE_DATA) == 0 {
            return Ok(link.block[..link.size as usize].to_vec());
        }
        self.read_data(link, shown, 4096)
    }

    /// The inode number of `name` in directory `dir`, if it is there.
    fn find_entry(&mut self, dir: &Inode, name: &[u8], shown: &str) -> Result<Option<u32>> {
        let data = self.read_data(dir, shown, MAX_DIRECTORY_BYTES)?;
        let block_size = self.sb.block_size as usize;
        for block in data.chunks(block_size) {
            let mut pos = 0usize;
            while pos + 8 <= block.len() {
                let inode = le32(block, pos);
                let mut rec_len = usize::from(le16(block, pos + 4));
                if block_size == 65536 && (rec_len == 0 || rec_len == 65535) {
                    rec_len = 65536;
                }
                let name_len = if self.sb.filetype {
                    usize::from(block[pos + 6])
                } else {
                    usize::from(le16(block, pos + 6))
                };
                if rec_len < 8 || pos + rec_len > block.len() || 8 + name_len > rec_len {
                    return Err(corrupt(format!(
                        "a bad entry in the directory of inode {}",
                        dir.number
                    )));
                }
                if inode != 0 && &block[pos + 8..pos + 8 + name_len] == name {
                    return Ok(Some(inode));
                }
                pos += rec_len;
            }
        }
        Ok(None)
    }

    /// The contents of `inode`, when it is at most `limit` bytes.
    fn read_data(&mut self, inode: &Inode, what: &str, limit: u64) -> Result<Vec<u8>> {
        if inode.size > limit {
            return Err(Ext4ReadError::TooLarge {
                what: what.to_owned(),
                len: inode.size,
                limit,
            });
        }
        if inode.flags & FLAG_INLINE_DATA != 0 {
            return Err(Ext4ReadError::Unsupported(format!(
                "{what} keeps its data inline"
            )));
        }
        if inode.flags & FLAG_ENCRYPT != 0 {
            return Err(Ext4ReadError::Unsupported(format!("{what} is encrypted")));
        }
        let size = usize::try_from(inode.size)
            .map_err(|_| corrupt(format!("{what} is larger than memory")))?;
        let needed = inode.size.div_ceil(self.sb.block_size);
        let mut runs = Vec::new();
        let mut budget = MAP_BUDGET;
        if inode.flags & FLAG_EXTENTS != 0 {
            self.extent_runs(&inode.block, None, needed, &mut runs, &mut budget)?;
        } else {
            self.block_map_runs(inode, needed, &mut runs, &mut budget)?;
        }
        let mut data = vec![0u8; size];
        let bs = self.sb.block_size;
        // Runs in order and apart, so a crafted map reads each byte of the file once at most.
        let mut next = 0u64;
        for run in runs {
            if run.logical < next {
                return Err(corrupt(format!("{what}'s block map overlaps itself")));
            }
            next = run.logical.saturating_add(run.count);
            let end = run
                .physical
                .checked_add(run.count)
                .filter(|&e| e <= self.sb.blocks);
            if end.is_none() {
                return Err(corrupt(format!(
                    "{what}'s blocks {}+{} lie past the end",
                    run.physical, run.count
                )));
            }
            let start = run.logical.saturating_mul(bs);
            if start >= inode.size {
                continue;
            }
            let len = run.count.saturating_mul(bs).min(inode.size - start);
            // Both fit: start < size, and size fit in usize above.
            let (from, to) = (start as usize, (start + len) as usize);
            self.read_at(run.physical * bs, &mut data[from..to])?;
        }
        Ok(data)
    }

    /// The runs of the extent tree node `node` (i_block or a tree block); `depth` is what the
    /// parent index says the node's depth must be.
    fn extent_runs(
        &mut self,
        node: &[u8],
        depth: Option<u16>,
        needed: u64,
        runs: &mut Vec<Run>,
        budget: &mut usize,
    ) -> Result<()> {
        *budget = budget
            .checked_sub(1)
            .ok_or_else(|| corrupt("an extent tree larger than any file here needs"))?;
        if le16(node, 0) != EXTENT_MAGIC {
            return Err(corrupt("an extent tree node without its magic"));
        }
        let entries = usize::from(le16(node, 2));
        let node_depth = le16(node, 6);
        if entries > (node.len() - 12) / 12
            || node_depth > MAX_EXTENT_DEPTH
            || depth.is_some_and(|d| d != node_depth)
        {
            return Err(corrupt("an extent tree node with bad counts or depth"));
        }
        for i in 0..entries {
            let e = &node[12 + 12 * i..24 + 12 * i];
            let logical = u64::from(le32(e, 0));
            if logical >= needed {
                break;
            }
            if node_depth == 0 {
                let len = le16(e, 4);
                if len > 32768 {
                    // Allocated but never written: reads as zeros.
                    continue;
                }
                let physical = u64::from(le16(e, 6)) << 32 | u64::from(le32(e, 8));
                runs.push(Run {
                    logical,
                    physical,
                    count: u64::from(len),
                });
            } else {
                let child = u64::from(le32(e, 4)) | u64::from(le16(e, 8)) << 32;
                let block = self.read_block(child)?;
                self.extent_runs(&block, Some(node_depth - 1), needed, runs, budget)?;
            }
        }
        Ok(())
    }

    /// The runs of an ext2/3 block map: 12 direct blocks, then single, double and triple
    /// indirect blocks of 32-bit block numbers (0: a hole).
    fn block_map_runs(
        &mut self,
        inode: &Inode,
        needed: u64,
        runs: &mut Vec<Run>,
        budget: &mut usize,
    ) -> Result<()> {
        let per_block = self.sb.block_size / 4;
        let mut logical = 0u64;
        for i in 0..15 {
            if logical >= needed {
                break;
            }
            let n = u64::from(le32(&inode.block, 4 * i));
            let level = i.saturating_sub(11) as u32;
            let span = per_block.pow(level);
            if n != 0 {
                self.map_level(n, level, logical, needed, runs, budget)?;
            }
            logical += span;
        }
        Ok(())
    }

    fn map_level(
        &mut self,
        n: u64,
        level: u32,
        logical: u64,
        needed: u64,
        runs: &mut Vec<Run>,
        budget: &mut usize,
    ) -> Result<()> {
        if level == 0 {
            match runs.last_mut() {
                Some(last)
                    if last.logical + last.count == logical && last.physical + last.count == n =>
                {
                    last.count += 1;
                }
                _ => runs.push(Run {
                    logical,
                    physical: n,
                    count: 1,
                }),
            }
            return Ok(());
        }
        *budget = budget
            .checked_sub(1)
            .ok_or_else(|| corrupt("a block map larger than any file here needs"))?;
        let per_block = self.sb.block_size / 4;
        let span = per_block.pow(level - 1);
        let block = self.read_block(n)?;
        for (i, raw) in block.chunks_exact(4).enumerate() {
            let at = logical + i as u64 * span;
            if at >= needed {
                break;
            }
            let child = u64::from(le32(raw, 0));
            if child != 0 {
                self.map_level(child, level - 1, at, needed, runs, budget)?;
            }
        }
        Ok(())
    }
}

/// The components of `path`, last first (so that `pop` gives them in order), without empty
/// ones and `.`.
fn components(path: &[u8]) -> Vec<Vec<u8>> {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .rev()
        .map(<[u8]>::to_vec)
        .collect()
}

/// Builders for tests of other crates.
#[cfg(any(test, feature = "test-support"))]
pub mod test_support {
    use std::path::Path;
    use std::process::Command;

    /// The file system `mke2fs -q -F <args> -U <uuid> -d <tree>` makes in a new `len`-byte file
    /// at `image`, read whole. Panics (with the package to install) when mke2fs is missing or
    /// fails: for tests only.
    pub fn mke2fs(tree: &Path, image: &Path, args: &[&str], uuid: &str, len: u64) -> Vec<u8> {
        std::fs::File::create(image)
            .and_then(|f| f.set_len(len))
            .expect("the image file");
        let status = Command::new("mke2fs")
            .args(["-q", "-F"])
            .args(args)
            .args(["-U", uuid, "-d"])
            .arg(tree)
            .arg(image)
            .status()
            .expect("mke2fs (apt-get install e2fsprogs)");
        assert!(status.success(), "mke2fs failed: {status}");
        std::fs::read(image).expect("read the image")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Cursor;
    use std::path::Path;
    use std::sync::OnceLock;

    const UUID: &str = "7e57e474-0000-4000-8000-0000000000ab";

    fn stage(root: &Path) {
        let write = |rel: &str, bytes: &[u8]| {
            let path = root.join(rel);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, bytes).expect("write");
        };
        write("usr/lib/shim/shimx64.efi.signed", &pattern(1_000_003, 7));
        write("boot/small", b"hello\n");
        write("boot/empty", b"");
        // Past 12 + 256 blocks of 1 KiB: the ext2 build maps it through a double indirect block.
        write("boot/big", &pattern(600_000, 3));
        for i in 0..300 {
            write(&format!("many/entry-with-a-long-name-{i:04}"), &[i as u8]);
        }
        std::os::unix::fs::symlink("../usr/lib/shim", root.join("boot/shim")).expect("symlink");
        std::os::unix::fs::symlink("/boot/small", root.join("abs")).expect("symlink");
        std::os::unix::fs::symlink("loop2", root.join("loop1")).expect("symlink");
        std::os::unix::fs::symlink("loop1", root.join("loop2")).expect("symlink");
        let long = format!("/{}/../boot/small", "x".repeat(80));
        std::os::unix::fs::symlink(long, root.join("slow")).expect("symlink");
        std::fs::create_dir_all(root.join("x".repeat(80))).expect("mkdir");
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 11) as u8)
            .collect()
    }

    /// A file system made by mke2fs (with Debian's mke2fs.conf: ext4 has 64bit, extents,
    /// flex_bg and metadata_csum) from [`stage`]'s tree: `kind` ext2 or ext4, `options` its
    /// `-O` list.
    fn make(kind: &str, block_size: u32, options: &str) -> Vec<u8> {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        stage(&root);
        let block_size = block_size.to_string();
        let mut args = vec!["-t", kind, "-b", &block_size];
        if !options.is_empty() {
            args.extend(["-O", options]);
        }
        test_support::mke2fs(&root, &dir.path().join("fs.img"), &args, UUID, 8 << 20)
    }

    fn ext4_image() -> &'static [u8] {
        static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
        IMAGE.get_or_init(|| make("ext4", 4096, ""))
    }

    fn check_reads(image: &[u8]) {
        let len = image.len() as u64;
        // At an offset, as a partition of a disk is.
        let mut disk = vec![0xAAu8; 4096];
        disk.extend_from_slice(image);
        let mut fs = Ext4Volume::open(Cursor::new(disk), 4096, len).expect("open");
        assert_eq!(fs.uuid(), UUID);
        assert_eq!(
            fs.read_file("/usr/lib/shim/shimx64.efi.signed", 2 << 20)
                .expect("shim"),
            pattern(1_000_003, 7)
        );
        assert_eq!(fs.read_file("boot/small", 10).expect("small"), b"hello\n");
        assert_eq!(fs.read_file("/boot/empty", 10).expect("empty"), b"");
        assert_eq!(
            fs.read_file("/boot/big", 1 << 20).expect("big"),
            pattern(600_000, 3)
        );
        assert_eq!(
            fs.read_file("/many/entry-with-a-long-name-0299", 10)
                .expect("in a large directory"),
            [43u8]
        );
        // Relative, absolute and slow symbolic links, and `..`.
        assert_eq!(
            fs.read_file("/boot/shim/shimx64.efi.signed", 2 << 20)
                .expect("through a relative link")
                .len(),
            1_000_003
        );
        assert_eq!(fs.read_file("/abs", 10).expect("absolute"), b"hello\n");
        assert_eq!(fs.read_file("/slow", 10).expect("slow"), b"hello\n");
        assert_eq!(
            fs.read_file("/usr/../boot/small", 10).expect(".."),
            b"hello\n"
        );

        let err = |r: Result<Vec<u8>>| r.expect_err("an error").to_string();
        assert_eq!(
            err(fs.read_file("/usr/lib/grub/x", 10)),
            "/usr/lib/grub is not in the file system"
        );
        assert_eq!(
            err(fs.read_file("/boot/small/x", 10)),
            "/boot/small is not a directory"
        );
        assert_eq!(
            err(fs.read_file("/boot", 10)),
            "/boot is not a regular file"
        );
        assert_eq!(
            err(fs.read_file("/boot/big", 1000)),
            "/boot/big is 600000 bytes, over the limit of 1000"
        );
        assert_eq!(
            err(fs.read_file("/loop1", 10)),
            "/loop1: too many symbolic links on the way"
        );
    }

    #[test]
    fn reads_files_links_and_large_directories_of_mke2fs_file_systems() {
        check_reads(ext4_image());
        // ext4 without 64bit (32-byte descriptors), and ext2's block maps with 1 KiB blocks and
        // without file types in directory entries.
        check_reads(&make("ext4", 1024, "^64bit"));
        check_reads(&make("ext2", 1024, "^filetype"));
    }

    #[test]
    fn what_is_no_ext_or_reaches_outside_is_refused() {
        let image = ext4_image();
        let open = |bytes: Vec<u8>, len: u64| Ext4Volume::open(Cursor::new(bytes), 0, len);
        let err = open(vec![0; 4096], 4096).expect_err("zeros");
        assert_eq!(
            err.to_string(),
            "not an ext2/3/4 file system: no superblock magic 0xEF53"
        );
        let err = open(image.to_vec(), image.len() as u64 / 2).expect_err("cut");
        assert!(err.to_string().contains("do not fit"), "{err}");
        let mut meta_bg = image.to_vec();
        meta_bg[1024 + 96] |= 0x10;
        let err = open(meta_bg, image.len() as u64).expect_err("meta_bg");
        assert_eq!(
            err.to_string(),
            "the file system uses meta_bg, which this reader does not read"
        );
    }

    fn read_all(bytes: Vec<u8>) {
        let len = bytes.len() as u64;
        if let Ok(mut fs) = Ext4Volume::open(Cursor::new(bytes), 0, len) {
            for path in [
                "/usr/lib/shim/shimx64.efi.signed",
                "/boot/big",
                "/boot/shim/x",
                "/slow",
            ] {
                let _ = fs.read_file(path, 4 << 20);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn corrupted_file_systems_never_panic(
            flips in proptest::collection::vec((0usize..200_000, any::<u8>()), 1..40),
        ) {
            let mut bytes = ext4_image().to_vec();
            for (at, value) in flips {
                if let Some(b) = bytes.get_mut(at) {
                    *b = value;
                }
            }
            read_all(bytes);
        }

        #[test]
        fn arbitrary_bytes_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..8192)) {
            if bytes.len() > 1024 + 58 {
                bytes[1024 + 56] = 0x53;
                bytes[1024 + 57] = 0xEF;
            }
            read_all(bytes);
        }
    }
}
