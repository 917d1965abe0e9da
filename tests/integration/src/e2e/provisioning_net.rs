//! A real layer-2 provisioning network for a `pxe_ilo` lab: the node's NIC on a bridge with
//! Debian's dnsmasq as the DHCP server, and the conductor's TFTP, HTTP and API listeners on that
//! network, as on a site's provisioning LAN.
//!
//! # Layout
//! ```text
//!  host (the test, the conductor)            network namespace vmdpxe-<pid>-<n>
//!  ┌──────────────────────────────┐          ┌────────────────────────────────────────┐
//!  │ vpx<pid>-<n>  10.213.X.1/24 ─┼── veth ──┼─ uplink ─┐                             │
//!  │  conductor: TFTP :69, HTTP,  │          │          br0 10.213.X.2/24 ─ dnsmasq    │
//!  │  API (the agent's callbacks) │          │  tap0 ───┘   (DHCP only, no DNS)        │
//!  └──────────────────────────────┘          │   └─ QEMU (the emulator runs it here)   │
//!                                            └────────────────────────────────────────┘
//! ```
//! The node's QEMU runs in the namespace (`ilo-emulator --qemu-netns`) with its NIC on the tap,
//! so its DHCP broadcasts reach only dnsmasq, and it reaches the conductor at 10.213.X.1 over
//! the veth, which is also where the conductor reaches the agent's iSCSI target.
//!
//! # DHCP
//! dnsmasq answers with the README's example configuration (boot file by client architecture,
//! the master iPXE script's URL to clients that run iPXE), with one change: QEMU's only PXE
//! ROM *is* iPXE, so a node whose MAC the test tags `pxe-rom` ([`ProvisioningNet::boot_as_pxe_rom`])
//! is answered as a plain PXE ROM is (PXELINUX for BIOS, GRUB's network image for UEFI). The
//! tags live in dnsmasq's `dhcp-hostsdir`, which it re-reads when a file appears there.
//!
//! # Clean-up
//! Everything made here goes on drop, on every path (a panic unwinds through the drop): dnsmasq
//! is killed, the namespace deleted (which deletes the bridge, the tap and both veth ends). A
//! run that was killed outright leaves its namespace behind; the next start deletes every
//! `vmdpxe-<pid>-*` namespace whose process is gone, and kills what still runs in it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::child::ChildGuard;

/// The prefix of the namespaces this module makes.
const NETNS_PREFIX: &str = "vmdpxe-";
/// The tap interface QEMU's NIC is on, inside the namespace.
pub const TAP: &str = "tap0";
/// The first and last addresses dnsmasq hands out (host part).
const DHCP_RANGE: (u8, u8) = (100, 199);

static LABS: AtomicUsize = AtomicUsize::new(0);

/// A provisioning network, removed on drop.
pub struct ProvisioningNet {
    /// The namespace QEMU runs in (`ip netns add`).
    pub netns: String,
    /// The host's end of the veth: the conductor's address on the network.
    pub server_ip: Ipv4Addr,
    host_if: String,
    dir: PathBuf,
    dnsmasq: Option<ChildGuard>,
}

/// `ip ARGS`, which must succeed.
fn ip(args: &[&str]) {
    let out = crate::tools::tool("ip", "iproute2", args);
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// `ip ARGS`, whose failure is only reported (clean-up goes on).
fn ip_quiet(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Kills every process left in namespace `name`, then deletes it.
fn delete_netns(name: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
        let pids = String::from_utf8_lossy(&out.stdout).into_owned();
        let pids: Vec<&str> = pids.split_whitespace().collect();
        if !pids.is_empty() {
            let _ = Command::new("kill")
                .arg("-KILL")
                .args(&pids)
                .stderr(Stdio::null())
                .status();
        }
    }
    if !ip_quiet(&["netns", "delete", name]) {
        eprintln!("provisioning network: could not delete network namespace {name}");
    }
}

/// Deletes the namespaces of earlier runs whose process is gone (a run killed outright).
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(NETNS_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            eprintln!("provisioning network: deleting {name}, left by a run that is gone");
            delete_netns(&name);
        }
    }
}

