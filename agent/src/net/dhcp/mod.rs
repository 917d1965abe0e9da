//! DHCPv4 client over an AF_PACKET socket (RFC 2131 §4.4: INIT → SELECTING → REQUESTING → BOUND).
//!
//! # Design
//! The interface has no address yet, so the kernel's UDP stack cannot send from 0.0.0.0:68 and
//! receive broadcast replies reliably; the client builds IPv4/UDP itself ([`packet`]) and talks
//! through a `SOCK_DGRAM` packet socket bound to the interface (the kernel adds the Ethernet
//! header; the destination is the broadcast MAC). The message codec is [`message`], pure and
//! property-tested. Retransmission follows RFC 2131 §4.1: 4 s, doubling up to 64 s, each
//! randomised by ±1 s, all bounded by the caller's deadline.
//!
//! # Limitations
//! No renewal (T1/T2): a deploy lasts minutes and the lease time is logged. No DHCPDECLINE after
//! an ARP probe. IPv4 only.

pub mod message;
pub mod packet;

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use message::{DhcpMessage, DhcpOptions, MessageType, OP_BOOTREPLY, PARAMETER_REQUEST_LIST};
use packet::{CLIENT_PORT, SERVER_PORT};

/// First retransmission delay (RFC 2131 §4.1).
const FIRST_RETRANSMIT: Duration = Duration::from_secs(4);
/// Largest retransmission delay (RFC 2131 §4.1).
const MAX_RETRANSMIT: Duration = Duration::from_secs(64);
/// REQUESTs sent without an answer before starting over with DISCOVER.
const MAX_REQUESTS: u32 = 4;

/// What the server granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Our address.
    pub address: Ipv4Addr,
    /// Its prefix length.
    pub prefix_len: u8,
    /// First router (option 3).
    pub gateway: Option<Ipv4Addr>,
    /// DNS servers (option 6).
    pub dns: Vec<Ipv4Addr>,
    /// Lease time in seconds (option 51).
    pub lease_secs: Option<u32>,
    /// The server that granted it (option 54).
    pub server: Ipv4Addr,
}

/// A packet socket bound to one interface, carrying IPv4.
struct PacketSocket {
    fd: OwnedFd,
    ifindex: i32,
}

const ETH_P_IP: u16 = 0x0800;
// linux/if_packet.h
const PACKET_AUXDATA: libc::c_int = 8;
const TP_STATUS_CSUMNOTREADY: u32 = 1 << 3;

/// One received packet.
struct Received {
    len: usize,
    /// False when checksum offload left the UDP checksum unfinished (see [`packet::parse_udp`]).
    checksum_ready: bool,
}

