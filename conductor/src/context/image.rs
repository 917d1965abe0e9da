//! Image references (docs/architecture.md §3): where the iLO finds the deploy ISO and the agent the
//! instance image, and the `image_info` the agent gets in `standby.prepare_image`
//! (docs/ironic-protocols.md §3.4).
//!
//! # Design
//! [`parse`] reads a reference with the node's one parser ([`ImageRef`]), naming the field it
//! came from in every error.
//! [`resolve`] turns it into a URL the BMC or the agent can fetch:
//! - `http(s)://` is passed through (the image server is the operator's);
//! - `file://` (a file on the conductor) is uploaded to the object store once, under a name
//!   derived from its path, size and modification time, and reached by a temp URL: a second
//!   deploy of the same file reuses the object;
//! - `swift://container/object` is an object of the store, reached by a temp URL.
//!
//! A Glance UUID is refused: this conductor has no Glance endpoint yet.

use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use uuid::Uuid;
use vmdeploy_shared::io::hash::{ExpectedDigest, HashAlgo};

pub use crate::node::image_ref::ImageRef;
use crate::node::instance_info::{DiskFormat, InstanceInfo};
use crate::objects::{ObjectBody, ObjectError, ObjectPath, ObjectStore, PutOptions};
use crate::store::JsonObject;

/// Reads `value` of `field` (e.g. `instance_info/image_source`) as a reference this conductor
/// can resolve; the error names both.
pub fn parse(field: &str, value: &str) -> anyhow::Result<ImageRef> {
    let reference = ImageRef::parse(value).map_err(|e| anyhow::anyhow!("{field}: {e}"))?;
    refuse_glance(field, &reference)?;
    Ok(reference)
}

/// Refuses a Glance image id: this conductor has no Glance endpoint to ask for the image.
fn refuse_glance(field: &str, reference: &ImageRef) -> anyhow::Result<()> {
    match reference {
        ImageRef::Glance(id) => Err(glance_refused(field, *id)),
        _ => Ok(()),
    }
}

fn glance_refused(field: &str, id: Uuid) -> anyhow::Error {
    anyhow::anyhow!("{field} {id} is a Glance image id, and no Glance is configured: give an http(s)://, file:// or swift:// reference")
}

/// Checks that `reference` can be resolved without uploading anything: the file exists and is
/// a readable regular file, the object exists. `http(s)` is taken as given (the BMC and the
/// agent fetch it, not the conductor).
pub async fn check(
    objects: &dyn ObjectStore,
    field: &str,
    reference: &ImageRef,
) -> anyhow::Result<()> {
    match reference {
        ImageRef::Http(_) => Ok(()),
        ImageRef::Glance(id) => Err(glance_refused(field, *id)),
        ImageRef::File(path) => {
            let meta = tokio::fs::metadata(path)
                .await
                .with_context(|| format!("{field}: reading {}", path.display()))?;
            if !meta.is_file() {
                bail!("{field}: {} is not a regular file", path.display());
            }
            tokio::fs::File::open(path)
                .await
                .with_context(|| format!("{field}: opening {}", path.display()))?;
            Ok(())
        }
        ImageRef::Swift(path) => match objects.head(path).await {
            Ok(_) => Ok(()),
            Err(ObjectError::NotFound(_)) => {
                bail!(
                    "{field}: object {path} not found in the {} store",
                    objects.kind()
                )
            }
            Err(e) => Err(e).with_context(|| format!("{field}: looking up object {path}")),
        },
    }
}

