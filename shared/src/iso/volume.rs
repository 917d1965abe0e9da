//! ISO 9660 volume layout: the directory tree, path tables, directory records and the volume
//! descriptors, written sector by sector to any `Write`.
//!
//! Plain ISO 9660 (ECMA-119) with upper-case d-character names, `;1` versions and no Joliet or
//! Rock Ridge: isolinux and GRUB both read such names, in lower case, and the boot ISOs have
//! only a handful of fixed file names. Layout, in sectors of 2048 bytes:
//!
//! ```text
//! 0–15   system area (zeros)
//! 16     primary volume descriptor
//! 17     El Torito boot record volume descriptor (when there is a boot catalog)
//! 18     volume descriptor set terminator
//! ..     L path table, M path table
//! ..     directories, breadth first (the path table's order)
//! ..     boot catalog
//! ..     files, in the order they were added
//! ```

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::Write;

use super::date::Civil;
use super::IsoError;

/// A logical sector.
pub const SECTOR: usize = 2048;
const PVD_LBA: u32 = 16;
/// ISO 9660 stores sizes in 32 bits.
const MAX_FILE: usize = u32::MAX as usize;
/// Longest name component we write (ISO 9660 level 2 allows 31; 8.3 is level 1).
const MAX_NAME: usize = 30;
/// ISO 9660 allows 8 directory levels including the root.
const MAX_DEPTH: usize = 7;

/// A file to put on the volume.
#[derive(Debug, Clone)]
pub struct IsoFile<'a> {
    /// Path components as stored, upper case: `["BOOT", "VMLINUZ."]` (directories are implied).
    pub path: Vec<String>,
    /// The contents.
    pub data: Cow<'a, [u8]>,
}

/// The El Torito part the volume needs to know about: where the boot catalog goes and what it
/// holds (built by [`super::eltorito`] once the files have their places).
pub trait BootCatalog {
    /// The catalog sector, given each file's LBA (same order as the files).
    fn catalog(&self, file_lbas: &[u32]) -> Result<[u8; SECTOR], IsoError>;
    /// Patches applied to files once their places are known (the boot-info-table):
    /// `(file index, new contents)`.
    fn patches(
        &self,
        file_lbas: &[u32],
        files: &[IsoFile<'_>],
    ) -> Result<Vec<(usize, Vec<u8>)>, IsoError>;
}

/// Everything that goes on the volume.
pub struct Volume<'a> {
    /// Volume identifier (d-characters, up to 32).
    pub volume_id: &'a str,
    /// Every date on the volume.
    pub time: Civil,
    /// Files.
    pub files: Vec<IsoFile<'a>>,
    /// El Torito boot catalog, if the volume is bootable.
    pub boot: Option<&'a dyn BootCatalog>,
}

/// d-characters: what ISO 9660 allows in identifiers.
fn is_d_char(c: char) -> bool {
    c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'
}

/// Checks a volume identifier.
pub fn check_volume_id(id: &str) -> Result<(), IsoError> {
    if id.is_empty() || id.len() > 32 || !id.chars().all(is_d_char) {
        return Err(IsoError::Invalid(format!(
            "volume id {id:?} must be 1 to 32 characters of A-Z, 0-9 and _"
        )));
    }
    Ok(())
}

/// Checks a directory name (d-characters, no dot).
fn check_dir_name(name: &str) -> Result<(), IsoError> {
    if name.is_empty() || name.len() > MAX_NAME || !name.chars().all(is_d_char) {
        return Err(IsoError::Invalid(format!(
            "directory name {name:?} must be 1 to {MAX_NAME} characters of A-Z, 0-9 and _"
        )));
    }
    Ok(())
}

/// Checks a file name: `NAME.EXT` with one dot (the extension may be empty), d-characters.
fn check_file_name(name: &str) -> Result<(), IsoError> {
    let ok = name.len() <= MAX_NAME
        && name.matches('.').count() == 1
        && name.len() > 1
        && name.chars().all(|c| c == '.' || is_d_char(c));
    if !ok {
        return Err(IsoError::Invalid(format!(
            "file name {name:?} must be NAME.EXT (one dot, at most {MAX_NAME} characters of A-Z, \
             0-9 and _)"
        )));
    }
    Ok(())
}

