//! The [`PartitionJob`] of a `standby.prepare_image` (or `deploy.write_image`) whose
//! `image_info.image_type` is `partition`: the fields Ironic's `AgentDeploy.write_image` sends
//! (`root_mb`, `swap_mb`, `ephemeral_mb`, `ephemeral_format`, `preserve_ephemeral`,
//! `deploy_boot_mode`, `boot_option`, `disk_label`, `configdrive`), parsed into the job the
//! conductor's `iscsi_ilo` flow builds from `instance_info`.

use serde_json::Value;
use vmdeploy_shared::params::BootMode;
use vmdeploy_shared::partition::{FsFormat, JobSpec, PartitionJob, TableKind};

/// Whether `image_info` describes a partition image (IPA: `image_type == "partition"`).
pub fn is_partition_image(info: &Value) -> bool {
    info.get("image_type").and_then(Value::as_str) == Some("partition")
}

/// A whole number in `image_info.<field>`: Ironic sends integers, older callers strings; null
/// and absence are `None`.
fn whole(info: &Value, field: &str) -> Result<Option<u64>, String> {
    match info.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("image_info.{field} is {n}: expected a whole number of MiB")),
        Some(Value::String(s)) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| format!("image_info.{field} is {s:?}: expected a whole number of MiB")),
        Some(other) => Err(format!(
            "image_info.{field} is {other}: expected a whole number of MiB"
        )),
    }
}

/// A string in `image_info.<field>`, null and absence being `None`.
fn text<'a>(info: &'a Value, field: &str) -> Result<Option<&'a str>, String> {
    match info.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(format!("image_info.{field} is {other}: expected a string")),
    }
}

/// Whether the instance boots from its disk: Ironic 39 sends `boot_option: local` (netboot of
/// partition images is gone); anything else boots from the network or a ramdisk, which needs no
/// boot partition.
pub fn local_boot(info: &Value) -> Result<bool, String> {
    Ok(text(info, "boot_option")?.is_none_or(|o| o.eq_ignore_ascii_case("local")))
}

/// Why a partition image with local boot in BIOS mode is refused before anything is written.
pub const BIOS_LOCAL_BOOT_UNSUPPORTED: &str = "image_info: a partition image with local boot in \
     BIOS mode (deploy_boot_mode bios): this agent installs boot loaders for UEFI only, so the \
     disk would not boot; nothing was written. Set the node's boot_mode to uefi, or deploy a \
     whole-disk image";

