//! The `Range` request header (RFC 9110 §14.2), as iLO and QEMU's curl driver send it when
//! they read virtual media: one byte range per request.
//!
//! # Design
//! [`parse_range`] turns the header and the object's length into what to answer: the whole
//! object (200), one part (206 with `Content-Range`), or nothing (416 with
//! `Content-Range: bytes */len`). A header that does not parse is ignored and the whole object
//! served, as RFC 9110 §14.2 allows ("a server MAY ignore the Range header field"); Swift and
//! nginx do the same.
//!
//! # Limitations
//! A request for several ranges is answered with the whole object (200) rather than a
//! `multipart/byteranges` body: no BMC or QEMU sends one, and a 200 is a correct answer to it.

/// What to send for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeReply {
    /// The whole object (no header, an ignored header, or several ranges).
    Full,
    /// Bytes `start..=end` (both inside the object).
    Partial {
        /// First byte.
        start: u64,
        /// Last byte, inclusive.
        end: u64,
    },
    /// No byte of the range exists: 416.
    Unsatisfiable,
}

/// One `first-last`, `first-` or `-suffix` spec.
enum Spec {
    From(u64, Option<u64>),
    Suffix(u64),
}

fn parse_number(text: &str) -> Option<u64> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn parse_spec(text: &str) -> Option<Spec> {
    let (first, last) = text.trim().split_once('-')?;
    if first.trim().is_empty() {
        return Some(Spec::Suffix(parse_number(last)?));
    }
    let first = parse_number(first)?;
    if last.trim().is_empty() {
        return Some(Spec::From(first, None));
    }
    let last = parse_number(last)?;
    // RFC 9110 §14.1.1: a last position below the first makes the spec invalid.
    (last >= first).then_some(Spec::From(first, Some(last)))
}

/// What to answer for `header` (the `Range` value, if any) on an object of `len` bytes.
pub fn parse_range(header: Option<&str>, len: u64) -> RangeReply {
    let Some(header) = header else {
        return RangeReply::Full;
    };
    let Some((unit, specs)) = header.split_once('=') else {
        return RangeReply::Full;
    };
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return RangeReply::Full;
    }
    let mut parts = specs.split(',');
    let Some(one) = parts.next() else {
        return RangeReply::Full;
    };
    if parts.next().is_some() {
        return RangeReply::Full;
    }
    match parse_spec(one) {
        None => RangeReply::Full,
        Some(Spec::From(first, _)) if first >= len => RangeReply::Unsatisfiable,
        Some(Spec::From(first, last)) => RangeReply::Partial {
            start: first,
            end: last.map_or(len - 1, |l| l.min(len - 1)),
        },
        Some(Spec::Suffix(0)) => RangeReply::Unsatisfiable,
        Some(Spec::Suffix(_)) if len == 0 => RangeReply::Unsatisfiable,
        Some(Spec::Suffix(n)) => RangeReply::Partial {
            start: len.saturating_sub(n),
            end: len - 1,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn range_table() {
        use RangeReply::*;
        let p = |start, end| Partial { start, end };
        let cases: &[(&str, Option<&str>, u64, RangeReply)] = &[
            ("no header", None, 100, Full),
            ("first sector", Some("bytes=0-511"), 1000, p(0, 511)),
            ("middle", Some("bytes=10-19"), 100, p(10, 19)),
            ("last byte only", Some("bytes=99-99"), 100, p(99, 99)),
            ("end clamped", Some("bytes=90-500"), 100, p(90, 99)),
            ("open end", Some("bytes=95-"), 100, p(95, 99)),
            ("suffix", Some("bytes=-10"), 100, p(90, 99)),
            (
                "suffix longer than object",
                Some("bytes=-500"),
                100,
                p(0, 99),
            ),
            ("spaces and case", Some(" Bytes = 1 - 2 "), 100, p(1, 2)),
            ("start at length", Some("bytes=100-"), 100, Unsatisfiable),
            ("start past end", Some("bytes=200-300"), 100, Unsatisfiable),
            ("zero suffix", Some("bytes=-0"), 100, Unsatisfiable),
            ("empty object", Some("bytes=0-"), 0, Unsatisfiable),
            ("suffix of empty object", Some("bytes=-5"), 0, Unsatisfiable),
            ("reversed: invalid, ignored", Some("bytes=20-10"), 100, Full),
            ("other unit", Some("items=0-1"), 100, Full),
            ("no equals", Some("bytes 0-1"), 100, Full),
            ("no dash", Some("bytes=5"), 100, Full),
            ("garbage", Some("bytes=a-b"), 100, Full),
            ("negative", Some("bytes=--5"), 100, Full),
            ("plus sign", Some("bytes=+1-2"), 100, Full),
            ("empty spec", Some("bytes=-"), 100, Full),
            (
                "overflow",
                Some("bytes=0-99999999999999999999999"),
                100,
                Full,
            ),
            ("two ranges: whole", Some("bytes=0-1,5-6"), 100, Full),
            ("empty", Some(""), 100, Full),
        ];
        for (name, header, len, want) in cases {
            assert_eq!(parse_range(*header, *len), *want, "{name}: {header:?}");
        }
    }

    proptest! {
        #[test]
        fn never_panics_and_stays_in_bounds(header in ".{0,40}", len in 0u64..10_000) {
            check(&header, len)?;
        }

        #[test]
        fn range_shaped_headers_stay_in_bounds(
            a in proptest::option::of(0u64..20_000),
            b in proptest::option::of(0u64..20_000),
            len in 0u64..10_000,
        ) {
            let header = format!(
                "bytes={}-{}",
                a.map(|v| v.to_string()).unwrap_or_default(),
                b.map(|v| v.to_string()).unwrap_or_default()
            );
            check(&header, len)?;
        }
    }

    fn check(header: &str, len: u64) -> Result<(), TestCaseError> {
        match parse_range(Some(header), len) {
            RangeReply::Partial { start, end } => {
                prop_assert!(start <= end, "{header:?} → {start}..={end}");
                prop_assert!(end < len, "{header:?} → end {end} ≥ len {len}");
            }
            RangeReply::Full | RangeReply::Unsatisfiable => {}
        }
        Ok(())
    }
}