/// dnsmasq's configuration: DHCP only, on `br0`, the boot files of the README's example (with
/// the lab's `pxe-rom` tag, see the module's documentation).
fn dnsmasq_config(dir: &Path, subnet: [u8; 3], server: Ipv4Addr, http_url: &str) -> String {
    let [a, b, c] = subnet;
    let (first, last) = DHCP_RANGE;
    format!(
        "# vmdeploy e2e provisioning network (tests/integration/src/e2e/provisioning_net.rs)\n\
         port=0\n\
         interface=br0\n\
         bind-interfaces\n\
         dhcp-authoritative\n\
         dhcp-range={a}.{b}.{c}.{first},{a}.{b}.{c}.{last},255.255.255.0,1h\n\
         dhcp-leasefile={leases}\n\
         dhcp-hostsdir={hosts}\n\
         log-dhcp\n\
         log-facility={log}\n\
         dhcp-match=set:ipxe,175\n\
         dhcp-match=set:efi64,option:client-arch,7\n\
         dhcp-match=set:efi64,option:client-arch,9\n\
         # A plain PXE ROM: one that is not iPXE, or a node tagged pxe-rom.\n\
         tag-if=set:pxe,tag:!ipxe\n\
         tag-if=set:pxe,tag:pxe-rom\n\
         dhcp-boot=tag:!pxe,{http_url}/boot.ipxe\n\
         dhcp-boot=tag:pxe,tag:efi64,grubnetx64.efi,,{server}\n\
         dhcp-boot=tag:pxe,tag:!efi64,pxelinux.0,,{server}\n",
        leases = dir.join("leases").display(),
        hosts = dir.join("hosts").display(),
        log = dir.join("dnsmasq.log").display(),
    )
}

