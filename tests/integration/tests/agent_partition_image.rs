//! Partition images written by the agent, laid out by the same `vmdeploy_shared::partition` job
//! the conductor's `iscsi_ilo` flow uses.
//!
//! - Without QEMU: the conductor (from `instance_info`) and the agent (from Ironic 39's
//!   `image_info`) build the same job and plan the same layout from equivalent inputs.
//! - With QEMU (TCG, OVMF with Secure Boot on and Microsoft's keys enrolled, under the
//!   `test-image-qemu` lock): the agent writes the test OS's `root.img` to a disk file with UEFI
//!   local boot (`standby.prepare_image`'s writer), then `image.install_bootloader`, told that
//!   the firmware runs Secure Boot, puts the image's own signed chain (Debian's shim and signed
//!   GRUB, read from the written ext4 root) into the ESP; the disk boots to the test OS's
//!   marker with the partition image's root UUID, its kernel locked down as Debian's is only
//!   under Secure Boot. Our unsigned local-boot GRUB (Secure Boot off) boots in
//!   `e2e_ironic`'s partition deploy; `install_bootloader`'s unit tests check both choices.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use vmdeploy_agent::api::image::Image;
use vmdeploy_agent::disk::Disk;
use vmdeploy_agent::firmware::SecureBoot;
use vmdeploy_agent::install::job::job_from_image_info;
use vmdeploy_agent::install::write::write_partition_image;
use vmdeploy_agent::stream::progress::Progress;
use vmdeploy_conductor::deploy::iscsi::write::partition::job_from_info;
use vmdeploy_conductor::node::instance_info::InstanceInfo;
use vmdeploy_integration_tests::lock::ResourceLock;
use vmdeploy_integration_tests::qemu::{self, Qemu};
use vmdeploy_integration_tests::test_image;
use vmdeploy_shared::params::BootMode;
use vmdeploy_shared::partition::{local_boot, plan, SectorSize};

const MIB: u64 = 1 << 20;
const BOOT_LIMIT: Duration = Duration::from_secs(240);

#[test]
fn the_conductor_and_the_agent_build_the_same_job_and_layout() {
    let cases = [
        (
            BootMode::Uefi,
            json!({}),
            json!({"deploy_boot_mode": "uefi"}),
        ),
        (
            BootMode::Bios,
            json!({"swap_mb": 512, "capabilities": {"disk_label": "gpt"}}),
            json!({"deploy_boot_mode": "bios", "swap_mb": 512, "disk_label": "gpt"}),
        ),
        (
            BootMode::Uefi,
            json!({"swap_mb": 64, "configdrive": "H4sIAAAA"}),
            json!({"deploy_boot_mode": "uefi", "swap_mb": 64, "configdrive": "H4sIAAAA"}),
        ),
    ];
    for (mode, instance_extra, image_extra) in cases {
        let mut info = json!({
            "image_source": "http://images.example/root.img",
            "kernel": "http://images.example/vmlinuz",
            "ramdisk": "http://images.example/initrd",
            "root_gb": 2,
        });
        let mut image_info = json!({
            "id": "root.img", "urls": ["http://images.example/root.img"],
            "image_type": "partition", "root_mb": 2048, "swap_mb": 0, "ephemeral_mb": 0,
            "ephemeral_format": null, "preserve_ephemeral": false, "boot_option": "local",
            "configdrive": null,
        });
        for (v, e) in [(&mut info, instance_extra), (&mut image_info, image_extra)] {
            if let (Some(m), serde_json::Value::Object(e)) = (v.as_object_mut(), e) {
                m.extend(e);
            }
        }
        let info = InstanceInfo::parse(info.as_object().expect("object")).expect("instance_info");
        let conductor = job_from_info(&info, mode, true).expect("the conductor's job");
        let agent = job_from_image_info(&image_info, None).expect("the agent's job");
        assert_eq!(conductor, agent, "{image_info}");
        let layout = |j: &vmdeploy_shared::partition::PartitionJob| {
            plan(&j.request(8 << 30, SectorSize::B512, 0, 4096)).expect("plan")
        };
        assert_eq!(layout(&conductor), layout(&agent));
    }
}

/// `grub-mkimage` with the shared local-boot recipe (image-build's `build_local_boot_grub`).
fn local_boot_grub(dir: &Path) -> PathBuf {
    let cfg = dir.join("early.cfg");
    std::fs::write(&cfg, local_boot::GRUB_EMBEDDED_CONFIG).expect("config");
    let out = dir.join("grub-x86_64.efi");
    let status = Command::new("grub-mkimage")
        .args(["-O", "x86_64-efi", "-p", local_boot::GRUB_EFI_PREFIX])
        .args(["-d", "/usr/lib/grub/x86_64-efi", "-c"])
        .arg(&cfg)
        .arg("-o")
        .arg(&out)
        .args(local_boot::GRUB_EFI_MODULES)
        .status()
        .expect("grub-mkimage (apt-get install grub-common grub-efi-amd64-bin)");
    assert!(status.success(), "grub-mkimage failed: {status}");
    out
}

