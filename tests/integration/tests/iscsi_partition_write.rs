//! Partition images written over the conductor's initiator into our agent's iSCSI target
//! serving a `losetup --direct-io=on` disk filled with random bytes first (so anything left
//! unwritten shows). The MBR/BIOS and GPT/UEFI layouts are deployed through the API, the whole
//! `iscsi_ilo` flow (the emulated iLO, the built-in store, the agent process as the ramdisk,
//! netboot from a built boot ISO) up to `active`; the refusals and `preserve_ephemeral` call
//! `write::write_image` directly. The disk is then read with the system's tools
//! ([`disk_check`]): the table (`sfdisk --json`, `sgdisk -p`), every partition's file system
//! (`blkid -p`), the ephemeral file system's consistency (`e2fsck -fn` / `xfs_repair -n`), the
//! root image and the config drive byte for byte. Expected sizes come from the request, not from
//! earlier output.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use serde_json::json;
use vmdeploy_conductor::deploy::iscsi::write::{write_image, DiskJob, PartitionJob, Written};
use vmdeploy_conductor::image_cache::{CachedImage, ImageCache, ImageSource, DEFAULT_LIMIT};
use vmdeploy_conductor::initiator::{Session, SessionConfig};
use vmdeploy_conductor::node::instance_info::InstanceInfo;
use vmdeploy_conductor::states::ProvisionState;
use vmdeploy_conductor::store::Store as _;
use vmdeploy_integration_tests::agent_target::AgentTarget;
use vmdeploy_integration_tests::conductor_env::{
    enroll_iscsi, inserted_floppy, stand_in_kernel_and_ramdisk, AgentProcess, IscsiEnv,
    IscsiOptions,
};
use vmdeploy_integration_tests::disk_check::{self, PartitionInfo, PartitionTable};
use vmdeploy_integration_tests::loopdev::{LoopDevice, LoopIo};
use vmdeploy_integration_tests::tools::tool_ok;
use vmdeploy_shared::params::BootMode;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const IQN: &str = "iqn.2024-01.org.vmdeploy:partition-write";
/// The instance: 1 GiB root, 1 GiB ephemeral, 64 MiB swap (Ironic's units: GiB, GiB, MiB).
const ROOT_GB: u64 = 1;
const EPHEMERAL_GB: u64 = 1;
const SWAP_MB: u64 = 64;
/// The disk: room for the partitions, the first MiB and a GPT backup, and some to spare.
const DISK_LEN: u64 = 2 * GIB + 128 * MIB;
const ROOT_IMAGE_LEN: u64 = 64 * MIB;
const ROOT_UUID: &str = "2f0d7a4e-93c1-4b5e-8a61-7c0ffee0d1e5";
/// How long a deploy may take to reach a waiting or final state.
const STEP: Duration = Duration::from_secs(180);

/// A loop device of [`DISK_LEN`] (a whole number of 4 MiB) full of random bytes.
fn garbage_disk() -> LoopDevice {
    let disk = LoopDevice::attach(&[], DISK_LEN, LoopIo::Direct);
    tool_ok(
        "dd",
        "coreutils",
        &[
            "if=/dev/urandom",
            &format!("of={}", disk.device().display()),
            "bs=4M",
            &format!("count={}", DISK_LEN / (4 * MIB)),
            "oflag=direct",
            "status=none",
        ],
    );
    disk
}

/// A 64 MiB ext4 root file system image with UUID [`ROOT_UUID`] and a few files.
fn root_image(dir: &Path) -> PathBuf {
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("etc")).expect("image tree");
    std::fs::write(tree.join("etc/hostname"), "instance\n").expect("image file");
    std::fs::write(
        tree.join("data.bin"),
        vmdeploy_integration_tests::tools::xorshift_bytes(3 << 20, 7),
    )
    .expect("image file");
    let image = dir.join("root.img");
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(ROOT_IMAGE_LEN))
        .expect("image file");
    tool_ok(
        "mkfs.ext4",
        "e2fsprogs",
        &[
            "-q",
            "-F",
            "-U",
            ROOT_UUID,
            "-L",
            "root",
            "-d",
            &tree.to_string_lossy(),
            &image.to_string_lossy(),
        ],
    );
    image
}

