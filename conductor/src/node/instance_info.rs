//! `instance_info`: what to deploy, as the scheduler (Nova) or the operator set it.
//!
//! # Design
//! [`InstanceInfo::parse`] reads every key the flows use once, with the rules of Ironic's
//! `deploy_utils.parse_instance_info` (docs/ironic-protocols.md §5.2, docs/architecture.md §3): Nova
//! sends every value as a string, so sizes accept a JSON integer or a numeric string; a partition
//! image (one with `kernel` and `ramdisk`) needs `root_gb`; a whole-disk image takes no swap or
//! ephemeral partition. Each error names its field, so validate and `last_error` can say which
//! one to fix. Unknown keys are left alone (the conductor keeps its own there: `boot_iso`, ...).
//!
//! # Limitations
//! A Glance image's kernel/ramdisk would come from Glance's image properties; without a Glance
//! client the whole-disk rule reads only `instance_info` (and the conductor's own flag).

use std::fmt;

use serde_json::Value;
use vmdeploy_shared::io::hash::{ExpectedDigest, HashAlgo, HashError};

use super::capabilities::{Capabilities, CapabilitiesError};
use super::image_ref::{ImageRef, ImageRefError};
use crate::store::{JsonObject, Node};

/// Why `instance_info` cannot be deployed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstanceInfoError {
    /// A required key is absent (or empty).
    #[error("instance_info/{0} is required")]
    Missing(&'static str),
    /// A key has a value the deploy cannot use.
    #[error("instance_info/{field}: {reason}")]
    Invalid {
        /// The key.
        field: &'static str,
        /// What is wrong, and what would be right.
        reason: String,
    },
    /// `capabilities` does not parse.
    #[error(transparent)]
    Capabilities(#[from] CapabilitiesError),
}

impl InstanceInfoError {
    fn invalid(field: &'static str, reason: impl Into<String>) -> InstanceInfoError {
        InstanceInfoError::Invalid {
            field,
            reason: reason.into(),
        }
    }

    /// The `instance_info` key at fault (for the API's field-level message).
    pub fn field(&self) -> &'static str {
        match self {
            InstanceInfoError::Missing(field) | InstanceInfoError::Invalid { field, .. } => field,
            InstanceInfoError::Capabilities(_) => "capabilities",
        }
    }
}

/// Image format, as Glance's `disk_format` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskFormat {
    /// Bytes as they go on the disk.
    Raw,
    /// QEMU copy-on-write (the agent converts it).
    Qcow2,
}

impl DiskFormat {
    /// The name IPA's `image_info.disk_format` uses.
    pub fn as_str(self) -> &'static str {
        match self {
            DiskFormat::Raw => "raw",
            DiskFormat::Qcow2 => "qcow2",
        }
    }
}

/// A parsed `instance_info`.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceInfo {
    /// The image to write.
    pub image_source: ImageRef,
    /// Root partition size in GiB (partition images).
    pub root_gb: Option<u64>,
    /// Swap partition in MiB (0 = none).
    pub swap_mb: u64,
    /// Ephemeral partition in GiB (0 = none).
    pub ephemeral_gb: u64,
    /// File system of the ephemeral partition.
    pub ephemeral_format: Option<String>,
    /// Keep the ephemeral partition on rebuild.
    pub preserve_ephemeral: bool,
    /// The image's digest, when given (checked by whoever writes the image).
    pub checksum: Option<ExpectedDigest>,
    /// The image's format, when given (`None` = let the writer detect it).
    pub disk_format: Option<DiskFormat>,
    /// Kernel of a partition image.
    pub kernel: Option<ImageRef>,
    /// Ramdisk of a partition image.
    pub ramdisk: Option<ImageRef>,
    /// Config drive: gzip+base64 text or a URL (a string), or the JSON to build it from.
    pub configdrive: Option<Value>,
    /// The scheduler's capabilities (`boot_mode`, `boot_option`, `secure_boot`, ...).
    pub capabilities: Capabilities,
}