#[test]
fn an_agent_written_partition_image_boots_locally_under_ovmf() {
    let img = test_image::ensure();
    let dir = tempfile::Builder::new()
        .prefix("vmdeploy-agent-partition")
        .tempdir_in("/var/tmp")
        .expect("scratch dir");
    // OVMF is checked (and its variables copied) before the long part.
    let ovmf = qemu::ovmf_secure_boot_q35_args(dir.path());
    let disk_path = dir.path().join("disk.img");
    std::fs::File::create(&disk_path)
        .and_then(|f| f.set_len(512 * MIB))
        .expect("disk file");

    // standby.prepare_image's writer, with the fields Ironic 39 sends for UEFI local boot.
    let job = job_from_image_info(
        &json!({"image_type": "partition", "root_mb": 64, "swap_mb": 8, "ephemeral_mb": 0,
                "preserve_ephemeral": false, "deploy_boot_mode": "uefi", "boot_option": "local"}),
        None,
    )
    .expect("job");
    let disk = Arc::new(Disk::open(&disk_path).expect("open the disk"));
    let root_img = std::fs::read(&img.part_image).expect("root.img");
    let (record, _) = write_partition_image(
        Cursor::new(root_img),
        &disk,
        &job,
        None,
        None,
        &Progress::default(),
    )
    .expect("the partition image written");
    drop(disk);
    assert_eq!(record.root_uuid, img.part_root_uuid);
    let uuids = record.to_ipa();
    let esp_uuid = uuids["efi system partition uuid"]
        .as_str()
        .expect("an ESP")
        .to_owned();

    // image.install_bootloader with Ironic's parameters, under Secure Boot. Our GRUB is there
    // too, and must not be what goes in.
    let image = Image {
        disk: Arc::new(Ok(disk_path.clone())),
        installed: Arc::new(Mutex::new(Some(record))),
        grub_efi: local_boot_grub(dir.path()),
        secure_boot: || SecureBoot::Enabled,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let params = json!({
        "root_uuid": uuids["root uuid"], "efi_system_part_uuid": esp_uuid,
        "prep_boot_part_uuid": null, "target_boot_mode": "uefi",
    });
    let fut = image
        .start("install_bootloader", &params)
        .unwrap_or_else(|e| panic!("install_bootloader refused: {e}"));
    let out = runtime
        .block_on(fut)
        .unwrap_or_else(|e| panic!("install_bootloader failed: {}", e.message));
    assert!(
        out["result"].as_str().is_some_and(|r| r.contains(
            "the image's signed shim (/usr/lib/shim/shimx64.efi.signed) and GRUB installed at \\EFI\\BOOT\\BOOTX64.EFI"
        )),
        "{out}"
    );
    // Debian's signed GRUB reads its configuration from its built-in prefix, which the agent
    // read from the binary: check it against the real file.
    let signed = vmdeploy_integration_tests::deploy_iso::signed_loaders();
    let grub = std::fs::read(signed.join("usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed"))
        .expect("Debian's signed GRUB (bash scripts/setup)");
    assert_eq!(
        local_boot::grub_prefix(&grub).as_deref(),
        Some("/EFI/debian")
    );

    let _one = ResourceLock::acquire("test-image-qemu");
    let mut args = ovmf;
    args.extend([
        "-nic".into(),
        "none".into(),
        "-drive".into(),
        format!("if=virtio,file={},format=raw", disk_path.display()),
    ]);
    let log = dir.path().join("ovmf-partition.serial.log");
    let mut qemu = Qemu::start(&args, &log);
    // The verdict line: booted or failed (the test OS prints its lockdown mode first).
    let line = qemu.wait_for(BOOT_LIMIT, |l| {
        l.contains("VMDEPLOY-TEST-OS booted root=") || l.contains("VMDEPLOY-TEST-OS failed: ")
    });
    let Some(line) = line else {
        panic!(
            "no VMDEPLOY-TEST-OS line within {BOOT_LIMIT:?}; serial log:\n{}",
            qemu.console_text()
        );
    };
    assert_eq!(
        line.text.trim_end(),
        img.marker(&img.part_root_uuid),
        "serial log:\n{}",
        qemu.console_text()
    );
    let console = qemu.console_text();
    assert!(
        console.contains("VMDEPLOY-TEST-OS lockdown: none [integrity]"),
        "the test OS's kernel is not locked down: it did not boot under Secure Boot; serial \
         log:\n{console}"
    );
    qemu.kill();
}
