//! FAT images: the virtual floppy the conductor builds and the agent reads.
//!
//! # Design
//! [`build_floppy`] formats a 1.44 MB FAT12 image in memory with `fatfs` and puts the given files
//! in its root directory. The volume label is written both in the boot sector and as a root
//! directory volume entry, in the case given, as `mkfs.vfat -n ir-vfd-dev` does: udev/blkid read
//! the directory entry first, and ramdisks look for `/dev/disk/by-label/ir-vfd-dev`
//! (`docs/ironic-protocols.md` §1.1, §1.4).
//!
//! On the agent side, [`fat_label`] reads the label from a boot sector after validating the BIOS
//! parameter block (a hybrid ISO's MBR must not pass for a floppy, `docs/qemu-and-boot.md` §9.5), and
//! [`read_root_file`] reads one root-directory file from any `Read + Seek` without mounting.
//!
//! # Limitations
//! Root-directory files only: fatfs 0.3.6 writes subdirectories that fail `fsck.fat`
//! (`docs/crates.md` §0). Config drives are ISO images, not FAT.

use std::io::{self, Cursor, Read, Seek, SeekFrom, Write};

/// The label Ironic gives the parameter floppy.
pub const FLOPPY_LABEL: &str = "ir-vfd-dev";
/// A 3.5" high-density floppy: 2880 sectors of 512 bytes.
pub const FLOPPY_SIZE: usize = 1_474_560;

const BOOT_SIGNATURE_OFFSET: usize = 510;
const BPB_BYTES_PER_SECTOR: usize = 0x0B;
const BPB_SECTORS_PER_CLUSTER: usize = 0x0D;
const BPB_RESERVED_SECTORS: usize = 0x0E;
const BPB_NUM_FATS: usize = 0x10;
const BPB_TOTAL_SECTORS_16: usize = 0x13;
const BPB_MEDIA: usize = 0x15;
const BPB_SECTORS_PER_FAT_16: usize = 0x16;
const BPB_TOTAL_SECTORS_32: usize = 0x20;
const EBPB16_SIGNATURE: usize = 0x26;
const EBPB16_LABEL: usize = 0x2B;
const EBPB32_SIGNATURE: usize = 0x42;
const EBPB32_LABEL: usize = 0x47;
const LABEL_LEN: usize = 11;
const DIR_ENTRY_LEN: usize = 32;
const ATTR_VOLUME_ID: u8 = 0x08;