/// A URL for `reference` valid for `ttl`, uploading a `file://` image into `container` first
/// when the store does not hold it yet.
pub async fn resolve(
    objects: &dyn ObjectStore,
    container: &str,
    field: &str,
    reference: &ImageRef,
    ttl: Duration,
) -> anyhow::Result<String> {
    match reference {
        ImageRef::Http(url) => Ok(url.to_string()),
        ImageRef::Glance(id) => Err(glance_refused(field, *id)),
        ImageRef::Swift(path) => {
            check(objects, field, reference).await?;
            objects
                .temp_url(path, ttl)
                .await
                .with_context(|| format!("{field}: making a temp URL for {path}"))
        }
        ImageRef::File(file) => {
            let meta = tokio::fs::metadata(file)
                .await
                .with_context(|| format!("{field}: reading {}", file.display()))?;
            if !meta.is_file() {
                bail!("{field}: {} is not a regular file", file.display());
            }
            let path = ObjectPath::new(container, file_object_name(file, &meta));
            let present = match objects.head(&path).await {
                Ok(info) => info.size == meta.len(),
                Err(ObjectError::NotFound(_)) => false,
                Err(e) => {
                    return Err(e).with_context(|| format!("{field}: looking up object {path}"))
                }
            };
            if !present {
                let mut options = PutOptions::default();
                options
                    .metadata
                    .insert("source".into(), file.display().to_string());
                objects
                    .put(&path, ObjectBody::File(file.clone()), &options)
                    .await
                    .with_context(|| {
                        format!(
                            "{field}: uploading {} to the {} store as {path}",
                            file.display(),
                            objects.kind()
                        )
                    })?;
            }
            objects
                .temp_url(&path, ttl)
                .await
                .with_context(|| format!("{field}: making a temp URL for {path}"))
        }
    }
}

/// The object name of a conductor-local file: `file-<digest>-<file name>`, the digest over the
/// path, size and modification time, so a changed file gets a new object.
fn file_object_name(file: &std::path::Path, meta: &std::fs::Metadata) -> String {
    let mut hash = Sha256::new();
    hash.update(file.as_os_str().as_encoded_bytes());
    hash.update(meta.len().to_le_bytes());
    if let Ok(modified) = meta.modified() {
        if let Ok(since) = modified.duration_since(std::time::UNIX_EPOCH) {
            hash.update(since.as_nanos().to_le_bytes());
        }
    }
    let digest = hex::encode(hash.finalize());
    let base: String = file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("file-{}-{base}", &digest[..16])
}

/// The image fields of `instance_info` the agent deploy needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceImage {
    /// `image_source`, parsed.
    pub source: ImageRef,
    /// The raw `image_source` (its last path segment is the image id).
    pub source_text: String,
    /// Digest to verify the download against.
    pub digest: ExpectedDigest,
    /// `image_disk_format` (`raw` when absent).
    pub disk_format: String,
    /// `image_container_format` (`bare` when absent).
    pub container_format: String,
}

/// Reads the image fields of `instance_info` with the node's typed view
/// ([`crate::node::instance_info::InstanceInfo`]), naming the field in every error, and checks
/// what the agent deploy needs beyond it: a whole-disk image (the agent writes no partition
/// images), a checksum, and a reference this conductor can resolve (no Glance).
pub fn instance_image(info: &JsonObject) -> anyhow::Result<InstanceImage> {
    let parsed = InstanceInfo::parse(info)?;
    if parsed.kernel.is_some() || parsed.ramdisk.is_some() {
        bail!("instance_info/kernel, ramdisk: agent_ilo writes whole-disk images only; remove kernel and ramdisk");
    }
    any_instance_image(info)
}

/// [`instance_image`] for a flow that writes partition images too (`iscsi_ilo`): the same
/// checks, a `kernel` and `ramdisk` allowed.
pub fn any_instance_image(info: &JsonObject) -> anyhow::Result<InstanceImage> {
    let parsed = InstanceInfo::parse(info)?;
    let checksum = parsed.required_checksum()?.cloned();
    let source_text = info
        .get("image_source")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .trim()
        .to_owned();
    let source = parsed.image_source;
    refuse_glance("instance_info/image_source", &source)?;
    let Some(checksum) = checksum else {
        bail!("instance_info/image_checksum (or image_os_hash_algo and image_os_hash_value) is required");
    };
    let container_format = match info.get("image_container_format") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_owned(),
        None | Some(Value::Null) | Some(Value::String(_)) => "bare".to_owned(),
        Some(other) => {
            bail!("instance_info/image_container_format must be a string, found {other}")
        }
    };
    Ok(InstanceImage {
        source,
        source_text,
        digest: checksum,
        disk_format: parsed
            .disk_format
            .map_or(DiskFormat::Raw, |f| f)
            .as_str()
            .to_owned(),
        container_format,
    })
}