/// The job of `info`; `configdrive` is the command's own `configdrive` parameter, which wins
/// over `image_info.configdrive` (Ironic sends both, the same). Errors name the field.
///
/// An ephemeral partition is refused: it needs an `mkfs` the deploy ramdisk does not carry.
pub fn job_from_image_info(
    info: &Value,
    configdrive: Option<&Value>,
) -> Result<PartitionJob, String> {
    let root_mib = match whole(info, "root_mb")? {
        None | Some(0) => {
            return Err(
                "image_info.root_mb is missing or 0: a partition image needs the root \
                 partition's size in MiB"
                    .into(),
            )
        }
        Some(mb) => mb,
    };
    let swap_mib = whole(info, "swap_mb")?.unwrap_or(0);
    let ephemeral_mib = whole(info, "ephemeral_mb")?.unwrap_or(0);
    if ephemeral_mib > 0 {
        return Err(format!(
            "image_info.ephemeral_mb is {ephemeral_mib}: this agent cannot make the ephemeral \
             file system (the deploy ramdisk has no mkfs); deploy with ephemeral_gb 0, or with \
             the iscsi_ilo deploy interface, whose conductor makes it"
        ));
    }
    let ephemeral_format = match text(info, "ephemeral_format")? {
        None => FsFormat::Ext4,
        Some(name) => FsFormat::parse(name).ok_or_else(|| {
            format!(
                "image_info.ephemeral_format is {name:?}: expected one of {}",
                FsFormat::names()
            )
        })?,
    };
    let preserve_ephemeral = match info.get("preserve_ephemeral") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => true,
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => false,
        Some(other) => {
            return Err(format!(
                "image_info.preserve_ephemeral is {other}: expected true or false"
            ))
        }
    };
    let boot_mode = match text(info, "deploy_boot_mode")? {
        // IPA's default when the node says nothing.
        None => BootMode::Bios,
        Some(mode) => BootMode::parse(mode).map_err(|_| {
            format!("image_info.deploy_boot_mode is {mode:?}: expected bios or uefi")
        })?,
    };
    let local_boot = local_boot(info)?;
    let disk_label = match text(info, "disk_label")? {
        None => None,
        Some(l) => Some(
            TableKind::from_disk_label(l)
                .ok_or_else(|| format!("image_info.disk_label is {l:?}: expected msdos or gpt"))?,
        ),
    };
    let configdrive = match configdrive
        .filter(|v| !v.is_null())
        .or(info.get("configdrive"))
    {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.trim().is_empty() => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            return Err(
                "configdrive is a JSON object: this agent writes a ready config drive image \
                 (base64 of gzip, or a URL), it does not build one"
                    .into(),
            )
        }
    };
    PartitionJob::new(JobSpec {
        boot_mode,
        local_boot,
        root_mib,
        swap_mib,
        ephemeral_mib,
        ephemeral_format,
        preserve_ephemeral,
        disk_label,
        configdrive,
    })
    .map_err(|e| format!("image_info.{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `image_info` as Ironic 39's `AgentDeploy.write_image` builds it for a partition image
    /// (field names from ironic/drivers/modules/agent.py `PARTITION_IMAGE_LABELS`).
    fn ironic_image_info(extra: Value) -> Value {
        let mut v = json!({
            "id": "root.img",
            "urls": ["http://images.example/root.img"],
            "disk_format": "raw",
            "container_format": "bare",
            "stream_raw_images": true,
            "os_hash_algo": "sha256",
            "os_hash_value": "0".repeat(64),
            "node_uuid": "1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
            "kernel": null,
            "ramdisk": null,
            "root_gb": "1",
            "root_mb": 1024,
            "swap_mb": 0,
            "ephemeral_mb": 0,
            "ephemeral_format": null,
            "configdrive": null,
            "preserve_ephemeral": false,
            "image_type": "partition",
            "deploy_boot_mode": "uefi",
            "boot_option": "local",
        });
        if let (Some(m), Value::Object(e)) = (v.as_object_mut(), extra) {
            m.extend(e);
        }
        v
    }

    #[test]
    fn ironic_39s_image_info() {
        let info = ironic_image_info(json!({}));
        assert!(is_partition_image(&info));
        let job = job_from_image_info(&info, None).expect("job");
        assert_eq!(job.table, TableKind::Gpt);
        assert!(job.efi_system_partition);
        assert_eq!(
            (job.root_mib, job.swap_mib, job.ephemeral_mib),
            (1024, 0, 0)
        );
        assert_eq!(job.configdrive, None);
        assert!(!is_partition_image(
            &json!({"image_type": "whole-disk-image"})
        ));
    }

    #[test]
    fn every_field() {
        let info = ironic_image_info(json!({
            "root_mb": "2048", "swap_mb": 64, "deploy_boot_mode": "bios",
            "disk_label": "gpt", "configdrive": "H4sI-in-image-info",
        }));
        let job = job_from_image_info(&info, Some(&json!("H4sI-param"))).expect("job");
        assert_eq!((job.root_mib, job.swap_mib), (2048, 64));
        assert_eq!(job.table, TableKind::Gpt);
        assert!(!job.efi_system_partition, "BIOS has no ESP");
        assert_eq!(job.configdrive.as_deref(), Some("H4sI-param"));
        let job = job_from_image_info(&info, Some(&Value::Null)).expect("job");
        assert_eq!(job.configdrive.as_deref(), Some("H4sI-in-image-info"));
        let net = ironic_image_info(json!({"boot_option": "netboot"}));
        assert!(
            !job_from_image_info(&net, None)
                .expect("job")
                .efi_system_partition
        );
    }

    #[test]
    fn errors_name_the_field() {
        for (extra, field) in [
            (json!({"root_mb": 0}), "image_info.root_mb"),
            (json!({"root_mb": null}), "image_info.root_mb"),
            (json!({"swap_mb": "lots"}), "image_info.swap_mb"),
            (json!({"ephemeral_mb": 1024}), "image_info.ephemeral_mb"),
            (
                json!({"ephemeral_format": "ntfs"}),
                "image_info.ephemeral_format",
            ),
            (
                json!({"preserve_ephemeral": true}),
                "image_info.preserve_ephemeral",
            ),
            (
                json!({"deploy_boot_mode": "efi"}),
                "image_info.deploy_boot_mode",
            ),
            (json!({"disk_label": "dos"}), "image_info.disk_label"),
            (json!({"configdrive": {"meta_data": {}}}), "configdrive"),
        ] {
            let err =
                job_from_image_info(&ironic_image_info(extra.clone()), None).expect_err(field);
            assert!(err.contains(field), "{extra}: {err}");
        }
    }
}
