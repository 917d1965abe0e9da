//! Reading PDUs off the socket in pieces, so that a Data-Out payload can land straight in the
//! command's aligned buffer (no intermediate copy), and writing PDUs with their padding.
//!
//! Digests are never negotiated by this target (it answers `None`), so frames are BHS, AHS, data
//! and padding only (RFC 7143 §11.2).

use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use vmdeploy_shared::iscsi::pdu::{padded_len, segment_lengths};
use vmdeploy_shared::iscsi::BHS_LEN;

/// How long the rest of a PDU may take once its header has arrived: a client that stops in the
/// middle of a PDU is dropped rather than holding the connection forever.
pub const PDU_BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// A received header with the lengths it announces.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    /// The raw BHS.
    pub raw: [u8; BHS_LEN],
    /// TotalAHSLength in bytes.
    pub ahs_len: usize,
    /// DataSegmentLength.
    pub data_len: usize,
}

/// Reads the next BHS. `Ok(None)` on a clean end of stream at a PDU boundary.
pub async fn read_header<R: AsyncRead + Unpin>(r: &mut R) -> anyhow::Result<Option<Header>> {
    let mut raw = [0u8; BHS_LEN];
    let first = r.read(&mut raw).await.context("reading a PDU header")?;
    if first == 0 {
        return Ok(None);
    }
    if first < BHS_LEN {
        tokio::time::timeout(PDU_BODY_TIMEOUT, r.read_exact(&mut raw[first..]))
            .await
            .context("timed out in the middle of a PDU header")?
            .context("reading the rest of a PDU header")?;
    }
    let (ahs_len, data_len) = segment_lengths(&raw);
    Ok(Some(Header {
        raw,
        ahs_len,
        data_len,
    }))
}

/// Reads exactly `buf.len()` bytes of a PDU body, with [`PDU_BODY_TIMEOUT`].
pub async fn read_body<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> anyhow::Result<()> {
    if buf.is_empty() {
        return Ok(());
    }
    tokio::time::timeout(PDU_BODY_TIMEOUT, r.read_exact(buf))
        .await
        .context("timed out in the middle of a PDU")?
        .context("reading a PDU body")?;
    Ok(())
}

/// Reads and throws away `len` bytes.
pub async fn skip<R: AsyncRead + Unpin>(r: &mut R, mut len: usize) -> anyhow::Result<()> {
    let mut scratch = [0u8; 4096];
    while len > 0 {
        let n = len.min(scratch.len());
        read_body(r, &mut scratch[..n]).await?;
        len -= n;
    }
    Ok(())
}

/// Reads the padding after a data segment of `data_len` bytes.
pub async fn skip_padding<R: AsyncRead + Unpin>(r: &mut R, data_len: usize) -> anyhow::Result<()> {
    skip(r, padded_len(data_len) - data_len).await
}

/// Reads a whole (small) data segment plus padding into a Vec.
pub async fn read_data_vec<R: AsyncRead + Unpin>(
    r: &mut R,
    data_len: usize,
) -> anyhow::Result<Vec<u8>> {
    let mut v = vec![0u8; data_len];
    read_body(r, &mut v).await?;
    skip_padding(r, data_len).await?;
    Ok(v)
}

/// Writes a PDU: header, data, padding.
pub async fn write_pdu<W: AsyncWrite + Unpin>(
    w: &mut W,
    header: &[u8; BHS_LEN],
    data: &[u8],
) -> std::io::Result<()> {
    w.write_all(header).await?;
    if !data.is_empty() {
        w.write_all(data).await?;
        let pad = padded_len(data.len()) - data.len();
        if pad > 0 {
            w.write_all(&[0u8; 3][..pad]).await?;
        }
    }
    Ok(())
}
