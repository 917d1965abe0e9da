//! The DHCPv4 message (RFC 2131 §2, options RFC 2132): a pure codec, no I/O.
//!
//! # Design
//! Only the options the client uses are typed ([`DhcpOptions`]); others are skipped on parse.
//! Parsing never panics on any input (proptest below): every length is checked before use.
//!
//! # Limitations
//! Option overload (52: options in `sname`/`file`) and long options split over several instances
//! (RFC 3396) are not decoded: the first instance wins. `sname`/`file` are sent as zeros.

use std::net::Ipv4Addr;

/// BOOTREQUEST (client → server).
pub const OP_BOOTREQUEST: u8 = 1;
/// BOOTREPLY (server → client).
pub const OP_BOOTREPLY: u8 = 2;
/// `htype` for Ethernet (RFC 1700 ARP hardware types).
pub const HTYPE_ETHERNET: u8 = 1;
/// The `flags` bit asking the server to broadcast its reply (RFC 2131 §2, figure 2): we have no
/// address yet, so a unicast reply to the offered address could not reach us through the stack.
pub const FLAG_BROADCAST: u16 = 0x8000;
/// RFC 2131 §3: the options field starts with 99.130.83.99.
pub const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];

// Fixed-header offsets (RFC 2131 §2, figure 1).
const OP_OFFSET: usize = 0;
const HTYPE_OFFSET: usize = 1;
const HLEN_OFFSET: usize = 2;
const HOPS_OFFSET: usize = 3;
const XID_OFFSET: usize = 4;
const SECS_OFFSET: usize = 8;
const FLAGS_OFFSET: usize = 10;
const CIADDR_OFFSET: usize = 12;
const YIADDR_OFFSET: usize = 16;
const SIADDR_OFFSET: usize = 20;
const GIADDR_OFFSET: usize = 24;
const CHADDR_OFFSET: usize = 28;
const COOKIE_OFFSET: usize = 236;
const OPTIONS_OFFSET: usize = 240;

// Option codes (RFC 2132).
const OPT_PAD: u8 = 0;
const OPT_SUBNET_MASK: u8 = 1;
const OPT_ROUTER: u8 = 3;
const OPT_DNS: u8 = 6;
const OPT_REQUESTED_IP: u8 = 50;
const OPT_LEASE_TIME: u8 = 51;
const OPT_MESSAGE_TYPE: u8 = 53;
const OPT_SERVER_ID: u8 = 54;
const OPT_PARAMETER_REQUEST_LIST: u8 = 55;
const OPT_CLIENT_ID: u8 = 61;
const OPT_END: u8 = 255;

/// What the client asks for in option 55.
pub const PARAMETER_REQUEST_LIST: [u8; 4] = [OPT_SUBNET_MASK, OPT_ROUTER, OPT_DNS, OPT_LEASE_TIME];

/// Most addresses one option can carry (255 bytes / 4).
pub const MAX_ADDRESSES: usize = 63;

/// Option 53 values (RFC 2132 §9.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    /// DHCPDISCOVER
    Discover,
    /// DHCPOFFER
    Offer,
    /// DHCPREQUEST
    Request,
    /// DHCPDECLINE
    Decline,
    /// DHCPACK
    Ack,
    /// DHCPNAK
    Nak,
    /// DHCPRELEASE
    Release,
    /// DHCPINFORM
    Inform,
}

impl MessageType {
    fn code(self) -> u8 {
        match self {
            Self::Discover => 1,
            Self::Offer => 2,
            Self::Request => 3,
            Self::Decline => 4,
            Self::Ack => 5,
            Self::Nak => 6,
            Self::Release => 7,
            Self::Inform => 8,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Self::Discover,
            2 => Self::Offer,
            3 => Self::Request,
            4 => Self::Decline,
            5 => Self::Ack,
            6 => Self::Nak,
            7 => Self::Release,
            8 => Self::Inform,
            _ => return None,
        })
    }
}

