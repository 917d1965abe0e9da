//! Transparent decompression chosen by magic bytes (gzip, zstd, xz; anything else is passed
//! through as is).
//!
//! # Design
//! Pure-Rust decoders so the static agent carries no extra C code and builds with nothing but
//! rustc: flate2 on miniz_oxide (also what imago uses for compressed qcow2 clusters), ruzstd,
//! lzma-rust2. Every decoder reads through the caller's `BufRead` and consumes only what it
//! decodes, so the caller can drain the rest of the stream into the checksum afterwards.
//!
//! # Limitations
//! Memory: zstd windows are capped at [`ZSTD_MAX_WINDOW`] and xz dictionaries at
//! [`XZ_MEM_LIMIT_KIB`]; `zstd -19` (8 MiB) and `xz -6` (8 MiB) stay well inside the agent's
//! memory aim, `xz -9` (64 MiB dictionary) is accepted but then dominates the agent's RSS.

use std::io::{self, BufRead, Read};

use ruzstd::decoding::{BlockDecodingStrategy, FrameDecoder};

/// Largest zstd window accepted: 32 MiB (window log 25; `zstd -19` uses 8 MiB, only `--long` or
/// `--ultra -22` go beyond).
pub const ZSTD_MAX_WINDOW: u64 = 32 * 1024 * 1024;

/// xz decoder memory limit in KiB: enough for `xz -9` (64 MiB dictionary) plus decoder state.
pub const XZ_MEM_LIMIT_KIB: u32 = 72 * 1024;

/// Compression of a stream, told by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// RFC 1952 gzip (`1f 8b`).
    Gzip,
    /// RFC 8878 zstd frame (`28 b5 2f fd`).
    Zstd,
    /// xz container (`fd 37 7a 58 5a 00`).
    Xz,
    /// Not compressed (or an unknown format, passed through unchanged).
    None,
}

/// Bytes [`Compression::detect`] needs.
pub const MAGIC_LEN: usize = 6;

impl Compression {
    /// The compression `head` (the first bytes of a stream) announces.
    pub fn detect(head: &[u8]) -> Compression {
        if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0x00]) {
            Compression::Xz
        } else {
            Compression::None
        }
    }

    /// A reader of the decompressed stream over `source`.
    pub fn decoder<'a, R: BufRead + 'a>(self, source: R) -> Box<dyn Read + 'a> {
        match self {
            // Multi-member gzip (concatenated `gzip` outputs, pigz) is one stream per RFC 1952 §2.2.
            Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(source)),
            Compression::Zstd => Box::new(ZstdReader::new(source)),
            Compression::Xz => Box::new(lzma_rust2::XzReader::new_mem_limit(
                source,
                true,
                XZ_MEM_LIMIT_KIB,
            )),
            Compression::None => Box::new(source),
        }
    }
}

/// zstd decoder over a `BufRead`, decoding consecutive frames (RFC 8878 §3.1: a stream is a
/// sequence of frames, which `zstd` writes when input is concatenated or multi-threaded).
pub struct ZstdReader<R> {
    source: R,
    decoder: FrameDecoder,
    in_frame: bool,
}

impl<R: BufRead> ZstdReader<R> {
    /// Wraps `source`.
    pub fn new(source: R) -> Self {
        let mut decoder = FrameDecoder::new();
        decoder.set_max_window_size(ZSTD_MAX_WINDOW);
        ZstdReader {
            source,
            decoder,
            in_frame: false,
        }
    }
}

