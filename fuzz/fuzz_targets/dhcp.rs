//! DHCP replies as the agent's client receives them from a packet socket: the IPv4/UDP framing
//! (`net::dhcp::packet::parse_udp`) and the BOOTP message with its options
//! (`net::dhcp::message::DhcpMessage::decode`), then the lease read from an ACK
//! (`lease_from_ack`). Both layers have encoders: what decodes must encode and decode the same.
//!
//! The first byte chooses: bit 0 set, the rest is a whole IPv4 packet (bit 1: verify the UDP
//! checksum); clear, the rest is the UDP payload.
#![no_main]

use std::net::Ipv4Addr;

use libfuzzer_sys::fuzz_target;
use vmdeploy_agent::net::dhcp::lease_from_ack;
use vmdeploy_agent::net::dhcp::message::DhcpMessage;
use vmdeploy_agent::net::dhcp::packet::{build_udp, parse_udp};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let payload = if mode & 1 == 1 {
        match parse_udp(rest, mode & 2 != 0) {
            Ok(d) => {
                assert!(
                    d.payload.len() + 28 <= rest.len(),
                    "payload past the packet"
                );
                let again = build_udp(d.src, d.dst, d.src_port, d.dst_port, 1, d.payload);
                let reparsed = parse_udp(&again, true).expect("a built packet parses");
                assert_eq!(reparsed, d, "UDP round trip");
                d.payload
            }
            Err(e) => {
                assert!(!e.to_string().is_empty());
                return;
            }
        }
    } else {
        rest
    };
    match DhcpMessage::decode(payload) {
        Ok(msg) => {
            let wire = msg.encode();
            assert_eq!(
                DhcpMessage::decode(&wire).as_ref(),
                Ok(&msg),
                "DHCP round trip"
            );
            if let Ok(lease) = lease_from_ack(&msg, Ipv4Addr::new(10, 0, 0, 1)) {
                let _ = format!("{lease:?}");
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