/// A directory of the tree; `dirs` and `files` are indices into the layout's tables.
#[derive(Debug, Default)]
struct Dir {
    name: String,
    parent: usize,
    /// Sub-directory names to their index in `Layout::dirs`.
    dirs: BTreeMap<String, usize>,
    /// File names (with `;1`) to their index in the volume's files.
    files: BTreeMap<String, usize>,
    lba: u32,
    sectors: u32,
}

/// Every directory in path table order, each file's place, and the totals.
struct Layout {
    dirs: Vec<Dir>,
    file_lbas: Vec<u32>,
    path_table_len: u32,
    l_table: u32,
    m_table: u32,
    catalog: Option<u32>,
    total_sectors: u32,
}

fn sectors_for(len: usize) -> Result<u32, IsoError> {
    u32::try_from(len.div_ceil(SECTOR))
        .map_err(|_| IsoError::Invalid(format!("{len} bytes do not fit on an ISO 9660 volume")))
}

fn add_lba(lba: u32, sectors: u32) -> Result<u32, IsoError> {
    lba.checked_add(sectors)
        .ok_or_else(|| IsoError::Invalid("the volume is larger than ISO 9660 can address".into()))
}

/// Directory record length for a name of `name_len` bytes (padded to even).
fn record_len(name_len: usize) -> usize {
    let len = 33 + name_len;
    len + len % 2
}

/// Bytes a directory's records take, none crossing a sector boundary.
fn dir_bytes(names: impl Iterator<Item = usize>) -> usize {
    // "." and ".." have one-byte names.
    let mut used = 2 * record_len(1);
    for name_len in names {
        let len = record_len(name_len);
        if used % SECTOR + len > SECTOR {
            used = used.div_ceil(SECTOR) * SECTOR;
        }
        used += len;
    }
    used
}

