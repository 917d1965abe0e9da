//! DHCP-less deploy, end to end: an `agent_ilo` deploy whose node
//! carries Ironic's `network_data` with a static address in QEMU's user network. The floppy
//! hands the address to the agent, which must configure it without asking DHCP.
//!
//! QEMU's user network has no switch to turn its DHCP server off, so the emulator captures the
//! node's frames (`--qemu-capture-net`, one pcap per QEMU run) and the test checks that the node
//! sent no DHCP request (UDP to port 67) yet did talk from the static address.

use std::time::Duration;

use sha2::{Digest, Sha256};
use vmdeploy_integration_tests::e2e::{Firmware, Lab, LabOptions};

/// The node's static address in slirp's 10.0.2.0/24 (DHCP would hand out 10.0.2.15).
const STATIC_IP: [u8; 4] = [10, 0, 2, 50];

/// A raw disk image whose boot sector prints `marker` on COM1 and powers the machine off.
fn boot_sector_image(marker: &str) -> Vec<u8> {
    // xor ax,ax; mov ds,ax; mov dx,0x3f8; mov si,0x7c1d; lodsb; test al,al; jz +3; out dx,al;
    // jmp -8; mov dx,0x604; mov ax,0x2000; out dx,ax (q35 ACPI power-off); cli; hlt; jmp -4.
    let mut mbr = vec![
        0x31, 0xC0, 0x8E, 0xD8, 0xBA, 0xF8, 0x03, 0xBE, 0x1D, 0x7C, 0xAC, 0x84, 0xC0, 0x74, 0x03,
        0xEE, 0xEB, 0xF8, 0xBA, 0x04, 0x06, 0xB8, 0x00, 0x20, 0xEF, 0xFA, 0xF4, 0xEB, 0xFC,
    ];
    mbr.extend_from_slice(format!("\r\n{marker}\r\n\0").as_bytes());
    mbr.resize(510, 0);
    mbr.extend_from_slice(&[0x55, 0xAA]);
    mbr.resize(1 << 20, 0);
    mbr
}

#[test]
fn e2e_dhcpless_static_network_data() {
    let marker = "E2E-DHCPLESS-MARKER";
    let image = boot_sector_image(marker);
    let sha = hex::encode(Sha256::digest(&image));
    let lab = Lab::start(
        "e2e_dhcpless_static_network_data",
        LabOptions {
            media: vec![("/img.raw".into(), image)],
            capture_net: true,
            // The conductor reaches the agent through host forwards to the static address.
            guest_ip: Some(STATIC_IP.map(|o| o.to_string()).join(".")),
            ..Default::default()
        },
    );
    let node = lab.enroll("dhcpless", "agent_ilo", Firmware::Bios);
    let mac = lab.emulator_state()["machine"]["mac"]
        .as_str()
        .expect("the emulator names the node's MAC")
        .to_owned();
    let ip = STATIC_IP.map(|o| o.to_string()).join(".");
    let network_data = serde_json::json!({
        "links": [{"id": "port0", "type": "phy", "ethernet_mac_address": mac}],
        "networks": [{
            "id": "net0", "type": "ipv4", "link": "port0",
            "ip_address": ip, "netmask": "255.255.255.0",
            "routes": [{"network": "0.0.0.0", "netmask": "0.0.0.0", "gateway": "10.0.2.2"}],
        }],
        "services": [{"type": "dns", "address": "10.0.2.3"}],
    });
    let network_data = network_data.to_string();
    lab.set_whole_disk_image(
        &node,
        &lab.guest_media_url("/img.raw"),
        "raw",
        &sha,
        &["--network-data", &network_data],
    );
    assert_eq!(
        lab.show(&node)["network_data"]["networks"][0]["ip_address"],
        ip.as_str(),
        "the API keeps network_data"
    );
    lab.bm(&["node", "deploy", &node]);
    lab.wait_state(&node, "active", Duration::from_secs(400));
    lab.wait_console(marker, 1, Duration::from_secs(180));

    let console = lab.console();
    assert!(
        console
            .lines()
            .any(|l| l.contains("static configuration") && l.contains(&ip)),
        "the agent's console shows no static configuration of {ip}"
    );
    assert!(
        !console.contains("DHCP lease"),
        "the agent took a DHCP lease"
    );

    // Every QEMU run's capture: no DHCP from the node at all; the ramdisk's run talked from
    // the static address.
    let mut pcaps: Vec<_> = std::fs::read_dir(lab.qemu_server_dir())
        .expect("the emulator's server directory")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| n.starts_with("net-") && n.ends_with(".pcap"))
        })
        .collect();
    pcaps.sort();
    assert!(!pcaps.is_empty(), "no net-<run>.pcap written");
    let mut from_static = 0;
    for path in &pcaps {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let frames = pcap::frames(&data).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut dhcp = 0;
        let mut mine = 0;
        for frame in &frames {
            let Some(ip) = pcap::ipv4(frame) else {
                continue;
            };
            if ip.protocol == 17 && ip.dst_port == Some(67) {
                dhcp += 1;
            }
            if ip.src == STATIC_IP {
                mine += 1;
            }
        }
        eprintln!(
            "{}: {} frames, {mine} from {ip}, {dhcp} DHCP requests",
            path.display(),
            frames.len()
        );
        assert_eq!(dhcp, 0, "{}: the node asked DHCP", path.display());
        from_static += mine;
    }
    assert!(
        from_static > 0,
        "no frame from {ip} in any capture: {pcaps:?}"
    );
}

