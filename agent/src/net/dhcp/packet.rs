//! IPv4 + UDP framing for DHCP over a packet socket (the interface has no address yet, so the
//! kernel's UDP stack cannot be used): build (RFC 791 header, RFC 768 checksum with the pseudo
//! header) and parse with every length and checksum checked. Pure, no I/O.

use std::net::Ipv4Addr;

/// DHCP server port (RFC 2131 §4.1).
pub const SERVER_PORT: u16 = 67;
/// DHCP client port.
pub const CLIENT_PORT: u16 = 68;

const IPV4_HEADER_LEN: usize = 20;
const UDP_HEADER_LEN: usize = 8;
const PROTO_UDP: u8 = 17;
const DEFAULT_TTL: u8 = 64;

/// Why a received packet is not a UDP datagram for us.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// Shorter than an IPv4 header, or its lengths run past the end.
    #[error("truncated IPv4/UDP packet")]
    Truncated,
    /// Not IPv4, or an IPv4 header length below 20.
    #[error("not an IPv4 packet")]
    NotIpv4,
    /// Not UDP.
    #[error("not UDP (protocol {0})")]
    NotUdp(u8),
    /// A fragment (DHCP replies fit in one packet; reassembly is not worth it).
    #[error("IPv4 fragment")]
    Fragment,
    /// Header or UDP checksum mismatch.
    #[error("bad {0} checksum")]
    BadChecksum(&'static str),
}

/// A received UDP datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpDatagram<'a> {
    /// IPv4 source.
    pub src: Ipv4Addr,
    /// IPv4 destination.
    pub dst: Ipv4Addr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
    /// Payload.
    pub payload: &'a [u8],
}