impl Layout {
    fn new(files: &[IsoFile<'_>], bootable: bool) -> Result<Layout, IsoError> {
        // The tree, directories numbered breadth first once all are known.
        let mut tree: Vec<Dir> = vec![Dir::default()];
        for (index, file) in files.iter().enumerate() {
            let Some((name, dirs)) = file.path.split_last() else {
                return Err(IsoError::Invalid("a file with an empty path".into()));
            };
            if dirs.len() > MAX_DEPTH {
                return Err(IsoError::Invalid(format!(
                    "{} is nested deeper than ISO 9660's 8 levels",
                    file.path.join("/")
                )));
            }
            if file.data.len() > MAX_FILE {
                return Err(IsoError::Invalid(format!(
                    "{} is {} bytes; ISO 9660 files hold at most {MAX_FILE}",
                    file.path.join("/"),
                    file.data.len()
                )));
            }
            check_file_name(name)?;
            let mut at = 0;
            for dir in dirs {
                check_dir_name(dir)?;
                at = match tree[at].dirs.get(dir) {
                    Some(&next) => next,
                    None => {
                        let next = tree.len();
                        tree.push(Dir {
                            name: dir.clone(),
                            parent: at,
                            ..Dir::default()
                        });
                        tree[at].dirs.insert(dir.clone(), next);
                        next
                    }
                };
            }
            let stored = format!("{name};1");
            if tree[at].dirs.contains_key(name) || tree[at].files.insert(stored, index).is_some() {
                return Err(IsoError::Invalid(format!(
                    "{} is on the volume twice",
                    file.path.join("/")
                )));
            }
        }
        for dir in &tree {
            if dir
                .dirs
                .keys()
                .any(|d| dir.files.contains_key(&format!("{d};1")))
            {
                return Err(IsoError::Invalid(
                    "a name is both a file and a directory".into(),
                ));
            }
        }

        // Breadth first, children by name: the order the path table requires.
        let mut order = vec![0usize];
        let mut next = 0;
        while next < order.len() {
            let children: Vec<usize> = tree[order[next]].dirs.values().copied().collect();
            order.extend(children);
            next += 1;
        }
        let mut renumber = vec![0usize; tree.len()];
        for (new, &old) in order.iter().enumerate() {
            renumber[old] = new;
        }
        let mut dirs: Vec<Dir> = Vec::with_capacity(tree.len());
        let mut taken: Vec<Option<Dir>> = tree.into_iter().map(Some).collect();
        for &old in &order {
            let mut dir = taken[old].take().unwrap_or_default();
            dir.parent = renumber[dir.parent];
            for child in dir.dirs.values_mut() {
                *child = renumber[*child];
            }
            dirs.push(dir);
        }

        if dirs.len() > usize::from(u16::MAX) {
            return Err(IsoError::Invalid(
                "more directories than an ISO 9660 path table can number".into(),
            ));
        }
        let path_table_len: usize = dirs
            .iter()
            .map(|d| {
                let name = d.name.len().max(1);
                8 + name + name % 2
            })
            .sum();
        let path_table_len = u32::try_from(path_table_len)
            .map_err(|_| IsoError::Invalid("too many directories".into()))?;
        let table_sectors = sectors_for(path_table_len as usize)?;
        // PVD, maybe the boot record, terminator.
        let mut lba = PVD_LBA + if bootable { 3 } else { 2 };
        let l_table = lba;
        lba = add_lba(lba, table_sectors)?;
        let m_table = lba;
        lba = add_lba(lba, table_sectors)?;
        for dir in &mut dirs {
            let names = dir
                .dirs
                .keys()
                .map(String::len)
                .chain(dir.files.keys().map(String::len));
            dir.sectors = sectors_for(dir_bytes(names))?;
            dir.lba = lba;
            lba = add_lba(lba, dir.sectors)?;
        }
        let catalog = if bootable {
            let at = lba;
            lba = add_lba(lba, 1)?;
            Some(at)
        } else {
            None
        };
        let mut file_lbas = Vec::with_capacity(files.len());
        for file in files {
            file_lbas.push(lba);
            lba = add_lba(lba, sectors_for(file.data.len())?)?;
        }
        Ok(Layout {
            dirs,
            file_lbas,
            path_table_len,
            l_table,
            m_table,
            catalog,
            total_sectors: lba,
        })
    }
}

fn both_u16(v: u16) -> [u8; 4] {
    let [a, b] = v.to_le_bytes();
    [a, b, b, a]
}

fn both_u32(v: u32) -> [u8; 8] {
    let le = v.to_le_bytes();
    [le[0], le[1], le[2], le[3], le[3], le[2], le[1], le[0]]
}

/// The 7-byte recording date of a directory record (UTC).
fn dir_date(t: &Civil) -> [u8; 7] {
    // Civil::from_epoch bounds the year to 1980..=2107, so every field fits a byte.
    [
        (t.year - 1900) as u8,
        t.month as u8,
        t.day as u8,
        t.hour as u8,
        t.minute as u8,
        t.second as u8,
        0,
    ]
}

/// The 17-byte volume descriptor date (UTC).
fn vd_date(t: &Civil) -> [u8; 17] {
    let text = format!(
        "{:04}{:02}{:02}{:02}{:02}{:02}00",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    );
    let mut out = [0u8; 17];
    out[..16].copy_from_slice(&text.as_bytes()[..16]);
    out
}

/// One directory record.
fn dir_record(name: &[u8], lba: u32, len: u32, is_dir: bool, time: &Civil) -> Vec<u8> {
    let mut rec = vec![0u8; record_len(name.len())];
    // record_len is at most 33 + 31 + 1 bytes.
    rec[0] = rec.len() as u8;
    rec[2..10].copy_from_slice(&both_u32(lba));
    rec[10..18].copy_from_slice(&both_u32(len));
    rec[18..25].copy_from_slice(&dir_date(time));
    rec[25] = if is_dir { 0x02 } else { 0x00 };
    rec[28..32].copy_from_slice(&both_u16(1));
    rec[32] = name.len() as u8;
    rec[33..33 + name.len()].copy_from_slice(name);
    rec
}

fn put_padded(field: &mut [u8], text: &str) {
    field.fill(b' ');
    field[..text.len()].copy_from_slice(text.as_bytes());
}

/// Writes the whole volume; returns the number of bytes written.
pub fn write_volume<W: Write>(vol: &Volume<'_>, out: &mut W) -> Result<u64, IsoError> {
    check_volume_id(vol.volume_id)?;
    let layout = Layout::new(&vol.files, vol.boot.is_some())?;
    let patches = match vol.boot {
        Some(boot) => boot.patches(&layout.file_lbas, &vol.files)?,
        None => Vec::new(),
    };
    let mut w = SectorWriter { out, written: 0 };

    w.zeros(PVD_LBA as usize * SECTOR)?;
    w.sector(&pvd(vol, &layout))?;
    if let Some(catalog) = layout.catalog {
        w.sector(&boot_record(catalog))?;
    }
    w.sector(&terminator())?;
    w.padded(&path_table(&layout, false))?;
    w.padded(&path_table(&layout, true))?;
    for number in 0..layout.dirs.len() {
        w.padded(&dir_extent(number, &layout, &vol.files, &vol.time))?;
    }
    if let Some(boot) = vol.boot {
        w.sector(&boot.catalog(&layout.file_lbas)?)?;
    }
    for (index, file) in vol.files.iter().enumerate() {
        match patches.iter().find(|(i, _)| *i == index) {
            Some((_, patched)) => w.padded(patched)?,
            None => w.padded(&file.data)?,
        }
    }
    debug_assert_eq!(w.written, u64::from(layout.total_sectors) * SECTOR as u64);
    Ok(w.written)
}

struct SectorWriter<'w, W: Write> {
    out: &'w mut W,
    written: u64,
}

