//! The EFI system image of the UEFI El Torito entry: a small FAT12 file system holding
//! `EFI/BOOT/BOOTX64.EFI`.
//!
//! Written here rather than with `fatfs`: fatfs 0.3.6 writes sub-directories that fail
//! `fsck.fat` (`docs/crates.md` §0), and an ESP needs two levels of them. The image is laid out in
//! one pass: every directory and file gets contiguous clusters, directories first, so the FAT is
//! a set of straight chains. All dates come from the caller's fixed time, and the volume serial
//! number is a constant, so the same inputs give the same bytes.

use super::date::Civil;
use super::IsoError;

const BYTES_PER_SECTOR: usize = 512;
const RESERVED_SECTORS: usize = 1;
const NUM_FATS: usize = 2;
/// One sector of root directory entries (the root holds only `EFI`).
const ROOT_ENTRIES: usize = 16;
const DIR_ENTRY: usize = 32;
/// FAT12 holds at most 4084 clusters; more would make readers take it for FAT16.
const MAX_FAT12_CLUSTERS: usize = 4084;
const MEDIA_FIXED: u8 = 0xF8;
const ATTR_DIRECTORY: u8 = 0x10;
const ATTR_ARCHIVE: u8 = 0x20;
/// A fixed volume serial number (mkfs.vfat would take the clock).
const VOLUME_SERIAL: u32 = 0x564D_4446;
/// The image is padded to whole ISO sectors.
const ALIGN: usize = 2048;

/// A file for the image: path components in 8.3 upper case (`["EFI", "BOOT", "BOOTX64.EFI"]`).
#[derive(Debug, Clone, Copy)]
pub struct FatFile<'a> {
    /// Directories and the file name.
    pub path: &'a [&'a str],
    /// Contents.
    pub data: &'a [u8],
}

/// One node of the tree being laid out.
#[derive(Debug)]
struct Node<'a> {
    name: [u8; 11],
    /// `None` for a directory.
    data: Option<&'a [u8]>,
    children: Vec<usize>,
    parent: usize,
    first_cluster: usize,
    clusters: usize,
}

/// An 8.3 name as stored: name padded to 8, extension to 3, upper-case letters, digits and `_`.
fn short_name(name: &str) -> Result<[u8; 11], IsoError> {
    let (base, ext) = name.split_once('.').unwrap_or((name, ""));
    let ok = |s: &str, max: usize| {
        s.len() <= max
            && s.chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    };
    if base.is_empty() || !ok(base, 8) || !ok(ext, 3) {
        return Err(IsoError::Invalid(format!(
            "{name:?} is not an upper-case 8.3 FAT name"
        )));
    }
    let mut out = [b' '; 11];
    out[..base.len()].copy_from_slice(base.as_bytes());
    out[8..8 + ext.len()].copy_from_slice(ext.as_bytes());
    Ok(out)
}

/// Clusters a node of `size` bytes takes: an empty file none, a directory at least one.
fn clusters_for(size: usize, is_dir: bool, cluster: usize) -> usize {
    let n = size.div_ceil(cluster);
    if is_dir {
        n.max(1)
    } else {
        n
    }
}

/// Sectors per cluster and the cluster count for nodes of the given `(size, is_dir)`: the
/// smallest cluster that keeps the count FAT12.
fn geometry(sizes: &[(usize, bool)]) -> Result<(usize, usize), IsoError> {
    let mut spc = 1;
    while spc <= 64 {
        let cluster = spc * BYTES_PER_SECTOR;
        let clusters: usize = sizes
            .iter()
            .map(|&(s, d)| clusters_for(s, d, cluster))
            .sum();
        if clusters <= MAX_FAT12_CLUSTERS {
            return Ok((spc, clusters));
        }
        spc *= 2;
    }
    Err(IsoError::Invalid(
        "the EFI system image contents are too large for FAT12 (over 130 MiB)".into(),
    ))
}