/// The options the client sends or reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DhcpOptions {
    /// 53
    pub message_type: Option<MessageType>,
    /// 1
    pub subnet_mask: Option<Ipv4Addr>,
    /// 3 (first is the default gateway)
    pub routers: Vec<Ipv4Addr>,
    /// 6
    pub dns: Vec<Ipv4Addr>,
    /// 51, seconds
    pub lease_time: Option<u32>,
    /// 54
    pub server_id: Option<Ipv4Addr>,
    /// 50
    pub requested_ip: Option<Ipv4Addr>,
    /// 55
    pub parameter_request_list: Vec<u8>,
    /// 61
    pub client_id: Option<Vec<u8>>,
}

/// A DHCP message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhcpMessage {
    /// [`OP_BOOTREQUEST`] or [`OP_BOOTREPLY`].
    pub op: u8,
    /// Hardware type.
    pub htype: u8,
    /// Hardware address length.
    pub hlen: u8,
    /// Relay hops.
    pub hops: u8,
    /// Transaction id chosen by the client.
    pub xid: u32,
    /// Seconds since the client began.
    pub secs: u16,
    /// [`FLAG_BROADCAST`] and reserved bits.
    pub flags: u16,
    /// Client address (renewing).
    pub ciaddr: Ipv4Addr,
    /// "Your" address: the one offered.
    pub yiaddr: Ipv4Addr,
    /// Next server.
    pub siaddr: Ipv4Addr,
    /// Relay agent.
    pub giaddr: Ipv4Addr,
    /// Client hardware address (16 bytes; the first `hlen` are the MAC).
    pub chaddr: [u8; 16],
    /// Options.
    pub options: DhcpOptions,
}

/// Why a packet is not a DHCP message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DhcpError {
    /// Shorter than the fixed header and cookie.
    #[error("DHCP message too short: {0} bytes")]
    TooShort(usize),
    /// The magic cookie is wrong.
    #[error("DHCP magic cookie missing")]
    NoCookie,
    /// An option's length runs past the end.
    #[error("DHCP option {code} truncated")]
    TruncatedOption {
        /// The option code.
        code: u8,
    },
    /// An option has a length its type cannot have.
    #[error("DHCP option {code} has a bad length {len}")]
    BadOptionLength {
        /// The option code.
        code: u8,
        /// Its length.
        len: usize,
    },
}

fn ip_at(bytes: &[u8], offset: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        bytes[offset],
        bytes[offset + 1],
        bytes[offset + 2],
        bytes[offset + 3],
    )
}

impl DhcpMessage {
    /// A client request (DISCOVER/REQUEST) from `mac`, broadcast flag set.
    pub fn request(xid: u32, mac: [u8; 6], secs: u16, options: DhcpOptions) -> Self {
        let mut chaddr = [0u8; 16];
        chaddr[..6].copy_from_slice(&mac);
        Self {
            op: OP_BOOTREQUEST,
            htype: HTYPE_ETHERNET,
            hlen: 6,
            hops: 0,
            xid,
            secs,
            flags: FLAG_BROADCAST,
            ciaddr: Ipv4Addr::UNSPECIFIED,
            yiaddr: Ipv4Addr::UNSPECIFIED,
            siaddr: Ipv4Addr::UNSPECIFIED,
            giaddr: Ipv4Addr::UNSPECIFIED,
            chaddr,
            options,
        }
    }