impl<W: Write> SectorWriter<'_, W> {
    fn zeros(&mut self, len: usize) -> Result<(), IsoError> {
        const ZEROS: [u8; SECTOR] = [0; SECTOR];
        let mut left = len;
        while left > 0 {
            let n = left.min(SECTOR);
            self.out.write_all(&ZEROS[..n])?;
            left -= n;
        }
        self.written += len as u64;
        Ok(())
    }

    fn sector(&mut self, data: &[u8; SECTOR]) -> Result<(), IsoError> {
        self.padded(data)
    }

    /// `data` and zeros up to the next sector boundary.
    fn padded(&mut self, data: &[u8]) -> Result<(), IsoError> {
        self.out.write_all(data)?;
        self.written += data.len() as u64;
        let rest = (SECTOR - data.len() % SECTOR) % SECTOR;
        self.zeros(rest)
    }
}

fn pvd(vol: &Volume<'_>, layout: &Layout) -> [u8; SECTOR] {
    let mut s = [0u8; SECTOR];
    s[0] = 1;
    s[1..6].copy_from_slice(b"CD001");
    s[6] = 1;
    put_padded(&mut s[8..40], "");
    put_padded(&mut s[40..72], vol.volume_id);
    s[80..88].copy_from_slice(&both_u32(layout.total_sectors));
    s[120..124].copy_from_slice(&both_u16(1));
    s[124..128].copy_from_slice(&both_u16(1));
    // SECTOR is 2048.
    s[128..132].copy_from_slice(&both_u16(SECTOR as u16));
    s[132..140].copy_from_slice(&both_u32(layout.path_table_len));
    s[140..144].copy_from_slice(&layout.l_table.to_le_bytes());
    s[148..152].copy_from_slice(&layout.m_table.to_be_bytes());
    let root = &layout.dirs[0];
    let rec = dir_record(
        &[0],
        root.lba,
        root.sectors * SECTOR as u32,
        true,
        &vol.time,
    );
    s[156..156 + rec.len()].copy_from_slice(&rec);
    put_padded(&mut s[190..318], "");
    put_padded(&mut s[318..446], "");
    put_padded(&mut s[446..574], "");
    put_padded(&mut s[574..702], "VMDEPLOY");
    put_padded(&mut s[702..739], "");
    put_padded(&mut s[739..776], "");
    put_padded(&mut s[776..813], "");
    let date = vd_date(&vol.time);
    s[813..830].copy_from_slice(&date);
    s[830..847].copy_from_slice(&date);
    // Expiration and effective dates: "not specified" is sixteen '0's and a zero offset.
    s[847..863].fill(b'0');
    s[864..880].fill(b'0');
    s[881] = 1;
    s
}

