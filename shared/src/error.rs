//! Walking an error's causes: the whole chain on one line for messages, and the first cause of a
//! given type for decisions (a TLS failure is recognised by its type, never by its text).
//!
//! `std::io::Error::source` skips the error an `io::Error` wraps (it returns that error's own
//! source), and TLS and HTTP stacks hand their errors up inside `io::Error`s, sometimes nested
//! (tokio-rustls's handshake error inside the connector's). So every `io::Error` met on the way
//! is also opened with `get_ref`, as deep as it nests.

use std::error::Error;
use std::fmt;
use std::io;

/// The error and its causes on one line, joined with `: `. A cause whose text the line already
/// ends with is left out: many wrappers repeat their source's message.
pub fn chain(err: &(dyn Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// An error shown with its causes, as [`chain`] words them, for log fields:
/// `tracing::warn!(error = %Chain(&err), "...")`, so a log line names the cause
/// (`connecting to 10.0.0.5:443: connection refused`) and not only the last step. The text is
/// built only when the field is formatted, that is when the line is actually logged.
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&chain(self.0))
    }
}

/// The first error of type `T` in `err`'s chain (itself included), looking inside every
/// `io::Error`'s payload as well.
pub fn find_cause<'a, T: Error + 'static>(err: &'a (dyn Error + 'static)) -> Option<&'a T> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        if let Some(payload) = e.downcast_ref::<io::Error>().and_then(io::Error::get_ref) {
            if let Some(found) = find_cause::<T>(payload) {
                return Some(found);
            }
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_field_form_shows_the_causes() {
        let err = Wrapped {
            msg: "fetching the image",
            source: io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused"),
        };
        assert_eq!(
            Chain(&err).to_string(),
            "fetching the image: connection refused"
        );
    }

    #[derive(Debug)]
    struct Wrapped {
        msg: &'static str,
        source: io::Error,
    }
    impl fmt::Display for Wrapped {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.msg)
        }
    }
    impl Error for Wrapped {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.source)
        }
    }

    #[derive(Debug, PartialEq)]
    struct Marker(u8);
    impl fmt::Display for Marker {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "marker {}", self.0)
        }
    }
    impl Error for Marker {}

    /// An error with a source, as the HTTP stacks build them.
    #[derive(Debug)]
    struct Wrapper(&'static str, Box<dyn Error + Send + Sync>);
    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }
    impl Error for Wrapper {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(self.1.as_ref())
        }
    }

    #[test]
    fn found_by_type_through_wrappers_and_nested_io_errors() {
        let direct = Marker(1);
        assert_eq!(find_cause::<Marker>(&direct), Some(&Marker(1)));
        let in_io = io::Error::other(Marker(2));
        assert_eq!(find_cause::<Marker>(&in_io), Some(&Marker(2)));
        let nested = io::Error::other(io::Error::other(Marker(3)));
        assert_eq!(find_cause::<Marker>(&nested), Some(&Marker(3)));
        let wrapped = Wrapper("sending request", Box::new(io::Error::other(Marker(4))));
        assert_eq!(find_cause::<Marker>(&wrapped), Some(&Marker(4)));
    }

    #[test]
    fn the_text_alone_is_not_the_type() {
        let text = io::Error::other("marker 5");
        assert_eq!(find_cause::<Marker>(&text), None);
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(find_cause::<Marker>(&refused), None);
    }

    #[test]
    fn chain_joins_causes_once() {
        let e = Wrapper(
            "error sending request",
            Box::new(Wrapper("connect", Box::new(Marker(7)))),
        );
        assert_eq!(chain(&e), "error sending request: connect: marker 7");
        let repeats = Wrapper("GET failed: marker 8", Box::new(Marker(8)));
        assert_eq!(chain(&repeats), "GET failed: marker 8");
    }
}
