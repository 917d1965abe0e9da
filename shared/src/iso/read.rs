//! Reading an ISO 9660 (ECMA-119) volume without mounting it: the agent reads the deploy CD's
//! driver index, modules and firmware this way (no `isofs` module, no mount), as it reads the
//! floppy's FAT. Only what our writer and `xorriso -as mkisofs` put in the primary tree is
//! read: no Joliet, no Rock Ridge, no multi-extent files.
//!
//! # Layout read (ECMA-119 §8.4, §9.1)
//! ```text
//! sector 16..   volume descriptors: type(1) "CD001" version(1) ...; type 1 primary, 255 ends
//!   primary +80   volume space size, u32 little endian (then big endian)
//!   primary +128  logical block size, u16 LE (2048 on every CD)
//!   primary +156  the root directory record (34 bytes)
//! directory     records, none across a sector boundary (a 0 length byte: next sector)
//!   +0 length  +2 extent LBA u32 LE  +10 data length u32 LE  +25 flags (bit 1 directory,
//!   bit 7 multi-extent)  +32 name length  +33 name (0x00 self, 0x01 parent, else NAME.EXT;1)
//! ```
//! The CD is untrusted input: every extent is checked against the volume's size, directories
//! and files against limits, and the depth of a path; nothing here panics on any bytes.

use std::io::{self, Read, Seek, SeekFrom};

/// ISO 9660's sector size (the logical block size every CD uses).
pub const SECTOR: u64 = 2048;

/// The largest directory read (a deploy CD's directories are a few sectors).
pub const MAX_DIRECTORY_BYTES: u32 = 1 << 20;

/// Deepest path looked up (ISO 9660 allows 8 levels with the root).
const MAX_DEPTH: usize = 8;

