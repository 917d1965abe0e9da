//! `image.install_bootloader` on a file-backed disk the partition writer laid out.

use std::io::Read;
use std::sync::{Arc, Mutex};

use serde_json::json;

use super::*;
use crate::disk::Disk;
use crate::firmware::SecureBoot;
use crate::install::job::job_from_image_info;
use crate::install::window::ByteWindow;
use crate::install::write::write_from_memory;
use crate::install::PartitionRecord;

const MIB: u64 = 1 << 20;
const ROOT_UUID: &str = "7e57da7a-0000-4000-8000-000000000001";
const FAKE_GRUB: &[u8] = b"MZ\x90\x00 a stand-in GRUB EFI binary";

struct Fixture {
    _dir: tempfile::TempDir,
    image: Image,
    record: PartitionRecord,
}

/// A 400 MiB disk file with a UEFI partition layout (ESP + root), and the `image` extension
/// over it; `remember` says whether the extension knows the write (else it scans the table).
/// The root is an ext superblock with [`ROOT_UUID`] and nothing else.
fn fixture(remember: bool) -> Fixture {
    let mut root = vec![0u8; 2 * MIB as usize];
    root[1024 + 56..1024 + 58].copy_from_slice(&0xEF53u16.to_le_bytes());
    root[1024 + 104..1024 + 120].copy_from_slice(&[
        0x7e, 0x57, 0xda, 0x7a, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 1,
    ]);
    fixture_with_root(remember, root)
}

/// An ext4 file system with [`ROOT_UUID`] holding `files` (path, bytes), made by mke2fs.
fn ext4_root(files: &[(&str, &[u8])]) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = dir.path().join("tree");
    for (rel, bytes) in files {
        let path = tree.join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, bytes).expect("write");
    }
    std::fs::create_dir_all(&tree).expect("tree");
    vmdeploy_shared::ext4::test_support::mke2fs(
        &tree,
        &dir.path().join("root.ext4"),
        &["-t", "ext4"],
        ROOT_UUID,
        4 * MIB,
    )
}

fn fixture_with_root(remember: bool, root: Vec<u8>) -> Fixture {
    let dir = tempfile::Builder::new()
        .prefix("vmdeploy-image-ext-test")
        .tempdir_in("/var/tmp")
        .expect("scratch dir");
    let path = dir.path().join("disk.img");
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(400 * MIB))
        .expect("disk file");
    let grub = dir.path().join("grub-x86_64.efi");
    std::fs::write(&grub, FAKE_GRUB).expect("grub");
    let job = job_from_image_info(
        &json!({"image_type": "partition", "root_mb": 32, "deploy_boot_mode": "uefi",
                "boot_option": "local"}),
        None,
    )
    .expect("job");
    let disk = Arc::new(Disk::open(&path).expect("open"));
    let (record, _) = write_from_memory(root, &disk, &job).expect("written");
    assert_eq!(record.root_uuid, ROOT_UUID);
    let image = Image {
        disk: Arc::new(Ok(path)),
        installed: Arc::new(Mutex::new(remember.then(|| record.clone()))),
        grub_efi: grub,
        secure_boot: || SecureBoot::Disabled,
    };
    Fixture {
        _dir: dir,
        image,
        record,
    }
}

/// The files of `\EFI\BOOT` in the fixture's ESP.
fn esp_file(f: &Fixture, name: &str) -> Vec<u8> {
    esp_path(f, &format!("EFI/BOOT/{name}")).expect(name)
}

/// The file at `path` in the fixture's ESP, if it is there.
fn esp_path(f: &Fixture, path: &str) -> Option<Vec<u8>> {
    let efi = f.record.layout.partition(Role::Efi).expect("esp");
    let dev = std::fs::File::open(&f.record.disk).expect("open");
    let mut window = ByteWindow::new(
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&f.record.disk)
            .expect("open"),
        efi.offset,
        efi.len,
    );
    drop(dev);
    let fs = fatfs::FileSystem::new(&mut window, fatfs::FsOptions::new()).expect("FAT");
    let mut out = Vec::new();
    let mut file = fs.root_dir().open_file(path).ok()?;
    file.read_to_end(&mut out).expect(path);
    Some(out)
}