    /// Encodes the message (padded to the 300-byte BOOTP minimum some servers expect).
    /// Address lists longer than [`MAX_ADDRESSES`] are cut to fit one option.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; OPTIONS_OFFSET];
        out[OP_OFFSET] = self.op;
        out[HTYPE_OFFSET] = self.htype;
        out[HLEN_OFFSET] = self.hlen;
        out[HOPS_OFFSET] = self.hops;
        out[XID_OFFSET..XID_OFFSET + 4].copy_from_slice(&self.xid.to_be_bytes());
        out[SECS_OFFSET..SECS_OFFSET + 2].copy_from_slice(&self.secs.to_be_bytes());
        out[FLAGS_OFFSET..FLAGS_OFFSET + 2].copy_from_slice(&self.flags.to_be_bytes());
        out[CIADDR_OFFSET..CIADDR_OFFSET + 4].copy_from_slice(&self.ciaddr.octets());
        out[YIADDR_OFFSET..YIADDR_OFFSET + 4].copy_from_slice(&self.yiaddr.octets());
        out[SIADDR_OFFSET..SIADDR_OFFSET + 4].copy_from_slice(&self.siaddr.octets());
        out[GIADDR_OFFSET..GIADDR_OFFSET + 4].copy_from_slice(&self.giaddr.octets());
        out[CHADDR_OFFSET..CHADDR_OFFSET + 16].copy_from_slice(&self.chaddr);
        out[COOKIE_OFFSET..OPTIONS_OFFSET].copy_from_slice(&MAGIC_COOKIE);
        let o = &self.options;
        if let Some(t) = o.message_type {
            put(&mut out, OPT_MESSAGE_TYPE, &[t.code()]);
        }
        if let Some(id) = &o.client_id {
            put(&mut out, OPT_CLIENT_ID, &id[..id.len().min(255)]);
        }
        if let Some(ip) = o.requested_ip {
            put(&mut out, OPT_REQUESTED_IP, &ip.octets());
        }
        if let Some(ip) = o.server_id {
            put(&mut out, OPT_SERVER_ID, &ip.octets());
        }
        if !o.parameter_request_list.is_empty() {
            let list = &o.parameter_request_list;
            put(
                &mut out,
                OPT_PARAMETER_REQUEST_LIST,
                &list[..list.len().min(255)],
            );
        }
        if let Some(mask) = o.subnet_mask {
            put(&mut out, OPT_SUBNET_MASK, &mask.octets());
        }
        put_addresses(&mut out, OPT_ROUTER, &o.routers);
        put_addresses(&mut out, OPT_DNS, &o.dns);
        if let Some(secs) = o.lease_time {
            put(&mut out, OPT_LEASE_TIME, &secs.to_be_bytes());
        }
        out.push(OPT_END);
        if out.len() < 300 {
            out.resize(300, OPT_PAD);
        }
        out
    }

    /// Decodes a message; unknown options are skipped.
    pub fn decode(bytes: &[u8]) -> Result<Self, DhcpError> {
        if bytes.len() < OPTIONS_OFFSET {
            return Err(DhcpError::TooShort(bytes.len()));
        }
        if bytes[COOKIE_OFFSET..OPTIONS_OFFSET] != MAGIC_COOKIE {
            return Err(DhcpError::NoCookie);
        }
        let mut chaddr = [0u8; 16];
        chaddr.copy_from_slice(&bytes[CHADDR_OFFSET..CHADDR_OFFSET + 16]);
        let mut msg = Self {
            op: bytes[OP_OFFSET],
            htype: bytes[HTYPE_OFFSET],
            hlen: bytes[HLEN_OFFSET],
            hops: bytes[HOPS_OFFSET],
            xid: u32::from_be_bytes([
                bytes[XID_OFFSET],
                bytes[XID_OFFSET + 1],
                bytes[XID_OFFSET + 2],
                bytes[XID_OFFSET + 3],
            ]),
            secs: u16::from_be_bytes([bytes[SECS_OFFSET], bytes[SECS_OFFSET + 1]]),
            flags: u16::from_be_bytes([bytes[FLAGS_OFFSET], bytes[FLAGS_OFFSET + 1]]),
            ciaddr: ip_at(bytes, CIADDR_OFFSET),
            yiaddr: ip_at(bytes, YIADDR_OFFSET),
            siaddr: ip_at(bytes, SIADDR_OFFSET),
            giaddr: ip_at(bytes, GIADDR_OFFSET),
            chaddr,
            options: DhcpOptions::default(),
        };
        decode_options(&bytes[OPTIONS_OFFSET..], &mut msg.options)?;
        Ok(msg)
    }
}

