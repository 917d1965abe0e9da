//! El Torito: the boot catalog with a BIOS (x86) entry and a UEFI section, and isolinux's
//! boot-info-table.
//!
//! Catalog sector: validation entry, initial/default entry (BIOS, no emulation), a final section
//! header for platform 0xEF (UEFI) with one no-emulation entry for the EFI system image.

use super::volume::{BootCatalog, IsoFile, SECTOR};
use super::IsoError;

const PLATFORM_X86: u8 = 0x00;
const PLATFORM_EFI: u8 = 0xEF;
const BOOTABLE: u8 = 0x88;
const NO_EMULATION: u8 = 0x00;
const FINAL_SECTION_HEADER: u8 = 0x91;
/// The primary volume descriptor's sector, which the boot-info-table names.
const PVD_LBA: u32 = 16;
/// isolinux is loaded 4 virtual (512-byte) sectors at a time by the BIOS: the rest it reads
/// itself, so the default entry loads 2 KiB as xorriso's `-boot-load-size 4` does.
const BIOS_LOAD_SECTORS: u16 = 4;

/// The two boot entries, by index into the volume's files.
#[derive(Debug, Clone, Copy)]
pub struct ElTorito {
    /// The BIOS boot image (isolinux.bin), which gets a boot-info-table.
    pub bios_image: usize,
    /// The EFI system image (FAT).
    pub efi_image: usize,
    /// The EFI image's length in bytes.
    pub efi_image_len: usize,
}

impl ElTorito {
    fn lba(file_lbas: &[u32], index: usize) -> Result<u32, IsoError> {
        file_lbas
            .get(index)
            .copied()
            .ok_or_else(|| IsoError::Invalid(format!("boot image {index} is not on the volume")))
    }
}

/// A 32-byte catalog entry (default or section entry) for a no-emulation image.
fn boot_entry(load_sectors: u16, lba: u32) -> [u8; 32] {
    let mut e = [0u8; 32];
    e[0] = BOOTABLE;
    e[1] = NO_EMULATION;
    // Load segment 0 means the traditional 0x7C0.
    e[6..8].copy_from_slice(&load_sectors.to_le_bytes());
    e[8..12].copy_from_slice(&lba.to_le_bytes());
    e
}

/// The validation entry: header id 1, platform, a checksum making the 16 words sum to zero, and
/// the 0x55 0xAA key.
fn validation_entry(platform: u8) -> [u8; 32] {
    let mut e = [0u8; 32];
    e[0] = 0x01;
    e[1] = platform;
    e[30] = 0x55;
    e[31] = 0xAA;
    let sum = e.chunks_exact(2).fold(0u16, |acc, w| {
        acc.wrapping_add(u16::from_le_bytes([w[0], w[1]]))
    });
    e[28..30].copy_from_slice(&0u16.wrapping_sub(sum).to_le_bytes());
    e
}

impl BootCatalog for ElTorito {
    fn catalog(&self, file_lbas: &[u32]) -> Result<[u8; SECTOR], IsoError> {
        let efi_sectors = u16::try_from(self.efi_image_len.div_ceil(512)).map_err(|_| {
            IsoError::Invalid(format!(
                "the EFI system image is {} bytes; an El Torito entry loads at most 32 MiB",
                self.efi_image_len
            ))
        })?;
        let mut s = [0u8; SECTOR];
        s[0..32].copy_from_slice(&validation_entry(PLATFORM_X86));
        s[32..64].copy_from_slice(&boot_entry(
            BIOS_LOAD_SECTORS,
            Self::lba(file_lbas, self.bios_image)?,
        ));
        let mut header = [0u8; 32];
        header[0] = FINAL_SECTION_HEADER;
        header[1] = PLATFORM_EFI;
        header[2..4].copy_from_slice(&1u16.to_le_bytes());
        s[64..96].copy_from_slice(&header);
        s[96..128].copy_from_slice(&boot_entry(
            efi_sectors,
            Self::lba(file_lbas, self.efi_image)?,
        ));
        Ok(s)
    }