/// RFC 1071 one's-complement sum, folded; `initial` carries a previous partial sum.
fn ones_complement_sum(data: &[u8], initial: u32) -> u32 {
    let mut sum = initial;
    let mut chunks = data.chunks_exact(2);
    for pair in &mut chunks {
        sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

fn finish_checksum(sum: u32) -> u16 {
    !(sum as u16)
}

fn pseudo_header_sum(src: Ipv4Addr, dst: Ipv4Addr, udp_len: u16) -> u32 {
    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&src.octets());
    pseudo[4..8].copy_from_slice(&dst.octets());
    pseudo[9] = PROTO_UDP;
    pseudo[10..12].copy_from_slice(&udp_len.to_be_bytes());
    ones_complement_sum(&pseudo, 0)
}

/// Builds an IPv4 packet carrying one UDP datagram (DF set, TTL 64, `id` as given).
/// Payloads must fit one packet (a DHCP message is ~300 bytes).
pub fn build_udp(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    src_port: u16,
    dst_port: u16,
    id: u16,
    payload: &[u8],
) -> Vec<u8> {
    let udp_len =
        u16::try_from(UDP_HEADER_LEN + payload.len()).expect("DHCP payloads are far below 64 KiB");
    let total_len = udp_len + IPV4_HEADER_LEN as u16;
    let mut p = Vec::with_capacity(usize::from(total_len));
    // IPv4 header (RFC 791 §3.1): version 4, IHL 5.
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&total_len.to_be_bytes());
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(&0x4000u16.to_be_bytes()); // DF, offset 0
    p.extend_from_slice(&[DEFAULT_TTL, PROTO_UDP, 0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    let header_sum = finish_checksum(ones_complement_sum(&p[..IPV4_HEADER_LEN], 0));
    p[10..12].copy_from_slice(&header_sum.to_be_bytes());
    // UDP header (RFC 768).
    p.extend_from_slice(&src_port.to_be_bytes());
    p.extend_from_slice(&dst_port.to_be_bytes());
    p.extend_from_slice(&udp_len.to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    let sum = ones_complement_sum(&p[IPV4_HEADER_LEN..], pseudo_header_sum(src, dst, udp_len));
    // RFC 768: a computed zero is sent as all ones (zero means "no checksum").
    let udp_sum = match finish_checksum(sum) {
        0 => 0xffff,
        s => s,
    };
    p[IPV4_HEADER_LEN + 6..IPV4_HEADER_LEN + 8].copy_from_slice(&udp_sum.to_be_bytes());
    p
}

/// Parses an IPv4 packet carrying UDP, checking lengths and both checksums. `verify_udp_checksum`
/// is false when the kernel says the checksum is not filled in yet (checksum offload: a packet
/// socket on a veth or a NIC with TX offload sees TP_STATUS_CSUMNOTREADY packets whose UDP
/// checksum field holds only the pseudo-header sum; packet(7) PACKET_AUXDATA).
pub fn parse_udp(packet: &[u8], verify_udp_checksum: bool) -> Result<UdpDatagram<'_>, PacketError> {
    if packet.len() < IPV4_HEADER_LEN {
        return Err(PacketError::Truncated);
    }
    if packet[0] >> 4 != 4 {
        return Err(PacketError::NotIpv4);
    }
    let header_len = usize::from(packet[0] & 0x0f) * 4;
    if header_len < IPV4_HEADER_LEN {
        return Err(PacketError::NotIpv4);
    }
    let total_len = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
    if total_len < header_len || total_len > packet.len() {
        return Err(PacketError::Truncated);
    }
    // The link layer may pad short frames: everything after total_len is ignored.
    let packet = &packet[..total_len];
    if finish_checksum(ones_complement_sum(&packet[..header_len], 0)) != 0 {
        return Err(PacketError::BadChecksum("IPv4 header"));
    }
    let frag = u16::from_be_bytes([packet[6], packet[7]]);
    if frag & 0x2000 != 0 || frag & 0x1fff != 0 {
        return Err(PacketError::Fragment);
    }
    if packet[9] != PROTO_UDP {
        return Err(PacketError::NotUdp(packet[9]));
    }
    let src = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
    let dst = Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]);
    let udp = &packet[header_len..];
    if udp.len() < UDP_HEADER_LEN {
        return Err(PacketError::Truncated);
    }
    let udp_len = u16::from_be_bytes([udp[4], udp[5]]);
    if usize::from(udp_len) < UDP_HEADER_LEN || usize::from(udp_len) > udp.len() {
        return Err(PacketError::Truncated);
    }
    let udp = &udp[..usize::from(udp_len)];
    let carried = u16::from_be_bytes([udp[6], udp[7]]);
    if verify_udp_checksum
        && carried != 0
        && finish_checksum(ones_complement_sum(
            udp,
            pseudo_header_sum(src, dst, udp_len),
        )) != 0
    {
        return Err(PacketError::BadChecksum("UDP"));
    }
    Ok(UdpDatagram {
        src,
        dst,
        src_port: u16::from_be_bytes([udp[0], udp[1]]),
        dst_port: u16::from_be_bytes([udp[2], udp[3]]),
        payload: &udp[UDP_HEADER_LEN..],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(
            src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(),
            sp in any::<u16>(), dp in any::<u16>(), id in any::<u16>(),
            payload in proptest::collection::vec(any::<u8>(), 0..600),
            padding in proptest::collection::vec(any::<u8>(), 0..30),
        ) {
            let mut p = build_udp(src.into(), dst.into(), sp, dp, id, &payload);
            p.extend_from_slice(&padding);
            let d = parse_udp(&p, true).expect("a built packet parses");
            prop_assert_eq!(d.src, Ipv4Addr::from(src));
            prop_assert_eq!(d.dst, Ipv4Addr::from(dst));
            prop_assert_eq!((d.src_port, d.dst_port), (sp, dp));
            prop_assert_eq!(d.payload, &payload[..]);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_udp(&bytes, true);
            let _ = parse_udp(&bytes, false);
        }

        #[test]
        fn a_flipped_bit_is_caught(
            payload in proptest::collection::vec(any::<u8>(), 1..100),
            bit in 0usize..8, at in any::<proptest::sample::Index>(),
        ) {
            let mut p = build_udp(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::BROADCAST, 67, 68, 7, &payload);
            let i = at.index(p.len());
            // A flip that zeroes the UDP checksum field means "no checksum" (RFC 768): skip it.
            let udp_sum = IPV4_HEADER_LEN + 6;
            let mut zeroed = p.clone();
            zeroed[i] ^= 1 << bit;
            prop_assume!(!(i >= udp_sum && i < udp_sum + 2 && zeroed[udp_sum..udp_sum + 2] == [0, 0]));
            p[i] ^= 1 << bit;
            prop_assert!(parse_udp(&p, true).map(|d| d.payload.to_vec()) != Ok(payload));
        }
    }

    #[test]
    fn header_checksum_matches_a_known_packet() {
        // RFC 1071-style check against a header computed by hand (Wikipedia's IPv4 example).
        let header = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(finish_checksum(ones_complement_sum(&header, 0)), 0xb861);
    }
}
