//! Logical unit numbers as the BHS carries them (SAM-2 §4.9).

/// A logical unit number in SAM-2 form, as the 8 bytes carried in the BHS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Lun(pub [u8; 8]);

impl Lun {
    /// The 8-byte form of LUN `n`: peripheral addressing below 256, flat space addressing up to
    /// 16383 (SAM-2 §4.9.6, the forms Linux's `int_to_scsilun` produces).
    pub fn from_number(n: u16) -> Lun {
        let mut bytes = [0u8; 8];
        if n < 256 {
            bytes[1] = n as u8;
        } else {
            let n = n & 0x3fff;
            bytes[0] = 0x40 | (n >> 8) as u8;
            bytes[1] = (n & 0xff) as u8;
        }
        Lun(bytes)
    }

    /// The LUN number of a single-level peripheral or flat-space address; `None` for other forms.
    pub fn number(&self) -> Option<u16> {
        if self.0[2..].iter().any(|&b| b != 0) {
            return None;
        }
        match self.0[0] >> 6 {
            0b00 if self.0[0] == 0 => Some(u16::from(self.0[1])),
            0b01 => Some((u16::from(self.0[0] & 0x3f) << 8) | u16::from(self.0[1])),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peripheral_and_flat_addressing() {
        assert_eq!(Lun::from_number(1).0, [0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Lun::from_number(300).0, [0x41, 0x2c, 0, 0, 0, 0, 0, 0]);
        for n in [0u16, 1, 255, 256, 16383] {
            assert_eq!(Lun::from_number(n).number(), Some(n));
        }
        assert_eq!(Lun([0x80, 0, 0, 0, 0, 0, 0, 0]).number(), None);
    }
}
