//! Text keys: the `key=value\0` data of Login and Text PDUs (RFC 7143 §6), and the negotiation of
//! the operational keys (RFC 7143 §13) for either side of a connection.
//!
//! # Design
//! [`TextKeys`] is the ordered list of pairs in one (reassembled) text. [`Negotiation`] holds
//! this side's wishes ([`OperationalParams`] as `local`) and the values in force (`result`,
//! starting at the RFC defaults). The proposer calls [`Negotiation::offer`] and feeds the peer's
//! answer to [`Negotiation::receive`]; the acceptor feeds the peer's offer to `receive` and sends
//! back what it returns. Keys that belong to login or discovery (names, `AuthMethod`, `CHAP_*`,
//! `SendTargets`, ...) are left to the caller: `receive` skips them.
//!
//! # Limitations
//! ErrorRecoveryLevel above 0 and more than one connection per session are never offered (both
//! are negotiated with the Minimum function, so a local value of 0/1 keeps them there). Markers
//! (RFC 3720 `IFMarker`/`OFMarker`) are answered `No`.

use thiserror::Error;

mod negotiation;

pub use negotiation::{is_login_or_discovery_key, Negotiation, OperationalParams, Role};

/// Errors in text keys or their negotiation.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum KeysError {
    /// A pair has no `=`.
    #[error("text pair without '=': {0:?}")]
    MissingEquals(String),
    /// A key name is empty, too long or has a character RFC 7143 §6.1 does not allow.
    #[error("invalid key name {0:?}")]
    InvalidKeyName(String),
    /// A value is longer than RFC 7143 §6.1 allows.
    #[error("value of {key} is {len} bytes long, over the limit of {limit}")]
    ValueTooLong {
        /// The key.
        key: String,
        /// The value's length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The text is not UTF-8.
    #[error("text is not UTF-8")]
    NotUtf8,
    /// A value has the wrong form for its key.
    #[error("invalid value for {key}: {value:?}")]
    InvalidValue {
        /// The key.
        key: String,
        /// The value received.
        value: String,
    },
    /// The peer answered with a value the negotiation rules do not allow.
    #[error("peer answered {key}={value}, which the offer {offered:?} does not allow")]
    InvalidAnswer {
        /// The key.
        key: String,
        /// What the peer answered.
        value: String,
        /// What this side offered.
        offered: String,
    },
}

/// Key names (RFC 7143 §13 and §12).
pub mod key {
    /// HeaderDigest.
    pub const HEADER_DIGEST: &str = "HeaderDigest";
    /// DataDigest.
    pub const DATA_DIGEST: &str = "DataDigest";
    /// MaxConnections.
    pub const MAX_CONNECTIONS: &str = "MaxConnections";
    /// SendTargets.
    pub const SEND_TARGETS: &str = "SendTargets";
    /// TargetName.
    pub const TARGET_NAME: &str = "TargetName";
    /// InitiatorName.
    pub const INITIATOR_NAME: &str = "InitiatorName";
    /// TargetAlias.
    pub const TARGET_ALIAS: &str = "TargetAlias";
    /// InitiatorAlias.
    pub const INITIATOR_ALIAS: &str = "InitiatorAlias";
    /// TargetAddress.
    pub const TARGET_ADDRESS: &str = "TargetAddress";
    /// TargetPortalGroupTag.
    pub const TARGET_PORTAL_GROUP_TAG: &str = "TargetPortalGroupTag";
    /// InitialR2T.
    pub const INITIAL_R2T: &str = "InitialR2T";
    /// ImmediateData.
    pub const IMMEDIATE_DATA: &str = "ImmediateData";
    /// MaxRecvDataSegmentLength.
    pub const MAX_RECV_DATA_SEGMENT_LENGTH: &str = "MaxRecvDataSegmentLength";
    /// MaxBurstLength.
    pub const MAX_BURST_LENGTH: &str = "MaxBurstLength";
    /// FirstBurstLength.
    pub const FIRST_BURST_LENGTH: &str = "FirstBurstLength";
    /// DefaultTime2Wait.
    pub const DEFAULT_TIME2WAIT: &str = "DefaultTime2Wait";
    /// DefaultTime2Retain.
    pub const DEFAULT_TIME2RETAIN: &str = "DefaultTime2Retain";
    /// MaxOutstandingR2T.
    pub const MAX_OUTSTANDING_R2T: &str = "MaxOutstandingR2T";
    /// DataPDUInOrder.
    pub const DATA_PDU_IN_ORDER: &str = "DataPDUInOrder";
    /// DataSequenceInOrder.
    pub const DATA_SEQUENCE_IN_ORDER: &str = "DataSequenceInOrder";
    /// ErrorRecoveryLevel.
    pub const ERROR_RECOVERY_LEVEL: &str = "ErrorRecoveryLevel";
    /// SessionType.
    pub const SESSION_TYPE: &str = "SessionType";
    /// AuthMethod.
    pub const AUTH_METHOD: &str = "AuthMethod";
    /// CHAP_A: algorithm list.
    pub const CHAP_A: &str = "CHAP_A";
    /// CHAP_I: identifier.
    pub const CHAP_I: &str = "CHAP_I";
    /// CHAP_C: challenge.
    pub const CHAP_C: &str = "CHAP_C";
    /// CHAP_N: name.
    pub const CHAP_N: &str = "CHAP_N";
    /// CHAP_R: response.
    pub const CHAP_R: &str = "CHAP_R";
    /// IFMarker (RFC 3720, removed by RFC 7143).
    pub const IF_MARKER: &str = "IFMarker";
    /// OFMarker (RFC 3720, removed by RFC 7143).
    pub const OF_MARKER: &str = "OFMarker";
    /// IFMarkInt (RFC 3720, removed by RFC 7143).
    pub const IF_MARK_INT: &str = "IFMarkInt";
    /// OFMarkInt (RFC 3720, removed by RFC 7143).
    pub const OF_MARK_INT: &str = "OFMarkInt";
}