/// FAT date and time of `t` (Civil::from_epoch keeps the year in 1980..=2107).
fn fat_date_time(t: &Civil) -> (u16, u16) {
    let date = ((t.year - 1980) << 9) | (t.month << 5) | t.day;
    let time = (t.hour << 11) | (t.minute << 5) | (t.second / 2);
    (date as u16, time as u16)
}

fn dir_entry(name: &[u8; 11], attr: u8, cluster: usize, size: u32, t: &Civil) -> [u8; 32] {
    let (date, time) = fat_date_time(t);
    let mut e = [0u8; DIR_ENTRY];
    e[0..11].copy_from_slice(name);
    e[11] = attr;
    e[14..16].copy_from_slice(&time.to_le_bytes());
    e[16..18].copy_from_slice(&date.to_le_bytes());
    e[18..20].copy_from_slice(&date.to_le_bytes());
    e[22..24].copy_from_slice(&time.to_le_bytes());
    e[24..26].copy_from_slice(&date.to_le_bytes());
    // FAT12 cluster numbers are below 4096.
    e[26..28].copy_from_slice(&(cluster as u16).to_le_bytes());
    e[28..32].copy_from_slice(&size.to_le_bytes());
    e
}

/// Builds the FAT12 image holding `files`.
pub fn build(files: &[FatFile<'_>], time: &Civil) -> Result<Vec<u8>, IsoError> {
    // 1. The tree; node 0 is the root directory.
    let mut nodes: Vec<Node<'_>> = vec![Node {
        name: [b' '; 11],
        data: None,
        children: Vec::new(),
        parent: 0,
        first_cluster: 0,
        clusters: 0,
    }];
    for file in files {
        let Some((name, dirs)) = file.path.split_last() else {
            return Err(IsoError::Invalid(
                "an EFI image file with an empty path".into(),
            ));
        };
        if file.data.len() > u32::MAX as usize {
            return Err(IsoError::Invalid(format!(
                "{name} is larger than FAT allows"
            )));
        }
        let mut at = 0;
        for dir in dirs {
            let short = short_name(dir)?;
            at = match nodes[at].children.iter().find(|&&c| nodes[c].name == short) {
                Some(&c) if nodes[c].data.is_none() => c,
                Some(_) => {
                    return Err(IsoError::Invalid(format!(
                        "{dir} is a file, not a directory"
                    )))
                }
                None => {
                    nodes.push(Node {
                        name: short,
                        data: None,
                        children: Vec::new(),
                        parent: at,
                        first_cluster: 0,
                        clusters: 0,
                    });
                    let new = nodes.len() - 1;
                    nodes[at].children.push(new);
                    new
                }
            };
        }
        let short = short_name(name)?;
        if nodes[at].children.iter().any(|&c| nodes[c].name == short) {
            return Err(IsoError::Invalid(format!(
                "{} is in the EFI image twice",
                file.path.join("/")
            )));
        }
        nodes.push(Node {
            name: short,
            data: Some(file.data),
            children: Vec::new(),
            parent: at,
            first_cluster: 0,
            clusters: 0,
        });
        let new = nodes.len() - 1;
        nodes[at].children.push(new);
    }
    if nodes[0].children.len() > ROOT_ENTRIES {
        return Err(IsoError::Invalid(format!(
            "the EFI image root holds at most {ROOT_ENTRIES} entries"
        )));
    }

    // 2. Sizes: a sub-directory holds ".", ".." and its children.
    let sizes: Vec<(usize, bool)> = nodes[1..]
        .iter()
        .map(|n| match n.data {
            Some(d) => (d.len(), false),
            None => ((2 + n.children.len()) * DIR_ENTRY, true),
        })
        .collect();
    let (spc, clusters) = geometry(&sizes)?;
    let cluster_bytes = spc * BYTES_PER_SECTOR;
    let mut next = 2;
    for (node, &(size, is_dir)) in nodes[1..].iter_mut().zip(&sizes) {
        node.clusters = clusters_for(size, is_dir, cluster_bytes);
        // An empty file has no clusters and names cluster 0.
        node.first_cluster = if node.clusters == 0 { 0 } else { next };
        next += node.clusters;
    }

    // 3. Geometry: FAT12 entries are 1.5 bytes; the total is rounded up to whole ISO sectors,
    //    the extra sectors at the end belonging to no cluster.
    //    Entries are packed in pairs, three bytes a pair: an odd count still takes a whole last
    //    triple (counting 1.5 bytes an entry came up one byte short whenever that landed on a
    //    sector boundary, and the writer below ran off the table).
    let fat_sectors = ((clusters + 2).div_ceil(2) * 3).div_ceil(BYTES_PER_SECTOR);
    let root_sectors = (ROOT_ENTRIES * DIR_ENTRY).div_ceil(BYTES_PER_SECTOR);
    let data_start = RESERVED_SECTORS + NUM_FATS * fat_sectors + root_sectors;
    let used = (data_start + clusters * spc) * BYTES_PER_SECTOR;
    let total_bytes = used.div_ceil(ALIGN) * ALIGN;
    let total_sectors = total_bytes / BYTES_PER_SECTOR;
    let total16 = u16::try_from(total_sectors).ok();
    let mut img = vec![0u8; total_bytes];

    // 4. Boot sector (no boot code: the firmware reads files, it does not run this).
    let b = &mut img[..BYTES_PER_SECTOR];
    b[0..3].copy_from_slice(&[0xEB, 0x3C, 0x90]);
    b[3..11].copy_from_slice(b"VMDEPLOY");
    b[11..13].copy_from_slice(&(BYTES_PER_SECTOR as u16).to_le_bytes());
    b[13] = spc as u8;
    b[14..16].copy_from_slice(&(RESERVED_SECTORS as u16).to_le_bytes());
    b[16] = NUM_FATS as u8;
    b[17..19].copy_from_slice(&(ROOT_ENTRIES as u16).to_le_bytes());
    b[19..21].copy_from_slice(&total16.unwrap_or(0).to_le_bytes());
    b[21] = MEDIA_FIXED;
    b[22..24].copy_from_slice(&(fat_sectors as u16).to_le_bytes());
    b[24..26].copy_from_slice(&32u16.to_le_bytes());
    b[26..28].copy_from_slice(&64u16.to_le_bytes());
    if total16.is_none() {
        b[32..36].copy_from_slice(&(total_sectors as u32).to_le_bytes());
    }
    b[36] = 0x80;
    b[38] = 0x29;
    b[39..43].copy_from_slice(&VOLUME_SERIAL.to_le_bytes());
    b[43..54].copy_from_slice(b"NO NAME    ");
    b[54..62].copy_from_slice(b"FAT12   ");
    b[510] = 0x55;
    b[511] = 0xAA;

    // 5. The FAT: media byte, end-of-chain marker, then one straight chain per node.
    let mut fat = vec![0u16; clusters + 2];
    fat[0] = 0xF00 | u16::from(MEDIA_FIXED);
    fat[1] = 0xFFF;
    for node in nodes[1..].iter().filter(|n| n.clusters > 0) {
        let last = node.first_cluster + node.clusters - 1;
        for (c, entry) in fat
            .iter_mut()
            .enumerate()
            .take(last)
            .skip(node.first_cluster)
        {
            // FAT12 cluster numbers are below 4096.
            *entry = (c + 1) as u16;
        }
        fat[last] = 0xFFF;
    }
    let mut fat_bytes = vec![0u8; fat_sectors * BYTES_PER_SECTOR];
    for (i, pair) in fat.chunks(2).enumerate() {
        let a = pair[0];
        let b = pair.get(1).copied().unwrap_or(0);
        fat_bytes[i * 3] = (a & 0xFF) as u8;
        fat_bytes[i * 3 + 1] = ((a >> 8) as u8 & 0x0F) | (((b & 0x0F) as u8) << 4);
        fat_bytes[i * 3 + 2] = (b >> 4) as u8;
    }
    for copy in 0..NUM_FATS {
        let at = (RESERVED_SECTORS + copy * fat_sectors) * BYTES_PER_SECTOR;
        img[at..at + fat_bytes.len()].copy_from_slice(&fat_bytes);
    }

    // 6. Directories and file contents.
    let cluster_at = |c: usize| (data_start + (c - 2) * spc) * BYTES_PER_SECTOR;
    let entries_of = |n: &Node<'_>| -> Vec<[u8; 32]> {
        n.children
            .iter()
            .map(|&c| {
                let child = &nodes[c];
                match child.data {
                    // Sizes were checked against u32 above.
                    Some(d) => dir_entry(
                        &child.name,
                        ATTR_ARCHIVE,
                        child.first_cluster,
                        d.len() as u32,
                        time,
                    ),
                    None => dir_entry(&child.name, ATTR_DIRECTORY, child.first_cluster, 0, time),
                }
            })
            .collect()
    };
    let root_at = (RESERVED_SECTORS + NUM_FATS * fat_sectors) * BYTES_PER_SECTOR;
    for (i, e) in entries_of(&nodes[0]).iter().enumerate() {
        img[root_at + i * DIR_ENTRY..][..DIR_ENTRY].copy_from_slice(e);
    }
    for node in &nodes[1..] {
        if node.clusters == 0 {
            continue;
        }
        let at = cluster_at(node.first_cluster);
        match node.data {
            Some(d) => img[at..at + d.len()].copy_from_slice(d),
            None => {
                let parent = &nodes[node.parent];
                let mut dot = [b' '; 11];
                dot[0] = b'.';
                let mut dotdot = dot;
                dotdot[1] = b'.';
                let mut all = vec![
                    dir_entry(&dot, ATTR_DIRECTORY, node.first_cluster, 0, time),
                    // ".." of a first-level directory names the root as cluster 0.
                    dir_entry(&dotdot, ATTR_DIRECTORY, parent.first_cluster, 0, time),
                ];
                all.extend(entries_of(node));
                for (i, e) in all.iter().enumerate() {
                    img[at + i * DIR_ENTRY..][..DIR_ENTRY].copy_from_slice(e);
                }
            }
        }
    }
    Ok(img)
}

