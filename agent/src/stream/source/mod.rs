//! Where an image's bytes come from: one GET, resumed with `Range` after a dropped connection, by
//! one of two clients that make the same decisions.
//!
//! # Design
//! - [`plain`]: `http://`, a blocking HTTP/1.1 client that reads the body straight into the
//!   caller's buffer (the hot path of bench/agent-stream.sh), framed by [`wire`].
//! - [`tls`]: `https://`, reqwest/rustls on a download thread, chunks through a channel.
//! - [`resume`]: the resume decisions both make (200 vs 206, validators, short bodies, retries),
//!   one pure, table-tested function.
//!
//! This module holds what both share ([`HttpOptions`], [`ImageSource`], [`spawn_download`]); the
//! clients are leaves: they import [`resume`], [`wire`] and the agent's [`crate::http`], never
//! this module.
//!
//! # Limitations
//! HTTP/1.1 only, no proxy; a redirect must stay on its scheme for `http://` (the plain client
//! does not speak TLS).

pub mod plain;
pub mod resume;
pub mod tls;
pub mod wire;

use std::io::{self, Read};
use std::sync::Arc;

use anyhow::{bail, Context};
use vmdeploy_shared::redact;

pub use crate::http::HttpOptions;

use super::progress::Progress;

/// The body of an image download, whichever way it is fetched.
#[derive(Debug)]
pub enum ImageSource {
    /// `http://`: blocking reads straight from the socket into the caller's buffer.
    Plain(Box<plain::PlainDownload>),
    /// `https://`: reqwest/rustls on a download thread, chunks through a channel.
    Tls(tls::ChannelReader),
}

impl Read for ImageSource {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ImageSource::Plain(p) => p.read(buf),
            ImageSource::Tls(c) => c.read(buf),
        }
    }
}

/// Starts downloading `url`; the returned reader yields the body. `http://` is read on the
/// caller's thread without copies ([`plain`]); `https://` runs reqwest on a background thread
/// ([`tls`]).
pub fn spawn_download(
    url: &str,
    opts: &HttpOptions,
    progress: Arc<Progress>,
) -> anyhow::Result<ImageSource> {
    let url = reqwest::Url::parse(url)
        .with_context(|| format!("parsing the image URL {}", redact::Url(url)))?;
    let redacted = redact::signatures(url.as_str()).into_owned();
    match url.scheme() {
        "http" => Ok(ImageSource::Plain(Box::new(plain::PlainDownload::new(
            url, redacted, opts, progress,
        )))),
        "https" => tls::spawn(url, redacted, opts, progress).map(ImageSource::Tls),
        other => bail!("unsupported image URL scheme {other:?} (http or https)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_never_show_a_signature() {
        let Err(err) = spawn_download(
            "http ://h/img?temp_url_sig=s3cret&temp_url_expires=1",
            &HttpOptions::default(),
            Default::default(),
        ) else {
            panic!("not a URL, yet accepted");
        };
        let shown = format!("{err:#}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("temp_url_sig=******"), "{shown}");
    }

    #[test]
    fn only_http_and_https() {
        let err = spawn_download("ftp://h/x", &HttpOptions::default(), Default::default())
            .expect_err("ftp");
        assert!(
            err.to_string().contains("unsupported image URL scheme"),
            "{err}"
        );
    }
}
