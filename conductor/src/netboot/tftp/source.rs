//! The blocks of a file as a transfer sends them, in octet or netascii mode.
//!
//! # Design
//! The file is read through a 64 KiB buffer: a kernel at 512-byte blocks is tens of thousands
//! of blocks, and `tokio::fs` runs each read on the blocking pool, so one read per block would
//! be one thread hop per block. Nothing more than the buffer and one block is held, so many
//! transfers of large ramdisks at once stay small in memory.

use tokio::io::{AsyncRead, AsyncReadExt, BufReader};
use vmdeploy_shared::tftp::netascii_encode;

/// Read buffer per transfer (see the module docs).
const READ_BUFFER: usize = 64 * 1024;

/// Yields a file's blocks.
pub struct BlockSource<R> {
    reader: BufReader<R>,
    /// Netascii only: converted bytes not yet sent.
    pending: Option<Vec<u8>>,
    /// Netascii only: raw bytes read for conversion.
    raw: Vec<u8>,
    eof: bool,
}

impl<R: AsyncRead + Unpin> BlockSource<R> {
    /// Blocks of `reader` as they are (octet mode).
    pub fn octet(reader: R) -> Self {
        BlockSource {
            reader: BufReader::with_capacity(READ_BUFFER, reader),
            pending: None,
            raw: Vec::new(),
            eof: false,
        }
    }

    /// Blocks of `reader` converted to netascii.
    pub fn netascii(reader: R) -> Self {
        BlockSource {
            pending: Some(Vec::new()),
            ..BlockSource::octet(reader)
        }
    }

    /// Appends the next block to `out`: `size` bytes, fewer only at the end of the file (so the
    /// block after the last full one is empty, as RFC 1350 ends a transfer).
    pub async fn next_block(&mut self, size: usize, out: &mut Vec<u8>) -> std::io::Result<()> {
        match &mut self.pending {
            None => {
                let start = out.len();
                out.resize(start + size, 0);
                let mut filled = 0;
                while filled < size && !self.eof {
                    let n = self.reader.read(&mut out[start + filled..]).await?;
                    filled += n;
                    self.eof = n == 0;
                }
                out.truncate(start + filled);
            }
            Some(pending) => {
                while pending.len() < size && !self.eof {
                    self.raw.resize(size, 0);
                    let n = self.reader.read(&mut self.raw).await?;
                    self.eof = n == 0;
                    netascii_encode(&self.raw[..n], pending);
                }
                let take = size.min(pending.len());
                out.extend_from_slice(&pending[..take]);
                pending.drain(..take);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn blocks(mut source: BlockSource<&[u8]>, size: usize) -> Vec<Vec<u8>> {
        let mut all = Vec::new();
        loop {
            let mut block = Vec::new();
            source
                .next_block(size, &mut block)
                .await
                .expect("in-memory read");
            let last = block.len() < size;
            all.push(block);
            if last {
                return all;
            }
        }
    }

    #[tokio::test]
    async fn octet_blocks_end_with_a_short_or_empty_block() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1024).collect();
        let got = blocks(BlockSource::octet(&data[..]), 512).await;
        assert_eq!(got.len(), 3);
        assert!(got[2].is_empty());
        assert_eq!(got.concat(), data);

        let got = blocks(BlockSource::octet(&data[..1000]), 512).await;
        assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), [512, 488]);

        let got = blocks(BlockSource::octet(&[][..]), 512).await;
        assert_eq!(got, [Vec::<u8>::new()]);
    }

    #[tokio::test]
    async fn netascii_blocks_carry_the_converted_bytes() {
        let data = b"line one\nline two\r\nbare\rcr\n".repeat(40);
        let mut expected = Vec::new();
        netascii_encode(&data, &mut expected);
        for size in [8, 9, 512] {
            let got = blocks(BlockSource::netascii(&data[..]), size).await;
            assert!(got[..got.len() - 1].iter().all(|b| b.len() == size));
            assert_eq!(got.concat(), expected, "block size {size}");
        }
    }
}
