//! [`job_from_info`]: [`PartitionJob`] from `instance_info`: fields, defaults, and errors that name the field.

use serde_json::{json, Value};

use super::*;
use vmdeploy_shared::partition::EFI_SYSTEM_PARTITION_MIB;

fn info(extra: Value) -> InstanceInfo {
    let mut map = json!({
        "image_source": "http://images.example/root.img",
        "kernel": "http://images.example/vmlinuz",
        "ramdisk": "http://images.example/initrd",
        "root_gb": 10,
    });
    if let (Some(m), Value::Object(e)) = (map.as_object_mut(), extra) {
        m.extend(e);
    }
    InstanceInfo::parse(map.as_object().expect("an object")).expect("valid instance_info")
}

fn job(extra: Value, mode: BootMode) -> anyhow::Result<PartitionJob> {
    job_from_info(&info(extra), mode, false)
}

#[test]
fn defaults() {
    let j = job(json!({}), BootMode::Bios).expect("job");
    assert_eq!(
        j,
        PartitionJob {
            boot_mode: BootMode::Bios,
            table: TableKind::Mbr,
            root_mib: 10 * 1024,
            swap_mib: 0,
            ephemeral_mib: 0,
            ephemeral_format: FsFormat::Ext4,
            preserve_ephemeral: false,
            configdrive: None,
            efi_system_partition: false,
        }
    );
    assert_eq!(
        job(json!({}), BootMode::Uefi).expect("job").table,
        TableKind::Gpt
    );
}

#[test]
fn every_field() {
    let j = job(
        json!({
            "swap_mb": 512,
            "ephemeral_gb": 2,
            "ephemeral_format": "XFS",
            "preserve_ephemeral": true,
            "configdrive": "H4sI",
            "capabilities": {"disk_label": "gpt"},
        }),
        BootMode::Bios,
    )
    .expect("job");
    assert_eq!(j.table, TableKind::Gpt);
    assert_eq!((j.swap_mib, j.ephemeral_mib), (512, 2048));
    assert_eq!(j.ephemeral_format, FsFormat::Xfs);
    assert!(j.preserve_ephemeral);
    assert_eq!(j.configdrive.as_deref(), Some("H4sI"));
    let mbr = job(
        json!({"capabilities": {"disk_label": "msdos"}}),
        BootMode::Uefi,
    );
    assert_eq!(mbr.expect("job").table, TableKind::Mbr);
}

#[test]
fn efi_partition_only_for_uefi_local_boot() {
    let i = info(json!({}));
    let plan = |mode, local| job_from_info(&i, mode, local).expect("job");
    assert!(plan(BootMode::Uefi, true).efi_system_partition);
    assert!(!plan(BootMode::Uefi, false).efi_system_partition);
    assert!(!plan(BootMode::Bios, true).efi_system_partition);
    let req = plan(BootMode::Uefi, true).request(8 << 30, SectorSize::B512, 1 << 20, 0);
    assert_eq!(req.efi_mib, EFI_SYSTEM_PARTITION_MIB);
    assert!(!req.grow_root_to_image);
}

#[test]
fn errors_name_the_field() {
    let cases = [
        (
            json!({"ephemeral_gb": 1, "ephemeral_format": "ntfs"}),
            "ephemeral_format",
        ),
        (json!({"preserve_ephemeral": true}), "preserve_ephemeral"),
        (json!({"configdrive": {"meta_data": {}}}), "configdrive"),
    ];
    for (extra, field) in cases {
        let err = job(extra.clone(), BootMode::Bios).expect_err(field);
        assert!(err.to_string().contains(field), "{extra}: {err:#}");
    }
    // root_gb missing or 0: the parser already refuses it; from_info says so too.
    let mut i = info(json!({}));
    for root in [None, Some(0)] {
        i.root_gb = root;
        let err = job_from_info(&i, BootMode::Bios, false).expect_err("root_gb");
        assert!(err.to_string().contains("instance_info.root_gb"), "{err:#}");
    }
}

#[test]
fn an_image_larger_than_root_is_refused_by_the_plan() {
    let j = job(json!({"root_gb": 1}), BootMode::Bios).expect("job");
    let err = partition::plan(&j.request(8 << 30, SectorSize::B512, (1 << 30) + 1, 0))
        .expect_err("too large");
    assert!(
        matches!(err, partition::PartitionError::ImageLargerThanRoot { .. }),
        "{err}"
    );
}
