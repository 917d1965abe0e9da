//! The lab with upstream OpenStack Ironic 39 as the conductor: our kernel and
//! initramfs are its deploy ramdisk, the emulated iLO 5 its Redfish BMC.
//!
//! Ironic runs as an operator runs it standalone: one `ironic` process (API and conductor) from
//! the setup's venv, `rpc_transport = none`, SQLite, `auth_strategy = noauth`, the `redfish`
//! hardware type with `redfish-virtual-media` boot and `direct` deploy, and its defaults
//! elsewhere, `[agent] require_tls` (true) among them: the agent must serve its API over TLS
//! with the certificate it sends as `agent_verify_ca`.
//!
//! # What Ironic needs around it, and how the lab gives it
//! - An HTTP server for `[deploy] http_root`, where Ironic puts the ISOs it builds and the
//!   images it caches ([`IronicHttp`]). The BMC (the
//!   emulator, on the host) reaches it at `external_http_url` (loopback); the node reaches it at
//!   `http_url`, the lab's media address `10.0.2.101:8080`, which the emulator forwards there.
//! - The node reaches the API at `10.0.2.100:6385` (`[service_catalog] endpoint_override`, the
//!   `ipa-api-url` Ironic puts on the kernel command line), forwarded to Ironic's port.
//! - Images are fetched by Ironic and served to the agent from `http_url`
//!   (`[agent] image_download_source = local`): the node cannot reach the host's loopback where
//!   the test publishes them, as a tenant network cannot reach a conductor's image store.
//! - Ironic checks the image URL it gives the agent with a HEAD request of its own, but the
//!   host has no route to the node's `10.0.2.101`: Ironic's `http_proxy` is the HTTP root's
//!   server, which serves proxy requests by their path.
//! - `mkisofs`: a link to `xorrisofs` in a directory put first on Ironic's `PATH`.
//! - BIOS ISOs: Debian's `isolinux.bin` (`[DEFAULT] isolinux_bin`); UEFI ISOs: the EFI system
//!   partition image `vmdeploy-image-build esp` writes (`[conductor] bootloader`), whose GRUB
//!   finds the ISO by the volume id Ironic gives it and reads `boot/grub/grub.cfg`
//!   (`[DEFAULT] grub_config_path`).
//! - The agent advertises `127.0.0.1:<the host port forwarded to the guest's 9999>`
//!   (`ipa-advertise-host`/`-port` in the node's `driver_info.kernel_append_params`), as a
//!   ramdisk behind NAT must.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use sha2::Digest as _;

use super::{Firmware, Lab, LabOptions, GUEST_API, GUEST_MEDIA, ILO_PASSWORD, ILO_USER};
use crate::bin;
use crate::emulator::MediaServer;

/// The product name that makes the emulator an iLO 5 (Redfish, Gen10).
pub const ILO5_PRODUCT: &str = "ProLiant DL360 Gen10";

/// The Ironic release the setup's venv pins (scripts/setup).
pub const IRONIC_VERSION: &str = "39.0.0";

/// Where, under Ironic's HTTP root, the test publishes the files Ironic fetches itself (deploy
/// kernel and ramdisk, the ESP image, the instance images).
pub const PUBLISHED: &str = "lab";

/// Ironic's HTTP root, served on loopback with the `Range` requests QEMU's curl driver makes
/// for virtual media (Python's `http.server` answers them with the whole file).
pub struct IronicHttp {
    /// The directory (`[deploy] http_root`).
    pub root: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
    _server: MediaServer,
}

impl IronicHttp {
    /// Serves `root` (created) on a free loopback port.
    pub fn start(root: &Path) -> IronicHttp {
        std::fs::create_dir_all(root.join(PUBLISHED)).expect("Ironic's HTTP root");
        let server = MediaServer::start_dir(root);
        let port = server.addr().port();
        IronicHttp {
            root: root.to_owned(),
            port,
            _server: server,
        }
    }
}

/// The test's side of a published file: where it lies and the URL Ironic fetches it from.
#[derive(Debug, Clone)]
pub struct Published {
    /// `http://127.0.0.1:PORT/lab/NAME`.
    pub url: String,
    /// The same file as the node reaches it (`http_url`), and Ironic too, through its proxy.
    pub node_url: String,
    /// Its SHA-256, hex.
    pub sha256: String,
}

impl Lab {
    fn ironic_http(&self) -> &IronicHttp {
        self.ironic
            .as_ref()
            .expect("an Ironic lab (LabOptions.peer = Peer::Ironic)")
    }

    /// Ironic's HTTP root (`[deploy] http_root`).
    pub fn ironic_http_root(&self) -> PathBuf {
        self.ironic_http().root.clone()
    }

