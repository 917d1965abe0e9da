//! The config drive of a partition image deploy: Ironic's form is the base64 text of a
//! gzip-compressed ISO 9660 (or vfat) image, given inline or as an http(s) URL the text is
//! fetched from. [`decode`] turns what arrived into the image; it is untrusted input, so every
//! size is bounded (a gzip bomb stops at [`MAX_CONFIGDRIVE_BYTES`]) and nothing can panic.
//! Fetching a URL is the caller's (the conductor's and the agent's HTTP clients differ); both
//! bound the download by [`MAX_DOWNLOAD_BYTES`] and report failures as
//! [`ConfigDriveError::Fetch`].

use std::io::Read as _;

use base64::Engine as _;

/// The largest config drive accepted, decoded and uncompressed (Ironic's limit: 64 MiB).
pub const MAX_CONFIGDRIVE_BYTES: u64 = 64 << 20;

/// The largest download of a config drive URL: the base64 text of a gzip of the largest
/// image that does not compress (4/3 of it), with room for line breaks.
pub const MAX_DOWNLOAD_BYTES: u64 = MAX_CONFIGDRIVE_BYTES / 3 * 4 + (4 << 20);

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// ISO 9660: the primary volume descriptor at sector 16 (2048-byte sectors) starts with a type
/// byte and `CD001`.
const ISO9660_MAGIC_OFFSET: usize = 16 * 2048 + 1;
const ISO9660_MAGIC: &[u8; 5] = b"CD001";

/// Whether `value` (the config drive as sent) is a URL to fetch rather than inline text.
pub fn is_url(value: &str) -> bool {
    let t = value.trim();
    t.starts_with("http://") || t.starts_with("https://")
}

/// What is wrong with a config drive.
#[derive(Debug, thiserror::Error)]
pub enum ConfigDriveError {
    /// The text is empty.
    #[error("the config drive is empty")]
    Empty,
    /// The text is not base64.
    #[error("the config drive is not base64 text (Ironic's form: base64 of a gzipped image): {0}")]
    Base64(base64::DecodeError),
    /// The gzip stream is broken.
    #[error("the config drive's gzip data is corrupt: {0}")]
    Gzip(std::io::Error),
    /// Too large once decoded.
    #[error(
        "the config drive is larger than {} MiB once decoded and uncompressed (Ironic's limit)",
        MAX_CONFIGDRIVE_BYTES >> 20
    )]
    TooLarge,
    /// Not an ISO 9660 or vfat image.
    #[error(
        "the config drive ({0} bytes decoded) is neither an ISO 9660 nor a vfat image (first \
         bytes {1})"
    )]
    NotAnImage(usize, String),
    /// The URL could not be fetched.
    #[error("fetching the config drive from {url}: {reason}")]
    Fetch {
        /// The URL, without credentials or query.
        url: String,
        /// What went wrong.
        reason: String,
    },
}

/// The config drive image in `data`: base64 text (whitespace ignored) of a gzipped or plain
/// image. With `raw_allowed` (a download), data that is not base64 is taken as the image itself
/// (gzipped or not). The result must be an ISO 9660 or vfat image of at most
/// [`MAX_CONFIGDRIVE_BYTES`].
pub fn decode(data: &[u8], raw_allowed: bool) -> Result<Vec<u8>, ConfigDriveError> {
    let text: Vec<u8> = data
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    if text.is_empty() {
        return Err(ConfigDriveError::Empty);
    }
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    let decoded = match engine.decode(&text) {
        Ok(d) => d,
        Err(_) if raw_allowed => data.to_vec(),
        Err(e) => return Err(ConfigDriveError::Base64(e)),
    };
    let image = if decoded.starts_with(&GZIP_MAGIC) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(decoded.as_slice())
            .take(MAX_CONFIGDRIVE_BYTES + 1)
            .read_to_end(&mut out)
            .map_err(ConfigDriveError::Gzip)?;
        out
    } else {
        decoded
    };
    if image.len() as u64 > MAX_CONFIGDRIVE_BYTES {
        return Err(ConfigDriveError::TooLarge);
    }
    let iso = image
        .get(ISO9660_MAGIC_OFFSET..ISO9660_MAGIC_OFFSET + ISO9660_MAGIC.len())
        .is_some_and(|m| m == ISO9660_MAGIC);
    let vfat = crate::fs_id::probe(&image).is_some_and(|id| id.kind == crate::fs_id::FsKind::Vfat);
    if !iso && !vfat {
        let head: String = image.iter().take(8).map(|b| format!("{b:02x}")).collect();
        return Err(ConfigDriveError::NotAnImage(image.len(), head));
    }
    Ok(image)
}

