//! Serial number arithmetic (RFC 1982), as RFC 7143 §4.2.2.1 requires for every CmdSN and StatSN
//! comparison: the counters wrap at 2^32.

/// `a < b` in serial number arithmetic (RFC 1982, as RFC 7143 §4.2.2.1 requires for CmdSN and
/// StatSN comparisons).
pub fn sn_lt(a: u32, b: u32) -> bool {
    a != b && (b.wrapping_sub(a) as i32) > 0
}

/// `a <= b` in serial number arithmetic.
pub fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comparisons_wrap() {
        assert!(sn_lt(1, 2));
        assert!(sn_lt(u32::MAX, 0), "wraps");
        assert!(!sn_lt(2, 1));
        assert!(!sn_lt(5, 5));
        assert!(sn_le(5, 5));
        assert!(sn_le(u32::MAX - 1, 3), "wraps");
        assert!(!sn_le(3, u32::MAX - 1));
    }
}
