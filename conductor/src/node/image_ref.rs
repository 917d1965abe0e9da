//! Image references: where an image, a kernel, a ramdisk or an ISO comes from
//! (docs/architecture.md §3, §6), read from `instance_info` and `driver_info`.
//!
//! # Design
//! One parser for every field that names an image, so `image_source`, `kernel`, `ramdisk`,
//! `boot_iso` and the deploy ISO accept the same forms: `http(s)://`, `file:///path`,
//! `swift://container/object`, a Glance image UUID (bare or `glance://<uuid>`). The parser
//! knows no field names: each caller wraps [`ImageRefError`] in its own field-naming error.
//! [`ImageRef`]'s `Display` is the reference's canonical text, and parses back to the same
//! reference (a `file://` path is percent-encoded, so `#`, `?` or `%` in a file name survive).
//!
//! Whether a reference can be used is the flows' business: this conductor has no Glance, so
//! they refuse [`ImageRef::Glance`] when they resolve one.

use std::fmt;
use std::path::PathBuf;

use url::Url;
use uuid::Uuid;

use crate::objects::ObjectPath;

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageRef {
    /// `http://` or `https://`: fetched as it is (the image server is the operator's).
    Http(Url),
    /// `file:///path`: a file on the conductor.
    File(PathBuf),
    /// `swift://container/object` (the object may contain `/`): an object of the object store.
    Swift(ObjectPath),
    /// A Glance image ID (bare UUID, or `glance://<uuid>`).
    Glance(Uuid),
}

/// Why a text is not an image reference. The messages quote the text, never a field name:
/// the caller knows which field it read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageRefError {
    /// Nothing but white space.
    #[error("is empty")]
    Empty,
    /// Not a URL of a known scheme and not a UUID.
    #[error(
        "{0:?} is not an image reference: use http(s)://, file://, \
         swift://container/object or a Glance image UUID"
    )]
    NotAReference(String),
    /// A URL of a scheme no one here fetches.
    #[error(
        "{value:?}: scheme {scheme:?} is not supported: use http(s)://, file://, \
         swift://container/object or a Glance image UUID"
    )]
    UnsupportedScheme {
        /// The reference.
        value: String,
        /// Its scheme, lower case.
        scheme: String,
    },
    /// An `http(s)://` URL that does not parse.
    #[error("{value:?}: {reason}")]
    BadUrl {
        /// The reference.
        value: String,
        /// The URL parser's complaint.
        reason: String,
    },
    /// An `http(s)://` URL without a host.
    #[error("{0:?} has no host")]
    NoHost(String),
    /// A `file://` URL that names no absolute local path.
    #[error("{0:?} is not an absolute local path (file:///path/to/image)")]
    NotALocalPath(String),
    /// A `swift://` URL without both a container and an object.
    #[error("{0:?} must be swift://container/object")]
    NotAnObject(String),
    /// A `glance://` URL without an image UUID.
    #[error("{0:?} must be glance://<image uuid>")]
    NotAGlanceId(String),
}

