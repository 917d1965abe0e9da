//! Automated cleaning (`deploy.automated_clean`) of an `agent_ilo` node, end to end with real
//! parts: the conductor's Manager behind its real API router, the `baremetal` CLI for undeploy,
//! manage and provide, the iLO emulator process, the built-in object store over TLS, and the
//! agent binary on a `losetup --direct-io=on` loop device, started on the floppy the emulator
//! was given, the way `conductor_deploy_flow.rs` plays the node's boot.
//!
//! 1. A whole-disk image (GPT, one ext4 partition, made by the system's sgdisk and mkfs) is
//!    deployed; `baremetal node undeploy` takes the node through `clean wait` (the agent ramdisk
//!    booted again from virtual media), the agent runs `erase_devices_metadata`, and the node
//!    ends `available`, powered off, media ejected, floppy deleted: `blkid -p` finds no table
//!    and no file system on the disk or at the partition's offset, sgdisk finds no GPT, and the
//!    disk's middle is as the image left it. The same node deploys again.
//! 2. A clean step that fails on the node (the root device hints name a disk the agent cannot
//!    find): `clean failed` with the agent's reason, powered off, media ejected, floppy
//!    deleted, token wiped; `baremetal node manage` then `provide` cleans it to `available`.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use vmdeploy_conductor::boot::vmedia;
use vmdeploy_conductor::objects::{ObjectError, ObjectPath, ObjectStore};
use vmdeploy_conductor::states::ProvisionState;
use vmdeploy_conductor::store::{Node, Store};
use vmdeploy_integration_tests::conductor_env::{
    api_settings, enroll, inserted_floppy, AgentProcess, Api, Builtin, Conductor, Emulator, Media,
    CONTAINER,
};
use vmdeploy_integration_tests::http::TestPki;
use vmdeploy_integration_tests::loopdev::{require_loop_devices, LoopDevice, LoopIo};

const MIB: usize = 1024 * 1024;
/// The node's disk.
const DISK_LEN: usize = 64 * MIB;
/// The image: GPT, partition 1 at 1 MiB, 30 MiB, ext4.
const IMAGE_LEN: usize = 40 * MIB;
const PART_START: usize = MIB;
const PART_LEN: usize = 30 * MIB;
/// Where the image carries a pattern cleaning must leave alone.
const PATTERN_AT: usize = 20 * MIB;

/// Runs a system tool and asserts it succeeded (a missing tool fails with the fix).
fn run(tool: &str, args: &[&str]) -> String {
    let out = Command::new(tool).args(args).output().unwrap_or_else(|e| {
        panic!("running {tool}: {e}; fix: apt-get install gdisk e2fsprogs util-linux")
    });
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What `blkid -p` finds at `offset` of `dev` (empty: nothing; exit code 2).
fn probe(dev: &Path, offset: usize) -> String {
    let dev = dev.to_str().expect("utf-8 path");
    let offset = offset.to_string();
    let out = Command::new("blkid")
        .args(["-p", "-o", "export", "-O", &offset, dev])
        .output()
        .expect("running blkid (fix: apt-get install util-linux)");
    match out.status.code() {
        Some(0) => String::from_utf8_lossy(&out.stdout).into_owned(),
        Some(2) => String::new(),
        other => panic!(
            "blkid -p -O {offset} {dev}: exit {other:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// The whole-disk image: a GPT with one ext4 partition (the system's sgdisk and mkfs.ext4),
/// and a pattern inside the partition.
fn whole_disk_image() -> Vec<u8> {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("image.raw");
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(IMAGE_LEN as u64))
        .expect("image file");
    let p = path.to_str().expect("utf-8 path");
    let first = PART_START / 512;
    let last = (PART_START + PART_LEN) / 512 - 1;
    run("sgdisk", &["-o", &format!("-n=1:{first}:{last}"), p]);
    run(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-E",
            &format!("offset={PART_START}"),
            p,
            &format!("{}k", PART_LEN / 1024),
        ],
    );
    let mut image = std::fs::read(&path).expect("reading the image");
    for (i, b) in image[PATTERN_AT..PATTERN_AT + MIB].iter_mut().enumerate() {
        *b = (i % 251) as u8 | 1;
    }
    image
}

/// The `baremetal` CLI against the conductor's API at `api_url`, as an operator runs it; run
/// off the runtime's threads (the API answers on them).
async fn cli(api_url: &str, args: &[&str]) -> std::process::Output {
    let api_url = api_url.to_owned();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let home = tempfile::tempdir().expect("temp HOME for the CLI's caches");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        vmdeploy_integration_tests::baremetal::run(&api_url, home.path(), &args)
    })
    .await
    .expect("the CLI task")
}

