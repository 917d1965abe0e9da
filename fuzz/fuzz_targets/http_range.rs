//! The `Range` request header as the conductor's object server answers it
//! (`objects::builtin::range::parse_range`): a partial answer must lie inside the object, and a
//! `bytes=a-b` the fuzzer writes must be answered as RFC 9110 §14.1.2 says.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vmdeploy_conductor::objects::builtin::range::{parse_range, RangeReply};

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let (len, header) = data.split_at(8);
    let mut raw = [0u8; 8];
    raw.copy_from_slice(len);
    // Object lengths from empty to huge, with small ones common.
    let len = match raw[0] % 4 {
        0 => u64::from(raw[1]),
        1 => u64::from(u16::from_le_bytes([raw[1], raw[2]])),
        2 => u64::from_le_bytes(raw) >> 8,
        _ => u64::MAX - u64::from(raw[1]),
    };
    let Ok(header) = std::str::from_utf8(header) else {
        return;
    };
    match parse_range(Some(header), len) {
        RangeReply::Partial { start, end } => {
            assert!(
                start <= end && end < len,
                "{header:?} on {len} bytes gave {start}..={end}"
            );
        }
        RangeReply::Full | RangeReply::Unsatisfiable => {}
    }
    assert_eq!(parse_range(None, len), RangeReply::Full);

    // A plain `bytes=a-b` has one right answer.
    if let Some((a, b)) = header
        .strip_prefix("bytes=")
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((digits(a)?, digits(b)?)))
    {
        let expected = if a > b {
            None
        } else if a >= len {
            Some(RangeReply::Unsatisfiable)
        } else {
            Some(RangeReply::Partial {
                start: a,
                end: b.min(len - 1),
            })
        };
        if let Some(expected) = expected {
            assert_eq!(
                parse_range(Some(header), len),
                expected,
                "{header:?} on {len} bytes"
            );
        }
    }
});

fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}