    fn patches(
        &self,
        file_lbas: &[u32],
        files: &[IsoFile<'_>],
    ) -> Result<Vec<(usize, Vec<u8>)>, IsoError> {
        let image = files
            .get(self.bios_image)
            .ok_or_else(|| IsoError::Invalid("the BIOS boot image is not on the volume".into()))?;
        let patched = boot_info_table(&image.data, Self::lba(file_lbas, self.bios_image)?)?;
        Ok(vec![(self.bios_image, patched)])
    }
}

/// isolinux's boot-info-table (as `mkisofs -boot-info-table`): at byte 8 of the image, the
/// PVD's LBA, the image's LBA, its length and the 32-bit sum of its words from byte 64 on.
pub fn boot_info_table(image: &[u8], lba: u32) -> Result<Vec<u8>, IsoError> {
    if image.len() < 64 || !image.len().is_multiple_of(4) {
        return Err(IsoError::Invalid(format!(
            "isolinux.bin is {} bytes: a boot image with a boot-info-table must be at least 64 \
             bytes and a multiple of 4",
            image.len()
        )));
    }
    let len = u32::try_from(image.len())
        .map_err(|_| IsoError::Invalid("isolinux.bin is larger than 4 GiB".into()))?;
    let checksum = image[64..].chunks_exact(4).fold(0u32, |acc, w| {
        acc.wrapping_add(u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
    });
    let mut out = image.to_vec();
    out[8..12].copy_from_slice(&PVD_LBA.to_le_bytes());
    out[12..16].copy_from_slice(&lba.to_le_bytes());
    out[16..20].copy_from_slice(&len.to_le_bytes());
    out[20..24].copy_from_slice(&checksum.to_le_bytes());
    out[24..64].fill(0);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_entry_sums_to_zero() {
        let e = validation_entry(PLATFORM_X86);
        let sum = e.chunks_exact(2).fold(0u16, |a, w| {
            a.wrapping_add(u16::from_le_bytes([w[0], w[1]]))
        });
        assert_eq!(sum, 0);
        assert_eq!(&e[30..], &[0x55, 0xAA]);
    }

    #[test]
    fn catalog_has_bios_and_efi_entries() {
        let t = ElTorito {
            bios_image: 0,
            efi_image: 1,
            efi_image_len: 1 << 20,
        };
        let s = t.catalog(&[40, 60]).expect("catalog");
        assert_eq!(s[32], BOOTABLE);
        assert_eq!(u16::from_le_bytes([s[38], s[39]]), 4);
        assert_eq!(u32::from_le_bytes([s[40], s[41], s[42], s[43]]), 40);
        assert_eq!(
            (s[64], s[65], s[66]),
            (FINAL_SECTION_HEADER, PLATFORM_EFI, 1)
        );
        assert_eq!(s[96], BOOTABLE);
        assert_eq!(u16::from_le_bytes([s[102], s[103]]), 2048);
        assert_eq!(u32::from_le_bytes([s[104], s[105], s[106], s[107]]), 60);
        assert!(s[128..].iter().all(|&b| b == 0));
    }

    #[test]
    fn oversized_efi_image_is_an_error() {
        let t = ElTorito {
            bios_image: 0,
            efi_image: 1,
            efi_image_len: 40 << 20,
        };
        assert!(t.catalog(&[40, 60]).is_err());
        assert!(t.catalog(&[40]).is_err());
    }

    #[test]
    fn boot_info_table_fields() {
        let mut image = vec![0u8; 2048];
        image[64..68].copy_from_slice(&7u32.to_le_bytes());
        image[2044..2048].copy_from_slice(&u32::MAX.to_le_bytes());
        // Old bytes in the table area are overwritten.
        image[8..64].fill(0xAB);
        let out = boot_info_table(&image, 99).expect("patched");
        let word = |at: usize| u32::from_le_bytes([out[at], out[at + 1], out[at + 2], out[at + 3]]);
        assert_eq!((word(8), word(12), word(16)), (16, 99, 2048));
        assert_eq!(word(20), 6); // 7 + 0xFFFFFFFF wraps
        assert!(out[24..64].iter().all(|&b| b == 0));
        assert!(boot_info_table(&image[..63], 1).is_err());
        assert!(boot_info_table(&image[..66], 1).is_err());
    }
}