/// Config drives made up for tests, here and in the conductor (feature `test-support`).
#[cfg(any(test, feature = "test-support"))]
pub mod test_support {
    use std::io::Write as _;

    use base64::Engine as _;

    use super::{ISO9660_MAGIC, ISO9660_MAGIC_OFFSET};

    /// A stand-in ISO 9660 image of `len` bytes (at least the magic's end): the volume
    /// descriptor magic where readers look for it.
    pub fn iso(len: usize) -> Vec<u8> {
        let mut image = vec![0u8; len.max(ISO9660_MAGIC_OFFSET + ISO9660_MAGIC.len())];
        image[ISO9660_MAGIC_OFFSET - 1] = 1;
        image[ISO9660_MAGIC_OFFSET..ISO9660_MAGIC_OFFSET + ISO9660_MAGIC.len()]
            .copy_from_slice(ISO9660_MAGIC);
        image
    }

    /// `data` gzipped, in memory.
    pub fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(data).expect("gzip in memory");
        enc.finish().expect("gzip in memory")
    }

    /// `data` in standard base64.
    pub fn b64(data: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(data)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::test_support::{b64, gzip, iso};
    use super::*;

    #[test]
    fn ironic_form_plain_base64_and_line_breaks() {
        let image = iso(40_000);
        assert_eq!(
            decode(b64(&gzip(&image)).as_bytes(), false).ok(),
            Some(image.clone())
        );
        assert_eq!(
            decode(b64(&image).as_bytes(), false).ok(),
            Some(image.clone())
        );
        let wrapped: String = b64(&gzip(&image))
            .as_bytes()
            .chunks(76)
            .map(|l| format!("{}\n", String::from_utf8_lossy(l)))
            .collect();
        assert_eq!(decode(wrapped.as_bytes(), false).ok(), Some(image.clone()));
        // A download may be the image itself, gzipped or not.
        assert_eq!(decode(&gzip(&image), true).ok(), Some(image.clone()));
        assert_eq!(decode(&image, true).ok(), Some(image));
    }

    #[test]
    fn bad_inputs_are_clear_errors() {
        let err = decode(b"not base64!", false).expect_err("bad base64");
        assert!(matches!(err, ConfigDriveError::Base64(_)), "{err}");
        assert!(err.to_string().contains("not base64"), "{err}");

        let mut broken = gzip(&iso(100_000));
        let n = broken.len();
        broken[n / 2..].fill(0x55);
        let err = decode(b64(&broken).as_bytes(), false).expect_err("bad gzip");
        assert!(matches!(err, ConfigDriveError::Gzip(_)), "{err}");
        assert!(err.to_string().contains("gzip data is corrupt"), "{err}");

        let big = iso(MAX_CONFIGDRIVE_BYTES as usize + 1);
        let err = decode(b64(&gzip(&big)).as_bytes(), false).expect_err("too large");
        assert!(matches!(err, ConfigDriveError::TooLarge), "{err}");
        assert!(err.to_string().contains("64 MiB"), "{err}");

        let err = decode(b64(b"hello world").as_bytes(), false).expect_err("not an image");
        assert!(matches!(err, ConfigDriveError::NotAnImage(11, _)), "{err}");

        assert!(matches!(
            decode(b" \n ", false),
            Err(ConfigDriveError::Empty)
        ));
    }

    #[test]
    fn the_largest_accepted_image_is_the_limit() {
        let image = iso(MAX_CONFIGDRIVE_BYTES as usize);
        assert_eq!(
            decode(&gzip(&image), true).map(|i| i.len()).ok(),
            Some(image.len())
        );
    }

    proptest! {
        #[test]
        fn untrusted_text_never_panics(data in proptest::collection::vec(any::<u8>(), 0..4096),
                                       raw in any::<bool>()) {
            let _ = decode(&data, raw);
            let _ = decode(b64(&data).as_bytes(), raw);
            let _ = decode(b64(&gzip(&data)).as_bytes(), raw);
        }

        #[test]
        fn truncated_gzip_is_an_error_not_a_panic(cut in 0usize..2000) {
            let gz = gzip(&iso(50_000));
            let cut = cut.min(gz.len().saturating_sub(1));
            prop_assert!(decode(b64(&gz[..cut]).as_bytes(), false).is_err());
        }
    }
}