/// Ironic's parameters (agent_client.py `install_bootloader`).
fn ironic_params(esp: Option<&str>, mode: &str) -> Value {
    json!({
        "root_uuid": ROOT_UUID,
        "efi_system_part_uuid": esp,
        "prep_boot_part_uuid": null,
        "target_boot_mode": mode,
    })
}

async fn run(image: &Image, params: Value) -> Result<Value, CommandError> {
    match image.start("install_bootloader", &params) {
        Ok(fut) => fut.await,
        Err(e) => panic!("refused to start: {e}"),
    }
}

#[tokio::test]
async fn uefi_installs_grub_and_its_environment_in_the_esp() {
    for remember in [true, false] {
        let f = fixture(remember);
        let esp_uuid = f.record.esp_uuid.clone().expect("an ESP");
        let out = run(&f.image, ironic_params(Some(&esp_uuid), "uefi"))
            .await
            .expect("installed");
        assert!(
            out["result"]
                .as_str()
                .is_some_and(|r| r.contains(&esp_uuid)),
            "{out}"
        );
        assert_eq!(esp_file(&f, "BOOTX64.EFI"), FAKE_GRUB);
        let env = String::from_utf8(esp_file(&f, "grubenv")).expect("text");
        assert!(
            env.contains(&format!("\nvmdeploy_root_uuid={ROOT_UUID}\n")),
            "{env}"
        );
        let cfg = String::from_utf8(esp_file(&f, "grub.cfg")).expect("text");
        assert!(cfg.contains(&format!("--set=root {ROOT_UUID}\n")), "{cfg}");
        assert!(
            cfg.contains(&format!("root=UUID={ROOT_UUID} console=ttyS0,115200")),
            "{cfg}"
        );
    }
}

#[tokio::test]
async fn an_unknown_esp_or_a_missing_grub_is_a_failed_command() {
    let f = fixture(false);
    let err = run(&f.image, ironic_params(Some("0000-0000"), "uefi"))
        .await
        .expect_err("no such ESP");
    assert!(err
        .message
        .contains("no EFI system partition with the FAT volume id 0000-0000"));

    let esp_uuid = f.record.esp_uuid.clone().expect("an ESP");
    let image = Image {
        grub_efi: "/nonexistent/grub-x86_64.efi".into(),
        disk: Arc::clone(&f.image.disk),
        installed: Arc::clone(&f.image.installed),
        secure_boot: || SecureBoot::Disabled,
    };
    let err = run(&image, ironic_params(Some(&esp_uuid), "uefi"))
        .await
        .expect_err("no GRUB");
    assert!(
        err.message.contains("/nonexistent/grub-x86_64.efi"),
        "{}",
        err.message
    );
}

