//! iSCSI PDU framing and headers, as either side receives them: `PduDecoder::decode` on a byte
//! stream (several PDUs back to back), `Pdu::decode` and `Bhs::decode`. What decodes must
//! encode again and decode to the same PDU (reserved bits aside, which is why the comparison
//! is on decoded values, not bytes), and no PDU may claim more bytes than arrived.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use vmdeploy_shared::iscsi::{Bhs, Digests, Pdu, PduDecoder, BHS_LEN};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, stream)) = data.split_first() else {
        return;
    };
    let digests = Digests {
        header: mode & 1 != 0,
        data: mode & 2 != 0,
    };
    // The login limit (8192) or a negotiated one; small enough that a hostile length is refused.
    let limit = if mode & 4 != 0 { 8192 } else { 262_144 };
    let decoder = PduDecoder::new(digests, limit);

    let mut buf = BytesMut::from(stream);
    for _ in 0..64 {
        let before = buf.len();
        match decoder.decode(&mut buf) {
            Ok(Some(pdu)) => {
                let taken = before - buf.len();
                assert!(
                    taken >= BHS_LEN && taken <= before,
                    "took {taken} of {before} bytes"
                );
                assert!(pdu.data.len() <= limit);
                round_trip(&pdu, digests, limit);
            }
            Ok(None) => {
                assert_eq!(buf.len(), before, "an incomplete PDU consumed bytes");
                break;
            }
            Err(e) => {
                assert!(!e.to_string().is_empty());
                break;
            }
        }
    }

    // The one-shot form must agree with the stream decoder on the first PDU.
    match Pdu::decode(stream, digests, limit) {
        Ok((pdu, used)) => {
            assert!(used <= stream.len());
            let mut again = BytesMut::from(stream);
            let first = decoder
                .decode(&mut again)
                .expect("same bytes")
                .expect("whole PDU");
            assert_eq!(first, pdu);
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }

    if let Some(raw) = stream.first_chunk::<BHS_LEN>() {
        if let Ok(bhs) = Bhs::decode(raw) {
            let (ahs_words, data_len) = (
                raw[4],
                usize::from(raw[5]) << 16 | usize::from(raw[6]) << 8 | usize::from(raw[7]),
            );
            let encoded = bhs.encode(ahs_words, data_len);
            assert_eq!(Bhs::decode(&encoded).as_ref(), Ok(&bhs), "BHS round trip");
            assert_eq!(encoded[4..8], raw[4..8], "lengths are kept");
        }
    }
});

fn round_trip(pdu: &Pdu, digests: Digests, limit: usize) {
    let Ok(wire) = pdu.encode(digests) else {
        return;
    };
    let (again, used) = Pdu::decode(&wire, digests, limit).expect("an encoded PDU decodes");
    assert_eq!(used, wire.len());
    assert_eq!(&again, pdu, "PDU round trip");
}
