//! The parameters floppy as the agent reads it: the FAT image (`fat::fat_label`,
//! `fat::read_root_file` on the whole device) and `parameters.txt` inside it (`Params::parse`,
//! with its `render` round trip, then the typed readers: agent and iSCSI-deploy parameters,
//! root device hints, MAC addresses, boot mode).
//!
//! The first byte chooses: odd, the rest is a disk image; even, the rest is the text itself (so
//! the text parsers are reached without a valid FAT around them).
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use vmdeploy_shared::fat;
use vmdeploy_shared::params::{
    AgentParams, BootMode, IscsiDeployParams, MacAddr, Params, RootDeviceHints, MAX_FILE_LEN,
};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 1 {
        if let Some(sector) = rest.get(..512) {
            let _ = fat::fat_label(sector);
        }
        match fat::read_root_file(Cursor::new(rest), "parameters.txt", MAX_FILE_LEN as u64) {
            Ok(text) => {
                assert!(
                    text.len() <= MAX_FILE_LEN,
                    "read {} bytes past the limit",
                    text.len()
                );
                assert!(text.len() <= rest.len(), "a file larger than its disk");
                text_params(&text);
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    } else {
        text_params(rest);
    }
});

fn text_params(text: &[u8]) {
    let params = match Params::parse(text) {
        Ok(p) => p,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    let rendered = params.render().expect("parsed parameters render");
    assert_eq!(
        Params::parse(rendered.as_bytes()).as_ref(),
        Ok(&params),
        "params round trip"
    );

    let _ = AgentParams::from_params(&params);
    let _ = IscsiDeployParams::from_params(&params);
    for (_, value) in params.iter() {
        if let Ok(hints) = RootDeviceHints::parse(value) {
            let again = RootDeviceHints::parse(&hints.render()).expect("rendered hints parse");
            assert_eq!(again, hints, "hints round trip");
        }
        let _ = MacAddr::parse(value);
        let _ = BootMode::parse(value);
    }
}
