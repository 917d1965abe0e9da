//! TFTP datagrams as the conductor's netboot server receives them (`tftp::packet::parse`):
//! what parses must encode and parse back to the same packet, and an error must say why.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vmdeploy_shared::tftp::packet::{self, Packet};

fuzz_target!(|data: &[u8]| match packet::parse(data) {
    Ok(p) => {
        let _ = p.opcode();
        let wire = p.encode().expect("a parsed packet encodes");
        assert_eq!(packet::parse(&wire).as_ref(), Ok(&p), "TFTP round trip");
        if let Packet::Data { payload, .. } = &p {
            assert!(payload.len() + 4 <= data.len());
        }
    }
    Err(e) => assert!(!e.to_string().is_empty()),
});
