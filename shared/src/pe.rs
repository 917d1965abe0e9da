//! PE/COFF images (EFI binaries): whether one carries an Authenticode signature, which UEFI
//! Secure Boot needs of every loader it runs. Read from bytes that may come from anywhere (a
//! package, a user's image): nothing here panics.
//!
//! # Layout read (the PE format's headers)
//! ```text
//! +0      "MZ"                 +0x3c  u32 offset of the PE header
//! PE      "PE\0\0", then the 20-byte COFF header, then the optional header:
//!         +0 magic 0x10b (PE32) or 0x20b (PE32+); its data directories start at +96 or +112,
//!         their count in the 4 bytes before; entry 4 (8 bytes: file offset, length) is the
//!         attribute certificate table, where the signatures are
//! ```

/// The size of a PE image's attribute certificate table (its Authenticode signatures), `Some(0)`
/// for an unsigned image, `None` when `pe` is not a PE32 or PE32+ image. Never panics.
pub fn certificate_table_len(pe: &[u8]) -> Option<u32> {
    let u16_at = |at: usize| -> Option<u16> {
        Some(u16::from_le_bytes(
            pe.get(at..at.checked_add(2)?)?.try_into().ok()?,
        ))
    };
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(
            pe.get(at..at.checked_add(4)?)?.try_into().ok()?,
        ))
    };
    if pe.get(..2) != Some(b"MZ".as_slice()) {
        return None;
    }
    let header = usize::try_from(u32_at(0x3c)?).ok()?;
    if pe.get(header..header.checked_add(4)?) != Some(b"PE\0\0".as_slice()) {
        return None;
    }
    // The optional header follows the 4-byte signature and the 20-byte COFF header; its data
    // directories start at 96 (PE32) or 112 (PE32+), the certificate table is entry 4.
    let optional = header.checked_add(24)?;
    let directories = match u16_at(optional)? {
        0x10b => optional.checked_add(96)?,
        0x20b => optional.checked_add(112)?,
        _ => return None,
    };
    let count = u32_at(directories.checked_sub(4)?)?;
    if count <= 4 {
        return Some(0);
    }
    let entry = directories.checked_add(4 * 8)?;
    let (offset, len) = (u32_at(entry)?, u32_at(entry.checked_add(4)?)?);
    let end = usize::try_from(offset)
        .ok()?
        .checked_add(usize::try_from(len).ok()?)?;
    if offset == 0 || len == 0 || end > pe.len() {
        return Some(0);
    }
    Some(len)
}

/// The bytes of the section named `name` (up to 8 bytes, as the section table spells it) as
/// the file holds them; `None` when `pe` is not a PE image, has no such section, or the section
/// lies outside the file.
pub fn section<'a>(pe: &'a [u8], name: &str) -> Option<&'a [u8]> {
    let u16_at = |at: usize| -> Option<usize> {
        Some(usize::from(u16::from_le_bytes(
            pe.get(at..at.checked_add(2)?)?.try_into().ok()?,
        )))
    };
    let u32_at = |at: usize| -> Option<usize> {
        usize::try_from(u32::from_le_bytes(
            pe.get(at..at.checked_add(4)?)?.try_into().ok()?,
        ))
        .ok()
    };
    if pe.get(..2) != Some(b"MZ".as_slice()) || name.len() > 8 {
        return None;
    }
    let header = u32_at(0x3c)?;
    if pe.get(header..header.checked_add(4)?) != Some(b"PE\0\0".as_slice()) {
        return None;
    }
    let sections = u16_at(header.checked_add(6)?)?;
    let table = header
        .checked_add(24)?
        .checked_add(u16_at(header.checked_add(20)?)?)?;
    let mut wanted = [0u8; 8];
    wanted[..name.len()].copy_from_slice(name.as_bytes());
    (0..sections).find_map(|i| {
        let entry = table.checked_add(i.checked_mul(40)?)?;
        if pe.get(entry..entry.checked_add(8)?)? != wanted {
            return None;
        }
        let (len, start) = (
            u32_at(entry.checked_add(16)?)?,
            u32_at(entry.checked_add(20)?)?,
        );
        pe.get(start..start.checked_add(len)?)
    })
}