/// Why a volume or a file on it could not be read.
#[derive(Debug, thiserror::Error)]
pub enum IsoReadError {
    /// Reading the device failed.
    #[error("reading the ISO 9660 volume: {0}")]
    Io(#[from] io::Error),
    /// No primary volume descriptor where ECMA-119 puts it.
    #[error("not an ISO 9660 volume: {0}")]
    NotIso9660(&'static str),
    /// A directory record that cannot be right.
    #[error("bad directory record in sector {sector}: {reason}")]
    BadRecord {
        /// The sector it is in.
        sector: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// An extent that reaches past the volume's end.
    #[error("{what} lies outside the volume (sectors {first}..{end} of {volume})")]
    OutOfVolume {
        /// The file or directory.
        what: String,
        /// Its first sector.
        first: u64,
        /// One past its last sector.
        end: u64,
        /// The volume's size in sectors.
        volume: u64,
    },
    /// A path component that is not there.
    #[error("{0} is not on the CD")]
    NotFound(String),
    /// A path that goes through a file.
    #[error("{0} is not a directory")]
    NotADirectory(String),
    /// A directory where a file was asked for.
    #[error("{0} is a directory")]
    IsADirectory(String),
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
    /// A file in several extents (ISO 9660 level 3): never written for a deploy CD.
    #[error("{0} is stored in several extents, which this reader does not read")]
    MultiExtent(String),
}

/// A file or directory in the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsoEntry {
    /// The name as shown: lower case, without `;1` and without a trailing `.`.
    pub name: String,
    /// First sector.
    pub lba: u32,
    /// Length in bytes.
    pub len: u32,
    /// Whether it is a directory.
    pub is_dir: bool,
}

/// An opened volume: the primary descriptor's facts and the device.
#[derive(Debug)]
pub struct IsoVolume<R> {
    device: R,
    volume_sectors: u64,
    volume_id: String,
    root: IsoEntry,
}

impl<R: Read + Seek> IsoVolume<R> {
    /// Reads the volume descriptors and checks the root directory's extent.
    pub fn open(mut device: R) -> Result<IsoVolume<R>, IsoReadError> {
        let mut sector = [0u8; SECTOR as usize];
        // Descriptors from sector 16 on; a real CD has a handful before the terminator.
        for index in 16..16 + 32 {
            device.seek(SeekFrom::Start(index * SECTOR))?;
            device
                .read_exact(&mut sector)
                .map_err(|_| IsoReadError::NotIso9660("the volume ends before its descriptors"))?;
            if &sector[1..6] != b"CD001" {
                return Err(IsoReadError::NotIso9660("no CD001 volume descriptor"));
            }
            match sector[0] {
                1 => return Self::from_primary(device, &sector),
                255 => break,
                _ => continue,
            }
        }
        Err(IsoReadError::NotIso9660("no primary volume descriptor"))
    }

    fn from_primary(device: R, pvd: &[u8]) -> Result<IsoVolume<R>, IsoReadError> {
        let volume_sectors = u64::from(le32(pvd, 80));
        let block = u16::from_le_bytes([pvd[128], pvd[129]]);
        if u64::from(block) != SECTOR {
            return Err(IsoReadError::NotIso9660(
                "a logical block size other than 2048",
            ));
        }
        let volume_id = String::from_utf8_lossy(&pvd[40..72]).trim_end().to_owned();
        // The root's record names itself 0x00, like every directory's `.` record.
        let record = &pvd[156..190];
        let root = IsoEntry {
            name: "/".to_owned(),
            lba: le32(record, 2),
            len: le32(record, 10),
            is_dir: record[25] & 0x02 != 0,
        };
        if !root.is_dir {
            return Err(IsoReadError::BadRecord {
                sector: 16,
                reason: "the root record is not a directory",
            });
        }
        let volume = IsoVolume {
            device,
            volume_sectors,
            volume_id,
            root,
        };
        volume.check_extent(&volume.root)?;
        Ok(volume)
    }

    /// The volume id (`VMEDIA_BOOT_ISO` on ours).
    pub fn volume_id(&self) -> &str {
        &self.volume_id
    }

    /// The volume's size in bytes, as its descriptor says.
    pub fn volume_bytes(&self) -> u64 {
        self.volume_sectors * SECTOR
    }

    fn check_extent(&self, entry: &IsoEntry) -> Result<(), IsoReadError> {
        let first = u64::from(entry.lba);
        let end = first + u64::from(entry.len).div_ceil(SECTOR);
        if end > self.volume_sectors || (entry.len > 0 && first < 16) {
            return Err(IsoReadError::OutOfVolume {
                what: entry.name.clone(),
                first,
                end,
                volume: self.volume_sectors,
            });
        }
        Ok(())
    }

    /// The entries of a directory, `.` and `..` left out, in the CD's order.
    pub fn list(&mut self, dir: &IsoEntry) -> Result<Vec<IsoEntry>, IsoReadError> {
        if !dir.is_dir {
            return Err(IsoReadError::NotADirectory(dir.name.clone()));
        }
        if dir.len > MAX_DIRECTORY_BYTES {
            return Err(IsoReadError::TooLarge {
                what: dir.name.clone(),
                len: u64::from(dir.len),
                limit: u64::from(MAX_DIRECTORY_BYTES),
            });
        }
        let bytes = self.read_extent(dir)?;
        let mut entries = Vec::new();
        for (index, sector) in bytes.chunks(SECTOR as usize).enumerate() {
            let sector_no = u64::from(dir.lba) + index as u64;
            let mut at = 0;
            while at < sector.len() {
                let len = usize::from(sector[at]);
                if len == 0 {
                    break;
                }
                let record = sector.get(at..at + len).ok_or(IsoReadError::BadRecord {
                    sector: sector_no,
                    reason: "a record crosses the sector's end",
                })?;
                if let Some(entry) = parse_record(record, sector_no)? {
                    self.check_extent(&entry)?;
                    entries.push(entry);
                }
                at += len;
            }
        }
        Ok(entries)
    }

    /// The entry at `path` (`/boot/vmlinuz`; components compared without case, `;1` and a
    /// trailing `.`).
    pub fn lookup(&mut self, path: &str) -> Result<IsoEntry, IsoReadError> {
        let mut current = self.root.clone();
        let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        if components.len() > MAX_DEPTH {
            return Err(IsoReadError::NotFound(path.to_owned()));
        }
        for (depth, component) in components.iter().enumerate() {
            let so_far = components[..=depth].join("/");
            if !current.is_dir {
                return Err(IsoReadError::NotADirectory(components[..depth].join("/")));
            }
            let wanted = component.to_ascii_lowercase();
            current = self
                .list(&current)?
                .into_iter()
                .find(|e| e.name == wanted)
                .ok_or_else(|| IsoReadError::NotFound(format!("/{so_far}")))?;
        }
        Ok(current)
    }

    /// The whole file at `path`, refused when over `limit` bytes.
    pub fn read_file(&mut self, path: &str, limit: u64) -> Result<Vec<u8>, IsoReadError> {
        let entry = self.lookup(path)?;
        if entry.is_dir {
            return Err(IsoReadError::IsADirectory(path.to_owned()));
        }
        if u64::from(entry.len) > limit {
            return Err(IsoReadError::TooLarge {
                what: path.to_owned(),
                len: u64::from(entry.len),
                limit,
            });
        }
        self.read_extent(&entry)
    }

    /// `len` bytes of a file from `offset` into it (a range of a bigger file: the agent reads
    /// one module out of a pack this way). Reading past the file's end is an error.
    pub fn read_range(
        &mut self,
        entry: &IsoEntry,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>, IsoReadError> {
        if offset
            .checked_add(len)
            .is_none_or(|end| end > u64::from(entry.len))
        {
            return Err(IsoReadError::TooLarge {
                what: format!("{} from byte {offset}", entry.name),
                len,
                limit: u64::from(entry.len).saturating_sub(offset),
            });
        }
        self.check_extent(entry)?;
        let len = usize::try_from(len).map_err(|_| IsoReadError::TooLarge {
            what: entry.name.clone(),
            len,
            limit: usize::MAX as u64,
        })?;
        self.device
            .seek(SeekFrom::Start(u64::from(entry.lba) * SECTOR + offset))?;
        let mut buf = vec![0; len];
        self.device.read_exact(&mut buf)?;
        Ok(buf)
    }

    fn read_extent(&mut self, entry: &IsoEntry) -> Result<Vec<u8>, IsoReadError> {
        self.read_range(entry, 0, u64::from(entry.len))
    }

    /// The device it reads (a counting wrapper's tally, say).
    pub fn device(&self) -> &R {
        &self.device
    }

    /// The root directory.
    pub fn root(&self) -> &IsoEntry {
        &self.root
    }
}

fn le32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// One directory record; `None` for `.` and `..`.
fn parse_record(record: &[u8], sector: u64) -> Result<Option<IsoEntry>, IsoReadError> {
    let bad = |reason| IsoReadError::BadRecord { sector, reason };
    if record.len() < 34 {
        return Err(bad("a record shorter than 34 bytes"));
    }
    let name_len = usize::from(record[32]);
    let name = record
        .get(33..33 + name_len)
        .ok_or_else(|| bad("a name longer than its record"))?;
    if name_len == 0 {
        return Err(bad("an empty name"));
    }
    if name == [0] || name == [1] {
        return Ok(None);
    }
    let flags = record[25];
    let shown = show_name(name).ok_or_else(|| bad("a name that is not ASCII"))?;
    if flags & 0x80 != 0 {
        return Err(IsoReadError::MultiExtent(shown));
    }
    Ok(Some(IsoEntry {
        name: shown,
        lba: le32(record, 2),
        len: le32(record, 10),
        is_dir: flags & 0x02 != 0,
    }))
}

/// `VMLINUZ.;1` → `vmlinuz`, `GRUB.CFG;1` → `grub.cfg`.
fn show_name(raw: &[u8]) -> Option<String> {
    if !raw.is_ascii() {
        return None;
    }
    let text = std::str::from_utf8(raw).ok()?;
    let text = text.split_once(';').map_or(text, |(name, _)| name);
    let text = text.strip_suffix('.').unwrap_or(text);
    Some(text.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iso::{write_boot_iso, BootIsoSpec, BootLoaders};
    use proptest::prelude::*;
    use std::io::Cursor;

    fn loaders() -> BootLoaders {
        BootLoaders {
            isolinux_bin: vec![0x90; 4096],
            ldlinux_c32: vec![1; 3000],
            grub_efi: [b"MZ".as_slice(), &[2; 70_000]].concat(),
            shim: None,
        }
    }

    /// A kernel the writer accepts: the boot protocol's `HdrS` at 0x202.
    fn kernel(len: usize) -> Vec<u8> {
        let mut k: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        k[0x202..0x206].copy_from_slice(b"HdrS");
        k
    }

    fn our_iso(kernel: &[u8], initramfs: &[u8]) -> Vec<u8> {
        let loaders = loaders();
        let spec = BootIsoSpec {
            kernel,
            initramfs,
            cmdline: "marker=1",
            loaders: &loaders,
        };
        write_boot_iso(&spec, Cursor::new(Vec::new()))
            .expect("writing")
            .into_inner()
    }

    #[test]
    fn reads_back_what_our_writer_wrote() {
        let kernel = kernel(10_000);
        let initramfs = vec![7u8; 5000];
        let iso = our_iso(&kernel, &initramfs);
        let mut volume = IsoVolume::open(Cursor::new(iso)).expect("opens");
        assert_eq!(volume.volume_id(), "VMEDIA_BOOT_ISO");
        assert_eq!(
            volume.read_file("/boot/vmlinuz", 1 << 20).expect("kernel"),
            kernel
        );
        assert_eq!(
            volume.read_file("BOOT/INITRD", 1 << 20).expect("initrd"),
            initramfs
        );
        let cfg = volume
            .read_file("/boot/grub/grub.cfg", 4096)
            .expect("grub.cfg");
        assert!(String::from_utf8_lossy(&cfg).contains("marker=1"));
        let root = volume.root().clone();
        let names: Vec<String> = volume
            .list(&root)
            .expect("root")
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert!(
            names.contains(&"boot".to_owned()) && names.contains(&"isolinux".to_owned()),
            "{names:?}"
        );
        let entry = volume.lookup("/boot/vmlinuz").expect("entry");
        assert_eq!(volume.read_range(&entry, 251, 3).expect("range"), [0, 1, 2]);
        assert!(volume.read_range(&entry, 9_999, 2).is_err());
        assert!(matches!(
            volume.read_file("/boot/vmlinuz", 100),
            Err(IsoReadError::TooLarge { .. })
        ));
        assert!(
            matches!(volume.read_file("/boot/nothing", 100), Err(IsoReadError::NotFound(p)) if p == "/boot/nothing")
        );
        assert!(matches!(
            volume.read_file("/boot", 1 << 20),
            Err(IsoReadError::IsADirectory(_))
        ));
        assert!(matches!(
            volume.lookup("/boot/vmlinuz/x"),
            Err(IsoReadError::NotADirectory(_))
        ));
    }

    #[test]
    fn what_is_no_iso_or_points_outside_is_refused() {
        assert!(matches!(
            IsoVolume::open(Cursor::new(vec![0u8; 40_000])),
            Err(IsoReadError::NotIso9660(_))
        ));
        assert!(matches!(
            IsoVolume::open(Cursor::new(vec![0u8; 100])),
            Err(IsoReadError::NotIso9660(_))
        ));
        let mut iso = our_iso(&kernel(4096), b"initrd");
        // The root's extent moved past the volume's end.
        let root_lba = 16 * SECTOR as usize + 156 + 2;
        iso[root_lba..root_lba + 4].copy_from_slice(&0x00ff_ffffu32.to_le_bytes());
        assert!(matches!(
            IsoVolume::open(Cursor::new(iso)),
            Err(IsoReadError::OutOfVolume { .. })
        ));
    }

    #[test]
    fn names_are_shown_in_lower_case_without_version_or_empty_extension() {
        assert_eq!(show_name(b"VMLINUZ.;1").as_deref(), Some("vmlinuz"));
        assert_eq!(show_name(b"GRUB.CFG;1").as_deref(), Some("grub.cfg"));
        assert_eq!(show_name(b"BOOT").as_deref(), Some("boot"));
        assert_eq!(show_name(b"\xff"), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any byte flipped anywhere in a real ISO: an error or the data, never a panic.
        #[test]
        fn corrupted_volumes_never_panic(
            flips in proptest::collection::vec((0usize..80_000, any::<u8>()), 1..40),
        ) {
            let mut iso = our_iso(&kernel(9000), &[4u8; 3000]);
            let len = iso.len();
            for (at, byte) in flips {
                iso[at % len] = byte;
            }
            if let Ok(mut volume) = IsoVolume::open(Cursor::new(iso)) {
                let _ = volume.read_file("/boot/vmlinuz", 1 << 20);
                let _ = volume.read_file("/boot/grub/grub.cfg", 1 << 20);
                let root = volume.root().clone();
                if let Ok(entries) = volume.list(&root) {
                    for entry in entries {
                        let _ = volume.list(&entry);
                    }
                }
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096), pvd in any::<bool>()) {
            let mut image = vec![0u8; 17 * SECTOR as usize];
            if pvd {
                image[16 * SECTOR as usize] = 1;
                image[16 * SECTOR as usize + 1..16 * SECTOR as usize + 6].copy_from_slice(b"CD001");
            }
            let at = 16 * SECTOR as usize + 6;
            let n = bytes.len().min(image.len() - at);
            image[at..at + n].copy_from_slice(&bytes[..n]);
            if let Ok(mut volume) = IsoVolume::open(Cursor::new(image)) {
                let _ = volume.lookup("/a/b/c");
            }
        }
    }
}