impl PacketSocket {
    fn open(ifindex: i32) -> io::Result<Self> {
        let proto = ETH_P_IP.to_be();
        // SAFETY: plain socket(2) call; the fd is checked, then owned.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                libc::c_int::from(proto),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh, valid descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let addr = Self::link_addr(ifindex, [0; 8], 0);
        // SAFETY: `addr` is a valid sockaddr_ll and its size is passed with it.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const addr).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let on: libc::c_int = 1;
        // SAFETY: setsockopt with a valid int option value and its size.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_AUXDATA,
                (&raw const on).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd, ifindex })
    }

    fn link_addr(ifindex: i32, addr: [u8; 8], halen: u8) -> libc::sockaddr_ll {
        libc::sockaddr_ll {
            sll_family: libc::AF_PACKET as libc::c_ushort,
            sll_protocol: ETH_P_IP.to_be(),
            sll_ifindex: ifindex,
            sll_hatype: 0,
            sll_pkttype: 0,
            sll_halen: halen,
            sll_addr: addr,
        }
    }

    /// Sends an IPv4 packet to the Ethernet broadcast address.
    fn send_broadcast(&self, packet: &[u8]) -> io::Result<()> {
        let dest = Self::link_addr(self.ifindex, [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0], 6);
        // SAFETY: the buffer and `dest` are valid for the call; their lengths are passed.
        let rc = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                packet.as_ptr().cast(),
                packet.len(),
                0,
                (&raw const dest).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Receives one packet, waiting at most until `until`; `None` on timeout.
    fn recv_until(&self, buf: &mut [u8], until: Instant) -> io::Result<Option<Received>> {
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = libc::c_int::try_from(left.as_millis().max(1)).unwrap_or(libc::c_int::MAX);
            // SAFETY: one valid pollfd for the call.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(err);
            }
            if rc == 0 {
                continue;
            }
            return match self.recv_with_status(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => other.map(Some),
            };
        }
    }

    /// recvmsg(2) with the PACKET_AUXDATA control message: `(length, checksum_ready)`.
    fn recv_with_status(&self, buf: &mut [u8]) -> io::Result<Received> {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // u64 elements keep the control buffer aligned for cmsghdr.
        let mut control = [0u64; 16];
        // SAFETY: msghdr is plain old data; zeroed is valid, then the pointers are filled in.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: `msg` points at `iov` (into `buf`) and `control`, all alive for the call.
        let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut checksum_ready = true;
        // SAFETY: CMSG_FIRSTHDR/CMSG_NXTHDR walk the control buffer the kernel filled, bounded by
        // msg_controllen; the auxdata payload is at least 4 bytes (tp_status comes first).
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_PACKET && (*cmsg).cmsg_type == PACKET_AUXDATA {
                    let status = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<u32>());
                    checksum_ready = status & TP_STATUS_CSUMNOTREADY == 0;
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        Ok(Received {
            len: n as usize,
            checksum_ready,
        })
    }
}

/// A small xorshift generator seeded from /dev/urandom (xid and jitter need unpredictability
/// between clients, not cryptographic strength).
struct Jitter(u64);