/// A config drive ISO (label `config-2`) and Ironic's form of it: base64 of its gzip.
fn config_drive(dir: &Path) -> (Vec<u8>, String) {
    let tree = dir.join("cd/openstack/latest");
    std::fs::create_dir_all(&tree).expect("config drive tree");
    std::fs::write(tree.join("meta_data.json"), r#"{"uuid": "instance"}"#).expect("meta data");
    std::fs::write(
        tree.join("user_data"),
        vmdeploy_integration_tests::tools::xorshift_bytes(1_500_000, 3),
    )
    .expect("user data");
    let iso = dir.join("cd.iso");
    tool_ok(
        "xorriso",
        "xorriso",
        &[
            "-as",
            "mkisofs",
            "-quiet",
            "-R",
            "-J",
            "-V",
            "config-2",
            "-o",
            &iso.to_string_lossy(),
            &dir.join("cd").to_string_lossy(),
        ],
    );
    let gz = Command::new("gzip")
        .arg("-c")
        .arg(&iso)
        .output()
        .expect("gzip is installed (package gzip)");
    assert!(gz.status.success(), "gzip -c {iso:?} failed");
    let bytes = std::fs::read(&iso).expect("reading the ISO");
    (
        bytes,
        base64::engine::general_purpose::STANDARD.encode(&gz.stdout),
    )
}

async fn cached(dir: &Path, image: &Path) -> (std::sync::Arc<ImageCache>, CachedImage) {
    let cache = ImageCache::open(dir.join("cache"), DEFAULT_LIMIT).expect("opening the cache");
    let source = ImageSource::new(
        &image.to_string_lossy(),
        format!("file://{}", image.display()),
        None,
    );
    let got = cache.get(&source).await.expect("caching the image");
    (cache, got)
}

fn job(extra: serde_json::Value, mode: BootMode) -> PartitionJob {
    let mut info = json!({
        "image_source": "http://images.example/root.img",
        "kernel": "http://images.example/vmlinuz",
        "ramdisk": "http://images.example/initrd",
        "root_gb": ROOT_GB,
        "swap_mb": SWAP_MB,
        "ephemeral_gb": EPHEMERAL_GB,
    });
    if let (Some(m), serde_json::Value::Object(e)) = (info.as_object_mut(), extra) {
        m.extend(e);
    }
    let info = InstanceInfo::parse(info.as_object().expect("object")).expect("instance_info");
    vmdeploy_conductor::deploy::iscsi::write::partition::job_from_info(&info, mode, false)
        .expect("a partition job")
}

async fn write(
    disk: &LoopDevice,
    image: &CachedImage,
    job: &PartitionJob,
) -> anyhow::Result<Written> {
    let target = AgentTarget::start(disk.device(), IQN);
    let session = Session::open(&SessionConfig::new(&target.portal, IQN, 1))
        .await
        .expect("logging in to the agent's target");
    let written = write_image(&session, image, &DiskJob::Partition(job.clone())).await;
    session.logout().await.expect("logging out");
    written
}

/// A partition-image deploy through the API with the real `iscsi_ilo` flow, ended (`active`
/// or `deploy failed`), with what it ran on.
struct ApiDeploy {
    env: IscsiEnv,
    node: vmdeploy_conductor::store::Node,
    agent: AgentProcess,
}

/// Deploys the partition image `image` onto `disk` through the API with the real `iscsi_ilo`
/// flow (root, swap and ephemeral sizes of this file, `extra` in `instance_info`, the firmware
/// `mode`), the agent process playing the booted ramdisk, until the deploy ends.
async fn deploy_through_api_until_done(
    dir: &Path,
    disk: &LoopDevice,
    image: &Path,
    extra: serde_json::Value,
    mode: BootMode,
) -> ApiDeploy {
    let env = IscsiEnv::start_with(IscsiOptions {
        netboot: true,
        ..IscsiOptions::new(STEP)
    })
    .await;
    let (kernel, ramdisk) = stand_in_kernel_and_ramdisk(dir);
    let (mut node, media) = enroll_iscsi(&env.conductor, &env.emulator, b"", disk, |_| {}).await;
    let boot_mode = boot_mode_name(mode);
    // The image is read where it is (it may be a large sparse file), checksum and all.
    let digest = {
        use sha2::Digest as _;
        let mut hasher = sha2::Sha256::new();
        let mut file = std::fs::File::open(image).expect("opening the image");
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = std::io::Read::read(&mut file, &mut buf).expect("reading the image");
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        hex::encode(hasher.finalize())
    };
    let mut info = json!({
        "image_source": format!("file://{}", image.display()),
        "image_os_hash_algo": "sha256",
        "image_os_hash_value": digest,
        "kernel": format!("file://{}", kernel.display()),
        "ramdisk": format!("file://{}", ramdisk.display()),
        "root_gb": ROOT_GB,
        "swap_mb": SWAP_MB,
        "ephemeral_gb": EPHEMERAL_GB,
        // As Nova sends them: a JSON text.
        "capabilities": format!("{{\"boot_mode\": \"{boot_mode}\"}}"),
    });
    if let (Some(m), serde_json::Value::Object(e)) = (info.as_object_mut(), extra) {
        m.extend(e);
    }
    if let serde_json::Value::Object(m) = info {
        node.instance_info.extend(m);
    }
    env.conductor
        .nodes
        .update_node(&node)
        .await
        .expect("the node's partition image");

    let waiting = env.conductor.deploy(node.uuid, STEP).await;
    assert_eq!(
        waiting.provision_state,
        ProvisionState::WaitCallBack,
        "last_error: {:?}",
        waiting.last_error
    );
    let floppy = inserted_floppy(&env.emulator);
    let agent = AgentProcess::start_iscsi(media.dir.path(), &floppy, env.iscsi_port, env.done_port);
    let node = env
        .conductor
        .wait_for(
            node.uuid,
            &[ProvisionState::Active, ProvisionState::DeployFailed],
            STEP,
        )
        .await;
    ApiDeploy { env, node, agent }
}

fn boot_mode_name(mode: BootMode) -> &'static str {
    match mode {
        BootMode::Bios => "bios",
        BootMode::Uefi => "uefi",
    }
}

