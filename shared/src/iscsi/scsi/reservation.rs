//! Persistent reservation wire formats (SPC-4 §6.13, §6.14): the PERSISTENT RESERVE OUT
//! parameter list and the PERSISTENT RESERVE IN parameter data. The state machine lives with the
//! target; this is the byte layout both ends agree on.

use super::codes::{asc, pr_type};
use super::{be32, be64, Sense};

/// Length of the basic PERSISTENT RESERVE OUT parameter list (SPC-4 §6.14.3).
pub const PR_OUT_BASIC_LEN: u32 = 24;

/// The basic PERSISTENT RESERVE OUT parameter list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrOutParameters {
    /// RESERVATION KEY: the key the sending I_T nexus is registered with (0 when it is not).
    pub key: u64,
    /// SERVICE ACTION RESERVATION KEY: the new key (REGISTER) or the key to preempt (PREEMPT).
    pub service_action_key: u64,
    /// SPEC_I_PT: register other initiator ports too.
    pub specify_initiator_ports: bool,
    /// ALL_TG_PT: register through every target port.
    pub all_target_ports: bool,
    /// APTPL: keep registrations across power loss.
    pub persist_through_power_loss: bool,
}

impl PrOutParameters {
    /// Parses the parameter list of a service action that carries the basic list. A length other
    /// than 24 is a PARAMETER LIST LENGTH ERROR (SPC-4 §6.14.3; SPEC_I_PT lists are longer, and
    /// this target does not accept them).
    pub fn parse(data: &[u8]) -> Result<Self, Sense> {
        if data.len() != PR_OUT_BASIC_LEN as usize {
            return Err(Sense::illegal_request(asc::PARAMETER_LIST_LENGTH_ERROR));
        }
        Ok(Self {
            key: be64(&data[0..8]),
            service_action_key: be64(&data[8..16]),
            specify_initiator_ports: data[20] & 0x08 != 0,
            all_target_ports: data[20] & 0x04 != 0,
            persist_through_power_loss: data[20] & 0x01 != 0,
        })
    }

    /// The 24-byte list (for initiators and tests).
    pub fn encode(&self) -> [u8; 24] {
        let mut out = [0u8; 24];
        out[0..8].copy_from_slice(&self.key.to_be_bytes());
        out[8..16].copy_from_slice(&self.service_action_key.to_be_bytes());
        out[20] = u8::from(self.specify_initiator_ports) << 3
            | u8::from(self.all_target_ports) << 2
            | u8::from(self.persist_through_power_loss);
        out
    }
}

/// READ KEYS parameter data (SPC-4 §6.13.2): generation, then one 8-byte key per registration.
pub fn read_keys(generation: u32, keys: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + 8 * keys.len());
    out.extend_from_slice(&generation.to_be_bytes());
    let len = u32::try_from(8 * keys.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    for k in keys {
        out.extend_from_slice(&k.to_be_bytes());
    }
    out
}

/// READ RESERVATION parameter data (SPC-4 §6.13.3): the holder's key (0 for the all-registrants
/// types) and the type, scope LU_SCOPE.
pub fn read_reservation(generation: u32, reservation: Option<(u64, u8)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(24);
    out.extend_from_slice(&generation.to_be_bytes());
    match reservation {
        None => out.extend_from_slice(&0u32.to_be_bytes()),
        Some((key, kind)) => {
            out.extend_from_slice(&16u32.to_be_bytes());
            out.extend_from_slice(&key.to_be_bytes());
            out.extend_from_slice(&[0; 4]); // obsolete
            out.push(0); // reserved
            out.push(kind & 0x0f); // scope 0: logical unit
            out.extend_from_slice(&[0; 2]); // obsolete
        }
    }
    out
}

/// REPORT CAPABILITIES parameter data (SPC-4 §6.13.4), 8 bytes: no SPEC_I_PT, no ALL_TG_PT, no
/// APTPL (nothing outlives the agent), CRH 0; type mask valid with every type of SPC-4; ALLOW
/// COMMANDS 0 (the table in §5.13 applies as written).
pub fn report_capabilities() -> [u8; 8] {
    let mut out = [0u8; 8];
    out[1] = 8;
    out[3] = 0x80; // TMV: the type mask is valid
    let mask = type_mask_bit(pr_type::WRITE_EXCLUSIVE)
        | type_mask_bit(pr_type::EXCLUSIVE_ACCESS)
        | type_mask_bit(pr_type::WRITE_EXCLUSIVE_RO)
        | type_mask_bit(pr_type::EXCLUSIVE_ACCESS_RO)
        | type_mask_bit(pr_type::WRITE_EXCLUSIVE_AR)
        | type_mask_bit(pr_type::EXCLUSIVE_ACCESS_AR);
    out[4..6].copy_from_slice(&mask.to_be_bytes());
    out
}

/// The PERSISTENT RESERVATION TYPE MASK bit of a type (SPC-4 table 173): byte 4 holds
/// WR_EX_AR(7) EX_AC_RO(6) WR_EX_RO(5) EX_AC(3) WR_EX(1); byte 5 bit 0 is EX_AC_AR.
fn type_mask_bit(kind: u8) -> u16 {
    match kind {
        pr_type::EXCLUSIVE_ACCESS_AR => 0x0001,
        k if k < 8 => 1 << (8 + k),
        _ => 0,
    }
}

