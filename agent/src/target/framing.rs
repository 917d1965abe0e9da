//! Reading PDUs off the socket in pieces, so that a Data-Out payload can land straight in the
//! command's aligned buffer (no intermediate copy), and writing PDUs with their padding.
//!
//! The lengths come from the codec's one header check ([`PduDecoder::layout`]: data segment
//! limit, padding, digests), the same one the conductor's initiator frames with. Digests are
//! never negotiated by this target (it answers `None`, login.rs), so its frames are BHS, AHS,
//! data and padding only (RFC 7143 §11.2); [`Limits`] holds that fact in one place.

use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use vmdeploy_shared::iscsi::pdu::{padded_len, FrameLayout};
use vmdeploy_shared::iscsi::{Digests, PduDecoder, BHS_LEN};

/// How long the rest of a PDU may take once its header has arrived: a client that stops in the
/// middle of a PDU is dropped rather than holding the connection forever.
pub const PDU_BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// The framing rules of this target's connections: no digests, and a data segment limit
/// (8192 during login, MaxRecvDataSegmentLength after).
#[derive(Debug, Clone, Copy)]
pub struct Limits(PduDecoder);

impl Limits {
    /// Frames whose data segments are at most `max_data_segment_len` bytes.
    pub fn new(max_data_segment_len: usize) -> Limits {
        Limits(PduDecoder::new(Digests::NONE, max_data_segment_len))
    }
}

/// A received header with the layout it announces.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    /// The raw BHS.
    pub raw: [u8; BHS_LEN],
    /// AHS and data lengths, padding, checked against the limit.
    pub layout: FrameLayout,
}

impl Header {
    /// DataSegmentLength.
    pub fn data_len(&self) -> usize {
        self.layout.data_len
    }

    /// Everything after the header (data and padding), for a PDU whose data is not wanted.
    pub fn body_len(&self) -> usize {
        self.layout.body_len()
    }
}

/// Reads the next BHS and checks it against `limits`. `Ok(None)` on a clean end of stream at a
/// PDU boundary. The AHS is the caller's to read or skip.
pub async fn read_header<R: AsyncRead + Unpin>(
    r: &mut R,
    limits: &Limits,
) -> anyhow::Result<Option<Header>> {
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
    let layout = limits.0.layout(&raw).context("checking a PDU header")?;
    Ok(Some(Header { raw, layout }))
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

/// Reads the padding after the data segment of `header`.
pub async fn skip_padding<R: AsyncRead + Unpin>(r: &mut R, header: &Header) -> anyhow::Result<()> {
    skip(r, header.layout.padding()).await
}

/// Reads a whole (small) data segment plus padding into a Vec.
pub async fn read_data_vec<R: AsyncRead + Unpin>(
    r: &mut R,
    header: &Header,
) -> anyhow::Result<Vec<u8>> {
    let mut v = vec![0u8; header.data_len()];
    read_body(r, &mut v).await?;
    skip_padding(r, header).await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use vmdeploy_shared::iscsi::{NopOut, Pdu, PduError, RESERVED_TAG};

    fn nop_out(data_len: usize) -> Vec<u8> {
        Pdu::with_data(
            NopOut {
                itt: 1,
                ttt: RESERVED_TAG,
                ..Default::default()
            },
            vec![7u8; data_len],
        )
        .encode(Digests::NONE)
        .expect("encodes")
    }

    #[tokio::test]
    async fn reads_a_pdu_in_pieces_with_the_decoders_lengths() {
        let mut wire = nop_out(5);
        wire.extend_from_slice(&nop_out(0));
        let mut r = &wire[..];
        let limits = Limits::new(8192);
        let header = read_header(&mut r, &limits)
            .await
            .expect("reads")
            .expect("a header");
        assert_eq!((header.data_len(), header.layout.padding()), (5, 3));
        assert_eq!(
            read_data_vec(&mut r, &header).await.expect("data"),
            [7u8; 5]
        );
        let second = read_header(&mut r, &limits).await.expect("reads");
        assert_eq!(second.map(|h| h.body_len()), Some(0));
        assert!(read_header(&mut r, &limits)
            .await
            .expect("clean end")
            .is_none());
    }

    #[tokio::test]
    async fn a_segment_over_the_limit_is_refused_from_the_header() {
        let wire = nop_out(9000);
        let err = read_header(&mut &wire[..], &Limits::new(8192))
            .await
            .expect_err("over the limit");
        assert_eq!(
            err.downcast_ref::<PduError>(),
            Some(&PduError::DataSegmentTooLong {
                len: 9000,
                limit: 8192
            })
        );
    }

    #[tokio::test]
    async fn written_pdus_are_padded_like_the_codecs() {
        let pdu = Pdu::with_data(
            NopOut {
                itt: 2,
                ttt: RESERVED_TAG,
                ..Default::default()
            },
            vec![1u8; 6],
        );
        let expected = pdu.encode(Digests::NONE).expect("encodes");
        let mut header = [0u8; BHS_LEN];
        header.copy_from_slice(&expected[..BHS_LEN]);
        let mut out = Vec::new();
        write_pdu(&mut out, &header, &pdu.data)
            .await
            .expect("writes");
        assert_eq!(out, expected);
    }
}
