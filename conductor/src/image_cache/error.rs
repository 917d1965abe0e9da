//! The errors of the image cache, one variant per way a fetch can fail, so the deploy flow can
//! say what went wrong (`last_error`) without parsing text.

use std::io;
use std::sync::Arc;

use vmdeploy_shared::io::hash::HashAlgo;

/// Why [`super::ImageCache::get`] (or [`super::ImageCache::open`]) failed.
///
/// `Clone`, because every caller waiting on one download gets the same error (I/O errors are
/// shared through an `Arc`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ImageCacheError {
    /// The URL's scheme is not one the cache fetches.
    #[error("image URL {url:?}: unsupported scheme (http, https or file; resolve swift:// to a temp URL first)")]
    UnsupportedUrl {
        /// The URL as given.
        url: String,
    },
    /// The server answered 404, or the `file://` path does not exist.
    #[error("image {url} not found")]
    NotFound {
        /// The image's URL.
        url: String,
    },
    /// The server answered another non-success status.
    #[error("image {url}: HTTP status {status}")]
    Http {
        /// The image's URL.
        url: String,
        /// The status code.
        status: u16,
    },
    /// The connection failed, stalled or broke, on every attempt.
    #[error("fetching image {url} failed after {attempts} attempt(s): {reason}")]
    Fetch {
        /// The image's URL.
        url: String,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        reason: String,
    },
    /// The download's digest is not the expected one; nothing entered the cache.
    #[error("image checksum mismatch for {url}: expected {algo}:{expected}, got {algo}:{actual}")]
    ChecksumMismatch {
        /// The image's URL.
        url: String,
        /// The algorithm.
        algo: HashAlgo,
        /// Expected digest, lowercase hex.
        expected: String,
        /// Digest of what was downloaded, lowercase hex.
        actual: String,
    },
    /// The image is neither raw nor a qcow2 the cache can convert.
    #[error("image {url}: unsupported format: {reason}")]
    UnsupportedFormat {
        /// The image's URL.
        url: String,
        /// What was found.
        reason: String,
    },
    /// The image (its download or its raw size) does not fit the cache's size limit.
    #[error("image {url} is {size} bytes or more, above the image cache limit of {limit} bytes (images.cache_limit)")]
    TooLarge {
        /// The image's URL.
        url: String,
        /// Size found so far (the download, or the raw size).
        size: u64,
        /// The cache's limit.
        limit: u64,
    },
    /// A local file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, e.g. `writing /state/images/tmp/x.download`.
        context: String,
        /// The error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The download task ended without a result (it panicked or the runtime shut down).
    #[error("image download of {url} ended abnormally: {reason}")]
    Aborted {
        /// The image's URL.
        url: String,
        /// The join error.
        reason: String,
    },
}

/// `url` as logs and a node's `last_error` show it: a temp URL's signature is a credential, and
/// is masked ([`vmdeploy_shared::redact::signatures`]); the rest says which object failed.
pub fn shown_url(url: &str) -> String {
    vmdeploy_shared::redact::signatures(url).into_owned()
}

impl ImageCacheError {
    /// The same error with its URL shown by [`shown_url`].
    pub fn mask_url(mut self) -> ImageCacheError {
        match &mut self {
            ImageCacheError::UnsupportedUrl { url }
            | ImageCacheError::NotFound { url }
            | ImageCacheError::Http { url, .. }
            | ImageCacheError::Fetch { url, .. }
            | ImageCacheError::ChecksumMismatch { url, .. }
            | ImageCacheError::UnsupportedFormat { url, .. }
            | ImageCacheError::TooLarge { url, .. }
            | ImageCacheError::Aborted { url, .. } => *url = shown_url(url),
            ImageCacheError::Io { .. } => {}
        }
        self
    }

    /// An [`ImageCacheError::Io`] naming what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> ImageCacheError {
        ImageCacheError::Io {
            context: context.into(),
            source: Arc::new(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_url_signatures_are_not_shown() {
        let cases = [
            (
                "https://s/v1/AUTH_a/c/o?temp_url_sig=abc&temp_url_expires=1",
                "https://s/v1/AUTH_a/c/o?temp_url_sig=******&temp_url_expires=1",
            ),
            ("http://h/img.qcow2", "http://h/img.qcow2"),
            ("http://h/img#frag", "http://h/img#frag"),
            ("file:///srv/img.raw", "file:///srv/img.raw"),
        ];
        for (url, shown) in cases {
            assert_eq!(shown_url(url), shown);
        }
        let err = ImageCacheError::Http {
            url: cases[0].0.into(),
            status: 401,
        }
        .mask_url();
        assert!(!err.to_string().contains("abc"), "{err}");
    }
}