/// [`cli`], asserting it succeeded; its standard output.
async fn baremetal(api_url: &str, args: &[&str]) -> String {
    vmdeploy_integration_tests::baremetal::succeeded(args, &cli(api_url, args).await)
}

async fn exists(objects: &dyn ObjectStore, path: &ObjectPath) -> bool {
    match objects.head(path).await {
        Ok(_) => true,
        Err(ObjectError::NotFound(_)) => false,
        Err(e) => panic!("head {path}: {e}"),
    }
}

/// Everything one test holds.
struct Env {
    conductor: Conductor,
    _api: Api,
    api_url: String,
    emulator: Emulator,
    builtin: Builtin,
    disk: LoopDevice,
    _media: Media,
    image: Vec<u8>,
    node: Node,
    _db: tempfile::TempDir,
}

impl Env {
    async fn start() -> Env {
        require_loop_devices();
        let image = whole_disk_image();
        let disk = LoopDevice::attach(&vec![0xAA; DISK_LEN], DISK_LEN as u64, LoopIo::Direct);
        let disk_name = disk.device().display().to_string();
        let emulator = Emulator::start(&[]);
        let pki = TestPki::new();
        let builtin = Builtin::start(&pki).await;
        let media = Media::new(&image);
        let db = tempfile::tempdir().expect("temp dir");
        let (listener, settings) =
            api_settings(Some(pki.ca_pem.clone()), Duration::from_secs(120)).await;
        let conductor = Conductor::builder(
            &db.path().join("vmdeploy.sqlite"),
            builtin.objects(),
            &settings,
        )
        .automated_clean()
        .start()
        .await;
        let api = Api::serve(listener, Arc::clone(&conductor.manager));
        let node = enroll(
            &conductor.nodes,
            ProvisionState::Available,
            emulator.driver_info(),
            &media,
            &image,
            json!({"root_device": {"name": disk_name}}),
        )
        .await;
        Env {
            conductor,
            _api: api,
            api_url: settings.api_url,
            emulator,
            builtin,
            disk,
            _media: media,
            image,
            node,
            _db: db,
        }
    }

    /// Boots the node as the emulator was told to: the agent on the inserted floppy.
    fn boot_agent(&self) -> (AgentProcess, tempfile::TempDir) {
        let state = self.emulator.state();
        assert_eq!(state["power"], "ON", "{state}");
        assert_eq!(state["last_boot"]["device"], "CDROM", "{state}");
        let dir = tempfile::tempdir().expect("agent dir");
        let agent = AgentProcess::start(dir.path(), &inserted_floppy(&self.emulator));
        (agent, dir)
    }

    /// Deploys the image and checks it is on the disk.
    async fn deploy(&self) {
        let uuid = self.node.uuid;
        let waiting = self.conductor.deploy(uuid, Duration::from_secs(60)).await;
        assert_eq!(
            waiting.provision_state,
            ProvisionState::WaitCallBack,
            "{:?}",
            waiting.last_error
        );
        let (mut agent, _dir) = self.boot_agent();
        let node = self
            .conductor
            .wait_for(
                uuid,
                &[ProvisionState::Active, ProvisionState::DeployFailed],
                Duration::from_secs(120),
            )
            .await;
        assert_eq!(
            node.provision_state,
            ProvisionState::Active,
            "last_error: {:?}\nagent log:\n{}",
            node.last_error,
            agent.log()
        );
        assert_eq!(agent.wait_exit(Duration::from_secs(30)), Some(0));
        let written = self.disk.contents();
        assert_eq!(
            &written[..self.image.len()],
            &self.image[..],
            "image written"
        );
        assert!(probe(self.disk.device(), 0).contains("PTTYPE=gpt"));
        assert!(probe(self.disk.device(), PART_START).contains("TYPE=ext4"));
    }