#[cfg(test)]
mod tests {
    use super::super::date::{Civil, DEFAULT_EPOCH};
    use super::*;

    fn time() -> Civil {
        Civil::from_epoch(DEFAULT_EPOCH).expect("in range")
    }

    /// The image holding `data` as `EFI/BOOT/BOOTX64.EFI` and nothing else.
    fn bootx64_only(data: &[u8]) -> Vec<u8> {
        build(
            &[FatFile {
                path: &["EFI", "BOOT", "BOOTX64.EFI"],
                data,
            }],
            &time(),
        )
        .expect("image")
    }

    #[test]
    fn short_names() {
        assert_eq!(&short_name("BOOTX64.EFI").expect("ok"), b"BOOTX64 EFI");
        assert_eq!(&short_name("EFI").expect("ok"), b"EFI        ");
        for bad in [
            "bootx64.efi",
            "TOOLONGNAME.EFI",
            "A.EFIX",
            "",
            ".EFI",
            "A B",
        ] {
            assert!(short_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn layout_is_fat12_and_aligned() {
        let data = vec![0x5Au8; 600_000];
        let img = bootx64_only(&data);
        assert_eq!(img.len() % ALIGN, 0);
        assert_eq!(&img[510..512], &[0x55, 0xAA]);
        assert_eq!(&img[54..62], b"FAT12   ");
        // The file is in there, in one piece.
        assert!(img.windows(4096).any(|w| w.iter().all(|&b| b == 0x5A)));
        assert!(img.len() < data.len() + 64 * 1024);
    }

    /// FAT12 entry `n` of the first FAT of `img`.
    fn fat12_entry(img: &[u8], n: usize) -> u16 {
        let fat = &img[RESERVED_SECTORS * BYTES_PER_SECTOR..];
        let at = n * 3 / 2;
        let pair = u16::from_le_bytes([fat[at], fat[at + 1]]);
        if n.is_multiple_of(2) {
            pair & 0xFFF
        } else {
            pair >> 4
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Any two file sizes up to 6 MB (shim and a signed GRUB are 1 and 3.8 MB): the image
        /// builds, each file's chain is straight and ends where its size says, and its bytes sit
        /// at its first cluster. The table's size once came up a byte short on some counts.
        #[test]
        fn any_sizes_give_straight_chains(a in 0usize..6_000_000, b in 0usize..6_000_000) {
            let (da, db) = (vec![0xA5u8; a], vec![0x5Au8; b]);
            let img = build(
                &[
                    FatFile { path: &["EFI", "BOOT", "BOOTX64.EFI"], data: &da },
                    FatFile { path: &["EFI", "BOOT", "GRUBX64.EFI"], data: &db },
                ],
                &time(),
            )
            .expect("image");
            let spc = usize::from(img[13]);
            let fat_sectors = usize::from(u16::from_le_bytes([img[22], img[23]]));
            let data_start = (RESERVED_SECTORS + NUM_FATS * fat_sectors) * BYTES_PER_SECTOR
                + ROOT_ENTRIES * DIR_ENTRY;
            let cluster = spc * BYTES_PER_SECTOR;
            // Directories first (EFI, BOOT: one cluster each), then the files in order.
            let mut first = 4;
            for (len, byte) in [(a, 0xA5u8), (b, 0x5A)] {
                let count = len.div_ceil(cluster);
                for c in first..first + count {
                    let want = if c + 1 == first + count { 0xFFF } else { (c + 1) as u16 };
                    proptest::prop_assert_eq!(fat12_entry(&img, c), want);
                }
                if len > 0 {
                    let at = data_start + (first - 2) * cluster;
                    proptest::prop_assert!(img[at..at + len].iter().all(|&x| x == byte));
                }
                first += count;
            }
        }
    }

    /// The counts where the FAT's last entry is odd and ends exactly on a sector boundary
    /// (n = 341, 1365, 2389, 3413 entries, two of them the reserved ones and two the
    /// directories): the table needs one more byte than 1.5 bytes an entry.
    #[test]
    fn an_odd_fat_ending_on_a_sector_boundary_fits() {
        for entries in [341usize, 1365, 2389, 3413] {
            let data = vec![7u8; (entries - 4) * BYTES_PER_SECTOR];
            let img = bootx64_only(&data);
            assert_eq!(img[13], 1, "one sector a cluster for {entries} entries");
            assert_eq!(fat12_entry(&img, entries - 1), 0xFFF, "{entries} entries");
        }
    }

    #[test]
    fn same_inputs_same_bytes() {
        let files = [FatFile {
            path: &["EFI", "BOOT", "BOOTX64.EFI"],
            data: b"x",
        }];
        assert_eq!(
            build(&files, &time()).expect("a"),
            build(&files, &time()).expect("b")
        );
    }

    #[test]
    fn bad_trees_are_errors() {
        let dup = [
            FatFile {
                path: &["EFI", "A.EFI"],
                data: b"1",
            },
            FatFile {
                path: &["EFI", "A.EFI"],
                data: b"2",
            },
        ];
        assert!(build(&dup, &time()).is_err());
        let file_as_dir = [
            FatFile {
                path: &["EFI"],
                data: b"1",
            },
            FatFile {
                path: &["EFI", "A.EFI"],
                data: b"2",
            },
        ];
        assert!(build(&file_as_dir, &time()).is_err());
        assert!(build(
            &[FatFile {
                path: &[],
                data: b""
            }],
            &time()
        )
        .is_err());
    }
}