impl InstanceInfo {
    /// Reads and checks `instance_info`.
    pub fn parse(map: &JsonObject) -> Result<InstanceInfo, InstanceInfoError> {
        let image_source = match text(map, "image_source")? {
            Some(s) => image_ref("image_source", &s)?,
            None => return Err(InstanceInfoError::Missing("image_source")),
        };
        let kernel = text(map, "kernel")?
            .map(|s| image_ref("kernel", &s))
            .transpose()?;
        let ramdisk = text(map, "ramdisk")?
            .map(|s| image_ref("ramdisk", &s))
            .transpose()?;
        let root_gb = size(map, "root_gb")?;
        let swap_mb = size(map, "swap_mb")?.unwrap_or(0);
        let ephemeral_gb = size(map, "ephemeral_gb")?.unwrap_or(0);
        let ephemeral_format = text(map, "ephemeral_format")?;
        let preserve_ephemeral = boolean(map, "preserve_ephemeral")?.unwrap_or(false);

        match (&kernel, &ramdisk) {
            (Some(_), None) => return Err(InstanceInfoError::Missing("ramdisk")),
            (None, Some(_)) => return Err(InstanceInfoError::Missing("kernel")),
            _ => {}
        }
        let whole_disk = kernel.is_none();
        if whole_disk {
            // Ironic: "Cannot deploy whole disk image with swap or ephemeral size set".
            for (field, value) in [("swap_mb", swap_mb), ("ephemeral_gb", ephemeral_gb)] {
                if value != 0 {
                    return Err(InstanceInfoError::invalid(
                        field,
                        "a whole-disk image (no kernel and ramdisk) cannot have swap or \
                         ephemeral partitions",
                    ));
                }
            }
        } else {
            match root_gb {
                None => return Err(InstanceInfoError::Missing("root_gb")),
                Some(0) => {
                    return Err(InstanceInfoError::invalid(
                        "root_gb",
                        "a partition image needs a root partition of at least 1 GiB",
                    ));
                }
                Some(_) => {}
            }
        }

        let algo = text(map, "image_os_hash_algo")?;
        let value = text(map, "image_os_hash_value")?;
        let checksum = match (algo, value) {
            (Some(algo), Some(value)) => {
                let algo = algo.parse::<HashAlgo>().map_err(|_| {
                    InstanceInfoError::invalid(
                        "image_os_hash_algo",
                        format!(
                            "unsupported algorithm {:?} (sha256 or sha512)",
                            algo.to_ascii_lowercase()
                        ),
                    )
                })?;
                Some(digest("image_os_hash_value", algo, &value)?)
            }
            (Some(_), None) => return Err(InstanceInfoError::Missing("image_os_hash_value")),
            (None, Some(_)) => return Err(InstanceInfoError::Missing("image_os_hash_algo")),
            (None, None) => match text(map, "image_checksum")? {
                // Legacy MD5; a SHA-2 digest put there (as modern Ironic allows) is told apart
                // by its length, the only thing the field carries.
                Some(hex) => {
                    let algo = HashAlgo::from_hex_len(hex.trim().len()).unwrap_or(HashAlgo::Md5);
                    Some(digest("image_checksum", algo, &hex)?)
                }
                None => None,
            },
        };

        let disk_format = match text(map, "image_disk_format")? {
            None => None,
            Some(f) => Some(match f.to_ascii_lowercase().as_str() {
                "raw" => DiskFormat::Raw,
                "qcow2" => DiskFormat::Qcow2,
                other => {
                    return Err(InstanceInfoError::invalid(
                        "image_disk_format",
                        format!("{other:?} cannot be written to a disk (raw or qcow2)"),
                    ));
                }
            }),
        };

        let configdrive = match map.get("configdrive") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(v @ (Value::String(_) | Value::Object(_))) => Some(v.clone()),
            Some(_) => {
                return Err(InstanceInfoError::invalid(
                    "configdrive",
                    "must be a string (gzipped base64 or a URL) or a JSON object",
                ));
            }
        };
        let capabilities = Capabilities::parse_field(
            "instance_info/capabilities",
            map.get("capabilities").unwrap_or(&Value::Null),
        )?;
        capabilities.validate()?;

