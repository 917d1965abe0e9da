//! Checking a written disk with the system's own tools, the way an operator would: the partition
//! table as `sfdisk --json` / `sfdisk --dump` / `sgdisk -p` read it, a partition's file system as
//! `blkid -p` probes it, its consistency as `fsck -n` sees it, and its bytes.
//!
//! The disk is a block device or an image file. A partition is addressed by its byte range
//! ([`PartitionInfo::range`]), so no partition device nodes (`losetup -P`, udev) are needed;
//! [`PartitionView`] attaches one partition read-only as a loop device for the tools that want a
//! device of its own (fsck).
//!
//! A missing tool fails the test with the package to install ([`crate::tools::tool`]).

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tools::{tool, tool_ok};

/// The MBR type and GPT type GUID of a Linux file system partition.
pub const MBR_LINUX: &str = "83";
/// The MBR type of a Linux swap partition.
pub const MBR_SWAP: &str = "82";
/// The MBR type of an EFI system partition.
pub const MBR_EFI: &str = "ef";
/// GPT: Linux filesystem data.
pub const GPT_LINUX: &str = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";
/// GPT: Linux swap.
pub const GPT_SWAP: &str = "0657FD6D-A4AB-43C4-84E5-0933C84B4F4F";
/// GPT: EFI System.
pub const GPT_EFI: &str = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B";

/// A partition table as `sfdisk --json` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionTable {
    /// `dos` or `gpt`.
    pub label: String,
    /// The disk identifier (`0x1234abcd` for dos, a GUID for gpt).
    pub id: String,
    /// Sector size in bytes.
    pub sector_size: u64,
    /// The partitions, in table order.
    pub partitions: Vec<PartitionInfo>,
}

/// One partition of a [`PartitionTable`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    /// The node name sfdisk gives it (`/dev/loop3p1`, `disk.img1`).
    pub node: String,
    /// The partition number (from the node name).
    pub number: u32,
    /// First sector.
    pub start: u64,
    /// Length in sectors.
    pub size: u64,
    /// The type: MBR hex without `0x` (`83`), GPT type GUID upper case.
    pub type_: String,
    /// GPT partition name, if any.
    pub name: Option<String>,
    /// GPT partition GUID, if any.
    pub uuid: Option<String>,
    /// The MBR boot flag.
    pub bootable: bool,
}

impl PartitionInfo {
    /// The partition's byte range `(offset, length)` on a disk of `sector_size`-byte sectors.
    pub fn range(&self, sector_size: u64) -> (u64, u64) {
        (self.start * sector_size, self.size * sector_size)
    }
}

/// The partition table of `disk` as `sfdisk --json` reads it. Panics (with sfdisk's words) when
/// there is none.
pub fn partitions(disk: &Path) -> PartitionTable {
    let path = disk.to_string_lossy();
    let out = tool("sfdisk", "fdisk", &["--json", &path]);
    assert!(
        out.status.success(),
        "sfdisk --json {path} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let out = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("sfdisk --json {path} printed no JSON ({e}): {out}"));
    let table = &json["partitiontable"];
    let text = |v: &serde_json::Value| v.as_str().map(str::to_owned);
    let partitions = table["partitions"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|p| {
            let node = text(&p["node"]).expect("a partition has a node");
            let digits: String = node
                .chars()
                .rev()
                .take_while(char::is_ascii_digit)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            PartitionInfo {
                number: digits.parse().unwrap_or(0),
                node,
                start: p["start"].as_u64().expect("a partition has a start"),
                size: p["size"].as_u64().expect("a partition has a size"),
                type_: text(&p["type"])
                    .expect("a partition has a type")
                    .to_uppercase(),
                name: text(&p["name"]),
                uuid: text(&p["uuid"]),
                bootable: p["bootable"].as_bool().unwrap_or(false),
            }
        })
        .collect();
    PartitionTable {
        label: text(&table["label"]).expect("a table has a label"),
        id: text(&table["id"]).unwrap_or_default(),
        sector_size: table["sectorsize"].as_u64().unwrap_or(512),
        partitions,
    }
}

/// `sfdisk --dump` of `disk`, as text (for messages and for the operator's view).
pub fn sfdisk_dump(disk: &Path) -> String {
    tool_ok("sfdisk", "fdisk", &["--dump", &disk.to_string_lossy()])
}

/// One partition line of `sgdisk -p`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SgdiskPartition {
    /// Partition number.
    pub number: u32,
    /// First sector.
    pub start: u64,
    /// Last sector (inclusive).
    pub end: u64,
    /// sgdisk's type code (`8300`, `8200`, `EF00`).
    pub code: String,
    /// The partition name.
    pub name: String,
}

