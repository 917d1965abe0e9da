//! The outgoing netascii conversion (RFC 1350 §1, which points to RFC 764's Telnet NVT rules):
//! a line ends in CR LF, and a CR that is not part of a line end is sent as CR NUL.
//!
//! # Design
//! The file on the server has Unix line ends, so every LF becomes CR LF and every CR becomes
//! CR NUL, byte by byte. Because no byte's output depends on its neighbours the conversion has
//! no state, and a file can be converted chunk by chunk in any chunk sizes.

/// Appends the netascii form of `input` to `out` (at most twice as long).
pub fn netascii_encode(input: &[u8], out: &mut Vec<u8>) {
    out.reserve(input.len());
    for &byte in input {
        match byte {
            b'\n' => out.extend_from_slice(b"\r\n"),
            b'\r' => out.extend_from_slice(b"\r\0"),
            other => out.push(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn converts_line_ends_and_bare_carriage_returns() {
        let cases: &[(&[u8], &[u8])] = &[
            (b"", b""),
            (b"plain", b"plain"),
            (b"a\nb\n", b"a\r\nb\r\n"),
            (b"a\rb", b"a\r\0b"),
            (b"\r\n", b"\r\0\r\n"),
            (b"\0\xff", b"\0\xff"),
        ];
        for (input, expected) in cases {
            let mut out = Vec::new();
            netascii_encode(input, &mut out);
            assert_eq!(&out, expected, "{input:?}");
        }
    }

    proptest! {
        #[test]
        fn chunked_conversion_equals_whole(input in prop::collection::vec(
            prop_oneof![Just(b'\n'), Just(b'\r'), any::<u8>()], 0..200), cut in 0usize..200) {
            let cut = cut.min(input.len());
            let mut whole = Vec::new();
            netascii_encode(&input, &mut whole);
            let mut chunked = Vec::new();
            netascii_encode(&input[..cut], &mut chunked);
            netascii_encode(&input[cut..], &mut chunked);
            prop_assert_eq!(whole, chunked);
        }
    }
}
