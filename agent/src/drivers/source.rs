//! Where the driver pack is read from: the deploy CD (a virtual-media boot), read as ISO 9660
//! through `vmdeploy_shared::iso::read` with no `isofs` and no mount; or a directory of the
//! initramfs (a network boot, which has no CD).
//!
//! The CD is a USB CD-ROM (`sr_mod`) that may show a moment after the floppy: the search scans
//! `/sys/class/block/sr*` a bounded number of times. Every byte read from the CD is counted: on
//! an iLO each one crosses the management network.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use vmdeploy_shared::driver_pack::{self, DriverPack};
use vmdeploy_shared::iso::read::{IsoEntry, IsoVolume};

/// A place the pack's files can be read from.
pub trait PackSource {
    /// Where it is, for the log.
    fn describe(&self) -> String;
    /// The pack file `name` (its name in the index), refused above `limit` bytes.
    fn read(&mut self, name: &str, limit: u64) -> anyhow::Result<Vec<u8>>;
    /// Bytes read from the medium so far.
    fn bytes_read(&self) -> u64;
}

/// Reads the index of `source` and parses it.
pub fn read_index(source: &mut dyn PackSource) -> anyhow::Result<DriverPack> {
    let bytes = source
        .read(driver_pack::INDEX_NAME, driver_pack::MAX_INDEX_BYTES)
        .with_context(|| format!("reading the driver index from {}", source.describe()))?;
    let text = String::from_utf8(bytes).context("the driver index is not UTF-8")?;
    DriverPack::parse(&text).with_context(|| format!("the driver index on {}", source.describe()))
}

/// The pack in a directory (a network-boot ramdisk's `/usr/lib/vmdeploy/drivers`).
#[derive(Debug)]
pub struct DirSource {
    dir: PathBuf,
    read: u64,
}

impl DirSource {
    /// The pack in `dir`, if it has an index.
    pub fn open(dir: &Path) -> Option<DirSource> {
        dir.join(driver_pack::INDEX_NAME)
            .is_file()
            .then(|| DirSource {
                dir: dir.to_owned(),
                read: 0,
            })
    }
}

impl PackSource for DirSource {
    fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    fn read(&mut self, name: &str, limit: u64) -> anyhow::Result<Vec<u8>> {
        anyhow::ensure!(
            !name.contains('/') && name != ".." && !name.is_empty(),
            "{name:?} is not a pack file name"
        );
        let path = self.dir.join(name);
        let file = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        let mut data = Vec::new();
        file.take(limit.saturating_add(1))
            .read_to_end(&mut data)
            .with_context(|| format!("reading {}", path.display()))?;
        anyhow::ensure!(
            data.len() as u64 <= limit,
            "{} is over {limit} bytes",
            path.display()
        );
        self.read += data.len() as u64;
        Ok(data)
    }

    fn bytes_read(&self) -> u64 {
        self.read
    }
}

/// Counts the bytes read through it.
#[derive(Debug)]
struct Counting<R> {
    inner: R,
    count: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        Ok(n)
    }
}

impl<R: Seek> Seek for Counting<R> {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.inner.seek(pos)
    }
}

/// The pack on a CD.
#[derive(Debug)]
pub struct CdSource {
    device: PathBuf,
    volume: IsoVolume<Counting<File>>,
    files: BTreeMap<String, IsoEntry>,
}

impl CdSource {
    /// Opens `device` as ISO 9660 and lists its pack directory; `Ok(None)` when it is a CD
    /// without a pack (not ours, or an older deploy ISO).
    pub fn open(device: &Path) -> anyhow::Result<Option<CdSource>> {
        let file = File::open(device).with_context(|| format!("opening {}", device.display()))?;
        let mut volume = IsoVolume::open(Counting {
            inner: file,
            count: 0,
        })
        .with_context(|| format!("reading {} as ISO 9660", device.display()))?;
        let dir = match volume.lookup(driver_pack::DIR) {
            Ok(dir) => dir,
            Err(vmdeploy_shared::iso::read::IsoReadError::NotFound(_)) => return Ok(None),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("looking for /{} on {}", driver_pack::DIR, device.display())
                })
            }
        };
        let files = volume
            .list(&dir)
            .with_context(|| format!("listing /{} on {}", driver_pack::DIR, device.display()))?
            .into_iter()
            .filter(|e| !e.is_dir)
            .map(|e| (e.name.clone(), e))
            .collect();
        Ok(Some(CdSource {
            device: device.to_owned(),
            volume,
            files,
        }))
    }
}

impl PackSource for CdSource {
    fn describe(&self) -> String {
        format!("the CD in {}", self.device.display())
    }

    fn read(&mut self, name: &str, limit: u64) -> anyhow::Result<Vec<u8>> {
        // The reader shows names lower case, without `;1` and a trailing dot.
        let shown = name.trim_end_matches('.').to_ascii_lowercase();
        let entry = self
            .files
            .get(&shown)
            .with_context(|| format!("/{}/{name} is not on {}", driver_pack::DIR, self.describe()))?
            .clone();
        anyhow::ensure!(
            u64::from(entry.len) <= limit,
            "/{}/{name} is {} bytes, over {limit}",
            driver_pack::DIR,
            entry.len
        );
        self.volume
            .read_range(&entry, 0, u64::from(entry.len))
            .with_context(|| {
                format!(
                    "reading /{}/{name} from {}",
                    driver_pack::DIR,
                    self.describe()
                )
            })
    }

    fn bytes_read(&self) -> u64 {
        self.volume.device().count
    }
}

/// Where to look for the CD, and how long.
#[derive(Debug, Clone)]
pub struct CdSearch {
    /// `/sys/class/block`.
    pub sys_class_block: PathBuf,
    /// `/dev`.
    pub dev_dir: PathBuf,
    /// Scans before giving up.
    pub attempts: u32,
    /// Pause between scans.
    pub interval: Duration,
}

impl Default for CdSearch {
    fn default() -> Self {
        CdSearch {
            sys_class_block: PathBuf::from("/sys/class/block"),
            dev_dir: PathBuf::from("/dev"),
            attempts: 15,
            interval: Duration::from_secs(1),
        }
    }
}

impl CdSearch {
    /// The first CD-ROM (`srN`, by name) that holds a driver pack; a CD that cannot be read is
    /// logged and passed over. `Ok(None)` once every attempt found none.
    pub fn find(&self) -> Option<CdSource> {
        for attempt in 1..=self.attempts.max(1) {
            let mut names: Vec<String> = std::fs::read_dir(&self.sys_class_block)
                .map(|read| {
                    read.filter_map(|e| e.ok())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| n.starts_with("sr"))
                        .collect()
                })
                .unwrap_or_default();
            names.sort();
            for name in names {
                let device = self.dev_dir.join(&name);
                match CdSource::open(&device) {
                    Ok(Some(cd)) => return Some(cd),
                    Ok(None) => {
                        tracing::info!(device = %device.display(), "a CD without a driver pack")
                    }
                    Err(e) => {
                        tracing::info!(device = %device.display(), "not a readable CD: {e:#}")
                    }
                }
            }
            if attempt < self.attempts {
                std::thread::sleep(self.interval);
            }
        }
        None
    }
}
