//! CHAP authentication for iSCSI login (RFC 1994 with MD5, as RFC 7143 §12.1.3 uses it):
//! one-way (the target checks the initiator) and mutual (the initiator also checks the target).
//!
//! # Design
//! The exchange in the security stage:
//! 1. initiator: `AuthMethod=CHAP,None` (with its name); target: `AuthMethod=CHAP`
//! 2. initiator: `CHAP_A=5`; target: `CHAP_A=5 CHAP_I=<id> CHAP_C=<challenge>`
//! 3. initiator: `CHAP_N=<user> CHAP_R=MD5(id ‖ secret ‖ challenge)`, and for mutual CHAP its own
//!    `CHAP_I`/`CHAP_C`; target: for mutual CHAP `CHAP_N`/`CHAP_R`, then the operational stage.
//!
//! [`respond_to_challenge`] is step 3 for the initiator; [`ChapChallenge`] and
//! [`verify_response`] are the checking side for either end. Responses are compared in constant
//! time.
//!
//! # Limitations
//! Only algorithm 5 (MD5) exists in RFC 7143; SHA-1/SHA-256 CHAP (RFC 9099 era) is not offered.

use md5::{Digest as _, Md5};
use subtle::ConstantTimeEq as _;
use thiserror::Error;

use super::keys::{decode_binary, encode_binary, key, TextKeys};
use crate::secret::Secret;

/// CHAP_A value for MD5 (RFC 1994 §4.1, RFC 7143 §12.1.3).
pub const CHAP_ALGORITHM_MD5: u32 = 5;
/// Length of an MD5 CHAP response.
pub const CHAP_RESPONSE_LEN: usize = 16;
/// Length of the challenges this module generates (RFC 7143 §12.1.3 asks for at least as long
/// as the secret's entropy; 16 bytes is what Linux and tgtd use).
pub const CHAP_CHALLENGE_LEN: usize = 16;
/// Longest challenge accepted from a peer (RFC 7143 §12.1.3: the binary value is at most 1024
/// bytes).
pub const CHAP_MAX_CHALLENGE_LEN: usize = 1024;

/// Errors in a CHAP exchange.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ChapError {
    /// A CHAP key the step needs is missing.
    #[error("CHAP key {0} missing")]
    MissingKey(&'static str),
    /// The peer offers no algorithm this side supports.
    #[error("CHAP algorithm list {0:?} does not include MD5 (5)")]
    UnsupportedAlgorithm(String),
    /// A CHAP value is malformed.
    #[error("invalid {key} value {value:?}")]
    InvalidValue {
        /// The key.
        key: &'static str,
        /// The value received (cut to 64 characters).
        value: String,
    },
    /// The peer sent back this side's own challenge (a reflection attack, RFC 7143 §12.1.3).
    #[error("the peer reused this side's CHAP challenge")]
    ReflectedChallenge,
    /// The response does not match the secret.
    #[error("CHAP response does not match")]
    BadResponse,
    /// The peer's CHAP_N is not the expected user.
    #[error("CHAP name {0:?} is not the expected one")]
    WrongName(String),
    /// The system random source failed.
    #[error("random source failed: {0}")]
    Random(String),
    /// `USER:SECRET` credentials without a colon or with an empty part.
    #[error("credentials must be USER:SECRET with both parts non-empty")]
    BadCredentials,
}

/// A CHAP user name and secret (the secret masked in `Debug`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChapCredentials {
    /// CHAP_N.
    pub user: String,
    /// The shared secret (RFC 7143 §12.1.3: 12 to 16 bytes recommended).
    pub secret: Secret<Vec<u8>>,
}

impl ChapCredentials {
    /// A user name and secret.
    pub fn new(user: impl Into<String>, secret: impl Into<Vec<u8>>) -> Self {
        Self {
            user: user.into(),
            secret: Secret::new(secret.into()),
        }
    }
}

impl std::str::FromStr for ChapCredentials {
    type Err = ChapError;

    /// Parses `USER:SECRET` (the secret may itself contain colons).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (user, secret) = s.split_once(':').ok_or(ChapError::BadCredentials)?;
        if user.is_empty() || secret.is_empty() {
            return Err(ChapError::BadCredentials);
        }
        Ok(ChapCredentials::new(user, secret))
    }
}

/// The MD5 CHAP response: MD5 over identifier, secret and challenge (RFC 1994 §4.1).
pub fn chap_md5_response(identifier: u8, secret: &[u8], challenge: &[u8]) -> [u8; 16] {
    let mut md5 = Md5::new();
    md5.update([identifier]);
    md5.update(secret);
    md5.update(challenge);
    md5.finalize().into()
}

