//! Netboot of `iscsi_ilo` partition-image deploys from a boot ISO shared by image, through the
//! real Manager: the iLO emulator processes (one per node), the built-in object store over TLS
//! or a real Swift, SQLite, the conductor's image cache, its boot ISO store with the loaders
//! `vmdeploy-image-build loaders` writes, and the agent binary as the iSCSI ramdisk on a
//! `losetup --direct-io=on` disk.
//!
//! Two nodes deploying the same partition image whose root file system has the same UUID share
//! one ISO (`usage_count` 2); a node whose root UUID differs gets its own; undeploying the last
//! user deletes it. A reboot or power-on through the API attaches the ISO again (a fresh temp
//! URL, the CD the persistent boot device), and fails without powering on when the ISO cannot
//! be attached. With Swift as the store, the count is Swift's own `X-Object-Meta-Usage-Count`,
//! read with a raw `HEAD`.
//!
//! The kernel is a stand-in with the x86 boot header (all the ISO writer checks; the in-memory
//! emulator boots nothing), the ramdisk starts with gzip's magic, as a real one does, so the
//! image cache must keep it as it is.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vmdeploy_conductor::boot::vmedia::boot_iso::{BootIsoKey, BootIsos, USAGE_COUNT};
use vmdeploy_conductor::drivers::ilo::IloClient;
use vmdeploy_conductor::drivers::{BootDevice, Management as _, VirtualMedia as _, VmediaDevice};
use vmdeploy_conductor::image_cache::{FetchPolicy, ImageCache};
use vmdeploy_conductor::node::driver_info::{IloDefaults, IloDriverInfo};
use vmdeploy_conductor::objects::swift::{SwiftAuth, SwiftConfig, SwiftStore};
use vmdeploy_conductor::objects::{ObjectPath, ObjectStore};
use vmdeploy_conductor::states::{NodePower, ProvisionState, ProvisionVerb};
use vmdeploy_conductor::store::{Node, NodeIdent, Store as _};
use vmdeploy_integration_tests::conductor_env::{
    api_settings, boot_loaders_dir, enroll, inserted_floppy, stand_in_kernel_and_ramdisk,
    AgentProcess, Api, Builtin, Conductor, Emulator, Media, CONTAINER,
};
use vmdeploy_integration_tests::free_port;
use vmdeploy_integration_tests::http::TestPki;
use vmdeploy_integration_tests::loopdev::{require_loop_devices, LoopDevice, LoopIo};
use vmdeploy_integration_tests::swift::{SwiftPeer, KEY, USER};
use vmdeploy_shared::iso::loaders::LoaderSources;
use vmdeploy_shared::secret::Secret;

/// How long a deploy or a power action may take.
const STEP: Duration = Duration::from_secs(120);
/// The root partition image: an ext4 file system.
const IMAGE_MB: u64 = 8;
/// The node's disk: `root_gb` 1 and room for the partition table.
const DISK_LEN: u64 = 1100 << 20;
const ROOT_A: &str = "6a1b2c3d-0000-4000-8000-0000000000a1";
const ROOT_B: &str = "6a1b2c3d-0000-4000-8000-0000000000b2";
/// The boot ISO's temp URL lifetime in these tests.
const ISO_TTL: Duration = Duration::from_secs(3600);
/// Extra kernel arguments on built ISOs.
const APPEND: &str = "console=ttyS0 nofb";

/// Where the test conductor keeps objects.
enum Objects {
    Builtin(Builtin),
    Swift(SwiftPeer),
}

/// What the conductor's boot ISO store finds where it looks for the boot loaders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loaders {
    /// `deploy.boot_loaders_dir` written by `vmdeploy-image-build loaders`.
    Written,
    /// No loaders directory (the default state of a new install): the conductor makes it
    /// from this system's packages on the first build.
    FromSystem,
    /// No loaders directory, and a system without the loader packages to make one from.
    Unavailable,
}

/// A conductor with the real `iscsi_ilo` flow, an image cache and a boot ISO store.
struct NetbootEnv {
    _pki: TestPki,
    objects_owner: Objects,
    objects: Arc<dyn ObjectStore>,
    dir: tempfile::TempDir,
    iscsi_port: u16,
    done_port: u16,
    conductor: Conductor,
    _api: Api,
    kernel: PathBuf,
    ramdisk: PathBuf,
    /// The conductor's boot ISO store (the same instance, so the same per-object locks).
    isos: Arc<BootIsos>,
}