/// `image_info` of `standby.prepare_image` for a whole-disk image at `url` (docs/ironic-protocols.md §3.4:
/// modern IPA's fields; the agent verifies `os_hash_*` first, else `checksum`).
pub fn image_info(node: Uuid, image: &InstanceImage, url: &str) -> Value {
    let id = image
        .source_text
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or(&image.source_text);
    let mut info = json!({
        "id": id,
        "urls": [url],
        "disk_format": image.disk_format,
        "container_format": image.container_format,
        "stream_raw_images": true,
        "image_type": "whole-disk",
        "node_uuid": node.to_string(),
    });
    if let Value::Object(map) = &mut info {
        let ExpectedDigest { algo, hex: value } = &image.digest;
        map.insert("os_hash_algo".into(), json!(algo.name()));
        map.insert("os_hash_value".into(), json!(value));
        // Old agents read only `checksum`, and md5 is the one they verify.
        if *algo == HashAlgo::Md5 {
            map.insert("checksum".into(), json!(value));
        }
    }
    info
}

/// A kernel or ramdisk from the image cache, kept byte for byte.
pub(crate) async fn fetch_as_is(
    ctx: &super::DeployContext,
    images: &crate::image_cache::ImageCache,
    field: &str,
    reference: &str,
) -> anyhow::Result<crate::image_cache::CachedImage> {
    let parsed = parse(field, reference)?;
    let url = match &parsed {
        // A file on the conductor is read where it is.
        file @ ImageRef::File(_) => file.to_string(),
        other => {
            resolve(
                ctx.objects.as_ref(),
                &ctx.config.container,
                field,
                other,
                ctx.config.deploy_helper_images_ttl,
            )
            .await?
        }
    };
    images
        .get(&crate::image_cache::ImageSource::as_is(
            reference, url, None,
        ))
        .await
        .with_context(|| format!("fetching {field} {reference}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    use bytes::Bytes;

    use crate::objects::ObjectInfo;

    /// An in-memory object store for these unit tests only (the real ones are the objects
    /// helper's built-in store and Swift).
    #[derive(Default)]
    struct MemStore {
        objects: Mutex<HashMap<String, Bytes>>,
        puts: Mutex<u32>,
    }

    #[async_trait::async_trait]
    impl ObjectStore for MemStore {
        async fn put(
            &self,
            path: &ObjectPath,
            body: ObjectBody,
            _options: &PutOptions,
        ) -> Result<(), ObjectError> {
            let bytes = match body {
                ObjectBody::Bytes(b) => b,
                ObjectBody::File(p) => Bytes::from(std::fs::read(p)?),
            };
            *self.puts.lock().expect("lock") += 1;
            self.objects
                .lock()
                .expect("lock")
                .insert(path.to_string(), bytes);
            Ok(())
        }
        async fn delete(&self, path: &ObjectPath) -> Result<bool, ObjectError> {
            Ok(self
                .objects
                .lock()
                .expect("lock")
                .remove(&path.to_string())
                .is_some())
        }
        async fn head(&self, path: &ObjectPath) -> Result<ObjectInfo, ObjectError> {
            let map = self.objects.lock().expect("lock");
            let b = map
                .get(&path.to_string())
                .ok_or_else(|| ObjectError::NotFound(path.clone()))?;
            Ok(ObjectInfo {
                size: b.len() as u64,
                metadata: Default::default(),
                delete_at: None,
            })
        }
        async fn temp_url(&self, path: &ObjectPath, ttl: Duration) -> Result<String, ObjectError> {
            Ok(format!(
                "https://store.example/{path}?ttl={}",
                ttl.as_secs()
            ))
        }
        fn kind(&self) -> &'static str {
            "memory"
        }
    }

    #[test]
    fn references_parse_by_scheme_and_errors_name_the_field() {
        let f = "driver_info.ilo_deploy_iso";
        assert_eq!(
            parse(f, "https://img.example/deploy.iso").expect("http"),
            ImageRef::Http(url::Url::parse("https://img.example/deploy.iso").expect("url"))
        );
        assert_eq!(
            parse(f, "file:///var/lib/images/deploy%20x.iso").expect("file"),
            ImageRef::File("/var/lib/images/deploy x.iso".into())
        );
        assert_eq!(
            parse(f, "swift://isos/dir/deploy.iso").expect("swift"),
            ImageRef::Swift(ObjectPath::new("isos", "dir/deploy.iso"))
        );
        for bad in [
            "ftp://host/x.iso",
            "swift://container",
            "swift:///object",
            "",
            "deploy.iso",
            "https://",
            "3c5b0fd4-7d36-4b0c-8bd1-0dc0dfb0e4e4",
        ] {
            let err = parse(f, bad).expect_err(bad);
            assert!(format!("{err:#}").contains(f), "{bad}: {err:#}");
        }
        let err = parse(f, "ftp://host/x").expect_err("ftp");
        assert!(format!("{err:#}").contains("\"ftp\""), "{err:#}");
    }

    #[tokio::test]
    async fn file_images_are_uploaded_once_and_swift_needs_the_object() {
        let store = MemStore::default();
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("disk image.raw");
        std::fs::write(&file, b"0123456789").expect("write");
        let url = url::Url::from_file_path(&file).expect("path");
        let r = parse("instance_info/image_source", url.as_str()).expect("file ref");
        let ttl = Duration::from_secs(60);
        let first = resolve(&store, "c", "f", &r, ttl).await.expect("resolved");
        let second = resolve(&store, "c", "f", &r, ttl).await.expect("resolved");
        assert_eq!(first, second);
        assert_eq!(*store.puts.lock().expect("lock"), 1, "uploaded once");
        assert!(
            first.starts_with("https://store.example/c/file-"),
            "{first}"
        );
        assert!(first.contains("disk_image.raw"), "{first}");
        let stored: Vec<Bytes> = store
            .objects
            .lock()
            .expect("lock")
            .values()
            .cloned()
            .collect();
        assert_eq!(stored, [Bytes::from_static(b"0123456789")]);

        let missing = ImageRef::File(dir.path().join("nope"));
        let err = resolve(&store, "c", "instance_info/image_source", &missing, ttl)
            .await
            .expect_err("missing file");
        assert!(
            format!("{err:#}").contains("instance_info/image_source"),
            "{err:#}"
        );

        let swift = parse("f", "swift://images/a.raw").expect("swift");
        let err = check(&store, "driver_info.ilo_deploy_iso", &swift)
            .await
            .expect_err("absent object");
        assert!(
            format!("{err:#}").contains("driver_info.ilo_deploy_iso"),
            "{err:#}"
        );
        store
            .put(
                &ObjectPath::new("images", "a.raw"),
                ObjectBody::Bytes(Bytes::from_static(b"x")),
                &PutOptions::default(),
            )
            .await
            .expect("put");
        assert_eq!(
            resolve(&store, "c", "f", &swift, ttl)
                .await
                .expect("temp url"),
            "https://store.example/images/a.raw?ttl=60"
        );
        let http = parse("f", "http://img/x.raw").expect("http");
        assert_eq!(
            resolve(&store, "c", "f", &http, ttl).await.expect("as is"),
            "http://img/x.raw"
        );
    }

    fn obj(v: Value) -> JsonObject {
        match v {
            Value::Object(o) => o,
            _ => JsonObject::new(),
        }
    }

    /// The field names and values below are written out from docs/ironic-protocols.md §3.4 (modern IPA's
    /// `image_info`), not from our own types.
    #[test]
    fn image_info_has_the_fields_of_the_reference() {
        let node = Uuid::parse_str("1be26c0b-03f2-4d2e-ae87-c02d7f33c123").expect("uuid");
        let sha512 = "ab".repeat(64);
        let info = obj(json!({
            "image_source": "http://images.example/v1/whole-disk.qcow2",
            "image_os_hash_algo": "SHA512",
            "image_os_hash_value": sha512,
            "image_disk_format": "qcow2",
            "root_gb": 10
        }));
        let image = instance_image(&info).expect("complete");
        let v = image_info(node, &image, "http://images.example/v1/whole-disk.qcow2");
        assert_eq!(
            v,
            json!({
                "id": "whole-disk.qcow2",
                "urls": ["http://images.example/v1/whole-disk.qcow2"],
                "os_hash_algo": "sha512",
                "os_hash_value": sha512,
                "disk_format": "qcow2",
                "container_format": "bare",
                "stream_raw_images": true,
                "image_type": "whole-disk",
                "node_uuid": "1be26c0b-03f2-4d2e-ae87-c02d7f33c123"
            })
        );
        let md5 = "0123456789abcdef0123456789ABCDEF";
        let legacy = obj(json!({"image_source": "swift://glance/img-1", "image_checksum": md5}));
        let image = instance_image(&legacy).expect("complete");
        let v = image_info(node, &image, "https://store/x");
        // Kilo's `checksum` (md5, what old agents verify) and the modern pair.
        assert_eq!(v["checksum"], json!(md5.to_ascii_lowercase()));
        assert_eq!(v["os_hash_algo"], json!("md5"));
        assert_eq!(v["os_hash_value"], json!(md5.to_ascii_lowercase()));
        assert_eq!(v["id"], json!("img-1"));
        assert_eq!(v["disk_format"], json!("raw"));
    }

    #[test]
    fn incomplete_instance_info_is_named() {
        let cases = [
            (json!({}), "instance_info/image_source is required"),
            (
                json!({"image_source": "http://x/i"}),
                "instance_info/image_checksum (or image_os_hash_algo and image_os_hash_value) is required",
            ),
            (
                json!({"image_source": "http://x/i", "image_os_hash_algo": "sha256"}),
                "instance_info/image_os_hash_value is required",
            ),
            (
                json!({"image_source": "http://x/i", "image_os_hash_algo": "crc32",
                       "image_os_hash_value": "00"}),
                "unsupported algorithm \"crc32\"",
            ),
            (
                json!({"image_source": "http://x/i", "image_checksum": "xyz"}),
                "instance_info/image_checksum",
            ),
            (
                json!({"image_source": "gopher://x/i", "image_checksum": "0".repeat(32)}),
                "instance_info/image_source",
            ),
            (
                json!({"image_source": [7], "image_checksum": "0".repeat(32)}),
                "instance_info/image_source: must be a string",
            ),
            (
                json!({"image_source": "3c5b0fd4-7d36-4b0c-8bd1-0dc0dfb0e4e4"}),
                "Glance",
            ),
            (
                json!({"image_source": "http://x/i", "kernel": "http://x/k", "ramdisk": "http://x/r",
                       "root_gb": 10, "image_checksum": "0".repeat(32)}),
                "whole-disk images only",
            ),
        ];
        for (info, want) in cases {
            let err = instance_image(&obj(info.clone())).expect_err("incomplete");
            assert!(format!("{err:#}").contains(want), "{info}: {err:#}");
        }
    }
}