/// [`deploy_through_api_until_done`] that must reach `active` (netbooting from the built boot
/// ISO); returns what the conductor recorded.
async fn deploy_through_api(
    dir: &Path,
    disk: &LoopDevice,
    image: &Path,
    extra: serde_json::Value,
    mode: BootMode,
) -> Written {
    let ApiDeploy {
        env,
        node,
        mut agent,
    } = deploy_through_api_until_done(dir, disk, image, extra, mode).await;
    let boot_mode = boot_mode_name(mode);
    assert_eq!(
        node.provision_state,
        ProvisionState::Active,
        "last_error: {:?}\nagent log:\n{}",
        node.last_error,
        agent.log()
    );
    assert_eq!(
        agent.wait_exit(Duration::from_secs(30)),
        Some(0),
        "the agent ends after done; its log:\n{}",
        agent.log()
    );
    // Netboot: the built boot ISO on the CD, the CD the persistent boot device, powered on.
    let state = env.emulator.state();
    assert_eq!(state["vmedia"]["CDROM"]["inserted"], true, "{state}");
    assert_eq!(state["persistent_boot"][0], "CDROM", "{state}");
    assert_eq!(state["power"], "ON", "{state}");
    assert_eq!(
        node.driver_internal_info["deploy_boot_mode"].as_str(),
        Some(boot_mode),
        "{:?}",
        node.driver_internal_info
    );
    Written {
        root_uuid_or_disk_id: node.driver_internal_info["root_uuid_or_disk_id"]
            .as_str()
            .expect("the conductor records the root UUID")
            .to_owned(),
        is_whole_disk: node.driver_internal_info["is_whole_disk_image"]
            .as_bool()
            .expect("the conductor records the image kind"),
    }
}

/// The partitions the request makes, as (MiB offset, MiB length), in disk order: ephemeral,
/// swap, config drive, root; first at 1 MiB, contiguous.
fn expected_mib(configdrive_bytes: u64) -> Vec<(u64, u64)> {
    let sizes = [
        EPHEMERAL_GB * 1024,
        SWAP_MB,
        configdrive_bytes.div_ceil(MIB),
        ROOT_GB * 1024,
    ];
    let mut at = 1;
    sizes
        .iter()
        .map(|&len| {
            let p = (at, len);
            at += len;
            p
        })
        .collect()
}

fn assert_layout(table: &PartitionTable, want: &[(u64, u64)], types: [&str; 4]) {
    let ss = table.sector_size;
    let got: Vec<(u64, u64, &str)> = table
        .partitions
        .iter()
        .map(|p| (p.start * ss / MIB, p.size * ss / MIB, p.type_.as_str()))
        .collect();
    let want: Vec<(u64, u64, &str)> = want
        .iter()
        .zip(types)
        .map(|(&(at, len), t)| (at, len, t))
        .collect();
    assert_eq!(got, want, "{table:?}");
    for (i, p) in table.partitions.iter().enumerate() {
        assert_eq!(p.number as usize, i + 1, "{p:?}");
        assert_eq!((p.start * ss) % MIB, 0, "{p:?} is not MiB-aligned");
    }
}