impl ProvisioningNet {
    /// Makes the namespace, the bridge, the tap and the veth, and starts dnsmasq. `dir` holds
    /// dnsmasq's files; `http_port` is the conductor's netboot HTTP port on
    /// [`ProvisioningNet::server_ip`].
    pub fn start(dir: &Path, http_port: u16) -> ProvisioningNet {
        // Missing, it fails here with the package to install, before anything is made.
        crate::tools::tool("dnsmasq", "dnsmasq-base", &["--version"]);
        sweep_stale();
        let pid = std::process::id();
        let n = LABS.fetch_add(1, Ordering::SeqCst);
        let netns = format!("{NETNS_PREFIX}{pid}-{n}");
        let host_if = format!("vpx{pid}-{n}");
        // 10.213.X.0/24, X from the pid and the lab's number, so that two runs at once do not
        // share a subnet.
        let x = u8::try_from((pid as usize).wrapping_mul(7).wrapping_add(n) % 250 + 1)
            .expect("below 251");
        let subnet = [10, 213, x];
        let server_ip = Ipv4Addr::new(10, 213, x, 1);
        std::fs::create_dir_all(dir.join("hosts")).expect("dnsmasq's hosts directory");

        ip(&["netns", "add", &netns]);
        // From here the value exists, so a failed step still removes what was made.
        let mut net = ProvisioningNet {
            netns,
            server_ip,
            host_if,
            dir: dir.to_path_buf(),
            dnsmasq: None,
        };
        let ns = net.netns.clone();
        let host_if = net.host_if.clone();
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", "uplink", "netns", &ns,
        ]);
        ip(&["addr", "add", &format!("{server_ip}/24"), "dev", &host_if]);
        ip(&["link", "set", &host_if, "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        // STP off (the default) puts ports straight into forwarding.
        ip(&["-n", &ns, "link", "add", "br0", "type", "bridge"]);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("10.213.{x}.2/24"),
            "dev",
            "br0",
        ]);
        ip(&["-n", &ns, "link", "set", "uplink", "master", "br0", "up"]);
        ip(&["-n", &ns, "tuntap", "add", "dev", TAP, "mode", "tap"]);
        ip(&["-n", &ns, "link", "set", TAP, "master", "br0", "up"]);
        ip(&["-n", &ns, "link", "set", "br0", "up"]);

        let http_url = format!("http://{server_ip}:{http_port}");
        let config = dir.join("dnsmasq.conf");
        std::fs::write(&config, dnsmasq_config(dir, subnet, server_ip, &http_url))
            .expect("writing dnsmasq.conf");
        let child = Command::new("ip")
            .args(["netns", "exec", &ns, "dnsmasq", "--keep-in-foreground"])
            .arg(format!("--conf-file={}", config.display()))
            .arg(format!("--pid-file={}", dir.join("dnsmasq.pid").display()))
            // Its lease and log files are the test's, in a directory only root writes.
            .arg("--user=root")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(dir.join("dnsmasq.stderr")).expect("dnsmasq's stderr file"),
            )
            .spawn()
            .unwrap_or_else(|e| panic!("starting dnsmasq: {e}"));
        let mut child = ChildGuard::new(child).with_log("dnsmasq", &dir.join("dnsmasq.log"));
        // Up when it logs that DHCP is on; an exit before that is a configuration it refused.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if net.dnsmasq_log().contains("DHCP, IP range") {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "dnsmasq exited ({status}): {}{}",
                    std::fs::read_to_string(dir.join("dnsmasq.stderr")).unwrap_or_default(),
                    net.dnsmasq_log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "dnsmasq did not start DHCP within 20 s: {}",
                net.dnsmasq_log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        net.dnsmasq = Some(child);
        eprintln!(
            "provisioning network: {} ({server_ip}/24 on {}), dnsmasq on br0",
            net.netns, net.host_if
        );
        net
    }

    /// Answers the NIC `mac` as a plain PXE ROM from now on (PXELINUX or GRUB's network image
    /// from the conductor's TFTP server), not as iPXE (the master script over HTTP).
    pub fn boot_as_pxe_rom(&self, mac: &str) {
        let file = self.dir.join("hosts").join(mac.replace(':', "-"));
        // Written beside the directory, so dnsmasq never sees it half-written.
        let tmp = self.dir.join("host.tmp");
        std::fs::write(&tmp, format!("{mac},set:pxe-rom\n")).expect("writing a dnsmasq host");
        // Renamed into place: dnsmasq reads the file when it appears, whole.
        std::fs::rename(&tmp, &file).expect("placing a dnsmasq host");
        // dnsmasq reads the directory on inotify; wait until it says so.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.dnsmasq_log().contains(&file.display().to_string()) {
            assert!(
                Instant::now() < deadline,
                "dnsmasq did not read {} within 10 s: {}",
                file.display(),
                self.dnsmasq_log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// dnsmasq's log so far (`log-dhcp`: every request, the tags it matched, the boot file).
    pub fn dnsmasq_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("dnsmasq.log")).unwrap_or_default()
    }

    /// The boot files dnsmasq named in its offers and acks to `mac`'s PXE ROM or loader (a
    /// request whose vendor class starts `PXEClient`; the deploy ramdisk's own DHCP client
    /// gets the same fields and is left out), one per reply, in order.
    pub fn boot_files_sent(&self, mac: &str) -> Vec<String> {
        boot_files_in_log(&self.dnsmasq_log(), mac)
    }
}

/// [`ProvisioningNet::boot_files_sent`] on the text of dnsmasq's `log-dhcp` log: each line is
/// `... dnsmasq-dhcp[PID]: XID WHAT`, and a request's lines share its transaction id. The boot
/// file is logged as `bootfile name: NAME` (BOOTP's `file` field) or as option 67 when the
/// client asked for it (`sent size: N option: 67 bootfile-name  NAME`).
fn boot_files_in_log(log: &str, mac: &str) -> Vec<String> {
    let mac = mac.to_lowercase();
    let mut pxe_client = std::collections::HashSet::new();
    let mut to_mac = std::collections::HashSet::new();
    let mut files = Vec::new();
    for line in log.lines() {
        let Some((_, rest)) = line.split_once("]: ") else {
            continue;
        };
        let Some((xid, what)) = rest.split_once(' ') else {
            continue;
        };
        if what.starts_with("vendor class: PXEClient") {
            pxe_client.insert(xid.to_owned());
        } else if (what.starts_with("DHCPOFFER") || what.starts_with("DHCPACK"))
            && what.to_lowercase().contains(&mac)
        {
            to_mac.insert(xid.to_owned());
        } else if !(pxe_client.contains(xid) && to_mac.contains(xid)) {
            continue;
        } else if let Some(name) = what.strip_prefix("bootfile name: ") {
            files.push(name.trim().to_owned());
        } else if let Some((_, name)) = what.split_once("option: 67 bootfile-name") {
            files.push(name.trim().to_owned());
        }
    }
    files
}

