//! SCSI as the target receives it (CDBs, PERSISTENT RESERVE OUT parameter lists) and as the
//! initiator receives it (sense data, READ CAPACITY (16), READ KEYS). Encoders exist for the
//! reply formats: what parses must encode to bytes that parse to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vmdeploy_shared::iscsi::scsi::reservation::{self, PrOutParameters};
use vmdeploy_shared::iscsi::scsi::{Capacity, ScsiCommand, Sense};

fuzz_target!(|data: &[u8]| {
    let mut cdb = [0u8; 16];
    let n = data.len().min(16);
    cdb[..n].copy_from_slice(&data[..n]);
    match ScsiCommand::parse(&cdb) {
        Ok(cmd) => {
            let _ = format!("{cmd:?}");
        }
        Err(sense) => {
            // The refusal goes back to the initiator as fixed-format sense: it must parse.
            let fixed = sense.to_fixed();
            assert_eq!(
                Sense::parse(&fixed).as_ref(),
                Ok(&sense),
                "sense round trip"
            );
        }
    }

    if let Ok(params) = PrOutParameters::parse(data) {
        assert_eq!(PrOutParameters::parse(&params.encode()), Ok(params));
    }

    match Sense::parse(data) {
        Ok(sense) => {
            let again = Sense::parse(&sense.to_fixed()).expect("fixed sense parses");
            assert_eq!(again.key, sense.key);
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }

    if let Ok(cap) = Capacity::parse_read_capacity_16(data) {
        assert_eq!(
            Capacity::parse_read_capacity_16(&cap.to_read_capacity_16()).ok(),
            Some(cap)
        );
    }

    match reservation::parse_read_keys(data) {
        Ok((generation, keys)) => {
            assert!(
                keys.len() * 8 + 8 <= data.len(),
                "{} keys from {} bytes",
                keys.len(),
                data.len()
            );
            assert_eq!(
                reservation::parse_read_keys(&reservation::read_keys(generation, &keys)).ok(),
                Some((generation, keys))
            );
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