        Ok(InstanceInfo {
            image_source,
            root_gb,
            swap_mb,
            ephemeral_gb,
            ephemeral_format,
            preserve_ephemeral,
            checksum,
            disk_format,
            kernel,
            ramdisk,
            configdrive,
            capabilities,
        })
    }

    /// Reads and checks a node's `instance_info`.
    pub fn of(node: &Node) -> Result<InstanceInfo, InstanceInfoError> {
        Self::parse(&node.instance_info)
    }

    /// Whether the image holds a whole disk (partition table and all) rather than one
    /// partition. As Ironic: the conductor's `driver_internal_info.is_whole_disk_image`, once it
    /// recorded one, else no `kernel` and no `ramdisk`.
    pub fn is_whole_disk(&self, driver_internal_info: &JsonObject) -> bool {
        match driver_internal_info.get("is_whole_disk_image") {
            Some(Value::Bool(flag)) => *flag,
            _ => self.kernel.is_none() && self.ramdisk.is_none(),
        }
    }

    /// The checksum, which a deploy needs unless Glance supplies it: the agent refuses to write
    /// an image it cannot verify (Ironic's agent `validate`).
    pub fn required_checksum(&self) -> Result<Option<&ExpectedDigest>, InstanceInfoError> {
        match (&self.checksum, &self.image_source) {
            (Some(c), _) => Ok(Some(c)),
            (None, ImageRef::Glance(_)) => Ok(None),
            (None, _) => Err(InstanceInfoError::Missing(
                "image_checksum (or image_os_hash_algo and image_os_hash_value)",
            )),
        }
    }
}

/// An image reference read from `field`.
fn image_ref(field: &'static str, s: &str) -> Result<ImageRef, InstanceInfoError> {
    ImageRef::parse(s).map_err(|e| match e {
        ImageRefError::Empty => InstanceInfoError::Missing(field),
        other => InstanceInfoError::invalid(field, other.to_string()),
    })
}

/// A digest of `algo` read from `field`, hex kept lower case.
fn digest(
    field: &'static str,
    algo: HashAlgo,
    hex: &str,
) -> Result<ExpectedDigest, InstanceInfoError> {
    ExpectedDigest::new(algo, hex).map_err(|e| match e {
        HashError::BadDigest {
            algo,
            value,
            expected_len,
        } => InstanceInfoError::invalid(
            field,
            format!(
                "a {algo} digest is {expected_len} hex digits, got {:?}",
                value.to_ascii_lowercase()
            ),
        ),
        other => InstanceInfoError::invalid(field, other.to_string()),
    })
}

/// A string value; numbers are taken as their text (Nova and the CLI disagree on types).
fn text(map: &JsonObject, field: &'static str) -> Result<Option<String>, InstanceInfoError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(_) => Err(InstanceInfoError::invalid(field, "must be a string")),
    }
}

/// A size: a non-negative JSON integer (or a float without fraction), or a string of digits.
fn size(map: &JsonObject, field: &'static str) -> Result<Option<u64>, InstanceInfoError> {
    let bad = |shown: &dyn fmt::Display| {
        InstanceInfoError::invalid(
            field,
            format!("must be a non-negative integer, not {shown}"),
        )
    };
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
        Some(Value::String(s)) => s
            .trim()
            .parse::<u64>()
            .map(Some)
            .map_err(|_| bad(&format!("{s:?}"))),
        Some(Value::Number(n)) => {
            if let Some(v) = n.as_u64() {
                return Ok(Some(v));
            }
            match n.as_f64() {
                // 2^53: every integer below is exact in an f64, so the cast loses nothing.
                Some(f) if f >= 0.0 && f.fract() == 0.0 && f < 9_007_199_254_740_992.0 => {
                    Ok(Some(f as u64))
                }
                _ => Err(bad(n)),
            }
        }
        Some(other) => Err(bad(other)),
    }
}