impl Jitter {
    fn new(mac: [u8; 6]) -> Self {
        let mut seed = [0u8; 8];
        let from_urandom = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| io::Read::read_exact(&mut f, &mut seed))
            .is_ok();
        let mut state = u64::from_ne_bytes(seed);
        if !from_urandom {
            // No /dev yet: mix the MAC and the clock so two nodes still differ.
            let mut mixed = [0u8; 8];
            mixed[..6].copy_from_slice(&mac);
            state = u64::from_ne_bytes(mixed)
                ^ u64::from(std::process::id())
                ^ crate::logging::uptime().as_nanos() as u64;
        }
        Self(state | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `base` randomised by ±1 s (RFC 2131 §4.1).
    fn around(&mut self, base: Duration) -> Duration {
        let offset_ms = (self.next() % 2001) as i64 - 1000;
        let ms = (base.as_millis() as i64 + offset_ms).max(500);
        Duration::from_millis(ms as u64)
    }
}

/// Runs DISCOVER → OFFER → REQUEST → ACK on interface `ifindex` (MAC `mac`) until `deadline`.
pub fn obtain_lease(ifindex: i32, mac: [u8; 6], deadline: Instant) -> anyhow::Result<Lease> {
    let socket = PacketSocket::open(ifindex).context("opening a packet socket for DHCP")?;
    let mut rng = Jitter::new(mac);
    let started = Instant::now();
    let client_id: Vec<u8> = std::iter::once(1).chain(mac).collect();
    let mut offers_seen = 0u32;
    let mut naks = 0u32;
    loop {
        let xid = rng.next() as u32;
        let secs = || u16::try_from(started.elapsed().as_secs()).unwrap_or(u16::MAX);
        // SELECTING: DISCOVER until an OFFER.
        let discover = |secs: u16| {
            DhcpMessage::request(
                xid,
                mac,
                secs,
                DhcpOptions {
                    message_type: Some(MessageType::Discover),
                    parameter_request_list: PARAMETER_REQUEST_LIST.to_vec(),
                    client_id: Some(client_id.clone()),
                    ..Default::default()
                },
            )
        };
        let offer = exchange(
            &socket,
            &mut rng,
            deadline,
            u32::MAX,
            xid,
            mac,
            |_| discover(secs()),
            |m| m.options.message_type == Some(MessageType::Offer),
        )?;
        let Some(offer) = offer else {
            anyhow::bail!(
                "no DHCP offer within {:?} (DISCOVERs sent with xid {xid:#010x}; {offers_seen} offers, {naks} NAKs before)",
                deadline.saturating_duration_since(started)
            );
        };
        offers_seen += 1;
        let Some(server) = offer.options.server_id else {
            tracing::warn!(xid, "DHCP offer without a server identifier: ignored");
            continue;
        };
        tracing::info!(offered = %offer.yiaddr, %server, "DHCP offer");
        // REQUESTING: REQUEST until ACK or NAK.
        let request = DhcpMessage::request(
            xid,
            mac,
            secs(),
            DhcpOptions {
                message_type: Some(MessageType::Request),
                requested_ip: Some(offer.yiaddr),
                server_id: Some(server),
                parameter_request_list: PARAMETER_REQUEST_LIST.to_vec(),
                client_id: Some(client_id.clone()),
                ..Default::default()
            },
        );
        let reply = exchange(
            &socket,
            &mut rng,
            deadline,
            MAX_REQUESTS,
            xid,
            mac,
            |_| request.clone(),
            |m| {
                matches!(
                    m.options.message_type,
                    Some(MessageType::Ack | MessageType::Nak)
                ) && m.options.server_id.is_none_or(|id| id == server)
            },
        )?;
        match reply {
            Some(ack) if ack.options.message_type == Some(MessageType::Ack) => {
                return lease_from_ack(&ack, server);
            }
            Some(_) => {
                naks += 1;
                tracing::warn!(%server, "DHCP NAK: starting over");
            }
            None if Instant::now() >= deadline => {
                anyhow::bail!("no DHCP ACK from {server} before the timeout")
            }
            None => tracing::warn!(%server, "no answer to DHCP REQUEST: starting over"),
        }
    }
}

/// Sends `build(attempt)` and waits for a reply `accept` takes, retransmitting with backoff,
/// at most `max_sends` times or until `deadline`. Replies for other xids/clients are skipped.
#[allow(clippy::too_many_arguments)]
fn exchange(
    socket: &PacketSocket,
    rng: &mut Jitter,
    deadline: Instant,
    max_sends: u32,
    xid: u32,
    mac: [u8; 6],
    build: impl Fn(u16) -> DhcpMessage,
    accept: impl Fn(&DhcpMessage) -> bool,
) -> anyhow::Result<Option<DhcpMessage>> {
    let mut delay = FIRST_RETRANSMIT;
    let mut buf = vec![0u8; 2048];
    for attempt in 0..max_sends {
        if Instant::now() >= deadline {
            return Ok(None);
        }
        let msg = build(u16::try_from(attempt).unwrap_or(u16::MAX));
        let ip_packet = packet::build_udp(
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::BROADCAST,
            CLIENT_PORT,
            SERVER_PORT,
            rng.next() as u16,
            &msg.encode(),
        );
        socket
            .send_broadcast(&ip_packet)
            .context("sending a DHCP message")?;
        tracing::debug!(xid, attempt, kind = ?msg.options.message_type, "DHCP sent");
        let until = (Instant::now() + rng.around(delay)).min(deadline);
        delay = (delay * 2).min(MAX_RETRANSMIT);
        while let Some(got) = socket
            .recv_until(&mut buf, until)
            .context("receiving DHCP replies")?
        {
            let Some(reply) = parse_reply(&buf[..got.len], got.checksum_ready, xid, mac) else {
                continue;
            };
            if accept(&reply) {
                return Ok(Some(reply));
            }
        }
    }
    Ok(None)
}

/// A BOOTREPLY for our xid and MAC, or `None` for anything else on the wire.
fn parse_reply(bytes: &[u8], checksum_ready: bool, xid: u32, mac: [u8; 6]) -> Option<DhcpMessage> {
    let datagram = packet::parse_udp(bytes, checksum_ready).ok()?;
    if datagram.dst_port != CLIENT_PORT || datagram.src_port != SERVER_PORT {
        return None;
    }
    let msg = match DhcpMessage::decode(datagram.payload) {
        Ok(msg) => msg,
        Err(e) => {
            tracing::debug!(error = %e, "ignoring a malformed DHCP reply");
            return None;
        }
    };
    (msg.op == OP_BOOTREPLY && msg.xid == xid && msg.chaddr[..6] == mac).then_some(msg)
}

/// The lease an ACK grants. Without option 1 the classful default mask is used (RFC 2131 leaves
/// the mask to the server; every server we know sends it).
pub fn lease_from_ack(ack: &DhcpMessage, server: Ipv4Addr) -> anyhow::Result<Lease> {
    let address = ack.yiaddr;
    anyhow::ensure!(
        !address.is_unspecified() && !address.is_broadcast(),
        "DHCP ACK gives no usable address ({address})"
    );
    let prefix_len = match ack.options.subnet_mask {
        Some(mask) => super::config::mask_to_prefix(mask)
            .ok_or_else(|| anyhow::anyhow!("DHCP ACK has a non-contiguous subnet mask {mask}"))?,
        None => match address.octets()[0] {
            0..=127 => 8,
            128..=191 => 16,
            _ => 24,
        },
    };
    Ok(Lease {
        address,
        prefix_len,
        gateway: ack.options.routers.first().copied(),
        dns: ack.options.dns.clone(),
        lease_secs: ack.options.lease_time,
        server,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(kind: MessageType, xid: u32, mac: [u8; 6], options: DhcpOptions) -> Vec<u8> {
        let mut msg = DhcpMessage::request(
            xid,
            mac,
            0,
            DhcpOptions {
                message_type: Some(kind),
                ..options
            },
        );
        msg.op = OP_BOOTREPLY;
        msg.yiaddr = Ipv4Addr::new(10, 9, 0, 50);
        packet::build_udp(
            Ipv4Addr::new(10, 9, 0, 1),
            Ipv4Addr::BROADCAST,
            SERVER_PORT,
            CLIENT_PORT,
            1,
            &msg.encode(),
        )
    }

    #[test]
    fn replies_for_other_clients_are_skipped() {
        let mac = [2, 0, 0, 0, 0, 1];
        let ours = reply(MessageType::Offer, 7, mac, DhcpOptions::default());
        assert!(parse_reply(&ours, true, 7, mac).is_some());
        assert!(parse_reply(&ours, true, 8, mac).is_none(), "other xid");
        assert!(
            parse_reply(&ours, true, 7, [2, 0, 0, 0, 0, 2]).is_none(),
            "other MAC"
        );
        assert!(
            parse_reply(&ours[..30], true, 7, mac).is_none(),
            "truncated"
        );
    }

    #[test]
    fn ack_gives_the_lease() {
        let mac = [2, 0, 0, 0, 0, 1];
        let bytes = reply(
            MessageType::Ack,
            7,
            mac,
            DhcpOptions {
                subnet_mask: Some(Ipv4Addr::new(255, 255, 255, 0)),
                routers: vec![Ipv4Addr::new(10, 9, 0, 1), Ipv4Addr::new(10, 9, 0, 2)],
                dns: vec![Ipv4Addr::new(10, 9, 0, 53)],
                lease_time: Some(3600),
                ..Default::default()
            },
        );
        let ack = parse_reply(&bytes, true, 7, mac).expect("ours");
        let lease = lease_from_ack(&ack, Ipv4Addr::new(10, 9, 0, 1)).expect("lease");
        assert_eq!(lease.address, Ipv4Addr::new(10, 9, 0, 50));
        assert_eq!(lease.prefix_len, 24);
        assert_eq!(lease.gateway, Some(Ipv4Addr::new(10, 9, 0, 1)));
        assert_eq!(lease.dns, vec![Ipv4Addr::new(10, 9, 0, 53)]);
        assert_eq!(lease.lease_secs, Some(3600));
    }

    #[test]
    fn jitter_stays_within_a_second() {
        let mut rng = Jitter::new([1; 6]);
        for _ in 0..1000 {
            let d = rng.around(FIRST_RETRANSMIT);
            assert!(
                d >= Duration::from_secs(3) && d <= Duration::from_secs(5),
                "{d:?}"
            );
        }
    }
}