/// What went wrong building or reading a FAT image.
#[derive(Debug, thiserror::Error)]
pub enum FatError {
    /// The label does not fit the 11 bytes FAT has for it, or is not printable ASCII.
    #[error("volume label {0:?} must be 1 to 11 printable ASCII characters")]
    BadLabel(String),
    /// A file name cannot go in the root directory.
    #[error("file name {0:?} is not a valid root-directory name")]
    BadFileName(String),
    /// The files do not fit on the floppy.
    #[error("files of {0} bytes do not fit on a 1.44 MB floppy")]
    TooBig(usize),
    /// The boot sector is not a FAT boot sector.
    #[error("not a FAT file system: {0}")]
    NotFat(&'static str),
    /// The file is not in the root directory.
    #[error("{0} not found in the FAT root directory")]
    FileNotFound(String),
    /// The file is larger than the caller allows.
    #[error("{name} is {len} bytes, more than the {max} allowed")]
    FileTooLarge {
        /// File name.
        name: String,
        /// Its length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// fatfs failed (corrupt file system, I/O error).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

fn io_err(context: &'static str) -> impl FnOnce(io::Error) -> FatError {
    move |source| FatError::Io { context, source }
}

fn label_bytes(label: &str) -> Result<[u8; LABEL_LEN], FatError> {
    if label.is_empty()
        || label.len() > LABEL_LEN
        || !label.bytes().all(|b| (0x20..0x7f).contains(&b))
        || label.starts_with(' ')
    {
        return Err(FatError::BadLabel(label.chars().take(32).collect()));
    }
    let mut bytes = [b' '; LABEL_LEN];
    bytes[..label.len()].copy_from_slice(label.as_bytes());
    Ok(bytes)
}

fn check_file_name(name: &str) -> Result<(), FatError> {
    let bad = name.is_empty()
        || name.len() > 255
        || name == "."
        || name == ".."
        || name.starts_with(' ')
        || name.ends_with(['.', ' '])
        || name
            .chars()
            .any(|c| c.is_control() || "/\\:*?\"<>|".contains(c));
    if bad {
        return Err(FatError::BadFileName(name.chars().take(64).collect()));
    }
    Ok(())
}

fn u16_at(sector: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes([sector[offset], sector[offset + 1]])
}

fn u32_at(sector: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes([
        sector[offset],
        sector[offset + 1],
        sector[offset + 2],
        sector[offset + 3],
    ])
}

/// The validated geometry of a FAT boot sector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bpb {
    bytes_per_sector: u64,
    reserved_sectors: u64,
    num_fats: u64,
    sectors_per_fat_16: u64,
}

fn parse_bpb(sector: &[u8]) -> Result<Bpb, FatError> {
    if sector.len() < 512 {
        return Err(FatError::NotFat("boot sector shorter than 512 bytes"));
    }
    // An x86 jump (EB xx 90 or E9 xx xx) opens every FAT boot sector; an MBR (including an
    // isohybrid one) does not.
    if !(sector[0] == 0xEB && sector[2] == 0x90 || sector[0] == 0xE9) {
        return Err(FatError::NotFat("no jump instruction"));
    }
    if sector[BOOT_SIGNATURE_OFFSET..BOOT_SIGNATURE_OFFSET + 2] != [0x55, 0xAA] {
        return Err(FatError::NotFat("no 55 AA boot signature"));
    }
    let bytes_per_sector = u16_at(sector, BPB_BYTES_PER_SECTOR);
    if !matches!(bytes_per_sector, 512 | 1024 | 2048 | 4096) {
        return Err(FatError::NotFat("bytes per sector not 512..4096"));
    }
    let spc = sector[BPB_SECTORS_PER_CLUSTER];
    if spc == 0 || !spc.is_power_of_two() {
        return Err(FatError::NotFat("sectors per cluster not a power of two"));
    }
    let reserved = u16_at(sector, BPB_RESERVED_SECTORS);
    if reserved == 0 {
        return Err(FatError::NotFat("no reserved sectors"));
    }
    let fats = sector[BPB_NUM_FATS];
    if !(1..=2).contains(&fats) {
        return Err(FatError::NotFat("number of FATs not 1 or 2"));
    }
    let media = sector[BPB_MEDIA];
    if media != 0xF0 && media < 0xF8 {
        return Err(FatError::NotFat("invalid media descriptor"));
    }
    if u16_at(sector, BPB_TOTAL_SECTORS_16) == 0 && u32_at(sector, BPB_TOTAL_SECTORS_32) == 0 {
        return Err(FatError::NotFat("zero total sectors"));
    }
    Ok(Bpb {
        bytes_per_sector: u64::from(bytes_per_sector),
        reserved_sectors: u64::from(reserved),
        num_fats: u64::from(fats),
        sectors_per_fat_16: u64::from(u16_at(sector, BPB_SECTORS_PER_FAT_16)),
    })
}

/// The volume label in a FAT boot sector (the first 512 bytes of a device), trailing spaces
/// removed; `Ok(None)` for a valid FAT boot sector without a label (`NO NAME`).
pub fn fat_label(boot_sector: &[u8]) -> Result<Option<String>, FatError> {
    let bpb = parse_bpb(boot_sector)?;
    // FAT32 has no 16-bit FAT size and keeps its extended BPB further in.
    let (sig_offset, label_offset) = if bpb.sectors_per_fat_16 == 0 {
        (EBPB32_SIGNATURE, EBPB32_LABEL)
    } else {
        (EBPB16_SIGNATURE, EBPB16_LABEL)
    };
    if boot_sector[sig_offset] != 0x29 {
        return Ok(None);
    }
    let raw = &boot_sector[label_offset..label_offset + LABEL_LEN];
    let label = String::from_utf8_lossy(raw).trim_end().to_owned();
    if label.is_empty() || label == "NO NAME" {
        return Ok(None);
    }
    Ok(Some(label))
}

/// Builds a 1.44 MB FAT12 floppy image labelled `label` holding `files` in its root directory.
pub fn build_floppy(label: &str, files: &[(&str, &[u8])]) -> Result<Vec<u8>, FatError> {
    let label = label_bytes(label)?;
    for (name, _) in files {
        check_file_name(name)?;
    }
    // 1457664 bytes of data area minus directory overhead; leave fatfs to find the exact limit,
    // but refuse the obvious case early with a clear message.
    let total: usize = files.iter().map(|(_, data)| data.len()).sum();
    if total > FLOPPY_SIZE - 33 * 512 {
        return Err(FatError::TooBig(total));
    }

    let mut image = Cursor::new(vec![0u8; FLOPPY_SIZE]);
    // Geometry of a standard 3.5" HD floppy (what mkfs.vfat -C … 1440 writes).
    let options = fatfs::FormatVolumeOptions::new()
        .fat_type(fatfs::FatType::Fat12)
        .volume_label(label)
        .media(0xF0)
        .sectors_per_track(18)
        .heads(2)
        .max_root_dir_entries(224)
        .bytes_per_cluster(512)
        .drive_num(0);
    fatfs::format_volume(&mut image, options).map_err(io_err("formatting the floppy"))?;

    // Volume label directory entry in the first root-directory slot (the root directory is
    // all zeros after formatting).
    let root_dir = {
        let sector = image.get_ref();
        let bpb = parse_bpb(sector)?;
        let offset =
            (bpb.reserved_sectors + bpb.num_fats * bpb.sectors_per_fat_16) * bpb.bytes_per_sector;
        usize::try_from(offset).map_err(|_| FatError::NotFat("root directory offset"))?
    };
    {
        let buf = image.get_mut();
        let entry = &mut buf[root_dir..root_dir + DIR_ENTRY_LEN];
        entry[..LABEL_LEN].copy_from_slice(&label);
        entry[LABEL_LEN] = ATTR_VOLUME_ID;
    }

    image
        .seek(SeekFrom::Start(0))
        .map_err(io_err("rewinding"))?;
    {
        let fs = fatfs::FileSystem::new(&mut image, fatfs::FsOptions::new())
            .map_err(io_err("opening the new file system"))?;
        for (name, data) in files {
            let root = fs.root_dir();
            let mut file = root
                .create_file(name)
                .map_err(io_err("creating a file on the floppy"))?;
            file.truncate().map_err(io_err("truncating a file"))?;
            file.write_all(data).map_err(|e| {
                if e.kind() == io::ErrorKind::Other || e.to_string().contains("No space") {
                    FatError::TooBig(total)
                } else {
                    FatError::Io {
                        context: "writing a file on the floppy",
                        source: e,
                    }
                }
            })?;
            file.flush().map_err(io_err("flushing a file"))?;
        }
        fs.unmount().map_err(io_err("closing the file system"))?;
    }
    Ok(image.into_inner())
}

/// Makes a `Read + Seek` usable where fatfs wants `Read + Write + Seek`; every write fails.
///
/// fatfs writes nothing while reading when access dates are off, except its dirty flag on
/// unmount, and that only if mounting changed it (it does not): a write here would be a bug, and
/// it fails loudly instead of touching the device.
struct ReadOnly<R>(R);

impl<R: Read> Read for ReadOnly<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl<R: Seek> Seek for ReadOnly<R> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.0.seek(pos)
    }
}