/// The partitions `sgdisk -p` lists for `disk` (a GPT disk), and its whole output. sgdisk also
/// verifies the table's CRCs; a damaged table makes it fail, which fails the test.
pub fn sgdisk_partitions(disk: &Path) -> (Vec<SgdiskPartition>, String) {
    let out = tool_ok("sgdisk", "gdisk", &["-p", &disk.to_string_lossy()]);
    let mut parts = Vec::new();
    let mut in_table = false;
    for line in out.lines() {
        if line.trim_start().starts_with("Number") {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        // Number Start End Size Unit Code Name...
        if fields.len() < 6 {
            continue;
        }
        let (Ok(number), Ok(start), Ok(end)) = (
            fields[0].parse::<u32>(),
            fields[1].parse::<u64>(),
            fields[2].parse::<u64>(),
        ) else {
            continue;
        };
        parts.push(SgdiskPartition {
            number,
            start,
            end,
            code: fields[5].to_owned(),
            name: fields[6..].join(" "),
        });
    }
    (parts, out)
}

/// What `blkid -p -o export` says of the file system at byte range `(offset, len)` of `disk`
/// (`None` for the whole device): `TYPE`, `UUID`, `LABEL`, ... Empty when blkid finds nothing.
pub fn blkid(disk: &Path, range: Option<(u64, u64)>) -> BTreeMap<String, String> {
    let mut args = vec!["-p".to_owned(), "-o".into(), "export".into()];
    if let Some((offset, len)) = range {
        args.extend([
            "-O".into(),
            offset.to_string(),
            "-S".into(),
            len.to_string(),
        ]);
    }
    args.push(disk.to_string_lossy().into_owned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = tool("blkid", "util-linux", &args);
    // Exit 2: nothing found.
    assert!(
        out.status.success() || out.status.code() == Some(2),
        "blkid {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `len` bytes of `disk` from byte `offset`.
pub fn read_range(disk: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut f = std::fs::File::open(disk).unwrap_or_else(|e| panic!("opening {disk:?}: {e}"));
    f.seek(SeekFrom::Start(offset))
        .unwrap_or_else(|e| panic!("seeking {disk:?} to {offset}: {e}"));
    let mut buf = vec![0u8; len];
    f.read_exact(&mut buf)
        .unwrap_or_else(|e| panic!("reading {len} bytes of {disk:?} at {offset}: {e}"));
    buf
}

/// The first byte where `a` and `b` differ, if any (and whether their lengths differ).
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then_some(a.len().min(b.len())))
}

/// One partition of a disk attached read-only as a loop device of its own
/// (`losetup --offset --sizelimit --read-only`), detached on drop.
pub struct PartitionView {
    device: PathBuf,
}

impl PartitionView {
    /// Attaches bytes `(offset, len)` of `disk`. Needs root (as every loop device).
    pub fn attach(disk: &Path, (offset, len): (u64, u64)) -> PartitionView {
        crate::loopdev::require_loop_devices();
        let out = tool_ok(
            "losetup",
            "mount",
            &[
                "--find",
                "--show",
                "--read-only",
                "--offset",
                &offset.to_string(),
                "--sizelimit",
                &len.to_string(),
                &disk.to_string_lossy(),
            ],
        );
        let device = PathBuf::from(out.trim());
        assert!(device.starts_with("/dev"), "losetup printed {out:?}");
        PartitionView { device }
    }

    /// The loop device, e.g. `/dev/loop7`.
    pub fn device(&self) -> &Path {
        &self.device
    }
}

impl Drop for PartitionView {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
    }
}

/// Checks the file system at `(offset, len)` of `disk` read-only, with the checker its `fs_type`
/// (blkid's TYPE) needs: `e2fsck -fn` for ext2/3/4, `xfs_repair -n` for xfs, `fsck.vfat -n` for
/// vfat. Panics with the checker's output when it finds anything.
pub fn fsck_clean(disk: &Path, range: (u64, u64), fs_type: &str) {
    let view = PartitionView::attach(disk, range);
    let dev = view.device().to_string_lossy().into_owned();
    let (program, package, args): (&str, &str, Vec<&str>) = match fs_type {
        "ext2" | "ext3" | "ext4" => ("e2fsck", "e2fsprogs", vec!["-f", "-n", &dev]),
        "xfs" => ("xfs_repair", "xfsprogs", vec!["-n", &dev]),
        "vfat" => ("fsck.vfat", "dosfstools", vec!["-n", &dev]),
        other => panic!("no checker known for a {other} file system"),
    };
    let out = tool(program, package, &args);
    assert!(
        out.status.success(),
        "{program} {args:?} on the {fs_type} file system at {range:?} found problems ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