/// Builders for tests of other crates.
#[cfg(any(test, feature = "test-support"))]
pub mod test_support {
    /// [`pe`] with one section named `name` holding `data` at the end of the file.
    pub fn with_section(name: &str, data: &[u8]) -> Vec<u8> {
        let mut image = pe((0, 0), 0x400);
        let start = image.len();
        image.extend_from_slice(data);
        // One section; no optional header data directories past the 16 pe() writes (the
        // optional header's size is its PE32+ length, 240).
        image[0x80 + 6..0x80 + 8].copy_from_slice(&1u16.to_le_bytes());
        image[0x80 + 20..0x80 + 22].copy_from_slice(&240u16.to_le_bytes());
        let entry = 0x80 + 24 + 240;
        image[entry..entry + 8].fill(0);
        image[entry..entry + name.len()].copy_from_slice(name.as_bytes());
        let len = u32::try_from(data.len()).expect("a small section");
        let at = u32::try_from(start).expect("a small image");
        image[entry + 16..entry + 20].copy_from_slice(&len.to_le_bytes());
        image[entry + 20..entry + 24].copy_from_slice(&at.to_le_bytes());
        image
    }

    /// A minimal PE32+ image: MZ, the header at 0x80, 16 data directories, the certificate
    /// table at `cert` (offset, len).
    pub fn pe(cert: (u32, u32), len: usize) -> Vec<u8> {
        let mut d = vec![0u8; len];
        d[..2].copy_from_slice(b"MZ");
        d[0x3c..0x40].copy_from_slice(&0x80u32.to_le_bytes());
        d[0x80..0x84].copy_from_slice(b"PE\0\0");
        let optional = 0x80 + 24;
        d[optional..optional + 2].copy_from_slice(&0x20bu16.to_le_bytes());
        let dirs = optional + 112;
        d[dirs - 4..dirs].copy_from_slice(&16u32.to_le_bytes());
        d[dirs + 32..dirs + 36].copy_from_slice(&cert.0.to_le_bytes());
        d[dirs + 36..dirs + 40].copy_from_slice(&cert.1.to_le_bytes());
        d
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::pe;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn signed_unsigned_and_not_pe() {
        assert_eq!(
            certificate_table_len(&pe((0x400, 0x100), 0x500)),
            Some(0x100)
        );
        assert_eq!(certificate_table_len(&pe((0, 0), 0x500)), Some(0));
        // A table that runs past the end is no signature.
        assert_eq!(certificate_table_len(&pe((0x400, 0x200), 0x500)), Some(0));
        assert_eq!(certificate_table_len(b"ELF"), None);
    }

    #[test]
    fn a_section_is_found_by_name() {
        let image = test_support::with_section("mods", b"module bytes");
        assert_eq!(section(&image, "mods"), Some(b"module bytes".as_slice()));
        assert_eq!(section(&image, ".text"), None);
        assert_eq!(section(b"ELF", "mods"), None);
        // A section that says it is longer than the file is not returned.
        let mut cut = image.clone();
        cut.truncate(cut.len() - 1);
        assert_eq!(section(&cut, "mods"), None);
    }

    proptest! {
        #[test]
        fn sections_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1200), at in 0usize..1200) {
            let mut b = test_support::with_section("mods", &[7; 64]);
            let n = bytes.len().min(b.len()).min(at);
            b[..n].copy_from_slice(&bytes[..n]);
            let _ = section(&b, "mods");
            let _ = section(&bytes, "mods");
        }

        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600), at in 0usize..600) {
            let _ = certificate_table_len(&bytes);
            let mut b = pe((at as u32, 0x10), 0x300);
            let n = bytes.len().min(b.len());
            b[..n.min(at)].copy_from_slice(&bytes[..n.min(at)]);
            let _ = certificate_table_len(&b);
        }
    }
}