    /// Copies `from` into Ironic's HTTP root as `lab/NAME`; returns its host URL and SHA-256.
    pub fn publish(&self, name: &str, from: &Path) -> Published {
        let http = self.ironic_http();
        let to = http.root.join(PUBLISHED).join(name);
        std::fs::copy(from, &to)
            .unwrap_or_else(|e| panic!("copying {} to {}: {e}", from.display(), to.display()));
        let bytes = std::fs::read(&to).expect("reading back a published file");
        Published {
            url: format!("http://127.0.0.1:{}/{PUBLISHED}/{name}", http.port),
            node_url: format!("http://{GUEST_MEDIA}/{PUBLISHED}/{name}"),
            sha256: hex::encode(sha2::Sha256::digest(&bytes)),
        }
    }

    /// Writes `ironic.conf`, creates the database and starts `ironic`; returns when its API
    /// answers.
    pub(super) fn start_ironic(&mut self, options: &LabOptions) {
        let dir = self.dir.path().to_owned();
        let http_port = self.ironic_http().port;
        let http_root = self.ironic_http().root.clone();

        // mkisofs is xorrisofs here (Debian's xorriso; Ironic runs `mkisofs` by name).
        let tools = dir.join("ironic-bin");
        std::fs::create_dir_all(&tools).expect("ironic-bin");
        let xorrisofs = which("xorrisofs")
            .expect("xorrisofs is missing (fix: apt-get install xorriso; scripts/setup does)");
        std::os::unix::fs::symlink(xorrisofs, tools.join("mkisofs")).expect("mkisofs link");

        // The ESP image for UEFI ISOs.
        let esp = dir.join("esp.img");
        let out = Command::new(bin("vmdeploy-image-build"))
            .arg("esp")
            .arg("-o")
            .arg(&esp)
            .output()
            .expect("running vmdeploy-image-build esp");
        assert!(
            out.status.success(),
            "vmdeploy-image-build esp: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let esp = self.publish("esp.img", &esp);

        let logs = dir.join("ironic-deploy-logs");
        let config = ironic_conf(&IronicConf {
            api_port: self.api_port,
            database: &dir.join("ironic.sqlite"),
            lock_dir: &dir.join("ironic-locks"),
            http_root: &http_root,
            http_port,
            esp_url: &esp.url,
            callback_timeout_secs: options.callback_timeout_secs,
            deploy_logs: &logs,
        });
        let conf_path = dir.join("ironic.conf");
        std::fs::write(&conf_path, config).expect("writing ironic.conf");

        let path = crate::ironic_standalone::ironic_path(&[&tools]);
        crate::ironic_standalone::create_schema(&conf_path, &path)
            .unwrap_or_else(|e| panic!("{e:#}"));

        let log = dir.join("conductor.log");
        let child = crate::ironic_standalone::ironic_command(&conf_path, &path, &log)
            .unwrap_or_else(|e| panic!("{e:#}"))
            // Ironic checks the image URL it hands the agent (`http_url`, the node's view) with
            // a HEAD request of its own; the host has no route to the node's network, so its
            // HTTP traffic goes through the HTTP root's server, which answers proxy requests by
            // their path, as a router between a conductor and its provisioning network would.
            // Loopback (the BMC, the published images) goes direct.
            .env("http_proxy", format!("http://127.0.0.1:{http_port}"))
            .env("no_proxy", "127.0.0.1,localhost")
            .env_remove("NO_PROXY")
            .spawn()
            .expect("starting ironic (fix: scripts/setup installs Ironic into the venv)");
        // Ironic leads its own process group: the lab's end stops its workers with it.
        self.conductor = Some(super::wait_api(
            crate::child::ChildGuard::new(child).killing_group(),
            "ironic",
            self.api_port,
            &log,
            120,
        ));
        // The conductor side registers a moment after the API listens: wait for the driver.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.baremetal(&["driver", "list", "-f", "value", "-c", "name"]);
            if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("redfish") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "Ironic lists no redfish driver within 60 s: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Enrolls a `redfish` node on the emulated iLO 5 with our deploy kernel and ramdisk, a port
    /// with the node's MAC, automated cleaning off (a test turns it on where it wants it), and
    /// brings it to `available`; returns its UUID.
    pub fn enroll_redfish(&self, name: &str, firmware: Firmware) -> String {
        let iso = crate::deploy_iso::deploy_iso_build();
        let kernel = self.publish("deploy.kernel", &iso.kernel);
        let ramdisk = self.publish("deploy.initramfs", &iso.initramfs);
        let driver_info = [
            format!("redfish_address=https://{}", self.ilo),
            "redfish_system_id=/redfish/v1/Systems/1".to_owned(),
            format!("redfish_username={ILO_USER}"),
            format!("redfish_password={ILO_PASSWORD}"),
            format!("redfish_verify_ca={}", self.ilo_cert.display()),
            format!("deploy_kernel={}", kernel.url),
            format!("deploy_ramdisk={}", ramdisk.url),
        ];
        let interfaces = [
            ("--boot-interface", "redfish-virtual-media"),
            ("--deploy-interface", "direct"),
        ];
        let uuid = self.node_create(
            name,
            "redfish",
            &interfaces,
            &driver_info,
            "console=ttyS0,115200 ",
            firmware,
        );
        self.bm(&["node", "set", &uuid, "--no-automated-clean"]);
        self.add_port_and_provide(&uuid);
        uuid
    }

    /// Sets the node's instance to the raw whole-disk image `image`, checked by its SHA-256,
    /// with `download` as its `image_download_source`: `local`, Ironic fetches it and serves
    /// its copy to the agent; `http`, the agent fetches it from the source itself (Ironic still
    /// reads it first, to check it).
    pub fn set_ironic_whole_disk_image(&self, node: &str, image: &Published, download: &str) {
        let source = match download {
            "http" => &image.node_url,
            _ => &image.url,
        };
        self.bm(&[
            "node",
            "set",
            node,
            "--instance-info",
            &format!("image_download_source={download}"),
            "--instance-info",
            &format!("image_source={source}"),
            "--instance-info",
            "image_disk_format=raw",
            "--instance-info",
            "image_os_hash_algo=sha256",
            "--instance-info",
            &format!("image_os_hash_value={}", image.sha256),
        ]);
    }

    /// Ironic's deploy logs (`[agent] deploy_logs_local_path`): the tarballs our agent's
    /// `log.collect_system_logs` returned, by file name.
    pub fn ironic_deploy_logs(&self) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = std::fs::read_dir(self.dir.path().join("ironic-deploy-logs"))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        found.sort();
        found
    }
}

/// What `ironic.conf` is made of.
struct IronicConf<'a> {
    api_port: u16,
    database: &'a Path,
    lock_dir: &'a Path,
    http_root: &'a Path,
    http_port: u16,
    esp_url: &'a str,
    callback_timeout_secs: u64,
    deploy_logs: &'a Path,
}

