//! JSON Patch bodies of `PATCH /v1/nodes/{node}` (`api::patch`: parse, the node's rules, apply)
//! on a node document shaped like the one the API renders. After a patch applies, the document
//! is still an object and the last `add`/`replace` can be read back at its path.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use vmdeploy_conductor::api::fuzzing::patch_node;

fuzz_target!(|data: &[u8]| {
    let Ok(body) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let mut document = json!({
        "uuid": "1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
        "name": "node-1",
        "driver": "ilo",
        "driver_info": {"ilo_address": "10.0.0.5", "ilo_username": "admin", "list": [1, 2, {"a": []}]},
        "properties": {"capabilities": "boot_mode:uefi", "root_device": {"size": 10}},
        "instance_info": {"image_source": "http://x/y.img", "nested": {"deeper": [null]}},
        "extra": {},
        "instance_uuid": null,
        "maintenance": false,
        "provision_state": "available",
        "driver_internal_info": {}
    });
    let last_set = body.as_array().and_then(|ops| ops.last()).and_then(|op| {
        let kind = op.get("op")?.as_str()?;
        let path = op.get("path")?.as_str()?;
        let value = op.get("value")?;
        (matches!(kind, "add" | "replace") && !path.ends_with("/-"))
            .then(|| (path.to_owned(), value.clone()))
    });
    match patch_node(&mut document, body) {
        Ok(()) => {
            assert!(
                document.is_object(),
                "a patch turned the node into {document}"
            );
            if let Some((path, value)) = last_set {
                // An array `add` inserts: the value is at the index either way.
                assert_eq!(
                    document.pointer(&path),
                    Some(&value),
                    "{path} after the patch"
                );
            }
        }
        Err(e) => assert!(!e.message.is_empty()),
    }
});
