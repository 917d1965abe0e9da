//! iSCSI login and text keys: `TextKeys::parse` (with its encode round trip), the value parsers
//! (`parse_number`, `parse_bool`, `decode_binary`, CHAP's `parse_identifier` and
//! `parse_binary`), SendTargets answers, and the operational negotiation and CHAP steps each
//! side runs on the peer's keys.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vmdeploy_shared::iscsi::chap::{self, ChapChallenge, ChapCredentials};
use vmdeploy_shared::iscsi::keys::{
    decode_binary, encode_binary, parse_bool, parse_number, parse_send_targets,
};
use vmdeploy_shared::iscsi::{Negotiation, OperationalParams, Role, TextKeys};

fuzz_target!(|data: &[u8]| {
    let keys = match TextKeys::parse(data) {
        Ok(k) => k,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    let again = TextKeys::parse(&keys.encode()).expect("encoded keys parse");
    assert_eq!(again, keys, "text keys round trip");
    assert!(
        keys.encode().len() <= data.len() + 1,
        "encoding grew past the input"
    );

    for (k, v) in keys.iter() {
        let number = parse_number(k, v);
        if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
            assert_eq!(number.ok(), v.parse::<u64>().ok(), "decimal {v:?}");
        }
        let _ = parse_bool(k, v);
        if let Ok(bytes) = decode_binary(k, v) {
            assert!(
                bytes.len() <= v.len(),
                "{} bytes from a {}-char value",
                bytes.len(),
                v.len()
            );
            assert_eq!(decode_binary(k, &encode_binary(&bytes)).ok(), Some(bytes));
        }
        let _ = chap::parse_identifier(v);
        let _ = chap::parse_binary("CHAP_C", v);
        let _ = chap::offers_md5(v);
    }
    let targets = parse_send_targets(&keys);
    assert!(targets.len() <= keys.len());

    // Both roles answer the peer's operational keys; the answer must itself be parseable keys.
    for role in [Role::Initiator, Role::Target] {
        let mut neg = Negotiation::new(role, OperationalParams::default());
        let _ = neg.offer();
        match neg.receive(&keys) {
            Ok(answer) => {
                assert_eq!(TextKeys::parse(&answer.encode()).as_ref(), Ok(&answer));
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
        let _ = neg.complete();
    }

    // CHAP: the target checks a response, the initiator answers a challenge.
    let credentials = ChapCredentials::new("user", b"secret-secret".to_vec());
    let challenge = ChapChallenge {
        identifier: 7,
        challenge: vec![0x5a; 16],
    };
    let _ = challenge.check(&keys, &credentials);
    let mutual = ChapChallenge {
        identifier: 9,
        challenge: vec![0xa5; 16],
    };
    let _ = chap::respond_to_challenge(&keys, &credentials, Some(&mutual));
    let _ = chap::respond_to_challenge(&keys, &credentials, None);
});