fn boot_record(catalog: u32) -> [u8; SECTOR] {
    let mut s = [0u8; SECTOR];
    s[0] = 0;
    s[1..6].copy_from_slice(b"CD001");
    s[6] = 1;
    s[7..7 + 23].copy_from_slice(b"EL TORITO SPECIFICATION");
    s[0x47..0x4B].copy_from_slice(&catalog.to_le_bytes());
    s
}

fn terminator() -> [u8; SECTOR] {
    let mut s = [0u8; SECTOR];
    s[0] = 255;
    s[1..6].copy_from_slice(b"CD001");
    s[6] = 1;
    s
}

fn path_table(layout: &Layout, big_endian: bool) -> Vec<u8> {
    let mut t = Vec::with_capacity(layout.path_table_len as usize);
    for dir in &layout.dirs {
        let name: &[u8] = if dir.name.is_empty() {
            &[0]
        } else {
            dir.name.as_bytes()
        };
        // Names are at most MAX_NAME bytes; Layout::new checked that directory numbers fit 16
        // bits.
        t.push(name.len() as u8);
        t.push(0);
        let parent = (dir.parent + 1) as u16;
        if big_endian {
            t.extend_from_slice(&dir.lba.to_be_bytes());
            t.extend_from_slice(&parent.to_be_bytes());
        } else {
            t.extend_from_slice(&dir.lba.to_le_bytes());
            t.extend_from_slice(&parent.to_le_bytes());
        }
        t.extend_from_slice(name);
        if name.len() % 2 == 1 {
            t.push(0);
        }
    }
    t
}

/// A directory's records: ".", "..", then every child by name.
fn dir_extent(number: usize, layout: &Layout, files: &[IsoFile<'_>], time: &Civil) -> Vec<u8> {
    let dir = &layout.dirs[number];
    let parent = &layout.dirs[dir.parent];
    let size = |d: &Dir| d.sectors * SECTOR as u32;
    let mut records = vec![
        dir_record(&[0], dir.lba, size(dir), true, time),
        dir_record(&[1], parent.lba, size(parent), true, time),
    ];
    // Sub-directories and files merged by name, as ISO 9660 sorts them.
    let mut children: Vec<(&str, Vec<u8>)> = Vec::new();
    for (name, &child) in &dir.dirs {
        let d = &layout.dirs[child];
        children.push((
            name,
            dir_record(name.as_bytes(), d.lba, size(d), true, time),
        ));
    }
    for (name, &index) in &dir.files {
        // Sizes were checked against MAX_FILE in Layout::new.
        let len = files[index].data.len() as u32;
        let lba = layout.file_lbas[index];
        children.push((name, dir_record(name.as_bytes(), lba, len, false, time)));
    }
    children.sort_by(|a, b| a.0.cmp(b.0));
    records.extend(children.into_iter().map(|(_, r)| r));

    let mut out = Vec::with_capacity(dir.sectors as usize * SECTOR);
    for rec in records {
        if out.len() % SECTOR + rec.len() > SECTOR {
            out.resize(out.len().div_ceil(SECTOR) * SECTOR, 0);
        }
        out.extend_from_slice(&rec);
    }
    out.resize(dir.sectors as usize * SECTOR, 0);
    out
}
