//! Image formats: told apart by magic, qcow2 converted to a sparse raw file with imago (the crate
//! and approach of the agent's `stream::qcow2`, docs/crates.md §3.6).
//!
//! # Design
//! qcow2 cannot be converted while streaming (tables and clusters may sit anywhere in the file),
//! so the verified download is converted from a local file: imago reads the guest data in order,
//! and [`SparseWriter`] leaves every all-zero block a hole (unallocated and zero clusters alike).
//!
//! # Limitations
//! Backing files and external data files are refused (a cached image must be self-contained);
//! zstd-compressed clusters are refused by imago. Compressed downloads (gzip, xz, zstd) are
//! refused with a clear error rather than cached as "raw".

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use imago::{DenyImplicitOpenGate, FormatAccess, FormatDriverBuilder};
use serde::{Deserialize, Serialize};
use vmdeploy_shared::qcow2::{self, Qcow2Header};

use super::sparse::SparseWriter;
use super::ImageCacheError;

/// Header bytes [`detect`] reads to tell a qcow2 image's virtual size.
pub const HEADER_LEN: usize = qcow2::HEADER_LEN;

/// Formats that are not disk images we can write, by magic: refused, not cached as raw.
const REFUSED: &[(&[u8], &str)] = &[
    (
        &[0x1f, 0x8b],
        "gzip-compressed (decompress it, or give the agent driver the image)",
    ),
    (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], "xz-compressed"),
    (&[0x28, 0xb5, 0x2f, 0xfd], "zstd-compressed"),
    (b"KDMV", "vmdk"),
    (b"vhdxfile", "vhdx"),
];

/// The format an image came in; the cache always holds it raw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    /// Raw disk image, kept as downloaded (holes where zero).
    Raw,
    /// qcow2, converted to raw.
    Qcow2,
}

/// Decides the format from the first bytes of the download (at least [`HEADER_LEN`] unless the
/// image is shorter). For qcow2 also returns the virtual size.
pub fn detect(url: &str, head: &[u8]) -> Result<(ImageFormat, Option<u64>), ImageCacheError> {
    let unsupported = |reason: String| ImageCacheError::UnsupportedFormat {
        url: url.to_owned(),
        reason,
    };
    if qcow2::is_qcow2(head) {
        let header = Qcow2Header::parse(head).map_err(|e| unsupported(e.to_string()))?;
        return Ok((ImageFormat::Qcow2, Some(header.virtual_size)));
    }
    if let Some((_, name)) = REFUSED.iter().find(|(magic, _)| head.starts_with(magic)) {
        return Err(unsupported((*name).to_owned()));
    }
    Ok((ImageFormat::Raw, None))
}

/// Converts the qcow2 file `src` into the new raw file `dst` (sparse) and returns the raw size.
/// Blocking.
pub fn qcow2_to_raw(url: &str, src: &Path, dst: &Path) -> Result<u64, ImageCacheError> {
    let unsupported = |reason: String| ImageCacheError::UnsupportedFormat {
        url: url.to_owned(),
        reason,
    };
    let file = File::open(src)
        .map_err(|e| ImageCacheError::io(format!("opening {}", src.display()), e))?;
    let (head, image_len) = file
        .metadata()
        .and_then(|m| {
            let mut head = vec![0u8; m.len().min(qcow2::LAYOUT_HEAD_MAX as u64) as usize];
            file.read_exact_at(&mut head, 0)?;
            Ok((head, m.len()))
        })
        .map_err(|e| ImageCacheError::io(format!("reading {}", src.display()), e))?;
    qcow2::check_layout(&head, image_len).map_err(|e| unsupported(e.to_string()))?;
    let storage = imago::file::File::try_from(file)
        .map_err(|e| ImageCacheError::io(format!("opening {} for imago", src.display()), e))?;
    let qcow2 = imago::qcow2::Qcow2::<imago::file::File>::builder(storage)
        .write(false)
        .open(DenyImplicitOpenGate::default())
        .map_err(|e| unsupported(format!("opening the qcow2 image: {e}")))?;
    let access = FormatAccess::new(qcow2);
    let size = access.size();
    let out = File::create_new(dst)
        .map_err(|e| ImageCacheError::io(format!("creating {}", dst.display()), e))?;
    let mut writer = SparseWriter::new(out);
    // 1 MiB reads: a multiple of every qcow2 cluster size (512 B .. 2 MiB, 64 KiB typical);
    // imago splits reads at cluster boundaries itself.
    let mut buf = vec![0u8; 1 << 20];
    let mut offset = 0u64;
    while offset < size {
        let n = usize::try_from((size - offset).min(buf.len() as u64))
            .expect("at most the buffer's length");
        access.read(&mut buf[..n], offset).map_err(|e| {
            unsupported(format!("reading qcow2 guest data at offset {offset}: {e}"))
        })?;
        writer
            .write_all(&buf[..n])
            .map_err(|e| ImageCacheError::io(format!("writing {}", dst.display()), e))?;
        offset += n as u64;
    }
    let (out, len) = writer
        .finish()
        .map_err(|e| ImageCacheError::io(format!("finishing {}", dst.display()), e))?;
    out.sync_all()
        .map_err(|e| ImageCacheError::io(format!("syncing {}", dst.display()), e))?;
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qcow2_header(version: u32, backing: u64, size: u64) -> Vec<u8> {
        let mut h = Qcow2Header {
            version,
            virtual_size: size,
        }
        .to_bytes()
        .to_vec();
        h[8..16].copy_from_slice(&backing.to_be_bytes());
        h
    }

    /// Format and virtual size, or a word of the refusal.
    type Want = Result<(ImageFormat, Option<u64>), &'static str>;

    #[test]
    fn formats_by_magic() {
        let cases: &[(&str, Vec<u8>, Want)] = &[
            (
                "qcow2 v3",
                qcow2_header(3, 0, 1 << 30),
                Ok((ImageFormat::Qcow2, Some(1 << 30))),
            ),
            (
                "qcow2 v2",
                qcow2_header(2, 0, 512),
                Ok((ImageFormat::Qcow2, Some(512))),
            ),
            ("qcow2 v4", qcow2_header(4, 0, 512), Err("qcow2 version 4")),
            (
                "backing file",
                qcow2_header(3, 4096, 512),
                Err("backing file"),
            ),
            (
                "short qcow2",
                qcow2_header(3, 0, 512)[..10].to_vec(),
                Err("cut short"),
            ),
            ("gzip", vec![0x1f, 0x8b, 8, 0], Err("gzip")),
            ("zstd", vec![0x28, 0xb5, 0x2f, 0xfd, 0], Err("zstd")),
            ("xz", vec![0xfd, b'7', b'z', b'X', b'Z', 0, 1], Err("xz")),
            ("vmdk", b"KDMV\x01\x00".to_vec(), Err("vmdk")),
            ("raw zeros", vec![0u8; 64], Ok((ImageFormat::Raw, None))),
            (
                "raw mbr-ish",
                b"\xeb\x63\x90hello".to_vec(),
                Ok((ImageFormat::Raw, None)),
            ),
            ("empty", vec![], Ok((ImageFormat::Raw, None))),
        ];
        for (name, head, want) in cases {
            match (detect("http://x/i", head), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, *want, "{name}"),
                (Err(ImageCacheError::UnsupportedFormat { reason, .. }), Err(text)) => {
                    assert!(reason.contains(text), "{name}: {reason}")
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }
}