/// Special values (RFC 7143 §6.2, §13).
pub mod value {
    /// Boolean true.
    pub const YES: &str = "Yes";
    /// Boolean false.
    pub const NO: &str = "No";
    /// No digest / no authentication.
    pub const NONE: &str = "None";
    /// CRC32C digest.
    pub const CRC32C: &str = "CRC32C";
    /// CHAP authentication.
    pub const CHAP: &str = "CHAP";
    /// Answer to a key this side does not know.
    pub const NOT_UNDERSTOOD: &str = "NotUnderstood";
    /// Answer to a key that does not matter in this negotiation.
    pub const IRRELEVANT: &str = "Irrelevant";
    /// Answer to an offer with no acceptable value.
    pub const REJECT: &str = "Reject";
    /// SessionType of a discovery session.
    pub const DISCOVERY: &str = "Discovery";
    /// SessionType of a normal session.
    pub const NORMAL: &str = "Normal";
    /// SendTargets: every target.
    pub const ALL: &str = "All";
}

/// Longest key name (RFC 7143 §6.1: 63 bytes).
pub const MAX_KEY_NAME_LEN: usize = 63;
/// Longest value accepted (RFC 7143 §6.1: text values up to 8192 bytes; binary values for CHAP
/// up to the same order).
pub const MAX_VALUE_LEN: usize = 8192;

/// An ordered list of `key=value` pairs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TextKeys(pub Vec<(String, String)>);

impl TextKeys {
    /// An empty list.
    pub fn new() -> TextKeys {
        TextKeys(Vec::new())
    }

    /// Appends a pair.
    pub fn push(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.0.push((key.into(), value.into()));
    }

    /// The first value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the list holds `key`.
    pub fn contains(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// The pairs in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Appends every pair of `other`.
    pub fn extend(&mut self, other: TextKeys) {
        self.0.extend(other.0);
    }

    /// Parses a complete text (the data segments of a Login/Text sequence joined). Empty
    /// strings between NULs (padding) are skipped; a last pair without its NUL is accepted.
    pub fn parse(data: &[u8]) -> Result<TextKeys, KeysError> {
        let mut keys = TextKeys::new();
        for raw in data.split(|&b| b == 0) {
            if raw.is_empty() {
                continue;
            }
            let pair = std::str::from_utf8(raw).map_err(|_| KeysError::NotUtf8)?;
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| KeysError::MissingEquals(truncate(pair)))?;
            if !valid_key_name(k) {
                return Err(KeysError::InvalidKeyName(truncate(k)));
            }
            if v.len() > MAX_VALUE_LEN {
                return Err(KeysError::ValueTooLong {
                    key: k.to_string(),
                    len: v.len(),
                    limit: MAX_VALUE_LEN,
                });
            }
            keys.push(k, v);
        }
        Ok(keys)
    }

    /// The wire form: `key=value\0` for each pair.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, v) in &self.0 {
            out.extend_from_slice(k.as_bytes());
            out.push(b'=');
            out.extend_from_slice(v.as_bytes());
            out.push(0);
        }
        out
    }
}

pub(super) fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

/// RFC 7143 §6.1: key names are letters, digits, `.`, `-`, `+`, `@`, `_`, at most 63 bytes.
fn valid_key_name(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= MAX_KEY_NAME_LEN
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-+@".contains(&b))
}

/// Parses a numerical value: decimal, or hexadecimal with `0x` (RFC 7143 §6.1 numerical-value).
pub fn parse_number(key: &str, v: &str) -> Result<u64, KeysError> {
    let invalid = || KeysError::InvalidValue {
        key: key.to_string(),
        value: truncate(v),
    };
    let parsed = if let Some(hex) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16)
    } else if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        v.parse::<u64>()
    } else {
        return Err(invalid());
    };
    parsed.map_err(|_| invalid())
}

/// Parses a boolean value (`Yes` / `No`).
pub fn parse_bool(key: &str, v: &str) -> Result<bool, KeysError> {
    match v {
        value::YES => Ok(true),
        value::NO => Ok(false),
        _ => Err(KeysError::InvalidValue {
            key: key.to_string(),
            value: truncate(v),
        }),
    }
}