/// Everything the written disk must show, for either table kind.
fn check_contents(
    disk: &Path,
    table: &PartitionTable,
    written: &Written,
    image: &Path,
    configdrive: &[u8],
    ephemeral_type: &str,
) {
    let ss = table.sector_size;
    let part = |i: usize| -> &PartitionInfo { &table.partitions[i] };
    assert!(!written.is_whole_disk);
    assert_eq!(written.root_uuid_or_disk_id, ROOT_UUID);

    let swap = disk_check::blkid(disk, Some(part(1).range(ss)));
    assert_eq!(
        swap.get("TYPE").map(String::as_str),
        Some("swap"),
        "{swap:?}"
    );
    assert_eq!(
        swap.get("LABEL").map(String::as_str),
        Some("swap1"),
        "{swap:?}"
    );

    let eph = disk_check::blkid(disk, Some(part(0).range(ss)));
    assert_eq!(
        eph.get("TYPE").map(String::as_str),
        Some(ephemeral_type),
        "{eph:?}"
    );
    assert_eq!(
        eph.get("LABEL").map(String::as_str),
        Some("ephemeral0"),
        "{eph:?}"
    );
    disk_check::fsck_clean(disk, part(0).range(ss), ephemeral_type);

    let root = disk_check::blkid(disk, Some(part(3).range(ss)));
    assert_eq!(
        root.get("TYPE").map(String::as_str),
        Some("ext4"),
        "{root:?}"
    );
    assert_eq!(
        root.get("UUID").map(String::as_str),
        Some(ROOT_UUID),
        "{root:?}"
    );
    let want = std::fs::read(image).expect("reading the image");
    let got = disk_check::read_range(disk, part(3).range(ss).0, want.len());
    assert_eq!(
        disk_check::first_difference(&got, &want),
        None,
        "the root partition differs from the image"
    );
    disk_check::fsck_clean(disk, part(3).range(ss), "ext4");

    let cd = disk_check::blkid(disk, Some(part(2).range(ss)));
    assert_eq!(
        cd.get("TYPE").map(String::as_str),
        Some("iso9660"),
        "{cd:?}"
    );
    assert_eq!(
        cd.get("LABEL").map(String::as_str),
        Some("config-2"),
        "{cd:?}"
    );
    let got = disk_check::read_range(disk, part(2).range(ss).0, configdrive.len());
    assert_eq!(
        disk_check::first_difference(&got, configdrive),
        None,
        "the config drive partition differs from the decoded config drive"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mbr_bios_ephemeral_swap_configdrive_root_through_the_api() {
    let dir = tempfile::tempdir_in("/var/tmp").expect("scratch dir");
    let image_path = root_image(dir.path());
    let (iso, configdrive) = config_drive(dir.path());
    let disk = garbage_disk();

    let written = deploy_through_api(
        dir.path(),
        &disk,
        &image_path,
        json!({"configdrive": configdrive}),
        BootMode::Bios,
    )
    .await;

    let table = disk_check::partitions(disk.device());
    assert_eq!(
        table.label,
        "dos",
        "{}",
        disk_check::sfdisk_dump(disk.device())
    );
    assert_layout(
        &table,
        &expected_mib(iso.len() as u64),
        [
            disk_check::MBR_LINUX,
            disk_check::MBR_SWAP,
            disk_check::MBR_LINUX,
            disk_check::MBR_LINUX,
        ],
    );
    assert!(table.partitions[3].bootable, "root carries the boot flag");
    check_contents(disk.device(), &table, &written, &image_path, &iso, "ext4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpt_uefi_with_an_xfs_ephemeral_through_the_api() {
    let dir = tempfile::tempdir_in("/var/tmp").expect("scratch dir");
    let image_path = root_image(dir.path());
    let (iso, configdrive) = config_drive(dir.path());
    let disk = garbage_disk();

    let written = deploy_through_api(
        dir.path(),
        &disk,
        &image_path,
        json!({"configdrive": configdrive, "ephemeral_format": "xfs"}),
        BootMode::Uefi,
    )
    .await;

    let table = disk_check::partitions(disk.device());
    assert_eq!(
        table.label,
        "gpt",
        "{}",
        disk_check::sfdisk_dump(disk.device())
    );
    let want = expected_mib(iso.len() as u64);
    assert_layout(
        &table,
        &want,
        [
            disk_check::GPT_LINUX,
            disk_check::GPT_SWAP,
            disk_check::GPT_LINUX,
            disk_check::GPT_LINUX,
        ],
    );
    let (sg, text) = disk_check::sgdisk_partitions(disk.device());
    let got: Vec<(u32, u64, u64, &str, &str)> = sg
        .iter()
        .map(|p| (p.number, p.start, p.end, p.code.as_str(), p.name.as_str()))
        .collect();
    let sectors = MIB / table.sector_size;
    let names = [
        ("8300", "ephemeral"),
        ("8200", "swap"),
        ("8300", "configdrive"),
        ("8300", "root"),
    ];
    let expected: Vec<(u32, u64, u64, &str, &str)> = want
        .iter()
        .zip(names)
        .enumerate()
        .map(|(i, (&(at, len), (code, name)))| {
            (
                i as u32 + 1,
                at * sectors,
                (at + len) * sectors - 1,
                code,
                name,
            )
        })
        .collect();
    assert_eq!(got, expected, "{text}");
    check_contents(disk.device(), &table, &written, &image_path, &iso, "xfs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_larger_than_root_gb_fails_the_deploy_with_nothing_written() {
    let dir = tempfile::tempdir_in("/var/tmp").expect("scratch dir");
    let image_path = dir.path().join("big.img");
    std::fs::File::create(&image_path)
        .and_then(|f| f.set_len(ROOT_GB * GIB + MIB))
        .expect("a sparse image one MiB larger than root_gb");
    let disk = garbage_disk();
    let head = disk_check::read_range(disk.device(), 0, MIB as usize);
    let tail = disk_check::read_range(disk.device(), DISK_LEN - MIB, MIB as usize);

    let ApiDeploy { env, node, agent } =
        deploy_through_api_until_done(dir.path(), &disk, &image_path, json!({}), BootMode::Bios)
            .await;
    env.assert_failed_clean(
        &node,
        &[
            &format!("the image is {} bytes", ROOT_GB * GIB + MIB),
            "root_gb = 1 GiB",
        ],
        &agent.log(),
    );
    assert_eq!(
        disk_check::read_range(disk.device(), 0, MIB as usize),
        head,
        "the disk's first MiB is untouched"
    );
    assert_eq!(
        disk_check::read_range(disk.device(), DISK_LEN - MIB, MIB as usize),
        tail,
        "the disk's last MiB is untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preserve_ephemeral_keeps_the_partition_and_refuses_another_layout() {
    let dir = tempfile::tempdir_in("/var/tmp").expect("scratch dir");
    let image_path = root_image(dir.path());
    let (iso, configdrive) = config_drive(dir.path());
    let (_cache, image) = cached(dir.path(), &image_path).await;
    let disk = garbage_disk();
    let first = job(json!({"configdrive": configdrive}), BootMode::Bios);
    write(&disk, &image, &first)
        .await
        .expect("the first deploy");
    let table = disk_check::partitions(disk.device());
    let ss = table.sector_size;
    let (eph_at, eph_len) = table.partitions[0].range(ss);
    // The whole ephemeral partition: the file system and the old bytes in its free space.
    let ephemeral = disk_check::read_range(disk.device(), eph_at, eph_len as usize);
    // Old data in the root partition past the image, which a rebuild must overwrite.
    let (root_at, _) = table.partitions[3].range(ss);
    let junk = vec![0x5Au8; MIB as usize];
    {
        use std::os::unix::fs::FileExt as _;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(disk.device())
            .expect("opening the disk");
        f.write_all_at(&junk, root_at)
            .expect("scribbling on the root partition");
        f.sync_all().expect("sync");
    }

    // A different layout (less swap) is refused, and the disk is left as it was.
    let moved = job(
        json!({"configdrive": configdrive, "preserve_ephemeral": true, "swap_mb": SWAP_MB / 2}),
        BootMode::Bios,
    );
    let head = disk_check::read_range(disk.device(), 0, MIB as usize);
    let err = write(&disk, &image, &moved)
        .await
        .expect_err("a layout that moves partitions cannot keep the ephemeral one");
    let text = format!("{err:#}");
    assert!(
        text.contains("preserve_ephemeral") && text.contains("cannot be kept"),
        "{text}"
    );
    assert_eq!(disk_check::read_range(disk.device(), 0, MIB as usize), head);
    assert_eq!(
        disk_check::read_range(disk.device(), root_at, junk.len()),
        junk
    );

    // The same sizes: the table and the ephemeral partition stay, root is written again.
    let again = job(
        json!({"configdrive": configdrive, "preserve_ephemeral": true}),
        BootMode::Bios,
    );
    let written = write(&disk, &image, &again).await.expect("the rebuild");
    assert_eq!(disk_check::read_range(disk.device(), 0, MIB as usize), head);
    assert_eq!(
        disk_check::first_difference(
            &disk_check::read_range(disk.device(), eph_at, eph_len as usize),
            &ephemeral
        ),
        None,
        "the preserved ephemeral partition changed"
    );
    check_contents(disk.device(), &table, &written, &image_path, &iso, "ext4");
}