/// Just enough of the pcap format (libpcap, Ethernet) to read the node's IPv4 frames.
mod pcap {
    /// The frames of a pcap file, in order.
    pub fn frames(data: &[u8]) -> Result<Vec<&[u8]>, String> {
        let header = data.get(..24).ok_or("shorter than a pcap header")?;
        let magic = [header[0], header[1], header[2], header[3]];
        // Microsecond or nanosecond timestamps, either byte order.
        let little = match magic {
            [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => true,
            [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => false,
            other => return Err(format!("not a pcap file (magic {other:02x?})")),
        };
        let u32_at = |b: &[u8], at: usize| {
            let bytes = [b[at], b[at + 1], b[at + 2], b[at + 3]];
            if little {
                u32::from_le_bytes(bytes)
            } else {
                u32::from_be_bytes(bytes)
            }
        };
        let link_type = u32_at(header, 20);
        if link_type != 1 {
            return Err(format!("link type {link_type}, not Ethernet"));
        }
        let mut frames = Vec::new();
        let mut at = 24;
        while at < data.len() {
            let record = data
                .get(at..at + 16)
                .ok_or_else(|| format!("a record header cut off at byte {at}"))?;
            let len = u32_at(record, 8) as usize;
            let frame = data
                .get(at + 16..at + 16 + len)
                .ok_or_else(|| format!("a frame of {len} bytes cut off at byte {at}"))?;
            frames.push(frame);
            at += 16 + len;
        }
        Ok(frames)
    }

    /// What the test looks at in an IPv4 packet.
    pub struct Ipv4 {
        pub src: [u8; 4],
        pub protocol: u8,
        /// UDP or TCP destination port.
        pub dst_port: Option<u16>,
    }

    /// The IPv4 packet of an Ethernet frame (one 802.1Q tag skipped), if it is one.
    pub fn ipv4(frame: &[u8]) -> Option<Ipv4> {
        let mut ether_type = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
        let mut at = 14;
        if ether_type == 0x8100 {
            ether_type = u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?]);
            at = 18;
        }
        if ether_type != 0x0800 {
            return None;
        }
        let ip = frame.get(at..)?;
        let ihl = usize::from(*ip.first()? & 0x0f) * 4;
        let protocol = *ip.get(9)?;
        let src = [*ip.get(12)?, *ip.get(13)?, *ip.get(14)?, *ip.get(15)?];
        let dst_port = match protocol {
            6 | 17 => Some(u16::from_be_bytes([*ip.get(ihl + 2)?, *ip.get(ihl + 3)?])),
            _ => None,
        };
        Some(Ipv4 {
            src,
            protocol,
            dst_port,
        })
    }
}