impl<R: BufRead> Read for ZstdReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.in_frame {
                if self.source.fill_buf()?.is_empty() {
                    return Ok(0);
                }
                self.decoder.init(&mut self.source).map_err(|e| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("zstd: {e}"))
                })?;
                self.in_frame = true;
            }
            while self.decoder.can_collect() == 0 && !self.decoder.is_finished() {
                self.decoder
                    .decode_blocks(&mut self.source, BlockDecodingStrategy::UptoBlocks(1))
                    .map_err(|e| {
                        io::Error::new(io::ErrorKind::InvalidData, format!("zstd: {e}"))
                    })?;
            }
            let n = self.decoder.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            if self.decoder.is_finished() && self.decoder.can_collect() == 0 {
                self.in_frame = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Reads through 1-byte buffers (the decoders must not lose state between tiny reads).
    fn read_one_byte_at_a_time(mut r: impl Read) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut b = [0u8; 1];
        loop {
            match r.read(&mut b)? {
                0 => return Ok(out),
                _ => out.push(b[0]),
            }
        }
    }

    /// A BufRead that offers one byte of input per fill.
    struct Trickle<'a>(&'a [u8]);
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.fill_buf()?.len().min(buf.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.consume(n);
            Ok(n)
        }
    }
    impl BufRead for Trickle<'_> {
        fn fill_buf(&mut self) -> io::Result<&[u8]> {
            Ok(&self.0[..self.0.len().min(1)])
        }
        fn consume(&mut self, n: usize) {
            self.0 = &self.0[n..];
        }
    }

    fn sample() -> Vec<u8> {
        let mut v = Vec::new();
        for i in 0..20_000u32 {
            v.extend_from_slice(format!("line {i} {}\n", i % 7).as_bytes());
        }
        v
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).expect("in memory");
        e.finish().expect("in memory")
    }

    /// xz fixtures come from the xz CLI (the agent links only the decoder).
    fn xz(data: &[u8]) -> Vec<u8> {
        let mut child = std::process::Command::new("xz")
            .args(["-1", "-c"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("xz is installed (scripts/setup)");
        let mut stdin = child.stdin.take().expect("piped");
        let input = data.to_vec();
        let writer = std::thread::spawn(move || stdin.write_all(&input));
        let out = child.wait_with_output().expect("xz runs");
        writer.join().expect("writer thread").expect("feeding xz");
        assert!(out.status.success());
        out.stdout
    }

    fn zstd(data: &[u8]) -> Vec<u8> {
        ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
    }

    #[test]
    fn detect_magic() {
        let data = sample();
        assert_eq!(Compression::detect(&gzip(&data)), Compression::Gzip);
        assert_eq!(Compression::detect(&zstd(&data)), Compression::Zstd);
        assert_eq!(Compression::detect(&xz(&data)), Compression::Xz);
        assert_eq!(Compression::detect(b"QFI\xfb"), Compression::None);
        assert_eq!(Compression::detect(b""), Compression::None);
        assert_eq!(Compression::detect(&[0x1f]), Compression::None);
    }

    #[test]
    fn every_format_round_trips_through_one_byte_reads_and_inputs() {
        let data = sample();
        for (name, packed) in [
            ("gzip", gzip(&data)),
            ("zstd", zstd(&data)),
            ("xz", xz(&data)),
            ("none", data.clone()),
        ] {
            let c = Compression::detect(&packed);
            let out = read_one_byte_at_a_time(c.decoder(&packed[..])).expect(name);
            assert!(out == data, "{name}: one-byte reads");
            let out = read_one_byte_at_a_time(c.decoder(Trickle(&packed))).expect(name);
            assert!(out == data, "{name}: one-byte input");
        }
    }

    #[test]
    fn concatenated_members_and_frames_are_one_stream() {
        let data = sample();
        for (name, mut packed) in [
            ("gzip", gzip(&data)),
            ("zstd", zstd(&data)),
            ("xz", xz(&data)),
        ] {
            let second = packed.clone();
            packed.extend_from_slice(&second);
            let mut out = Vec::new();
            Compression::detect(&packed)
                .decoder(&packed[..])
                .read_to_end(&mut out)
                .expect(name);
            assert_eq!(out.len(), 2 * data.len(), "{name}");
        }
    }

    #[test]
    fn corrupt_and_truncated_streams_are_errors() {
        let data = sample();
        for (name, packed) in [
            ("gzip", gzip(&data)),
            ("zstd", zstd(&data)),
            ("xz", xz(&data)),
        ] {
            let cut = &packed[..packed.len() / 2];
            let mut out = Vec::new();
            let r = Compression::detect(cut).decoder(cut).read_to_end(&mut out);
            assert!(r.is_err(), "{name}: truncated stream must fail");
            let mut bad = packed.clone();
            let mid = bad.len() / 2;
            for b in &mut bad[mid..mid + 16] {
                *b ^= 0x5a;
            }
            let mut out = Vec::new();
            let r = Compression::detect(&bad)
                .decoder(&bad[..])
                .read_to_end(&mut out);
            assert!(
                r.is_err() || out != data,
                "{name}: corruption must not pass unnoticed"
            );
        }
    }
}