/// Whether `response` is right for this identifier, secret and challenge (constant time).
pub fn verify_response(identifier: u8, secret: &[u8], challenge: &[u8], response: &[u8]) -> bool {
    let expected = chap_md5_response(identifier, secret, challenge);
    response.len() == CHAP_RESPONSE_LEN && bool::from(expected.ct_eq(response))
}

/// Whether a `CHAP_A` list (comma separated numbers) offers MD5.
pub fn offers_md5(chap_a: &str) -> bool {
    chap_a
        .split(',')
        .any(|a| a.trim().parse::<u32>() == Ok(CHAP_ALGORITHM_MD5))
}

fn short(v: &str) -> String {
    v.chars().take(64).collect()
}

/// Parses `CHAP_I`: a number 0..=255 (decimal or `0x` hex).
pub fn parse_identifier(v: &str) -> Result<u8, ChapError> {
    super::keys::parse_number(key::CHAP_I, v)
        .ok()
        .and_then(|n| u8::try_from(n).ok())
        .ok_or(ChapError::InvalidValue {
            key: key::CHAP_I,
            value: short(v),
        })
}

/// Parses `CHAP_C` or `CHAP_R`: a binary value of 1..=1024 bytes.
pub fn parse_binary(name: &'static str, v: &str) -> Result<Vec<u8>, ChapError> {
    match decode_binary(name, v) {
        Ok(bytes) if !bytes.is_empty() && bytes.len() <= CHAP_MAX_CHALLENGE_LEN => Ok(bytes),
        _ => Err(ChapError::InvalidValue {
            key: name,
            value: short(v),
        }),
    }
}

/// A challenge this side sends: identifier and random bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChapChallenge {
    /// CHAP_I.
    pub identifier: u8,
    /// CHAP_C bytes.
    pub challenge: Vec<u8>,
}

impl ChapChallenge {
    /// A fresh random identifier and [`CHAP_CHALLENGE_LEN`]-byte challenge.
    pub fn generate() -> Result<ChapChallenge, ChapError> {
        let mut bytes = [0u8; CHAP_CHALLENGE_LEN + 1];
        getrandom::fill(&mut bytes).map_err(|e| ChapError::Random(e.to_string()))?;
        Ok(ChapChallenge {
            identifier: bytes[0],
            challenge: bytes[1..].to_vec(),
        })
    }

    /// The `CHAP_I` and `CHAP_C` keys carrying this challenge.
    pub fn keys(&self) -> TextKeys {
        let mut keys = TextKeys::new();
        keys.push(key::CHAP_I, self.identifier.to_string());
        keys.push(key::CHAP_C, encode_binary(&self.challenge));
        keys
    }

    /// Checks the peer's `CHAP_N` and `CHAP_R` against `expected`'s user and secret.
    pub fn check(&self, peer: &TextKeys, expected: &ChapCredentials) -> Result<(), ChapError> {
        let name = peer
            .get(key::CHAP_N)
            .ok_or(ChapError::MissingKey(key::CHAP_N))?;
        let response = parse_binary(
            key::CHAP_R,
            peer.get(key::CHAP_R)
                .ok_or(ChapError::MissingKey(key::CHAP_R))?,
        )?;
        let response_ok = verify_response(
            self.identifier,
            expected.secret.expose(),
            &self.challenge,
            &response,
        );
        if name != expected.user {
            return Err(ChapError::WrongName(short(name)));
        }
        if !response_ok {
            return Err(ChapError::BadResponse);
        }
        Ok(())
    }
}

