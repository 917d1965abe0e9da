//! Interface configuration: link flags, IPv4 address and netmask, default route (the socket
//! ioctls themselves are in [`crate::sys::net`]), and the prefix/netmask arithmetic.

use std::io;
use std::net::Ipv4Addr;

pub use crate::sys::net::{add_default_route, set_link_up};

/// Gives `name` the address `ip/prefix_len`.
pub fn set_ipv4_address(name: &str, ip: Ipv4Addr, prefix_len: u8) -> io::Result<()> {
    crate::sys::net::set_ipv4_address(name, ip, prefix_to_mask(prefix_len))
}

/// `24` → 255.255.255.0.
pub fn prefix_to_mask(prefix_len: u8) -> Ipv4Addr {
    let bits = u32::MAX
        .checked_shl(32 - u32::from(prefix_len.min(32)))
        .unwrap_or(0);
    Ipv4Addr::from(bits)
}

/// 255.255.255.0 → `Some(24)`; a non-contiguous mask → `None`.
pub fn mask_to_prefix(mask: Ipv4Addr) -> Option<u8> {
    let bits = u32::from(mask);
    let ones = bits.leading_ones();
    (bits.checked_shl(ones).unwrap_or(0) == 0).then_some(ones as u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn masks_and_prefixes() {
        assert_eq!(prefix_to_mask(0), Ipv4Addr::UNSPECIFIED);
        assert_eq!(prefix_to_mask(24), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(prefix_to_mask(32), Ipv4Addr::BROADCAST);
        assert_eq!(mask_to_prefix(Ipv4Addr::new(255, 255, 240, 0)), Some(20));
        assert_eq!(mask_to_prefix(Ipv4Addr::new(255, 0, 255, 0)), None);
    }

    proptest! {
        #[test]
        fn prefix_mask_round_trip(p in 0u8..=32) {
            prop_assert_eq!(mask_to_prefix(prefix_to_mask(p)), Some(p));
        }
    }
}