/// Under Secure Boot: the image's shim and signed GRUB (found at their Debian paths, with the
/// root partition from the record or found by its UUID) go in, with the configuration where
/// that GRUB reads it; an image without them, or with an unsigned shim, fails the command and
/// says why.
#[tokio::test]
async fn under_secure_boot_the_images_own_signed_chain_is_installed() {
    use vmdeploy_shared::pe::test_support::{pe, with_section};
    let shim = pe((0x400, 0x100), 0x500);
    // A "signed GRUB" with a prefix object in its mods section, and a signature.
    let mut mods = b"mimg\0\0\0\0".to_vec();
    mods.extend_from_slice(&24u64.to_le_bytes());
    mods.extend_from_slice(&48u64.to_le_bytes());
    mods.extend_from_slice(&3u32.to_le_bytes());
    mods.extend_from_slice(&24u32.to_le_bytes());
    mods.extend_from_slice(b"/EFI/debian\0\0\0\0\0");
    let mut grub = with_section("mods", &mods);
    let table = grub.len();
    grub.extend_from_slice(&[0x30; 0x40]);
    let dirs = 0x80 + 24 + 112;
    grub[dirs + 32..dirs + 36].copy_from_slice(&(table as u32).to_le_bytes());
    grub[dirs + 36..dirs + 40].copy_from_slice(&0x40u32.to_le_bytes());
    let debian = [
        ("usr/lib/shim/shimx64.efi.signed", shim.as_slice()),
        (
            "usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed",
            grub.as_slice(),
        ),
    ];
    for remember in [true, false] {
        let mut f = fixture_with_root(remember, ext4_root(&debian));
        f.image.secure_boot = || SecureBoot::Enabled;
        let esp_uuid = f.record.esp_uuid.clone().expect("an ESP");
        let out = run(&f.image, ironic_params(Some(&esp_uuid), "uefi"))
            .await
            .unwrap_or_else(|e| panic!("{}", e.message));
        assert!(
            out["result"]
                .as_str()
                .is_some_and(|r| r.contains("signed shim (/usr/lib/shim/shimx64.efi.signed)")),
            "{out}"
        );
        assert_eq!(esp_file(&f, "BOOTX64.EFI"), shim);
        assert_eq!(esp_file(&f, "grubx64.efi"), grub);
        let cfg = esp_path(&f, "EFI/debian/grub.cfg").expect("the config at GRUB's prefix");
        assert_eq!(cfg, esp_file(&f, "grub.cfg"));
        assert!(String::from_utf8_lossy(&cfg).contains(&format!("root=UUID={ROOT_UUID} ")));
    }

    let f = {
        let mut f = fixture_with_root(true, ext4_root(&[("etc/hostname", b"x\n")]));
        f.image.secure_boot = || SecureBoot::Enabled;
        f
    };
    let esp_uuid = f.record.esp_uuid.clone().expect("an ESP");
    let err = run(&f.image, ironic_params(Some(&esp_uuid), "uefi"))
        .await
        .expect_err("no chain");
    assert!(
        err.message.contains("carries no signed boot chain")
            && err.message.contains("/usr/lib/shim/shimx64.efi.signed")
            && err
                .message
                .contains("shim-signed and grub-efi-amd64-signed"),
        "{}",
        err.message
    );
    assert_eq!(
        esp_path(&f, "EFI/BOOT/BOOTX64.EFI"),
        None,
        "nothing was installed"
    );

    let unsigned = pe((0, 0), 0x500);
    let mut f = fixture_with_root(
        true,
        ext4_root(&[
            ("usr/lib/shim/shimx64.efi.signed", unsigned.as_slice()),
            (
                "usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed",
                grub.as_slice(),
            ),
        ]),
    );
    f.image.secure_boot = || SecureBoot::Enabled;
    let err = run(&f.image, ironic_params(Some(&esp_uuid_of(&f)), "uefi"))
        .await
        .expect_err("unsigned shim");
    assert!(
        err.message.contains("carries no signature"),
        "{}",
        err.message
    );
}

fn esp_uuid_of(f: &Fixture) -> String {
    f.record.esp_uuid.clone().expect("an ESP")
}

#[tokio::test]
async fn bios_is_refused_and_whole_disk_uefi_is_left_alone() {
    let f = fixture(true);
    let esp_uuid = f.record.esp_uuid.clone().expect("an ESP");
    let err = run(&f.image, ironic_params(Some(&esp_uuid), "bios"))
        .await
        .expect_err("bios");
    assert_eq!(err.message, BIOS_UNSUPPORTED);
    assert!(err.message.contains("UEFI only"));
    // The older format Ironic falls back to has no target_boot_mode: IPA's default, bios.
    let err = run(
        &f.image,
        json!({"root_uuid": ROOT_UUID, "efi_system_part_uuid": esp_uuid}),
    )
    .await
    .expect_err("no mode");
    assert_eq!(err.message, BIOS_UNSUPPORTED);

    let out = run(
        &f.image,
        json!({"root_uuid": "0x12345678", "efi_system_part_uuid": null,
                                    "prep_boot_part_uuid": null, "target_boot_mode": "uefi"}),
    )
    .await
    .expect("whole disk");
    assert!(
        out["result"]
            .as_str()
            .is_some_and(|r| r.contains("whole-disk")),
        "{out}"
    );

    for bad in [
        json!({"root_uuid": ROOT_UUID, "prep_boot_part_uuid": "x", "target_boot_mode": "uefi"}),
        json!({"root_uuid": ROOT_UUID, "target_boot_mode": "efi"}),
    ] {
        assert!(
            matches!(
                f.image.start("install_bootloader", &bad),
                Err(StartError::InvalidParams(_))
            ),
            "{bad}"
        );
    }
    assert!(matches!(
        f.image.start("install_grub", &json!({})),
        Err(StartError::UnknownCommand(_))
    ));
}