fn put(out: &mut Vec<u8>, code: u8, value: &[u8]) {
    out.push(code);
    out.push(u8::try_from(value.len()).expect("callers cut values to 255 bytes"));
    out.extend_from_slice(value);
}

fn put_addresses(out: &mut Vec<u8>, code: u8, list: &[Ipv4Addr]) {
    if list.is_empty() {
        return;
    }
    let bytes: Vec<u8> = list
        .iter()
        .take(MAX_ADDRESSES)
        .flat_map(|ip| ip.octets())
        .collect();
    put(out, code, &bytes);
}

fn decode_options(mut rest: &[u8], o: &mut DhcpOptions) -> Result<(), DhcpError> {
    // Keep the first instance of each option (see Limitations).
    let mut seen = [false; 256];
    while let Some((&code, tail)) = rest.split_first() {
        match code {
            OPT_PAD => {
                rest = tail;
                continue;
            }
            OPT_END => break,
            _ => {}
        }
        let (&len, tail) = tail
            .split_first()
            .ok_or(DhcpError::TruncatedOption { code })?;
        let len = usize::from(len);
        if tail.len() < len {
            return Err(DhcpError::TruncatedOption { code });
        }
        let (value, tail) = tail.split_at(len);
        rest = tail;
        if std::mem::replace(&mut seen[usize::from(code)], true) {
            continue;
        }
        let bad = || DhcpError::BadOptionLength { code, len };
        match code {
            OPT_MESSAGE_TYPE => {
                let [t] = value else { return Err(bad()) };
                o.message_type = MessageType::from_code(*t);
            }
            OPT_SUBNET_MASK => o.subnet_mask = Some(one_address(value).ok_or_else(bad)?),
            OPT_SERVER_ID => o.server_id = Some(one_address(value).ok_or_else(bad)?),
            OPT_REQUESTED_IP => o.requested_ip = Some(one_address(value).ok_or_else(bad)?),
            OPT_ROUTER => o.routers = addresses(value).ok_or_else(bad)?,
            OPT_DNS => o.dns = addresses(value).ok_or_else(bad)?,
            OPT_LEASE_TIME => {
                let secs: [u8; 4] = value.try_into().map_err(|_| bad())?;
                o.lease_time = Some(u32::from_be_bytes(secs));
            }
            OPT_PARAMETER_REQUEST_LIST => o.parameter_request_list = value.to_vec(),
            OPT_CLIENT_ID => o.client_id = Some(value.to_vec()),
            _ => {}
        }
    }
    Ok(())
}

fn one_address(value: &[u8]) -> Option<Ipv4Addr> {
    let octets: [u8; 4] = value.try_into().ok()?;
    Some(Ipv4Addr::from(octets))
}