impl ImageRef {
    /// Parses a reference (surrounding white space ignored).
    pub fn parse(text: &str) -> Result<ImageRef, ImageRefError> {
        let s = text.trim();
        if s.is_empty() {
            return Err(ImageRefError::Empty);
        }
        if let Ok(uuid) = Uuid::parse_str(s) {
            return Ok(ImageRef::Glance(uuid));
        }
        let Some((scheme, rest)) = s.split_once("://") else {
            return Err(ImageRefError::NotAReference(s.to_owned()));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "http" | "https" => {
                let url = Url::parse(s).map_err(|e| ImageRefError::BadUrl {
                    value: s.to_owned(),
                    reason: e.to_string(),
                })?;
                if url.host_str().is_none_or(str::is_empty) {
                    return Err(ImageRefError::NoHost(s.to_owned()));
                }
                Ok(ImageRef::Http(url))
            }
            "file" => Url::parse(s)
                .ok()
                .and_then(|url| url.to_file_path().ok())
                .map(ImageRef::File)
                .ok_or_else(|| ImageRefError::NotALocalPath(s.to_owned())),
            "swift" => match rest.split_once('/') {
                Some((container, object)) if !container.is_empty() && !object.is_empty() => {
                    Ok(ImageRef::Swift(ObjectPath::new(container, object)))
                }
                _ => Err(ImageRefError::NotAnObject(s.to_owned())),
            },
            "glance" => Uuid::parse_str(rest)
                .map(ImageRef::Glance)
                .map_err(|_| ImageRefError::NotAGlanceId(s.to_owned())),
            other => Err(ImageRefError::UnsupportedScheme {
                value: s.to_owned(),
                scheme: other.to_owned(),
            }),
        }
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageRef::Http(url) => write!(f, "{url}"),
            // `Url::from_file_path` percent-encodes what a URL would read as syntax (`#`, `?`,
            // `%`) but not `\`, which a `file:` URL's parser takes for `/`. It refuses only a
            // relative path, which the parser never yields.
            ImageRef::File(path) => match Url::from_file_path(path) {
                Ok(url) => f.write_str(&url.as_str().replace('\\', "%5C")),
                Err(()) => write!(f, "file://{}", path.display()),
            },
            ImageRef::Swift(path) => write!(f, "swift://{}/{}", path.container, path.object),
            ImageRef::Glance(uuid) => write!(f, "{uuid}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn every_form_parses() {
        let glance = "0b2d6bc1-1d1e-4b8f-93b0-6c1a4c0e8d5f";
        for (input, want) in [
            (
                "http://10.0.0.1/img.raw",
                ImageRef::Http(Url::parse("http://10.0.0.1/img.raw").expect("url")),
            ),
            (
                " HTTPS://h:8443/a/b?x=1 ",
                ImageRef::Http(Url::parse("https://h:8443/a/b?x=1").expect("url")),
            ),
            (
                "file:///var/lib/images/a%20b.img",
                ImageRef::File(PathBuf::from("/var/lib/images/a b.img")),
            ),
            (
                "swift://images/os/ubuntu.qcow2",
                ImageRef::Swift(ObjectPath::new("images", "os/ubuntu.qcow2")),
            ),
            (
                glance,
                ImageRef::Glance(Uuid::parse_str(glance).expect("uuid")),
            ),
            (
                &format!("glance://{glance}"),
                ImageRef::Glance(Uuid::parse_str(glance).expect("uuid")),
            ),
        ] {
            assert_eq!(ImageRef::parse(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn non_references_say_why() {
        for (input, want) in [
            ("", ImageRefError::Empty),
            (" ", ImageRefError::Empty),
            (
                "image.qcow2",
                ImageRefError::NotAReference("image.qcow2".into()),
            ),
            (
                "/var/lib/x.img",
                ImageRefError::NotAReference("/var/lib/x.img".into()),
            ),
            (
                "FTP://h/x",
                ImageRefError::UnsupportedScheme {
                    value: "FTP://h/x".into(),
                    scheme: "ftp".into(),
                },
            ),
            (
                "file://relative/path",
                ImageRefError::NotALocalPath("file://relative/path".into()),
            ),
            (
                "swift://container",
                ImageRefError::NotAnObject("swift://container".into()),
            ),
            (
                "swift:///object",
                ImageRefError::NotAnObject("swift:///object".into()),
            ),
            (
                "glance://not-a-uuid",
                ImageRefError::NotAGlanceId("glance://not-a-uuid".into()),
            ),
        ] {
            assert_eq!(ImageRef::parse(input), Err(want), "{input:?}");
        }
        assert!(matches!(
            ImageRef::parse("http://"),
            Err(ImageRefError::BadUrl { .. })
        ));
        assert!(matches!(
            ImageRef::parse("https://exa mple/x"),
            Err(ImageRefError::BadUrl { .. })
        ));
    }

    /// The image cache reads a `file://` URL back with `Url::to_file_path`: characters that
    /// are URL syntax must be encoded, or `#1` would be taken for a fragment.
    #[test]
    fn a_file_renders_as_a_url_that_names_it() {
        let path = PathBuf::from("/srv/images/disk #1?%20 b\\c.raw");
        let text = ImageRef::File(path.clone()).to_string();
        assert_eq!(text, "file:///srv/images/disk%20%231%3F%2520%20b%5Cc.raw");
        assert_eq!(ImageRef::parse(&text), Ok(ImageRef::File(path.clone())));
        let url = Url::parse(&text).expect("a URL");
        assert_eq!(url.to_file_path(), Ok(path));
    }

    proptest! {
        /// Whatever an operator types, the parser answers (no panic), and what it accepts
        /// renders to a text that parses back to the same reference.
        #[test]
        fn any_text_parses_or_is_refused(
            text in prop_oneof![
                any::<String>(),
                "(http|https|file|swift|glance|ftp|HTTP)://[ -~]{0,40}",
                "[0-9a-fA-F-]{30,40}",
            ]
        ) {
            if let Ok(reference) = ImageRef::parse(&text) {
                let shown = reference.to_string();
                prop_assert_eq!(ImageRef::parse(&shown), Ok(reference), "{}", shown);
            }
        }

        /// Every absolute path survives the trip through its `file://` text.
        #[test]
        fn file_paths_round_trip(name in "[^/\u{0}]{1,30}|[a\\\\#?%. ]{1,8}") {
            // `.` and `..` are no file names: a URL folds them away.
            prop_assume!(name != "." && name != "..");
            let path = PathBuf::from(format!("/srv/{name}"));
            let text = ImageRef::File(path.clone()).to_string();
            prop_assert_eq!(ImageRef::parse(&text), Ok(ImageRef::File(path)), "{}", text);
        }
    }
}