/// The initiator's step 3: given the target's `CHAP_A`/`CHAP_I`/`CHAP_C`, the `CHAP_N` and
/// `CHAP_R` to send. With `mutual`, the initiator's own challenge is appended (and checked not to
/// repeat the target's, RFC 7143 §12.1.3).
pub fn respond_to_challenge(
    target: &TextKeys,
    credentials: &ChapCredentials,
    mutual: Option<&ChapChallenge>,
) -> Result<TextKeys, ChapError> {
    if let Some(a) = target.get(key::CHAP_A) {
        if !offers_md5(a) {
            return Err(ChapError::UnsupportedAlgorithm(short(a)));
        }
    }
    let identifier = parse_identifier(
        target
            .get(key::CHAP_I)
            .ok_or(ChapError::MissingKey(key::CHAP_I))?,
    )?;
    let challenge = parse_binary(
        key::CHAP_C,
        target
            .get(key::CHAP_C)
            .ok_or(ChapError::MissingKey(key::CHAP_C))?,
    )?;
    let mut keys = TextKeys::new();
    keys.push(key::CHAP_N, credentials.user.clone());
    keys.push(
        key::CHAP_R,
        encode_binary(&chap_md5_response(
            identifier,
            credentials.secret.expose(),
            &challenge,
        )),
    );
    if let Some(ours) = mutual {
        if ours.challenge == challenge {
            return Err(ChapError::ReflectedChallenge);
        }
        keys.extend(ours.keys());
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_response_matches_rfc1994_construction() {
        // MD5(0x01 ‖ "secret" ‖ 0x000102..0f), computed independently with Python's hashlib:
        // hashlib.md5(b"\x01" + b"secret" + bytes(range(16))).hexdigest()
        let challenge: Vec<u8> = (0u8..16).collect();
        let response = chap_md5_response(1, b"secret", &challenge);
        assert_eq!(hex::encode(response), "740e86463bda3a4d7017d6e0fba0699d");
        assert!(verify_response(1, b"secret", &challenge, &response));
        assert!(!verify_response(2, b"secret", &challenge, &response));
        assert!(!verify_response(1, b"secret", &challenge, &response[..15]));
    }

    #[test]
    fn one_way_and_mutual_exchange() {
        let creds: ChapCredentials = "alice:secretpass12".parse().expect("parses");
        let target_challenge = ChapChallenge::generate().expect("random");
        let mut from_target = target_challenge.keys();
        from_target.push(key::CHAP_A, "5");
        let reply = respond_to_challenge(&from_target, &creds, None).expect("responds");
        assert_eq!(reply.get(key::CHAP_N), Some("alice"));
        target_challenge
            .check(&reply, &creds)
            .expect("target accepts");
        let wrong: ChapCredentials = "alice:wrongsecret".parse().expect("parses");
        assert_eq!(
            target_challenge.check(&reply, &wrong),
            Err(ChapError::BadResponse)
        );
        let other_user: ChapCredentials = "bob:secretpass12".parse().expect("parses");
        assert!(matches!(
            target_challenge.check(&reply, &other_user),
            Err(ChapError::WrongName(_))
        ));

        // Mutual: the initiator adds its challenge and checks the target's answer.
        let initiator_challenge = ChapChallenge::generate().expect("random");
        let reply = respond_to_challenge(&from_target, &creds, Some(&initiator_challenge))
            .expect("responds");
        let target_creds: ChapCredentials = "tgt:targetsecret1".parse().expect("parses");
        let target_reply = respond_to_challenge(&reply, &target_creds, None).expect("target");
        initiator_challenge
            .check(&target_reply, &target_creds)
            .expect("initiator accepts");

        // Reflection: the same challenge back is refused.
        let reflected = ChapChallenge {
            identifier: 9,
            challenge: target_challenge.challenge.clone(),
        };
        assert_eq!(
            respond_to_challenge(&from_target, &creds, Some(&reflected)),
            Err(ChapError::ReflectedChallenge)
        );
    }

    #[test]
    fn malformed_values() {
        let creds: ChapCredentials = "u:s".parse().expect("parses");
        let mut keys = TextKeys::new();
        keys.push(key::CHAP_A, "7");
        assert!(matches!(
            respond_to_challenge(&keys, &creds, None),
            Err(ChapError::UnsupportedAlgorithm(_))
        ));
        let mut keys = TextKeys::new();
        keys.push(key::CHAP_I, "256");
        keys.push(key::CHAP_C, "0x00");
        assert!(matches!(
            respond_to_challenge(&keys, &creds, None),
            Err(ChapError::InvalidValue { key: "CHAP_I", .. })
        ));
        let mut keys = TextKeys::new();
        keys.push(key::CHAP_I, "1");
        assert_eq!(
            respond_to_challenge(&keys, &creds, None),
            Err(ChapError::MissingKey("CHAP_C"))
        );
        assert!(offers_md5("7,5"));
        assert!(!offers_md5("x"));
        assert!("nocolon".parse::<ChapCredentials>().is_err());
        assert!(":s".parse::<ChapCredentials>().is_err());
        let c: ChapCredentials = "u:a:b".parse().expect("colon in secret");
        assert_eq!(c.secret.expose(), b"a:b");
        assert!(!format!("{c:?} {c:#?}").contains("a:b"));
    }
}