impl<R> Write for ReadOnly<R> {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "read-only FAT access",
        ))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads `name` (case-insensitive, as FAT names are) from the root directory of the FAT file
/// system at the start of `device`, refusing files over `max_len` bytes.
pub fn read_root_file<R: Read + Seek>(
    mut device: R,
    name: &str,
    max_len: u64,
) -> Result<Vec<u8>, FatError> {
    let mut boot = [0u8; 512];
    device
        .seek(SeekFrom::Start(0))
        .map_err(io_err("seeking to the boot sector"))?;
    device
        .read_exact(&mut boot)
        .map_err(io_err("reading the boot sector"))?;
    parse_bpb(&boot)?;
    device
        .seek(SeekFrom::Start(0))
        .map_err(io_err("seeking to the boot sector"))?;

    // fatfs 0.3.6 is not hardened against hostile images; the BPB check above rejects what is
    // not FAT, and catch_unwind turns any remaining panic on a corrupt image into an error.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        read_root_file_unchecked(ReadOnly(device), name, max_len)
    }));
    match result {
        Ok(inner) => inner,
        Err(_) => Err(FatError::NotFat("corrupt FAT structures")),
    }
}

fn read_root_file_unchecked<R: Read + Seek>(
    device: ReadOnly<R>,
    name: &str,
    max_len: u64,
) -> Result<Vec<u8>, FatError> {
    let fs = fatfs::FileSystem::new(device, fatfs::FsOptions::new().update_accessed_date(false))
        .map_err(io_err("opening the FAT file system"))?;
    let root = fs.root_dir();
    let mut found = None;
    for entry in root.iter() {
        let entry = entry.map_err(io_err("reading the root directory"))?;
        if entry.is_file() && entry.file_name().eq_ignore_ascii_case(name) {
            found = Some(entry);
            break;
        }
    }
    let entry = found.ok_or_else(|| FatError::FileNotFound(name.to_owned()))?;
    if entry.len() > max_len {
        return Err(FatError::FileTooLarge {
            name: name.to_owned(),
            len: entry.len(),
            max: max_len,
        });
    }
    let mut data = Vec::new();
    entry
        .to_file()
        .take(max_len + 1)
        .read_to_end(&mut data)
        .map_err(io_err("reading the file"))?;
    if data.len() as u64 > max_len {
        return Err(FatError::FileTooLarge {
            name: name.to_owned(),
            len: data.len() as u64,
            max: max_len,
        });
    }
    // A chain shorter than the size its entry gives (a first cluster of 0, a chain cut short)
    // is a corrupt image, not a shorter file: half a parameters file must not be read as one.
    if data.len() as u64 != entry.len() {
        return Err(FatError::NotFat(
            "a file's cluster chain is shorter than its directory entry says",
        ));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::process::Command;

    const PARAMS: &[u8] = b"deployment_id=1be26c0b\ndeployment_key=ABCDEF0123456789\n";

    fn write_temp(image: &[u8]) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        file.write_all(image).expect("writing the image");
        file.flush().expect("flushing the image");
        file
    }

    fn run(cmd: &mut Command) -> std::process::Output {
        let out = cmd.output().expect("tool is installed (scripts/setup)");
        assert!(
            out.status.success(),
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    #[test]
    fn floppy_passes_fsck_and_mtools_reads_it_back_byte_for_byte() {
        let token = vec![b'T'; 3000];
        let image = build_floppy(
            FLOPPY_LABEL,
            &[("parameters.txt", PARAMS), ("token", &token)],
        )
        .expect("builds");
        assert_eq!(image.len(), FLOPPY_SIZE);
        let file = write_temp(&image);
        let path = file.path().to_str().expect("UTF-8 temp path");

        let fsck = run(Command::new("fsck.fat").args(["-n", path]));
        let report = String::from_utf8_lossy(&fsck.stdout);
        assert!(!report.contains("Dirty bit"), "{report}");

        let listing = run(Command::new("mdir").args(["-i", path, "::"]));
        let listing = String::from_utf8_lossy(&listing.stdout);
        assert!(
            listing.contains("parameters.txt") || listing.contains("PARAMETERS"),
            "{listing}"
        );

        let back = run(Command::new("mtype").args(["-i", path, "::parameters.txt"]));
        assert_eq!(
            back.stdout, PARAMS,
            "mtype reads parameters.txt byte for byte"
        );
        let back = run(Command::new("mtype").args(["-i", path, "::token"]));
        assert_eq!(back.stdout, token);
    }

    #[test]
    fn label_is_in_the_boot_sector_and_the_root_directory() {
        let image = build_floppy(FLOPPY_LABEL, &[("parameters.txt", PARAMS)]).expect("builds");
        assert_eq!(
            &image[EBPB16_LABEL..EBPB16_LABEL + LABEL_LEN],
            b"ir-vfd-dev "
        );
        assert_eq!(image[EBPB16_SIGNATURE], 0x29);
        assert_eq!(
            fat_label(&image[..512]).expect("FAT"),
            Some(FLOPPY_LABEL.into())
        );
        // Root directory of a 1.44 MB floppy: 1 reserved + 2 FATs of 9 sectors = sector 19.
        let root = 19 * 512;
        assert_eq!(&image[root..root + LABEL_LEN], b"ir-vfd-dev ");
        assert_eq!(image[root + LABEL_LEN], ATTR_VOLUME_ID);
        let file = write_temp(&image);
        let blkid = Command::new("blkid")
            .args(["-o", "value", "-s", "LABEL"])
            .arg(file.path())
            .output()
            .expect("blkid runs");
        assert_eq!(String::from_utf8_lossy(&blkid.stdout).trim(), FLOPPY_LABEL);
    }

    #[test]
    fn reads_back_what_mkfs_vfat_and_mcopy_wrote() {
        // The independent writer: dosfstools + mtools, as Ironic builds the floppy.
        let dir = tempfile::tempdir().expect("temp dir");
        let img = dir.path().join("fd.img");
        let img_s = img.to_str().expect("UTF-8 path");
        run(Command::new("mkfs.vfat").args(["-C", "-n", "ir-vfd-dev", img_s, "1440"]));
        let src = dir.path().join("parameters.txt");
        std::fs::write(&src, PARAMS).expect("writing source");
        run(Command::new("mcopy")
            .args(["-i", img_s])
            .arg(&src)
            .arg("::parameters.txt"));
        let bytes = std::fs::read(&img).expect("reading image");
        assert_eq!(
            fat_label(&bytes[..512]).expect("FAT"),
            Some(FLOPPY_LABEL.into())
        );
        let data = read_root_file(Cursor::new(bytes), "PARAMETERS.TXT", 4096).expect("reads");
        assert_eq!(data, PARAMS);
    }

    #[test]
    fn read_root_file_round_trip_and_limits() {
        let image = build_floppy(FLOPPY_LABEL, &[("parameters.txt", PARAMS)]).expect("builds");
        let data = read_root_file(Cursor::new(&image), "parameters.txt", 4096).expect("reads");
        assert_eq!(data, PARAMS);
        assert!(matches!(
            read_root_file(Cursor::new(&image), "missing.txt", 4096),
            Err(FatError::FileNotFound(_))
        ));
        assert!(matches!(
            read_root_file(Cursor::new(&image), "parameters.txt", 10),
            Err(FatError::FileTooLarge { .. })
        ));
    }

    /// fatfs 0.3.6 computes `cluster - 2` unchecked: a file whose first cluster is 0 or 1
    /// panics in it (the fuzzer found one). read_root_file turns that into an error.
    #[test]
    fn a_file_starting_below_cluster_2_is_an_error_not_a_panic() {
        let mut image = build_floppy(FLOPPY_LABEL, &[("parameters.txt", PARAMS)]).expect("builds");
        let field = |at: usize| usize::from(u16::from_le_bytes([image[at], image[at + 1]]));
        // The BPB: bytes per sector, reserved sectors, FAT count, root entries, FAT sectors.
        let (sector, reserved, fats, entries, per_fat) = (
            field(11),
            field(14),
            usize::from(image[16]),
            field(17),
            field(22),
        );
        let root = sector * (reserved + fats * per_fat);
        // The file's short entry: not a long-name part (0x0F), not the volume label (0x08).
        let at = (0..entries)
            .map(|i| root + i * 32)
            .find(|&e| image[e] != 0 && image[e] != 0xE5 && image[e + 11] & 0x18 == 0)
            .expect("the file's directory entry");
        for cluster in [0u16, 1] {
            image[at + 26..at + 28].copy_from_slice(&cluster.to_le_bytes());
            let read = read_root_file(Cursor::new(&image), "parameters.txt", 4096);
            assert!(read.is_err(), "first cluster {cluster}: {read:?}");
        }
    }

    #[test]
    fn non_fat_sectors_are_refused() {
        assert!(fat_label(&[0u8; 100]).is_err());
        assert!(fat_label(&[0u8; 512]).is_err());
        // An isohybrid MBR starts with code, not a jump, even when it ends in 55 AA.
        let mut mbr = [0u8; 512];
        mbr[0] = 0x33;
        mbr[0x1FE] = 0x55;
        mbr[0x1FF] = 0xAA;
        assert!(matches!(fat_label(&mbr), Err(FatError::NotFat(_))));
        assert!(matches!(
            read_root_file(Cursor::new(vec![0u8; 4096]), "x", 10),
            Err(FatError::NotFat(_))
        ));
    }

    #[test]
    fn bad_labels_and_names_are_refused() {
        assert!(matches!(build_floppy("", &[]), Err(FatError::BadLabel(_))));
        assert!(matches!(
            build_floppy("twelve-chars", &[]),
            Err(FatError::BadLabel(_))
        ));
        assert!(matches!(
            build_floppy(FLOPPY_LABEL, &[("a/b", b"")]),
            Err(FatError::BadFileName(_))
        ));
        let huge = vec![0u8; FLOPPY_SIZE];
        assert!(matches!(
            build_floppy(FLOPPY_LABEL, &[("big", &huge)]),
            Err(FatError::TooBig(_))
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Corrupting bytes of the boot sector, FATs and root directory never panics the reader.
        #[test]
        fn corrupt_images_never_panic(edits in proptest::collection::vec((0usize..(33 * 512), any::<u8>()), 1..64)) {
            let mut image = build_floppy(FLOPPY_LABEL, &[("parameters.txt", PARAMS)]).expect("builds");
            for (offset, byte) in edits {
                image[offset] = byte;
            }
            let _ = fat_label(&image[..512]);
            let _ = read_root_file(Cursor::new(image), "parameters.txt", 4096);
        }

        #[test]
        fn random_sectors_never_panic(sector in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = fat_label(&sector);
        }
    }
}
