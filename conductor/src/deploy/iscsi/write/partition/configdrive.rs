//! The config drive of `instance_info.configdrive`: Ironic's form is the base64 text of a
//! gzip-compressed ISO 9660 (or vfat) image, given inline or as an http(s) URL the text is
//! fetched from. [`decode`] turns what arrived into the image; it is untrusted input, so every
//! size is bounded (a gzip bomb stops at [`MAX_CONFIGDRIVE_BYTES`]) and nothing can panic.

use std::io::Read as _;
use std::time::Duration;

use base64::Engine as _;

/// The largest config drive accepted, decoded and uncompressed (Ironic's limit: 64 MiB).
pub const MAX_CONFIGDRIVE_BYTES: u64 = 64 << 20;

/// The largest download of a config drive URL: the base64 text of a gzip of the largest
/// image that does not compress (4/3 of it), with room for line breaks.
const MAX_DOWNLOAD_BYTES: u64 = MAX_CONFIGDRIVE_BYTES / 3 * 4 + (4 << 20);

/// How long fetching a config drive URL may take in all.
const FETCH_TIMEOUT: Duration = Duration::from_secs(120);

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// ISO 9660: the primary volume descriptor at sector 16 (2048-byte sectors) starts with a type
/// byte and `CD001`.
const ISO9660_MAGIC_OFFSET: usize = 16 * 2048 + 1;
const ISO9660_MAGIC: &[u8; 5] = b"CD001";

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

/// The config drive image of `value` (`instance_info.configdrive`): fetched first when it is an
/// http(s) URL, then [`decode`]d.
pub async fn load(value: &str) -> Result<Vec<u8>, ConfigDriveError> {
    let trimmed = value.trim();
    if trimmed.starts_with("http://") || trimmed.starts_with("https://") {
        let body = fetch(trimmed).await?;
        decode(&body, true)
    } else {
        decode(trimmed.as_bytes(), false)
    }
}

async fn fetch(url: &str) -> Result<Vec<u8>, ConfigDriveError> {
    let shown = crate::image_cache::error::shown_url(url);
    let failed = |reason: String| ConfigDriveError::Fetch {
        url: shown.clone(),
        reason,
    };
    let client =
        crate::image_cache::fetch::build_client(&crate::image_cache::FetchPolicy::default())
            .map_err(|e| failed(e.to_string()))?;
    let mut response = client
        .get(url)
        .timeout(FETCH_TIMEOUT)
        .send()
        .await
        .map_err(|e| failed(e.without_url().to_string()))?;
    if !response.status().is_success() {
        return Err(failed(format!("the server answered {}", response.status())));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| failed(e.without_url().to_string()))?
    {
        if (body.len() + chunk.len()) as u64 > MAX_DOWNLOAD_BYTES {
            return Err(failed(format!(
                "the download is larger than {} MiB, more than any config drive within the \
                 {} MiB limit",
                MAX_DOWNLOAD_BYTES >> 20,
                MAX_CONFIGDRIVE_BYTES >> 20
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
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
    let vfat = vmdeploy_shared::fs_id::probe(&image)
        .is_some_and(|id| id.kind == vmdeploy_shared::fs_id::FsKind::Vfat);
    if !iso && !vfat {
        let head: String = image.iter().take(8).map(|b| format!("{b:02x}")).collect();
        return Err(ConfigDriveError::NotAnImage(image.len(), head));
    }
    Ok(image)
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use proptest::prelude::*;

    use super::*;

    /// A stand-in ISO 9660 image: the volume descriptor magic where readers look for it.
    fn iso(len: usize) -> Vec<u8> {
        let mut image = vec![0u8; len.max(ISO9660_MAGIC_OFFSET + 5)];
        image[ISO9660_MAGIC_OFFSET - 1] = 1;
        image[ISO9660_MAGIC_OFFSET..ISO9660_MAGIC_OFFSET + 5].copy_from_slice(ISO9660_MAGIC);
        image
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(data).expect("gzip in memory");
        enc.finish().expect("gzip in memory")
    }

    fn b64(data: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(data)
    }

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

    /// A one-request HTTP server on loopback answering `status` with `body`; its URL.
    async fn serve_once(status: &'static str, body: Vec<u8>) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding loopback");
        let addr = listener.local_addr().expect("local address");
        tokio::spawn(async move {
            if let Ok((mut conn, _)) = listener.accept().await {
                let mut request = [0u8; 4096];
                let _ = conn.read(&mut request).await;
                let head = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(&body).await;
            }
        });
        format!("http://{addr}/configdrive")
    }

    #[tokio::test]
    async fn a_url_is_fetched_then_decoded() {
        let image = iso(40_000);
        let url = serve_once("200 OK", b64(&gzip(&image)).into_bytes()).await;
        assert_eq!(load(&url).await.ok(), Some(image.clone()));
        // Inline text works the same way.
        assert_eq!(load(&b64(&gzip(&image))).await.ok(), Some(image));

        let url = serve_once("404 Not Found", b"no such object".to_vec()).await;
        let err = load(&url).await.expect_err("404");
        assert!(matches!(err, ConfigDriveError::Fetch { .. }), "{err}");
        assert!(err.to_string().contains("404"), "{err}");
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
