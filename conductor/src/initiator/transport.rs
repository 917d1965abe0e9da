//! PDU framing over a byte stream: a reader that decodes PDUs out of a growing buffer (data
//! segments stay in that buffer, no copy) and a vectored writer for header, data and tail.

use std::io::IoSlice;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use vmdeploy_shared::iscsi::{Digests, EncodedPdu, Pdu, PduDecoder};

use super::InitiatorError;

/// Smallest read buffer growth: big enough that a 256 KiB Data-In arrives in a few reads.
const READ_CHUNK: usize = 512 * 1024;

/// Decodes PDUs from a stream.
pub struct PduReader<R> {
    inner: R,
    buf: BytesMut,
    /// The framing rules in force (digests, largest data segment).
    pub decoder: PduDecoder,
}

impl<R: AsyncRead + Unpin> PduReader<R> {
    /// A reader over `inner`.
    pub fn new(inner: R, decoder: PduDecoder) -> Self {
        PduReader {
            inner,
            buf: BytesMut::with_capacity(READ_CHUNK),
            decoder,
        }
    }

    /// The next PDU; `Ok(None)` on a clean end of stream between PDUs.
    pub async fn next(&mut self) -> Result<Option<Pdu>, InitiatorError> {
        loop {
            if let Some(pdu) = self.decoder.decode(&mut self.buf)? {
                return Ok(Some(pdu));
            }
            let needed = self.decoder.frame_len(&self.buf)?.unwrap_or(0);
            self.buf
                .reserve(needed.saturating_sub(self.buf.len()).max(READ_CHUNK));
            let n = self.inner.read_buf(&mut self.buf).await.map_err(|e| {
                InitiatorError::ConnectionLost(format!("reading from the target: {e}"))
            })?;
            if n == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(InitiatorError::ConnectionLost(
                        "the target closed the connection in the middle of a PDU".into(),
                    ))
                };
            }
        }
    }

    /// [`PduReader::next`] with a time limit; end of stream is an error here.
    pub async fn next_within(
        &mut self,
        limit: Duration,
        what: &'static str,
    ) -> Result<Pdu, InitiatorError> {
        match tokio::time::timeout(limit, self.next()).await {
            Ok(Ok(Some(pdu))) => Ok(pdu),
            Ok(Ok(None)) => Err(InitiatorError::ConnectionLost(format!(
                "the target closed the connection while {what}"
            ))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(InitiatorError::Timeout(limit, what)),
        }
    }

    /// The underlying stream.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

/// Writes one encoded PDU with vectored writes (no copy of the data segment).
pub async fn write_encoded<W: AsyncWrite + Unpin>(
    w: &mut W,
    pdu: &EncodedPdu,
) -> std::io::Result<()> {
    let parts: [&[u8]; 3] = [&pdu.head, &pdu.data, pdu.tail()];
    let mut part = 0;
    let mut offset = 0;
    while part < parts.len() {
        if offset >= parts[part].len() {
            part += 1;
            offset = 0;
            continue;
        }
        let mut slices = [IoSlice::new(&[]), IoSlice::new(&[]), IoSlice::new(&[])];
        let mut count = 0;
        slices[count] = IoSlice::new(&parts[part][offset..]);
        count += 1;
        for p in &parts[part + 1..] {
            if !p.is_empty() {
                slices[count] = IoSlice::new(p);
                count += 1;
            }
        }
        let mut n = w.write_vectored(&slices[..count]).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 && part < parts.len() {
            let left = parts[part].len() - offset;
            if n >= left {
                n -= left;
                part += 1;
                offset = 0;
            } else {
                offset += n;
                n = 0;
            }
        }
    }
    Ok(())
}

/// Encodes and writes one PDU within `limit`.
pub async fn send_pdu<W: AsyncWrite + Unpin>(
    w: &mut W,
    pdu: &Pdu,
    digests: Digests,
    limit: Duration,
) -> Result<(), InitiatorError> {
    let encoded = pdu.encode_parts(digests)?;
    match tokio::time::timeout(limit, write_encoded(w, &encoded)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(InitiatorError::ConnectionLost(format!(
            "writing to the target: {e}"
        ))),
        Err(_) => Err(InitiatorError::Timeout(
            limit,
            "writing a PDU to the target",
        )),
    }
}

/// Flushes and shuts the write side down (best effort).
pub async fn shutdown<W: AsyncWrite + Unpin>(w: &mut W) {
    let _ = tokio::time::timeout(Duration::from_secs(2), w.shutdown()).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmdeploy_shared::iscsi::{DataOut, NopIn, RESERVED_TAG};

    /// A writer that accepts at most 7 bytes per call, to exercise the partial-write bookkeeping.
    struct Trickle(Vec<u8>);

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = buf.len().min(7);
            self.0.extend_from_slice(&buf[..n]);
            std::task::Poll::Ready(Ok(n))
        }
        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let mut n = 0;
            for b in bufs {
                let take = b.len().min(7 - n);
                self.0.extend_from_slice(&b[..take]);
                n += take;
                if n == 7 {
                    break;
                }
            }
            std::task::Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn partial_vectored_writes_and_reads_round_trip() {
        let digests = Digests {
            header: true,
            data: true,
        };
        let pdus = vec![
            Pdu::with_data(
                DataOut {
                    final_: true,
                    itt: 5,
                    ttt: RESERVED_TAG,
                    buffer_offset: 4,
                    ..Default::default()
                },
                vec![9u8; 1001],
            ),
            Pdu::new(NopIn {
                itt: RESERVED_TAG,
                ttt: 3,
                ..Default::default()
            }),
        ];
        let mut sink = Trickle(Vec::new());
        for pdu in &pdus {
            let encoded = pdu.encode_parts(digests).expect("encodes");
            write_encoded(&mut sink, &encoded).await.expect("writes");
        }
        let expected: Vec<u8> = pdus
            .iter()
            .flat_map(|p| p.encode(digests).expect("encodes"))
            .collect();
        assert_eq!(sink.0, expected);

        let mut reader = PduReader::new(&sink.0[..], PduDecoder::new(digests, 8192));
        for pdu in &pdus {
            assert_eq!(reader.next().await.expect("reads").as_ref(), Some(pdu));
        }
        assert_eq!(reader.next().await.expect("clean end"), None);
        let cut = &expected[..expected.len() - 3];
        let mut reader = PduReader::new(cut, PduDecoder::new(digests, 8192));
        reader.next().await.expect("first PDU is whole");
        assert!(matches!(
            reader.next().await,
            Err(InitiatorError::ConnectionLost(_))
        ));
    }
}