/// A boolean as oslo's `bool_from_string(strict=True)` reads one.
fn boolean(map: &JsonObject, field: &'static str) -> Result<Option<bool>, InstanceInfoError> {
    match map.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
            "1" | "t" | "true" | "on" | "y" | "yes" => Ok(Some(true)),
            "0" | "f" | "false" | "off" | "n" | "no" => Ok(Some(false)),
            _ => Err(InstanceInfoError::invalid(
                field,
                format!("must be true or false, not {s:?}"),
            )),
        },
        Some(Value::Number(n)) if n.as_u64() == Some(0) => Ok(Some(false)),
        Some(Value::Number(n)) if n.as_u64() == Some(1) => Ok(Some(true)),
        Some(other) => Err(InstanceInfoError::invalid(
            field,
            format!("must be true or false, not {other}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;
    use uuid::Uuid;

    use super::*;

    const MD5: &str = "d41d8cd98f00b204e9800998ecf8427e";
    const SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn object(v: Value) -> JsonObject {
        match v {
            Value::Object(m) => m,
            other => panic!("not an object: {other}"),
        }
    }

    fn parse(v: Value) -> Result<InstanceInfo, InstanceInfoError> {
        InstanceInfo::parse(&object(v))
    }

    /// The forms themselves are `image_ref`'s tests; here, that every error names its key.
    #[test]
    fn image_reference_errors_name_the_key() {
        for input in [
            "ftp://h/x",
            "http://",
            "file://relative/path",
            "swift://container",
            "glance://not-a-uuid",
            "/var/lib/x.img",
        ] {
            let err = parse(json!({"image_source": input})).expect_err(input);
            assert_eq!(err.field(), "image_source", "{input}: {err}");
            let err = parse(json!({"image_source": "http://h/i", "kernel": input,
                                   "ramdisk": "http://h/r", "root_gb": 1}))
            .expect_err(input);
            assert_eq!(err.field(), "kernel", "{input}: {err}");
        }
        assert_eq!(
            parse(json!({"image_source": "http://h/i", "kernel": "http://h/k",
                         "ramdisk": " ", "root_gb": 1})),
            Err(InstanceInfoError::Missing("ramdisk"))
        );
        let err = parse(json!({"image_source": "gopher://x/i"})).expect_err("gopher");
        assert!(
            err.to_string()
                .starts_with("instance_info/image_source: \"gopher://x/i\": scheme \"gopher\""),
            "{err}"
        );
    }

    #[test]
    fn whole_disk_image_as_nova_sends_it() {
        // Every value a string, capabilities a JSON string (docs/ironic-protocols.md §5.2).
        let info = parse(json!({
            "image_source": "http://img/disk.qcow2",
            "root_gb": "10",
            "swap_mb": "0",
            "image_checksum": MD5.to_uppercase(),
            "image_disk_format": "qcow2",
            "preserve_ephemeral": "False",
            "capabilities": "{\"boot_option\": \"local\", \"boot_mode\": \"uefi\"}",
            "configdrive": "H4sIAAAA",
            "boot_iso": "kept for the conductor",
        }))
        .expect("parses");
        assert_eq!(info.root_gb, Some(10));
        assert_eq!(info.swap_mb, 0);
        assert_eq!(
            info.checksum,
            Some(ExpectedDigest::new(HashAlgo::Md5, MD5).expect("md5"))
        );
        assert_eq!(info.disk_format, Some(DiskFormat::Qcow2));
        assert!(!info.preserve_ephemeral);
        assert_eq!(info.capabilities.get("boot_mode"), Some("uefi"));
        assert_eq!(info.configdrive, Some(json!("H4sIAAAA")));
        assert!(info.is_whole_disk(&JsonObject::new()));
        assert_eq!(info.required_checksum(), Ok(info.checksum.as_ref()));
    }

    #[test]
    fn partition_image() {
        let info = parse(json!({
            "image_source": "swift://images/root.img",
            "kernel": "swift://images/vmlinuz",
            "ramdisk": "swift://images/initrd",
            "root_gb": 20,
            "swap_mb": 512,
            "ephemeral_gb": "5",
            "ephemeral_format": "ext4",
            "preserve_ephemeral": true,
            "image_os_hash_algo": "SHA256",
            "image_os_hash_value": SHA256,
        }))
        .expect("parses");
        assert_eq!(info.root_gb, Some(20));
        assert_eq!((info.swap_mb, info.ephemeral_gb), (512, 5));
        assert_eq!(info.ephemeral_format.as_deref(), Some("ext4"));
        assert!(info.preserve_ephemeral);
        assert_eq!(
            info.checksum,
            Some(ExpectedDigest::new(HashAlgo::Sha256, SHA256).expect("sha256"))
        );
        assert!(!info.is_whole_disk(&JsonObject::new()));
        // The conductor's recorded flag wins.
        assert!(info.is_whole_disk(&object(json!({"is_whole_disk_image": true}))));
        let mut node = Node::new(
            Uuid::new_v4(),
            "agent_ilo",
            crate::states::ProvisionState::Available,
        );
        node.instance_info = object(json!({"image_source": "http://h/i"}));
        assert_eq!(
            InstanceInfo::of(&node).map(|i| i.image_source.to_string()),
            Ok("http://h/i".to_string())
        );
    }

    #[test]
    fn errors_name_the_field() {
        let base = || object(json!({"image_source": "http://h/i.img"}));
        let with = |key: &str, value: Value| {
            let mut m = base();
            m.insert(key.into(), value);
            InstanceInfo::parse(&m)
        };
        let partition = |extra: Value| {
            let mut m = object(json!({
                "image_source": "http://h/i.img",
                "kernel": "http://h/k",
                "ramdisk": "http://h/r",
            }));
            m.extend(object(extra));
            InstanceInfo::parse(&m)
        };
        for (name, result, field) in [
            ("no image", parse(json!({})), "image_source"),
            (
                "empty image",
                parse(json!({"image_source": ""})),
                "image_source",
            ),
            (
                "image not a string",
                parse(json!({"image_source": ["x"]})),
                "image_source",
            ),
            (
                "bad scheme",
                parse(json!({"image_source": "nfs://x/y"})),
                "image_source",
            ),
            ("root_gb words", with("root_gb", json!("ten")), "root_gb"),
            ("root_gb negative", with("root_gb", json!(-1)), "root_gb"),
            ("root_gb fraction", with("root_gb", json!(1.5)), "root_gb"),
            ("root_gb bool", with("root_gb", json!(true)), "root_gb"),
            (
                "swap on whole disk",
                with("swap_mb", json!("512")),
                "swap_mb",
            ),
            (
                "ephemeral on whole disk",
                with("ephemeral_gb", json!(1)),
                "ephemeral_gb",
            ),
            (
                "preserve maybe",
                with("preserve_ephemeral", json!("maybe")),
                "preserve_ephemeral",
            ),
            (
                "md5 short",
                with("image_checksum", json!("abc")),
                "image_checksum",
            ),
            (
                "md5 not hex",
                with("image_checksum", json!("z".repeat(32))),
                "image_checksum",
            ),
            (
                "algo unknown",
                with("image_os_hash_algo", json!("sha1")),
                "image_os_hash_value",
            ),
            (
                "format iso",
                with("image_disk_format", json!("iso")),
                "image_disk_format",
            ),
            (
                "configdrive number",
                with("configdrive", json!(5)),
                "configdrive",
            ),
            (
                "capabilities bad",
                with("capabilities", json!("{oops")),
                "capabilities",
            ),
            (
                "capabilities bad mode",
                with("capabilities", json!({"boot_mode": "efi"})),
                "capabilities",
            ),
            (
                "kernel only",
                with("kernel", json!("http://h/k")),
                "ramdisk",
            ),
            (
                "ramdisk only",
                with("ramdisk", json!("http://h/r")),
                "kernel",
            ),
            ("partition without root", partition(json!({})), "root_gb"),
            (
                "partition root zero",
                partition(json!({"root_gb": "0"})),
                "root_gb",
            ),
        ] {
            let err = result.expect_err(name);
            assert_eq!(err.field(), field, "{name}: {err}");
            assert!(
                err.to_string().contains(field) || field == "capabilities",
                "{name}: {err}"
            );
        }
        // One half of the os_hash pair.
        let mut m = base();
        m.insert("image_os_hash_algo".into(), json!("sha512"));
        assert_eq!(
            InstanceInfo::parse(&m),
            Err(InstanceInfoError::Missing("image_os_hash_value"))
        );
        let mut m = base();
        m.insert("image_os_hash_value".into(), json!(SHA256));
        assert_eq!(
            InstanceInfo::parse(&m),
            Err(InstanceInfoError::Missing("image_os_hash_algo"))
        );
        // An unknown algorithm is named as such.
        let mut m = base();
        m.insert("image_os_hash_algo".into(), json!("crc32"));
        m.insert("image_os_hash_value".into(), json!("00000000"));
        assert_eq!(
            InstanceInfo::parse(&m).expect_err("crc32").field(),
            "image_os_hash_algo"
        );
    }

    #[test]
    fn checksums() {
        let parse_sum = |extra: Value| {
            let mut m = object(json!({"image_source": "http://h/i"}));
            m.extend(object(extra));
            InstanceInfo::parse(&m).map(|i| i.checksum)
        };
        let sha512 = "a".repeat(128);
        assert_eq!(
            parse_sum(json!({"image_checksum": SHA256})),
            Ok(Some(
                ExpectedDigest::new(HashAlgo::Sha256, SHA256).expect("sha256")
            ))
        );
        assert_eq!(
            parse_sum(json!({
                "image_os_hash_algo": "sha512",
                "image_os_hash_value": sha512.to_uppercase(),
                "image_checksum": MD5,
            })),
            Ok(Some(
                ExpectedDigest::new(HashAlgo::Sha512, &sha512).expect("sha512")
            )),
            "os_hash wins over the legacy md5, hex kept lower case"
        );
        let glance =
            parse(json!({"image_source": "0b2d6bc1-1d1e-4b8f-93b0-6c1a4c0e8d5f"})).expect("glance");
        assert_eq!(glance.required_checksum(), Ok(None), "Glance supplies it");
        let http = parse(json!({"image_source": "http://h/i"})).expect("http");
        assert!(matches!(
            http.required_checksum(),
            Err(InstanceInfoError::Missing(_))
        ));
    }

    #[test]
    fn sizes_accept_integral_floats_and_blank_strings() {
        let info = parse(json!({
            "image_source": "http://h/i",
            "root_gb": 40.0,
            "swap_mb": "",
            "ephemeral_gb": null,
        }))
        .expect("parses");
        assert_eq!(
            (info.root_gb, info.swap_mb, info.ephemeral_gb),
            (Some(40), 0, 0)
        );
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            any::<String>().prop_map(Value::String),
            "(https?|file|swift|glance)://[a-z0-9/%.:]{0,12}".prop_map(Value::String),
            "[0-9a-fA-F]{0,130}".prop_map(Value::String),
        ];
        leaf.prop_recursive(2, 12, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::btree_map("[a-z_]{0,8}", inner, 0..3)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    const KEYS: [&str; 15] = [
        "image_source",
        "root_gb",
        "swap_mb",
        "ephemeral_gb",
        "ephemeral_format",
        "preserve_ephemeral",
        "image_checksum",
        "image_os_hash_algo",
        "image_os_hash_value",
        "image_disk_format",
        "kernel",
        "ramdisk",
        "configdrive",
        "capabilities",
        "deploy_boot_mode",
    ];

    proptest! {
        #[test]
        fn arbitrary_json_never_panics(
            values in prop::collection::vec(prop::option::of(any_json()), KEYS.len()),
        ) {
            let map: JsonObject = KEYS
                .iter()
                .zip(values)
                .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
                .collect();
            if let Ok(info) = InstanceInfo::parse(&map) {
                let _ = info.is_whole_disk(&map);
                let _ = info.required_checksum();
                let _ = info.image_source.to_string();
            }
        }
    }
}