impl NetbootEnv {
    async fn start(swift: bool) -> NetbootEnv {
        NetbootEnv::start_with(swift, Loaders::Written).await
    }

    async fn start_with(swift: bool, loaders: Loaders) -> NetbootEnv {
        require_loop_devices();
        require_mkfs_ext4();
        let pki = TestPki::new();
        let (objects_owner, objects, ca_pem) = if swift {
            let peer = SwiftPeer::start().expect("Swift starts (scripts/setup installs it)");
            let store = SwiftStore::new(SwiftConfig::new(SwiftAuth::TempAuth {
                url: format!("{}/auth/v1.0", peer.base_url),
                user: USER.to_string(),
                key: Secret::new(KEY),
            }))
            .expect("Swift store");
            let objects: Arc<dyn ObjectStore> = Arc::new(store);
            (Objects::Swift(peer), objects, None)
        } else {
            let builtin = Builtin::start(&pki).await;
            let objects = builtin.objects();
            (Objects::Builtin(builtin), objects, Some(pki.ca_pem.clone()))
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let (listener, settings) = api_settings(ca_pem.clone(), STEP).await;
        let images = ImageCache::open_with(
            dir.path().join("images"),
            1 << 30,
            FetchPolicy {
                extra_ca_pem: ca_pem,
                ..FetchPolicy::default()
            },
        )
        .expect("image cache");
        let scratch = dir.path().join("scratch");
        std::fs::create_dir(&scratch).expect("scratch dir");
        let loaders_dir = match loaders {
            Loaders::Written => boot_loaders_dir(dir.path()),
            Loaders::FromSystem | Loaders::Unavailable => dir.path().join("boot-loaders"),
        };
        let mut isos = BootIsos::new(Arc::clone(&objects), CONTAINER.into(), loaders_dir)
            .with_scratch_dir(scratch)
            .with_cmdline_append(APPEND)
            .with_temp_url_ttl(ISO_TTL);
        if loaders == Loaders::Unavailable {
            isos = isos.with_loader_sources(LoaderSources {
                isolinux_bin: "/nonexistent/isolinux.bin".into(),
                ldlinux_c32: "/nonexistent/ldlinux.c32".into(),
                grub_efi_modules: "/nonexistent/x86_64-efi".into(),
            });
        }
        let isos = Arc::new(isos);
        let (iscsi_port, done_port) = (free_port(), free_port());
        let conductor = Conductor::builder(
            &dir.path().join("vmdeploy.sqlite"),
            Arc::clone(&objects),
            &settings,
        )
        .iscsi(images)
        .boot_isos(Arc::clone(&isos))
        .tune(move |config| {
            config.iscsi_port = iscsi_port;
            config.done_port = done_port;
        })
        .start()
        .await;
        let api = Api::serve(listener, Arc::clone(&conductor.manager));
        let (kernel, ramdisk) = stand_in_kernel_and_ramdisk(dir.path());
        NetbootEnv {
            _pki: pki,
            objects_owner,
            objects,
            dir,
            iscsi_port,
            done_port,
            conductor,
            _api: api,
            kernel,
            ramdisk,
            isos,
        }
    }

    /// Enrolls an `iscsi_ilo` node for the partition image `image` (with this env's kernel and
    /// ramdisk) on `disk`, reached through `emulator`, deploys it through the Manager with the
    /// agent as its ramdisk, and returns it `active`. The conductor speaks `protocol` (`ribcl`
    /// or `redfish`) to the iLO. The node's port is deleted afterwards, so the next node can
    /// take the same MAC.
    async fn deploy(
        &self,
        emulator: &Emulator,
        protocol: &str,
        image: &Path,
        disk: &LoopDevice,
    ) -> Node {
        let (node, log) = self
            .deploy_with(emulator, protocol, image, disk, json!({}))
            .await;
        assert_ended(&node, &log, ProvisionState::Active);
        node
    }

    /// [`NetbootEnv::deploy_with`] over RIBCL, which must end `deploy failed`; returns the node
    /// and its `last_error`.
    async fn deploy_failing(
        &self,
        emulator: &Emulator,
        image: &Path,
        disk: &LoopDevice,
        extra: Value,
    ) -> (Node, String) {
        let (node, log) = self
            .deploy_with(emulator, "ribcl", image, disk, extra)
            .await;
        assert_ended(&node, &log, ProvisionState::DeployFailed);
        let error = node.last_error.clone().unwrap_or_default();
        (node, error)
    }

    /// What one node needs on this env: a root image with the file system UUID `ROOT_A`, an
    /// iLO and a fresh disk.
    fn one_node(&self) -> (PathBuf, Emulator, LoopDevice) {
        let image = ext4_image(self.dir.path(), "root.img", ROOT_A);
        (image, Emulator::start(&[]), disk())
    }

    /// [`NetbootEnv::deploy`] with `extra` keys in `instance_info`, ending `active` or
    /// `deploy failed`; also returns the agent's log.
    async fn deploy_with(
        &self,
        emulator: &Emulator,
        protocol: &str,
        image: &Path,
        disk: &LoopDevice,
        extra: Value,
    ) -> (Node, String) {
        let bytes = std::fs::read(image).expect("reading the image");
        let media = Media::new(&bytes);
        let mut node = enroll(
            &self.conductor.nodes,
            ProvisionState::Available,
            emulator.driver_info(),
            &media,
            &bytes,
            json!({"root_device": {"name": disk.device().display().to_string()}}),
        )
        .await;
        node.driver = "iscsi_ilo".into();
        node.driver_info
            .insert("ilo_protocol".into(), json!(protocol));
        // The same image file for every node: the ISO key names the image reference.
        node.instance_info
            .insert("image_source".into(), json!(file_url(image)));
        node.instance_info
            .insert("kernel".into(), json!(file_url(&self.kernel)));
        node.instance_info
            .insert("ramdisk".into(), json!(file_url(&self.ramdisk)));
        node.instance_info.insert("root_gb".into(), json!(1));
        if let Value::Object(extra) = extra {
            node.instance_info.extend(extra);
        }
        self.conductor
            .nodes
            .update_node(&node)
            .await
            .expect("making it an iscsi_ilo partition-image node");

        let waiting = self.conductor.deploy(node.uuid, STEP).await;
        if waiting.provision_state == ProvisionState::DeployFailed {
            // Refused before the ramdisk booted (validation).
            return (waiting, String::new());
        }
        assert_eq!(
            waiting.provision_state,
            ProvisionState::WaitCallBack,
            "last_error: {:?}",
            waiting.last_error
        );
        let floppy = inserted_floppy(emulator);
        let agent =
            AgentProcess::start_iscsi(media.dir.path(), &floppy, self.iscsi_port, self.done_port);
        let node = self
            .conductor
            .wait_for(
                node.uuid,
                &[ProvisionState::Active, ProvisionState::DeployFailed],
                STEP,
            )
            .await;
        let log = agent.log();
        drop(agent);
        self.conductor.forget_ports(node.uuid).await;
        (node, log)
    }

    /// The boot ISO objects in the store with their counts (the store's own `HEAD`).
    async fn boot_isos(&self) -> Vec<(String, u64)> {
        let mut found = Vec::new();
        for name in self.boot_iso_names().await {
            let info = self
                .objects
                .head(&ObjectPath::new(CONTAINER, name.clone()))
                .await
                .expect("HEAD of a listed boot ISO");
            let count = info
                .metadata
                .get(USAGE_COUNT)
                .and_then(|c| c.parse().ok())
                .unwrap_or_else(|| panic!("{name} has no count: {:?}", info.metadata));
            found.push((name, count));
        }
        found.sort();
        found
    }

    /// Names of `boot-*` objects in the container: the built-in store's files, or Swift's
    /// container listing.
    async fn boot_iso_names(&self) -> Vec<String> {
        let mut names: Vec<String> = match &self.objects_owner {
            Objects::Builtin(builtin) => {
                match std::fs::read_dir(builtin.store.root().join(CONTAINER)) {
                    // Each object is `<name>.data` beside its metadata sidecar.
                    Ok(entries) => entries
                        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                        .filter_map(|n| n.strip_suffix(".data").map(str::to_string))
                        .collect(),
                    Err(_) => Vec::new(),
                }
            }
            Objects::Swift(peer) => swift_list(peer),
        };
        names.retain(|n| n.starts_with("boot-"));
        names.sort();
        names
    }

    /// `PUT .../states/provision {"target": "deleted"}`, waited for `available`.
    async fn undeploy(&self, uuid: uuid::Uuid) -> Node {
        self.conductor
            .manager
            .set_provision_state(&NodeIdent::Uuid(uuid), ProvisionVerb::Undeploy, None)
            .await
            .expect("the undeploy verb is accepted");
        let node = self
            .conductor
            .wait_for(
                uuid,
                &[ProvisionState::Available, ProvisionState::Error],
                STEP,
            )
            .await;
        assert_eq!(
            node.provision_state,
            ProvisionState::Available,
            "last_error: {:?}",
            node.last_error
        );
        node
    }

    /// `PUT .../states/power`, waited until the task cleared `target_power_state`.
    async fn power(&self, uuid: uuid::Uuid, target: NodePower) -> Node {
        self.conductor
            .manager
            .set_power_state(&NodeIdent::Uuid(uuid), target, None)
            .await
            .expect("the power request is accepted");
        let started = Instant::now();
        loop {
            let node = self.conductor.node(uuid).await;
            if node.target_power_state.is_none() && node.reservation.is_none() {
                return node;
            }
            assert!(started.elapsed() < STEP, "power {target} did not end");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Asserts a deploy ended in `want`, showing why and the agent's log when not.
fn assert_ended(node: &Node, agent_log: &str, want: ProvisionState) {
    assert_eq!(
        node.provision_state, want,
        "last_error: {:?}\nagent log:\n{agent_log}",
        node.last_error
    );
}

/// A node's disk: `DISK_LEN` bytes, the first 4 KiB `0xAA` ([`disk_untouched`] checks them).
fn disk() -> LoopDevice {
    LoopDevice::attach(&[0xAA; 4096], DISK_LEN, LoopIo::Direct)
}

fn file_url(path: &Path) -> String {
    format!("file://{}", path.display())
}

fn require_mkfs_ext4() {
    let ok = Command::new("mkfs.ext4")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "mkfs.ext4 is missing (fix: apt-get install e2fsprogs)");
}

/// An ext4 partition image whose file system UUID is `uuid`.
fn ext4_image(dir: &Path, name: &str, uuid: &str) -> PathBuf {
    let path = dir.join(name);
    let file = std::fs::File::create(&path).expect("image file");
    file.set_len(IMAGE_MB << 20).expect("sizing the image");
    drop(file);
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-U", uuid, "-L", "root"])
        .arg(&path)
        .output()
        .expect("running mkfs.ext4");
    assert!(
        out.status.success(),
        "mkfs.ext4: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// The conductor's iLO client for `emulator` (to change its state behind the conductor).
async fn ilo(emulator: &Emulator) -> IloClient {
    let config = IloDriverInfo::parse(&emulator.driver_info(), &IloDefaults::default())
        .expect("config")
        .config;
    IloClient::connect(&config).await.expect("connecting")
}

/// The CD's state: inserted, its URL.
fn cd(emulator: &Emulator) -> (bool, String) {
    let state = emulator.state();
    let cd = &state["vmedia"]["CDROM"];
    (
        cd["inserted"] == Value::Bool(true),
        cd["url"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Asserts the emulator has the ISO inserted and the CD as the persistent boot device.
fn assert_netboots(emulator: &Emulator, what: &str) -> String {
    let state = emulator.state();
    let (inserted, url) = cd(emulator);
    assert!(inserted, "{what}: the boot ISO is on the CD: {state}");
    assert_eq!(
        state["persistent_boot"][0], "CDROM",
        "{what}: the CD is the persistent boot device: {state}"
    );
    assert_eq!(state["power"], "ON", "{what}: {state}");
    url
}

/// Asserts Swift's own `HEAD` of the boot ISO `name` answers 200 with `count` users in its
/// `X-Object-Meta-Usage-Count`; returns the headers.
fn assert_swift_count(peer: &SwiftPeer, name: &str, count: u64) -> Vec<String> {
    let (status, headers) = peer.raw_head(&format!("/{CONTAINER}/{name}"));
    assert_eq!(status, 200, "{headers:?}");
    let want = format!("X-Object-Meta-Usage-Count: {count}");
    assert!(headers.contains(&want), "Swift reports {want}: {headers:?}");
    headers
}

/// The container listing of Swift (with a token, by curl).
fn swift_list(peer: &SwiftPeer) -> Vec<String> {
    let (token, storage_url) = peer.auth().expect("tempauth");
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10", "-H"])
        .arg(format!("X-Auth-Token: {token}"))
        .arg(format!("{storage_url}/{CONTAINER}"))
        .output()
        .expect("curl runs (fix: apt-get install curl)");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn recorded_iso(node: &Node) -> Value {
    node.driver_internal_info
        .get("netboot_boot_iso")
        .cloned()
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_share_a_boot_iso_by_image_and_root_uuid_and_the_last_undeploy_deletes_it() {
    let env = NetbootEnv::start(false).await;
    let image_a = ext4_image(env.dir.path(), "root-a.img", ROOT_A);
    let image_b = ext4_image(env.dir.path(), "root-b.img", ROOT_B);
    let (emu1, emu2, emu3) = (
        Emulator::start(&[]),
        Emulator::start(&[]),
        Emulator::start(&[]),
    );
    let disks: Vec<LoopDevice> = (0..3).map(|_| disk()).collect();

    let first = env.deploy(&emu1, "ribcl", &image_a, &disks[0]).await;
    assert_eq!(
        first.driver_internal_info["root_uuid_or_disk_id"], ROOT_A,
        "the root UUID read back"
    );
    let isos = env.boot_isos().await;
    assert_eq!(isos.len(), 1, "one ISO built: {isos:?}");
    assert_eq!(isos[0].1, 1);
    let shared = isos[0].0.clone();
    assert_eq!(
        recorded_iso(&first),
        json!({"reference": format!("swift://{CONTAINER}/{shared}"), "source": "built",
               "counted": true})
    );
    let url1 = assert_netboots(&emu1, "first node");
    assert!(url1.contains(&shared), "the CD is the shared ISO: {url1}");

    let second = env.deploy(&emu2, "ribcl", &image_a, &disks[1]).await;
    assert_eq!(second.driver_internal_info["root_uuid_or_disk_id"], ROOT_A);
    assert_eq!(
        env.boot_isos().await,
        vec![(shared.clone(), 2)],
        "the second node shares the ISO"
    );
    assert_eq!(recorded_iso(&second), recorded_iso(&first));
    let url2 = assert_netboots(&emu2, "second node");
    assert!(url2.contains(&shared), "{url2}");

    // Another root UUID: another command line, another ISO. This iLO is spoken to over
    // Redfish (the persistent CD is `BootSourceOverrideEnabled: Continuous` there).
    let third = env.deploy(&emu3, "redfish", &image_b, &disks[2]).await;
    assert_eq!(third.driver_internal_info["root_uuid_or_disk_id"], ROOT_B);
    let isos = env.boot_isos().await;
    assert_eq!(isos.len(), 2, "{isos:?}");
    let own = isos
        .iter()
        .find(|(name, _)| *name != shared)
        .expect("the third node's ISO")
        .clone();
    assert_eq!(own.1, 1, "{isos:?}");
    assert!(isos.contains(&(shared.clone(), 2)), "{isos:?}");
    let url3 = assert_netboots(&emu3, "third node");
    assert!(url3.contains(&own.0), "{url3}");

    // The ISO the iLO is given is a BIOS + UEFI boot ISO whose command line names the root
    // UUID and the configured arguments.
    let iso = vmdeploy_integration_tests::conductor_env::fetch_media(&url3)
        .expect("the CD's temp URL answers");
    let text = String::from_utf8_lossy(&iso);
    let cmdline = format!("root=UUID={ROOT_B} {APPEND}");
    assert!(text.contains(&cmdline), "the ISO carries {cmdline:?}");
    assert!(!text.contains(ROOT_A), "not the other node's root UUID");

    // A reboot through the API attaches the ISO again: the CD ejected and the boot device
    // changed behind the conductor's back come back, with a fresh temp URL.
    let client = ilo(&emu1).await;
    client
        .eject_vmedia(VmediaDevice::Cdrom)
        .await
        .expect("ejecting the CD");
    client
        .set_persistent_boot(&BootDevice::Hdd)
        .await
        .expect("booting from disk");
    assert!(!cd(&emu1).0);
    tokio::time::sleep(Duration::from_millis(1100)).await; // a temp URL counts seconds
    let rebooted = env.power(first.uuid, NodePower::Rebooting).await;
    assert_eq!(rebooted.last_error, None);
    let url1b = assert_netboots(&emu1, "after the API's reboot");
    assert!(url1b.contains(&shared), "{url1b}");
    assert_ne!(url1b, url1, "a fresh temp URL");
    assert!(
        vmdeploy_integration_tests::conductor_env::fetch_media(&url1b).is_some(),
        "the new URL answers"
    );

    // Power off, then power on through the API: attached again.
    let off = env.power(first.uuid, NodePower::Off).await;
    assert_eq!(off.last_error, None);
    assert_eq!(emu1.state()["power"], "OFF");
    client
        .eject_vmedia(VmediaDevice::Cdrom)
        .await
        .expect("ejecting the CD");
    let on = env.power(first.uuid, NodePower::On).await;
    assert_eq!(on.last_error, None);
    assert_netboots(&emu1, "after the API's power on");

    // An ISO that cannot be attached fails the power-on, which then does not happen.
    env.objects
        .delete(&ObjectPath::new(CONTAINER, own.0.clone()))
        .await
        .expect("deleting the third node's ISO behind the conductor");
    assert_eq!(env.power(third.uuid, NodePower::Off).await.last_error, None);
    let refused = env.power(third.uuid, NodePower::On).await;
    let error = refused.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("boot ISO") && error.contains("not powered on"),
        "{error}"
    );
    assert_eq!(emu3.state()["power"], "OFF", "the node stays off");

    // Undeploy: counts down, and the last user deletes the ISO.
    let gone = env.undeploy(first.uuid).await;
    assert_eq!(recorded_iso(&gone), Value::Null, "forgotten");
    assert_eq!(env.boot_isos().await, vec![(shared.clone(), 1)]);
    emu1.assert_media_ejected();
    env.undeploy(second.uuid).await;
    emu2.assert_media_ejected();
    let left = env.undeploy(third.uuid).await;
    assert_eq!(recorded_iso(&left), Value::Null);
    assert_eq!(env.boot_iso_names().await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_swift_the_count_is_the_objects_usage_count_metadata() {
    let env = NetbootEnv::start(true).await;
    let Objects::Swift(peer) = &env.objects_owner else {
        panic!("a Swift env");
    };
    let image = ext4_image(env.dir.path(), "root.img", ROOT_A);
    let (emu1, emu2) = (Emulator::start(&[]), Emulator::start(&[]));
    let disks: Vec<LoopDevice> = (0..2).map(|_| disk()).collect();

    let first = env.deploy(&emu1, "ribcl", &image, &disks[0]).await;
    let second = env.deploy(&emu2, "ribcl", &image, &disks[1]).await;
    let names = env.boot_iso_names().await;
    assert_eq!(names.len(), 1, "one shared ISO: {names:?}");
    let headers = assert_swift_count(peer, &names[0], 2);
    assert!(
        !headers
            .iter()
            .any(|h| h.to_ascii_lowercase().starts_with("x-delete-at")),
        "a boot ISO does not expire: {headers:?}"
    );
    let url = assert_netboots(&emu1, "first node");
    assert!(url.contains(&names[0]), "{url}");
    assert_netboots(&emu2, "second node");

    // Eight more users at once, then eight releases at once, through the conductor's store:
    // Swift has no compare-and-swap, so only the per-object lock keeps every count.
    let key = BootIsoKey {
        image_ref: file_url(&image),
        kernel_ref: file_url(&env.kernel),
        ramdisk_ref: file_url(&env.ramdisk),
        cmdline: format!("root=UUID={ROOT_A} {APPEND}"),
        secure_boot: false,
    };
    let object = env.isos.object_path(&key);
    assert_eq!(object.object, names[0], "the key the flow built");
    let acquires: Vec<_> = (0..8)
        .map(|_| {
            let (isos, key) = (Arc::clone(&env.isos), key.clone());
            let (kernel, ramdisk) = (env.kernel.clone(), env.ramdisk.clone());
            tokio::spawn(async move { isos.acquire(&key, &kernel, &ramdisk).await })
        })
        .collect();
    for task in acquires {
        task.await.expect("task").expect("acquire");
    }
    assert_swift_count(peer, &names[0], 10);
    let releases: Vec<_> = (0..8)
        .map(|_| {
            let (isos, object) = (Arc::clone(&env.isos), object.clone());
            tokio::spawn(async move { isos.release(&object).await })
        })
        .collect();
    for task in releases {
        task.await.expect("task").expect("release");
    }
    assert_swift_count(peer, &names[0], 2);

    env.undeploy(first.uuid).await;
    assert_swift_count(peer, &names[0], 1);
    env.undeploy(second.uuid).await;
    assert_eq!(
        peer.raw_head(&format!("/{CONTAINER}/{}", names[0])).0,
        404,
        "deleted at zero"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_boot_iso_is_attached_as_it_is_never_counted_and_checked_first() {
    let env = NetbootEnv::start(false).await;
    let Objects::Builtin(builtin) = &env.objects_owner else {
        panic!("a built-in store env");
    };
    let image = ext4_image(env.dir.path(), "root.img", ROOT_A);
    let given = env.dir.path().join("given.iso");
    std::fs::write(&given, vec![0x47; 96 * 1024]).expect("the given ISO");
    let (emu1, emu2) = (Emulator::start(&[]), Emulator::start(&[]));
    let disks: Vec<LoopDevice> = (0..2).map(|_| disk()).collect();

    let reference = file_url(&given);
    let (node, log) = env
        .deploy_with(
            &emu1,
            "ribcl",
            &image,
            &disks[0],
            json!({"ilo_boot_iso": reference}),
        )
        .await;
    assert_ended(&node, &log, ProvisionState::Active);
    assert_eq!(
        recorded_iso(&node),
        json!({"reference": reference, "source": "instance_info.ilo_boot_iso",
               "counted": false})
    );
    assert_eq!(
        env.boot_iso_names().await,
        Vec::<String>::new(),
        "nothing built"
    );
    let url = assert_netboots(&emu1, "given ISO");
    assert_eq!(
        vmdeploy_integration_tests::conductor_env::fetch_media(&url).as_deref(),
        Some(&std::fs::read(&given).expect("given ISO")[..]),
        "the CD is the given ISO"
    );
    let gone = env.undeploy(node.uuid).await;
    assert_eq!(recorded_iso(&gone), Value::Null);
    assert!(given.exists(), "the user's ISO is left alone");

    // A URL whose HEAD fails is refused by the deploy's validation, before anything is
    // written, with the field and the status in last_error.
    let missing = format!("{}/{CONTAINER}/no-such.iso", builtin.store.public_url());
    let (node, _) = env
        .deploy_with(
            &emu2,
            "ribcl",
            &image,
            &disks[1],
            json!({"ilo_boot_iso": missing}),
        )
        .await;
    assert_eq!(node.provision_state, ProvisionState::DeployFailed);
    let error = node.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("instance_info.ilo_boot_iso")
            && error.contains("HEAD")
            && error.contains("validation"),
        "{error}"
    );
    emu2.assert_media_ejected();
    assert_eq!(recorded_iso(&node), Value::Null);
}

/// Whether the first 4 KiB of `disk` (read through its device node) still hold the `0xAA`
/// it was made with: the wipe of the old partition table is the first write of a partition
/// deploy.
fn disk_untouched(disk: &LoopDevice) -> bool {
    use std::io::Read as _;
    let mut head = vec![0u8; 4096];
    std::fs::File::open(disk.device())
        .and_then(|mut f| f.read_exact(&mut head))
        .unwrap_or_else(|e| panic!("reading {}: {e}", disk.device().display()));
    head.iter().all(|b| *b == 0xAA)
}

/// A new install on a system with the loader packages: no `deploy.boot_loaders_dir`, and the
/// conductor makes it on the first build, as `vmdeploy-image-build loaders` would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_loaders_directory_the_conductor_makes_it_from_the_system() {
    let env = NetbootEnv::start_with(false, Loaders::FromSystem).await;
    let loaders = env.dir.path().join("boot-loaders");
    assert!(!loaders.exists());
    let (image, emulator, disk) = env.one_node();

    let node = env.deploy(&emulator, "ribcl", &image, &disk).await;
    assert_eq!(node.driver_internal_info["root_uuid_or_disk_id"], ROOT_A);
    assert_netboots(&emulator, "loaders made by the conductor");
    let reference = boot_loaders_dir(&env.dir.path().join("reference"));
    for name in ["isolinux.bin", "ldlinux.c32", "grubx64.efi"] {
        assert_eq!(
            std::fs::read(loaders.join(name)).expect("made"),
            std::fs::read(reference.join(name)).expect("written by image-build"),
            "{name} is what `vmdeploy-image-build loaders` writes"
        );
    }
    env.undeploy(node.uuid).await;
}

/// A new install: no `deploy.boot_loaders_dir`, and (here) no loader packages to make it from.
/// The deploy is refused by its validation: the running instance keeps its power and its disk,
/// and the message gives the commands that fix it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_boot_loaders_netboot_is_refused_before_power_or_disk_are_touched() {
    let env = NetbootEnv::start_with(false, Loaders::Unavailable).await;
    let (image, emulator, disk) = env.one_node();
    // The node runs its previous instance.
    emulator.power_on().await;
    let boots = emulator.state()["boots"].clone();

    let (node, error) = env
        .deploy_failing(&emulator, &image, &disk, json!({}))
        .await;
    assert!(error.contains("failed validation"), "{error}");
    assert!(
        error.contains("boot loaders") && error.contains("vmdeploy-image-build loaders -o"),
        "the command that makes the loaders directory: {error}"
    );
    assert!(
        error.contains("apt-get install"),
        "the packages the loaders come from: {error}"
    );
    let state = emulator.state();
    assert_eq!(state["power"], "ON", "the power is not touched: {state}");
    assert_eq!(state["boots"], boots, "nothing booted: {state}");
    emulator.assert_media_ejected();
    assert!(disk_untouched(&disk), "the disk is untouched");
    assert_eq!(env.boot_iso_names().await, Vec::<String>::new());
    assert_eq!(recorded_iso(&node), Value::Null);
}

/// An instance kernel that is not a bzImage cannot go on a boot ISO: the deploy fails before
/// the first byte of the disk is written, and nothing is left stored or recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_that_is_no_bzimage_fails_the_deploy_before_the_disk_is_written() {
    let env = NetbootEnv::start(false).await;
    let (image, emulator, disk) = env.one_node();
    let not_a_kernel = env.dir.path().join("vmlinuz.txt");
    std::fs::write(&not_a_kernel, vec![b'x'; 300_000]).expect("the wrong kernel");

    let (node, error) = env
        .deploy_failing(
            &emulator,
            &image,
            &disk,
            json!({"kernel": file_url(&not_a_kernel)}),
        )
        .await;
    assert!(
        disk_untouched(&disk),
        "the disk is untouched; last_error: {error}"
    );
    assert!(
        error.contains("bzImage") && error.contains("instance_info.kernel"),
        "{error}"
    );
    assert_eq!(env.boot_iso_names().await, Vec::<String>::new());
    assert_eq!(recorded_iso(&node), Value::Null);
    emulator.assert_media_ejected();
}

/// A failure after the boot ISO was built (here the layout: root and ephemeral do not fit the
/// disk) releases it in the deploy's clean-up: the ISO no node uses is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_after_the_boot_iso_was_built_deletes_it() {
    let env = NetbootEnv::start(false).await;
    let (image, emulator, disk) = env.one_node();

    let (node, error) = env
        .deploy_failing(&emulator, &image, &disk, json!({"ephemeral_gb": 1}))
        .await;
    assert!(error.contains("planning the partitions"), "{error}");
    assert_eq!(
        env.boot_iso_names().await,
        Vec::<String>::new(),
        "the ISO built for the deploy is deleted"
    );
    assert_eq!(recorded_iso(&node), Value::Null);
    assert!(disk_untouched(&disk), "{error}");
    emulator.assert_media_ejected();
}