impl Drop for ProvisioningNet {
    fn drop(&mut self) {
        self.dnsmasq.take();
        delete_netns(&self.netns);
        // The veth pair goes with the namespace; this is for a start that failed half-way.
        let _ = ip_quiet(&["link", "delete", &self.host_if]);
        let gone = !Path::new("/run/netns").join(&self.netns).exists()
            && !Path::new("/sys/class/net").join(&self.host_if).exists();
        if !gone {
            eprintln!(
                "provisioning network: {} or {} is still there after clean-up",
                self.netns, self.host_if
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_files_are_read_per_pxe_request_from_the_dhcp_log() {
        // Shaped as dnsmasq 2.90 logs them (log-dhcp); the third request is the ramdisk's.
        let log = "\
Dec  7 20:30:16 dnsmasq-dhcp[1]: 11 vendor class: PXEClient:Arch:00007:UNDI:003010
Dec  7 20:30:16 dnsmasq-dhcp[1]: 11 user class: iPXE
Dec  7 20:30:19 dnsmasq-dhcp[1]: 11 DHCPOFFER(br0) 10.213.68.187 2c:76:8a:5a:30:11 
Dec  7 20:30:19 dnsmasq-dhcp[1]: 11 sent size: 35 option: 67 bootfile-name  http://h:1/boot.ipxe
Dec  7 20:30:20 dnsmasq-dhcp[1]: 12 vendor class: PXEClient:Arch:00000:UNDI:002001
Dec  7 20:30:20 dnsmasq-dhcp[1]: 12 DHCPACK(br0) 10.213.68.187 2c:76:8a:5a:30:11 
Dec  7 20:30:20 dnsmasq-dhcp[1]: 12 bootfile name: pxelinux.0
Dec  7 20:30:30 dnsmasq-dhcp[1]: 13 DHCPACK(br0) 10.213.68.187 2c:76:8a:5a:30:11 
Dec  7 20:30:30 dnsmasq-dhcp[1]: 13 bootfile name: pxelinux.0
Dec  7 20:30:31 dnsmasq-dhcp[1]: 14 vendor class: PXEClient:Arch:00000:UNDI:002001
Dec  7 20:30:31 dnsmasq-dhcp[1]: 14 DHCPACK(br0) 10.213.68.188 2c:76:8a:5a:30:12 
Dec  7 20:30:31 dnsmasq-dhcp[1]: 14 bootfile name: pxelinux.0
";
        assert_eq!(
            boot_files_in_log(log, "2C:76:8A:5A:30:11"),
            ["http://h:1/boot.ipxe", "pxelinux.0"]
        );
        assert!(boot_files_in_log(log, "52:54:00:00:00:01").is_empty());
    }

    #[test]
    fn the_dnsmasq_config_names_the_boot_files_by_architecture_and_rom() {
        let c = dnsmasq_config(
            Path::new("/d"),
            [10, 213, 5],
            Ipv4Addr::new(10, 213, 5, 1),
            "http://10.213.5.1:8080",
        );
        for line in [
            "port=0",
            "dhcp-range=10.213.5.100,10.213.5.199,255.255.255.0,1h",
            "dhcp-hostsdir=/d/hosts",
            "dhcp-boot=tag:!pxe,http://10.213.5.1:8080/boot.ipxe",
            "dhcp-boot=tag:pxe,tag:efi64,grubnetx64.efi,,10.213.5.1",
            "dhcp-boot=tag:pxe,tag:!efi64,pxelinux.0,,10.213.5.1",
        ] {
            assert!(c.lines().any(|l| l == line), "{line} missing:\n{c}");
        }
    }
}
