//! Property tests of the iSCSI codec: the decoders take bytes from the network, so random and
//! mutated input must give an error or a value, never a panic; and what the encoder writes the
//! decoder must read back unchanged.

use bytes::BytesMut;
use proptest::prelude::*;
use vmdeploy_shared::iscsi::chap::{respond_to_challenge, ChapChallenge, ChapCredentials};
use vmdeploy_shared::iscsi::keys::{Negotiation, OperationalParams, Role, TextKeys};
use vmdeploy_shared::iscsi::{Ahs, Bhs, Digests, Pdu, PduDecoder, BHS_LEN};

const OPCODES: &[u8] = &[
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x10, 0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x31,
    0x32, 0x3f,
];

fn digests() -> impl Strategy<Value = Digests> {
    (any::<bool>(), any::<bool>()).prop_map(|(header, data)| Digests { header, data })
}

/// A valid typed header: random header bytes with a defined opcode and a valid login stage.
fn bhs() -> impl Strategy<Value = Bhs> {
    (
        prop::sample::select(OPCODES),
        prop::array::uniform32(any::<u8>()),
        prop::array::uniform16(any::<u8>()),
    )
        .prop_map(|(opcode, a, b)| {
            let mut raw = [0u8; BHS_LEN];
            raw[..32].copy_from_slice(&a);
            raw[32..].copy_from_slice(&b);
            raw[0] = (raw[0] & 0xc0) | opcode;
            // CSG/NSG of 2 is reserved: make login stages valid.
            if raw[1] & 0x03 == 2 {
                raw[1] |= 1;
            }
            if (raw[1] >> 2) & 0x03 == 2 {
                raw[1] |= 0x04;
            }
            Bhs::decode(&raw).expect("defined opcode and valid stages decode")
        })
}

fn pdu() -> impl Strategy<Value = Pdu> {
    (
        bhs(),
        prop::collection::vec(
            (any::<u8>(), prop::collection::vec(any::<u8>(), 0..40)),
            0..3,
        ),
        prop::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(bhs, ahs, data)| Pdu {
            bhs,
            ahs: ahs
                .into_iter()
                .map(|(ahs_type, specific)| Ahs { ahs_type, specific })
                .collect(),
            data: data.into(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600), d in digests()) {
        if let Ok((pdu, used)) = Pdu::decode(&bytes, d, 1 << 16) {
            prop_assert!(used <= bytes.len());
            let again = pdu.encode(d).expect("a decoded PDU re-encodes");
            let (back, _) = Pdu::decode(&again, d, 1 << 16).expect("re-encoded PDU decodes");
            prop_assert_eq!(back, pdu);
        }
        let mut buf = BytesMut::from(&bytes[..]);
        let decoder = PduDecoder::new(d, 1 << 16);
        // Drain as many frames as the decoder finds; it must stop without panicking.
        for _ in 0..16 {
            match decoder.decode(&mut buf) {
                Ok(Some(_)) => continue,
                _ => break,
            }
        }
    }

    #[test]
    fn random_bhs_with_valid_opcode_never_panics(mut raw in prop::array::uniform32(any::<u8>()), tail in prop::array::uniform16(any::<u8>()), op in prop::sample::select(OPCODES)) {
        raw[0] = (raw[0] & 0xc0) | op;
        let mut bhs = [0u8; BHS_LEN];
        bhs[..32].copy_from_slice(&raw);
        bhs[32..].copy_from_slice(&tail);
        if let Ok(decoded) = Bhs::decode(&bhs) {
            let again = decoded.encode(0, 0);
            prop_assert_eq!(Bhs::decode(&again), Ok(decoded));
        }
    }

    #[test]
    fn encode_decode_round_trip(pdu in pdu(), d in digests()) {
        let wire = pdu.encode(d).expect("encodes");
        prop_assert_eq!(wire.len() % 4, 0, "PDUs end on a word boundary");
        let (back, used) = Pdu::decode(&wire, d, 1 << 16).expect("decodes");
        prop_assert_eq!(used, wire.len());
        prop_assert_eq!(back, pdu);
    }

    #[test]
    fn mutated_valid_pdus_never_panic(
        pdu in pdu(),
        d in digests(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut wire = pdu.encode(d).expect("encodes");
        for (at, x) in flips {
            let i = at.index(wire.len());
            wire[i] ^= x;
        }
        let _ = Pdu::decode(&wire, d, 1 << 16);
        let short = cut.index(wire.len());
        let _ = Pdu::decode(&wire[..short], d, 1 << 16);
    }

    #[test]
    fn streamed_pdus_decode_in_any_split(
        pdus in prop::collection::vec(pdu(), 1..5),
        d in digests(),
        chunk in 1usize..200,
    ) {
        let mut wire = Vec::new();
        for p in &pdus {
            wire.extend(p.encode(d).expect("encodes"));
        }
        let decoder = PduDecoder::new(d, 1 << 16);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in wire.chunks(chunk) {
            buf.extend_from_slice(piece);
            while let Some(p) = decoder.decode(&mut buf).expect("valid stream") {
                out.push(p);
            }
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(out, pdus);
    }

    #[test]
    fn text_keys_parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        if let Ok(keys) = TextKeys::parse(&bytes) {
            prop_assert_eq!(TextKeys::parse(&keys.encode()), Ok(keys.clone()));
            // Whatever a peer offers, either role answers or errors without panicking.
            let _ = Negotiation::new(Role::Target, OperationalParams::default()).receive(&keys);
            let mut initiator = Negotiation::new(Role::Initiator, OperationalParams::default());
            let _ = initiator.offer();
            let _ = initiator.receive(&keys);
            let creds = ChapCredentials::new("u", "s");
            let _ = respond_to_challenge(&keys, &creds, None);
            if let Ok(challenge) = ChapChallenge::generate() {
                let _ = challenge.check(&keys, &creds);
            }
        }
    }

    #[test]
    fn text_keys_round_trip(pairs in prop::collection::vec(("[A-Za-z][A-Za-z0-9._+@-]{0,20}", "[ -~]{0,40}"), 0..10)) {
        let mut keys = TextKeys::new();
        for (k, v) in pairs {
            keys.push(k, v);
        }
        prop_assert_eq!(TextKeys::parse(&keys.encode()), Ok(keys));
    }

    #[test]
    fn negotiation_values_never_panic(
        k in prop::sample::select(vec![
            "MaxRecvDataSegmentLength", "MaxBurstLength", "FirstBurstLength", "InitialR2T",
            "ImmediateData", "MaxOutstandingR2T", "HeaderDigest", "DataDigest",
            "ErrorRecoveryLevel", "DefaultTime2Wait", "DefaultTime2Retain", "MaxConnections",
            "DataPDUInOrder", "DataSequenceInOrder", "IFMarker", "OFMarkInt", "X-vendor",
        ]),
        v in "[ -~]{0,24}|[0-9]{1,12}|0x[0-9a-f]{1,20}|Yes|No|None|CRC32C|CRC32C,None|Irrelevant|Reject",
    ) {
        let mut keys = TextKeys::new();
        keys.push(k, v);
        let mut target = Negotiation::new(Role::Target, OperationalParams::default());
        if let Ok(answers) = target.receive(&keys) {
            // An acceptor's answers are always valid text.
            prop_assert_eq!(TextKeys::parse(&answers.encode()), Ok(answers));
        }
        let mut initiator = Negotiation::new(Role::Initiator, OperationalParams::default());
        let _ = initiator.offer();
        let _ = initiator.receive(&keys);
    }
}