pub(super) fn bool_value(b: bool) -> &'static str {
    if b {
        value::YES
    } else {
        value::NO
    }
}

/// Decodes a binary value: `0x` + hex digits or `0b` + base64 (RFC 7143 §6.1 binary-value).
pub fn decode_binary(key: &str, v: &str) -> Result<Vec<u8>, KeysError> {
    use base64::Engine as _;
    let invalid = || KeysError::InvalidValue {
        key: key.to_string(),
        value: truncate(v),
    };
    if let Some(hex) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        // An odd number of digits has an implied leading zero (RFC 7143 §6.1).
        let padded;
        let digits = if hex.len() % 2 == 1 {
            padded = format!("0{hex}");
            padded.as_str()
        } else {
            hex
        };
        hex::decode(digits).map_err(|_| invalid())
    } else if let Some(b64) = v.strip_prefix("0b").or_else(|| v.strip_prefix("0B")) {
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| invalid())
    } else {
        Err(invalid())
    }
}

/// Encodes a binary value as `0x` + lowercase hex.
pub fn encode_binary(bytes: &[u8]) -> String {
    format!("0x{}", hex::encode(bytes))
}

/// One target from a SendTargets answer (RFC 7143 Appendix C).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveredTarget {
    /// TargetName.
    pub name: String,
    /// TargetAddress values: `host[:port],portal-group-tag`.
    pub addresses: Vec<String>,
}

/// The targets in a SendTargets answer, in order; addresses before any TargetName are ignored.
pub fn parse_send_targets(keys: &TextKeys) -> Vec<DiscoveredTarget> {
    let mut targets: Vec<DiscoveredTarget> = Vec::new();
    for (k, v) in keys.iter() {
        match k {
            key::TARGET_NAME => targets.push(DiscoveredTarget {
                name: v.to_string(),
                addresses: Vec::new(),
            }),
            key::TARGET_ADDRESS => {
                if let Some(last) = targets.last_mut() {
                    last.addresses.push(v.to_string());
                }
            }
            _ => {}
        }
    }
    targets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_encode() {
        let text = b"InitiatorName=iqn.2024-01.org.x:i\0SessionType=Normal\0\0\0";
        let keys = TextKeys::parse(text).expect("parses");
        assert_eq!(keys.len(), 2);
        assert_eq!(keys.get("SessionType"), Some("Normal"));
        assert_eq!(&keys.encode()[..], &text[..text.len() - 2]);
        assert_eq!(
            TextKeys::parse(b"A=1\0B=2").expect("no final NUL").get("B"),
            Some("2")
        );
        assert_eq!(
            TextKeys::parse(b"A=b=c\0").expect("= in value").get("A"),
            Some("b=c")
        );
    }

    #[test]
    fn parse_errors() {
        type Check = fn(&KeysError) -> bool;
        let cases: &[(&[u8], Check)] = &[
            (b"NoEquals\0", |e| matches!(e, KeysError::MissingEquals(_))),
            (b"=v\0", |e| matches!(e, KeysError::InvalidKeyName(_))),
            (b"Bad Key=v\0", |e| {
                matches!(e, KeysError::InvalidKeyName(_))
            }),
            (b"K=\xff\0", |e| matches!(e, KeysError::NotUtf8)),
        ];
        for (text, check) in cases {
            let err = TextKeys::parse(text).expect_err("must fail");
            assert!(check(&err), "{text:?}: {err}");
        }
        let long = format!("K={}\0", "v".repeat(MAX_VALUE_LEN + 1));
        assert!(matches!(
            TextKeys::parse(long.as_bytes()),
            Err(KeysError::ValueTooLong { .. })
        ));
    }

    #[test]
    fn numbers_and_binary() {
        assert_eq!(parse_number("K", "8192"), Ok(8192));
        assert_eq!(parse_number("K", "0x10"), Ok(16));
        assert!(parse_number("K", "").is_err());
        assert!(parse_number("K", "-1").is_err());
        assert!(parse_number("K", "99999999999999999999999").is_err());
        assert_eq!(decode_binary("C", "0x0a0B"), Ok(vec![0x0a, 0x0b]));
        assert_eq!(decode_binary("C", "0xabc"), Ok(vec![0x0a, 0xbc]));
        assert_eq!(decode_binary("C", "0bAQID"), Ok(vec![1, 2, 3]));
        assert!(decode_binary("C", "abc").is_err());
        assert!(decode_binary("C", "0xzz").is_err());
        assert_eq!(encode_binary(&[0xde, 0xad]), "0xdead");
    }

    #[test]
    fn send_targets() {
        let keys = TextKeys::parse(
            b"TargetAddress=x\0TargetName=iqn.a:1\0TargetAddress=127.0.0.1:3260,1\0TargetName=iqn-b\0",
        )
        .expect("parses");
        let targets = parse_send_targets(&keys);
        assert_eq!(targets.len(), 2);
        assert_eq!(targets[0].name, "iqn.a:1");
        assert_eq!(targets[0].addresses, vec!["127.0.0.1:3260,1".to_string()]);
        assert!(targets[1].addresses.is_empty());
    }
}