    /// Waits for `clean wait` after a verb that starts cleaning.
    async fn wait_clean_wait(&self) -> Node {
        let node = self
            .conductor
            .wait_for(
                self.node.uuid,
                &[
                    ProvisionState::CleanWait,
                    ProvisionState::CleanFailed,
                    ProvisionState::Available,
                ],
                Duration::from_secs(60),
            )
            .await;
        assert_eq!(
            node.provision_state,
            ProvisionState::CleanWait,
            "{:?}",
            node.last_error
        );
        assert!(node.driver_internal_info.contains_key("agent_secret_token"));
        assert!(
            exists(self.builtin.store.as_ref(), &self.floppy()).await,
            "the cleaning floppy is stored"
        );
        node
    }

    fn floppy(&self) -> ObjectPath {
        vmedia::floppy_object(CONTAINER, self.node.uuid)
    }

    /// The end of any cleaning: powered off, media out, floppy deleted, agent forgotten.
    async fn assert_cleaned_up(&self, node: &Node) {
        let state = self.emulator.state();
        assert_eq!(state["power"], "OFF", "{state}");
        self.emulator.assert_media_ejected();
        assert!(
            !exists(self.builtin.store.as_ref(), &self.floppy()).await,
            "the floppy object is deleted"
        );
        for gone in [
            "agent_secret_token",
            "agent_url",
            "agent_verify_ca",
            "clean_steps",
            "clean_step_index",
        ] {
            assert!(
                !node.driver_internal_info.contains_key(gone),
                "{gone} forgotten: {:?}",
                node.driver_internal_info
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeploy_cleans_the_disk_and_the_node_deploys_again() {
    let env = Env::start().await;
    let uuid = env.node.uuid.to_string();
    env.deploy().await;

    baremetal(&env.api_url, &["node", "undeploy", &uuid]).await;
    let waiting = env.wait_clean_wait().await;
    assert_eq!(
        waiting.target_provision_state,
        Some(ProvisionState::Available)
    );
    assert!(waiting.instance_info.is_empty(), "the instance is gone");
    let (mut agent, _dir) = env.boot_agent();
    let node = env
        .conductor
        .wait_for(
            env.node.uuid,
            &[ProvisionState::Available, ProvisionState::CleanFailed],
            Duration::from_secs(120),
        )
        .await;
    assert_eq!(
        node.provision_state,
        ProvisionState::Available,
        "last_error: {:?}\nagent log:\n{}",
        node.last_error,
        agent.log()
    );
    assert_eq!(node.last_error, None);
    let steps_run = &node.driver_internal_info["clean_steps_run"];
    assert_eq!(
        steps_run[0]["step"], "erase_devices_metadata",
        "{steps_run}"
    );
    assert_eq!(steps_run[0]["status"], "succeeded", "{steps_run}");
    assert_eq!(steps_run.as_array().map(Vec::len), Some(1), "{steps_run}");
    env.assert_cleaned_up(&node).await;
    assert_eq!(
        agent.wait_exit(Duration::from_secs(30)),
        Some(0),
        "the agent powered off on standby.power_off"
    );
    let shown = baremetal(
        &env.api_url,
        &[
            "node",
            "show",
            &uuid,
            "-f",
            "json",
            "-c",
            "provision_state",
            "-c",
            "clean_step",
        ],
    )
    .await;
    let shown: serde_json::Value = serde_json::from_str(&shown).expect("JSON");
    assert_eq!(shown["provision_state"], "available", "{shown}");
    assert_eq!(shown["clean_step"], json!({}), "{shown}");

    // The disk: no table, no file system, the middle as it was.
    let dev = env.disk.device();
    assert_eq!(probe(dev, 0), "", "no signature on the disk");
    assert_eq!(
        probe(dev, PART_START),
        "",
        "no file system at the partition"
    );
    let sgdisk = run("sgdisk", &["-p", dev.to_str().expect("utf-8")]);
    assert!(
        sgdisk.contains("Creating new GPT entries"),
        "sgdisk finds no GPT: {sgdisk}"
    );
    let disk = env.disk.contents();
    assert!(disk[..MIB].iter().all(|&b| b == 0), "first MiB zero");
    assert!(
        disk[DISK_LEN - MIB..].iter().all(|&b| b == 0),
        "last MiB zero"
    );
    assert_eq!(
        &disk[2 * MIB..PART_START + PART_LEN - MIB],
        &env.image[2 * MIB..PART_START + PART_LEN - MIB],
        "the partition's body is left alone"
    );
    assert_eq!(
        &disk[IMAGE_LEN..DISK_LEN - MIB],
        &vec![0xAA; DISK_LEN - MIB - IMAGE_LEN][..],
        "past the image, the disk is as it was"
    );

    // The same node deploys again, once the scheduler has set its instance again (undeploy
    // cleared instance_info, as Ironic's tear-down does).
    let mut set = vec!["node".to_owned(), "set".to_owned(), uuid.clone()];
    for (key, value) in &env.node.instance_info {
        let value = value.as_str().expect("string instance_info values");
        set.extend(["--instance-info".to_owned(), format!("{key}={value}")]);
    }
    let set: Vec<&str> = set.iter().map(String::as_str).collect();
    baremetal(&env.api_url, &set).await;
    env.deploy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_clean_step_ends_clean_failed_and_manage_provide_recovers() {
    let env = Env::start().await;
    let uuid = env.node.uuid.to_string();
    env.deploy().await;

    // The agent will find no disk for the step: its hints name one that does not exist.
    let disk_name = env.disk.device().display().to_string();
    let mut node = env.conductor.node(env.node.uuid).await;
    node.properties
        .insert("root_device".into(), json!({"name": "/dev/loop-none"}));
    env.conductor
        .nodes
        .update_node(&node)
        .await
        .expect("update");

    baremetal(&env.api_url, &["node", "undeploy", &uuid]).await;
    env.wait_clean_wait().await;
    let (agent, _dir) = env.boot_agent();
    let node = env
        .conductor
        .wait_for(
            env.node.uuid,
            &[ProvisionState::Available, ProvisionState::CleanFailed],
            Duration::from_secs(120),
        )
        .await;
    assert_eq!(
        node.provision_state,
        ProvisionState::CleanFailed,
        "agent log:\n{}",
        agent.log()
    );
    let error = node.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("erase_devices_metadata")
            && error.contains("no install disk")
            && error.contains("manage and provide"),
        "{error}"
    );
    let steps_run = &node.driver_internal_info["clean_steps_run"];
    assert_eq!(steps_run[0]["status"], "failed", "{steps_run}");
    env.assert_cleaned_up(&node).await;
    drop(agent);
    // Nothing was erased: the image is still on the disk.
    assert!(probe(env.disk.device(), PART_START).contains("TYPE=ext4"));

    // Ironic's way back: manage, fix, provide.
    let refused = cli(&env.api_url, &["node", "provide", &uuid]).await;
    assert!(
        !refused.status.success(),
        "provide is refused in clean failed: {}",
        String::from_utf8_lossy(&refused.stdout)
    );
    baremetal(&env.api_url, &["node", "manage", &uuid]).await;
    let node = env
        .conductor
        .wait_for(
            env.node.uuid,
            &[ProvisionState::Manageable],
            Duration::from_secs(30),
        )
        .await;
    let mut node = node;
    node.properties
        .insert("root_device".into(), json!({"name": disk_name}));
    env.conductor
        .nodes
        .update_node(&node)
        .await
        .expect("update");
    baremetal(&env.api_url, &["node", "provide", &uuid]).await;
    env.wait_clean_wait().await;
    let (mut agent, _dir) = env.boot_agent();
    let node = env
        .conductor
        .wait_for(
            env.node.uuid,
            &[ProvisionState::Available, ProvisionState::CleanFailed],
            Duration::from_secs(120),
        )
        .await;
    assert_eq!(
        node.provision_state,
        ProvisionState::Available,
        "last_error: {:?}\nagent log:\n{}",
        node.last_error,
        agent.log()
    );
    env.assert_cleaned_up(&node).await;
    assert_eq!(agent.wait_exit(Duration::from_secs(30)), Some(0));
    assert_eq!(probe(env.disk.device(), 0), "");
    assert_eq!(probe(env.disk.device(), PART_START), "");
}