/// `ironic.conf` for a standalone Ironic in the lab; every setting says why it is there.
fn ironic_conf(c: &IronicConf<'_>) -> String {
    format!(
        "[DEFAULT]
auth_strategy = noauth
rpc_transport = none
host = vmdeploy-lab
use_stderr = true
enabled_hardware_types = redfish
enabled_boot_interfaces = redfish-virtual-media
enabled_deploy_interfaces = direct
enabled_power_interfaces = redfish
enabled_management_interfaces = redfish
enabled_inspect_interfaces = no-inspect
enabled_network_interfaces = noop
default_network_interface = noop
enabled_raid_interfaces = no-raid
enabled_bios_interfaces = no-bios
enabled_vendor_interfaces = no-vendor
enabled_firmware_interfaces = no-firmware
enabled_console_interfaces = no-console
enabled_rescue_interfaces = no-rescue
# Debian's isolinux package puts it here, not where Ironic looks by default.
isolinux_bin = /usr/lib/ISOLINUX/isolinux.bin
# Where our ESP's GRUB reads its configuration on an ISO labelled VMEDIA_BOOT_ISO.
grub_config_path = boot/grub/grub.cfg

[api]
host_ip = 127.0.0.1
port = {api_port}

[database]
connection = sqlite:///{database}

[oslo_concurrency]
lock_path = {lock_dir}

[dhcp]
dhcp_provider = none

[service_catalog]
# The ipa-api-url on the ramdisk's command line: the API as the node reaches it.
endpoint_override = http://{GUEST_API}

[deploy]
http_root = {http_root}
# The agent downloads images from here (the lab's media address, forwarded to http_root).
http_url = http://{GUEST_MEDIA}
# The BMC fetches the ISOs from here.
external_http_url = http://127.0.0.1:{http_port}
# Cleaning runs erase_devices_metadata only (priority 99); a full erase of a sparse test disk
# would only cost time.
erase_devices_priority = 0

[agent]
# Ironic fetches http images itself, converts them to raw if needed and serves them from
# http_url: the node cannot reach the host's loopback where the test publishes them.
image_download_source = local
deploy_logs_collect = always
deploy_logs_storage_backend = local
deploy_logs_local_path = {deploy_logs}

[conductor]
bootloader = {esp_url}
deploy_callback_timeout = {timeout}
clean_callback_timeout = {timeout}
",
        api_port = c.api_port,
        database = c.database.display(),
        lock_dir = c.lock_dir.display(),
        http_root = c.http_root.display(),
        http_port = c.http_port,
        esp_url = c.esp_url,
        timeout = c.callback_timeout_secs,
        deploy_logs = c.deploy_logs.display(),
    )
}

/// The full path of `tool` on `PATH`.
fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(tool))
            .find(|p| p.is_file())
    })
}