/// One entry of READ FULL STATUS (SPC-4 §6.13.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FullStatusEntry {
    /// The registration's key.
    pub key: u64,
    /// Whether this registrant holds the reservation.
    pub holder: bool,
    /// The reservation type when `holder`.
    pub kind: u8,
    /// RELATIVE TARGET PORT IDENTIFIER.
    pub relative_target_port: u16,
    /// The initiator port's TransportID (SPC-4 §7.6.4.6, iSCSI format).
    pub transport_id: Vec<u8>,
}

/// READ FULL STATUS parameter data.
pub fn read_full_status(generation: u32, entries: &[FullStatusEntry]) -> Vec<u8> {
    let mut body = Vec::new();
    for e in entries {
        body.extend_from_slice(&e.key.to_be_bytes());
        body.extend_from_slice(&[0; 4]);
        body.push(u8::from(e.holder)); // R_HOLDER; ALL_TG_PT 0
        body.push(if e.holder { e.kind & 0x0f } else { 0 });
        body.extend_from_slice(&[0; 4]);
        body.extend_from_slice(&e.relative_target_port.to_be_bytes());
        let len = u32::try_from(e.transport_id.len()).unwrap_or(u32::MAX);
        body.extend_from_slice(&len.to_be_bytes());
        body.extend_from_slice(&e.transport_id);
    }
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(&generation.to_be_bytes());
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend(body);
    out
}

/// An iSCSI initiator port TransportID (SPC-4 §7.6.4.6, format 01b): the name, ",i,0x", the ISID
/// in hex, NUL-padded to a multiple of 4.
pub fn iscsi_transport_id(initiator: &str, isid: &[u8; 6]) -> Vec<u8> {
    let hex: String = isid.iter().map(|b| format!("{b:02x}")).collect();
    let mut name = format!("{initiator},i,0x{hex}").into_bytes();
    name.push(0);
    while !name.len().is_multiple_of(4) {
        name.push(0);
    }
    let mut out = Vec::with_capacity(4 + name.len());
    out.push(0x40 | 0x05); // format 01b, protocol identifier 5 (iSCSI)
    out.push(0);
    out.extend_from_slice(&u16::try_from(name.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.extend(name);
    out
}

/// Parses READ KEYS data into (generation, keys), for initiators and tests.
pub fn parse_read_keys(data: &[u8]) -> Result<(u32, Vec<u64>), super::ScsiError> {
    super::need(data, 8, "READ KEYS data")?;
    let len = usize::try_from(be32(&data[4..8])).unwrap_or(usize::MAX);
    let keys = data[8..].chunks_exact(8).take(len / 8).map(be64).collect();
    Ok((be32(&data[0..4]), keys))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_round_trip_and_check_length() {
        let p = PrOutParameters {
            key: 0x1122_3344_5566_7788,
            service_action_key: 42,
            specify_initiator_ports: false,
            all_target_ports: true,
            persist_through_power_loss: true,
        };
        assert_eq!(PrOutParameters::parse(&p.encode()), Ok(p));
        for len in [0usize, 8, 23, 25, 32] {
            let sense = PrOutParameters::parse(&vec![0u8; len]).expect_err("bad length");
            assert_eq!((sense.asc, sense.ascq), asc::PARAMETER_LIST_LENGTH_ERROR);
        }
    }

    #[test]
    fn read_keys_round_trips() {
        let data = read_keys(7, &[1, 0xdead_beef]);
        assert_eq!(data.len(), 24);
        assert_eq!(parse_read_keys(&data), Ok((7, vec![1, 0xdead_beef])));
        assert!(parse_read_keys(&data[..5]).is_err());
    }

    #[test]
    fn capabilities_mask_has_every_type() {
        let caps = report_capabilities();
        assert_eq!(u16::from_be_bytes([caps[0], caps[1]]), 8);
        // WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX in byte 4; EX_AC_AR in byte 5.
        assert_eq!(caps[4], 0x80 | 0x40 | 0x20 | 0x08 | 0x02);
        assert_eq!(caps[5], 0x01);
    }

    #[test]
    fn reservation_data_has_key_and_type() {
        let d = read_reservation(3, Some((9, pr_type::WRITE_EXCLUSIVE)));
        assert_eq!(d.len(), 24);
        assert_eq!(be32(&d[4..8]), 16);
        assert_eq!(be64(&d[8..16]), 9);
        assert_eq!(d[21], pr_type::WRITE_EXCLUSIVE);
        assert_eq!(read_reservation(3, None).len(), 8);
    }

    #[test]
    fn transport_id_is_padded() {
        let t = iscsi_transport_id("iqn.x", &[0x80, 0, 0, 0, 0, 1]);
        assert_eq!(t[0], 0x45);
        assert_eq!((t.len() - 4) % 4, 0);
        assert!(t[4..].starts_with(b"iqn.x,i,0x800000000001\0"));
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40)) {
            let _ = PrOutParameters::parse(&data);
            let _ = parse_read_keys(&data);
        }
    }
}
