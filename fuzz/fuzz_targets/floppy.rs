//! The parameters floppy as the agent reads it: the FAT image (`fat::fat_label`,
//! `fat::read_root_file` on the whole device) and `parameters.txt` inside it (`Params::parse`,
//! with its `render` round trip, then the typed readers: agent and iSCSI-deploy parameters,
//! root device hints, MAC addresses, boot mode).
//!
//! The first byte chooses: odd, the rest is a disk image; even, the rest is the text itself (so
//! the text parsers are reached without a valid FAT around them).
#![no_main]

use std::cell::Cell;
use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use vmdeploy_shared::fat;
use vmdeploy_shared::params::{
    AgentParams, BootMode, IscsiDeployParams, MacAddr, Params, RootDeviceHints, MAX_FILE_LEN,
};

thread_local! {
    /// Set while `fat::read_root_file` runs: it catches panics of the FAT crate it reads with.
    static IN_FAT_READER: Cell<bool> = const { Cell::new(false) };
}

fuzz_target!(
    init: {
        // libfuzzer-sys's hook aborts on every panic, caught or not. read_root_file catches
        // what fatfs 0.3.6 (not hardened against hostile images) panics on and returns an
        // error, which is its contract; the fuzzer found such an image (a cluster number below
        // 2, seed fatfs-cluster-below-2). A panic anywhere else still aborts, and one that
        // escaped read_root_file would abort too, through libfuzzer-sys's catch_unwind.
        let abort_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_FAT_READER.with(Cell::get) {
                abort_hook(info);
            }
        }));
    },
    |data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 1 {
        if let Some(sector) = rest.get(..512) {
            let _ = fat::fat_label(sector);
        }
        IN_FAT_READER.with(|f| f.set(true));
        let read = fat::read_root_file(Cursor::new(rest), "parameters.txt", MAX_FILE_LEN as u64);
        IN_FAT_READER.with(|f| f.set(false));
        match read {
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
    }
);

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