fn addresses(value: &[u8]) -> Option<Vec<Ipv4Addr>> {
    if value.is_empty() || !value.len().is_multiple_of(4) {
        return None;
    }
    Some(
        value
            .chunks_exact(4)
            .map(|c| Ipv4Addr::new(c[0], c[1], c[2], c[3]))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip() -> impl Strategy<Value = Ipv4Addr> {
        any::<[u8; 4]>().prop_map(Ipv4Addr::from)
    }

    fn message_type() -> impl Strategy<Value = MessageType> {
        (1u8..=8).prop_map(|c| MessageType::from_code(c).expect("1..=8 are all defined"))
    }

    fn options() -> impl Strategy<Value = DhcpOptions> {
        (
            proptest::option::of(message_type()),
            proptest::option::of(ip()),
            proptest::collection::vec(ip(), 0..=MAX_ADDRESSES),
            proptest::collection::vec(ip(), 0..=MAX_ADDRESSES),
            proptest::option::of(any::<u32>()),
            proptest::option::of(ip()),
            proptest::option::of(ip()),
            proptest::collection::vec(any::<u8>(), 0..=255),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..=255)),
        )
            .prop_map(
                |(
                    message_type,
                    subnet_mask,
                    routers,
                    dns,
                    lease_time,
                    server_id,
                    requested_ip,
                    prl,
                    client_id,
                )| {
                    DhcpOptions {
                        message_type,
                        subnet_mask,
                        routers,
                        dns,
                        lease_time,
                        server_id,
                        requested_ip,
                        parameter_request_list: prl,
                        client_id,
                    }
                },
            )
    }

    fn message() -> impl Strategy<Value = DhcpMessage> {
        (
            any::<[u8; 4]>(),
            any::<u32>(),
            any::<u16>(),
            any::<u16>(),
            (ip(), ip(), ip(), ip()),
            any::<[u8; 16]>(),
            options(),
        )
            .prop_map(|(head, xid, secs, flags, (c, y, s, g), chaddr, options)| {
                DhcpMessage {
                    op: head[0],
                    htype: head[1],
                    hlen: head[2],
                    hops: head[3],
                    xid,
                    secs,
                    flags,
                    ciaddr: c,
                    yiaddr: y,
                    siaddr: s,
                    giaddr: g,
                    chaddr,
                    options,
                }
            })
    }

    proptest! {
        #[test]
        fn round_trips(msg in message()) {
            let bytes = msg.encode();
            prop_assert!(bytes.len() >= 300);
            prop_assert_eq!(DhcpMessage::decode(&bytes), Ok(msg));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..700)) {
            let _ = DhcpMessage::decode(&bytes);
        }

        #[test]
        fn garbage_options_after_a_valid_header_never_panic(
            tail in proptest::collection::vec(any::<u8>(), 0..400)
        ) {
            let mut bytes = DhcpMessage::request(1, [2; 6], 0, DhcpOptions::default()).encode();
            bytes.truncate(OPTIONS_OFFSET);
            bytes.extend_from_slice(&tail);
            let _ = DhcpMessage::decode(&bytes);
        }
    }

    #[test]
    fn discover_has_the_fields_rfc_2131_asks_for() {
        let msg = DhcpMessage::request(
            0xdead_beef,
            [0x52, 0x54, 0, 0x12, 0x34, 0x56],
            3,
            DhcpOptions {
                message_type: Some(MessageType::Discover),
                parameter_request_list: PARAMETER_REQUEST_LIST.to_vec(),
                ..Default::default()
            },
        );
        let b = msg.encode();
        assert_eq!(b[0], OP_BOOTREQUEST);
        assert_eq!(&b[4..8], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(&b[10..12], &[0x80, 0]);
        assert_eq!(&b[28..34], &[0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        assert_eq!(&b[236..240], &MAGIC_COOKIE);
        assert_eq!(&b[240..243], &[53, 1, 1]);
        assert_eq!(&b[243..249], &[55, 4, 1, 3, 6, 51]);
        assert_eq!(b[249], OPT_END);
    }

    #[test]
    fn bad_inputs_give_typed_errors() {
        assert_eq!(DhcpMessage::decode(&[0; 10]), Err(DhcpError::TooShort(10)));
        assert_eq!(DhcpMessage::decode(&[0; 300]), Err(DhcpError::NoCookie));
        let mut b = DhcpMessage::request(1, [1; 6], 0, DhcpOptions::default()).encode();
        b.truncate(OPTIONS_OFFSET);
        b.extend_from_slice(&[OPT_ROUTER, 8, 1, 2, 3]);
        assert_eq!(
            DhcpMessage::decode(&b),
            Err(DhcpError::TruncatedOption { code: OPT_ROUTER })
        );
        b.truncate(OPTIONS_OFFSET);
        b.extend_from_slice(&[OPT_SUBNET_MASK, 3, 255, 255, 0, OPT_END]);
        assert_eq!(
            DhcpMessage::decode(&b),
            Err(DhcpError::BadOptionLength {
                code: OPT_SUBNET_MASK,
                len: 3
            })
        );
    }
}
