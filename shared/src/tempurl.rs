//! Swift temp URLs: signing and verification.
//!
//! # Format (`docs/ironic-protocols.md` §4.1)
//! `<base>/v1/AUTH_<account>/<container>/<object>?temp_url_sig=<sig>&temp_url_expires=<unix ts>`.
//! The signature is an HMAC over `"<METHOD>\n<expires>\n<path>"`, where `path` starts at `/v1/`.
//! Swift accepts two encodings: plain hex, whose length selects the digest (40 = SHA-1,
//! 64 = SHA-256, 128 = SHA-512), and `<algo>:<base64>` (standard or URL-safe alphabet, padding
//! optional).
//!
//! # Design
//! The conductor's built-in object store issues and checks URLs with this module, and the Swift
//! client signs with it, so one implementation serves both. SHA-256 is the default; SHA-1 is
//! accepted on verification only when the caller allows it (Swift deprecates it).
//!
//! # Limitations
//! Prefix-scoped (`temp_url_prefix`) and IP-restricted (`temp_url_ip_range`) URLs are refused on
//! verification rather than half-supported.

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};

use crate::secret::Secret;

/// A temp URL digest algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TempUrlDigest {
    /// HMAC-SHA1: what Kilo-era clients sign with; deprecated by Swift.
    Sha1,
    /// HMAC-SHA256: the default.
    Sha256,
    /// HMAC-SHA512.
    Sha512,
}

impl TempUrlDigest {
    /// The name Swift uses (`sha1`, `sha256`, `sha512`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha1 => "sha1",
            Self::Sha256 => "sha256",
            Self::Sha512 => "sha512",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        match name {
            "sha1" => Some(Self::Sha1),
            "sha256" => Some(Self::Sha256),
            "sha512" => Some(Self::Sha512),
            _ => None,
        }
    }

    fn from_hex_len(len: usize) -> Option<Self> {
        match len {
            40 => Some(Self::Sha1),
            64 => Some(Self::Sha256),
            128 => Some(Self::Sha512),
            _ => None,
        }
    }
}

/// How a signature is written into the URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureEncoding {
    /// Lower-case hex (Swift's classic form).
    Hex,
    /// `<algo>:<url-safe base64, no padding>` (python-swiftclient's form for SHA-512).
    Base64,
}

/// Why a temp URL was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TempUrlError {
    /// `temp_url_sig` or `temp_url_expires` is absent.
    #[error("temp URL is missing the {0} parameter")]
    MissingParameter(&'static str),
    /// `temp_url_expires` is not a Unix time or ISO-8601 `YYYY-MM-DDTHH:MM:SSZ`.
    #[error("temp_url_expires {0:?} is not a Unix time or YYYY-MM-DDTHH:MM:SSZ")]
    BadExpiry(String),
    /// The URL has expired.
    #[error("temp URL expired at {expires} (now {now})")]
    Expired {
        /// Expiry, Unix seconds.
        expires: u64,
        /// Current time, Unix seconds.
        now: u64,
    },
    /// The signature is neither hex of a known length nor `algo:base64`.
    #[error("temp_url_sig is malformed: {0}")]
    BadSignature(String),
    /// The digest is known but not allowed here.
    #[error("temp URL digest {0} is not allowed")]
    DigestNotAllowed(&'static str),
    /// The signature does not match any key.
    #[error("temp URL signature does not match")]
    Mismatch,
    /// A feature this implementation refuses (prefix or IP-range scoping).
    #[error("temp URL parameter {0} is not supported")]
    Unsupported(&'static str),
    /// The method cannot be signed.
    #[error("method {0:?} cannot be used with a temp URL")]
    BadMethod(String),
}

/// A temp URL key (`X-Account-Meta-Temp-URL-Key`). Never printed: `Debug` shows
/// `TempUrlKey(******)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TempUrlKey(Secret<Vec<u8>>);

impl TempUrlKey {
    /// Wraps key bytes.
    pub fn new(key: impl Into<Vec<u8>>) -> Self {
        Self(Secret::new(key.into()))
    }

    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.expose()
    }
}

/// Runs `$body` with `$mac`, an HMAC of the chosen digest keyed with `$key` over `$message`.
/// (A macro because the three digest types share no object-safe trait in hmac 0.13.)
macro_rules! with_hmac {
    ($digest:expr, $key:expr, $message:expr, |$mac:ident| $body:expr) => {
        match $digest {
            TempUrlDigest::Sha1 => {
                // HMAC accepts keys of any length (RFC 2104 §2): this cannot fail.
                let mut $mac = Hmac::<sha1::Sha1>::new_from_slice($key)
                    .expect("HMAC takes keys of any length");
                $mac.update($message);
                $body
            }
            TempUrlDigest::Sha256 => {
                let mut $mac = Hmac::<sha2::Sha256>::new_from_slice($key)
                    .expect("HMAC takes keys of any length");
                $mac.update($message);
                $body
            }
            TempUrlDigest::Sha512 => {
                let mut $mac = Hmac::<sha2::Sha512>::new_from_slice($key)
                    .expect("HMAC takes keys of any length");
                $mac.update($message);
                $body
            }
        }
    };
}

fn hmac_bytes(digest: TempUrlDigest, key: &[u8], message: &[u8]) -> Vec<u8> {
    with_hmac!(digest, key, message, |mac| mac
        .finalize()
        .into_bytes()
        .to_vec())
}

/// Constant-time comparison of `sig` with the HMAC of `message` (`Mac::verify_slice`).
fn hmac_matches(digest: TempUrlDigest, key: &[u8], message: &[u8], sig: &[u8]) -> bool {
    with_hmac!(digest, key, message, |mac| mac.verify_slice(sig).is_ok())
}

fn signed_message(method: &str, expires: u64, path: &str) -> String {
    format!("{method}\n{expires}\n{path}")
}

fn check_method(method: &str) -> Result<(), TempUrlError> {
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(TempUrlError::BadMethod(method.chars().take(16).collect()));
    }
    Ok(())
}

/// The signature for `method` on `path` (starting at `/v1/`) until `expires` (Unix seconds).
pub fn sign(
    key: &TempUrlKey,
    digest: TempUrlDigest,
    encoding: SignatureEncoding,
    method: &str,
    expires: u64,
    path: &str,
) -> Result<String, TempUrlError> {
    check_method(method)?;
    let mac = hmac_bytes(
        digest,
        key.as_bytes(),
        signed_message(method, expires, path).as_bytes(),
    );
    Ok(match encoding {
        SignatureEncoding::Hex => hex::encode(mac),
        SignatureEncoding::Base64 => format!(
            "{}:{}",
            digest.name(),
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac)
        ),
    })
}

/// The query string (`temp_url_sig=…&temp_url_expires=…`) for a temp URL.
pub fn query(
    key: &TempUrlKey,
    digest: TempUrlDigest,
    method: &str,
    expires: u64,
    path: &str,
) -> Result<String, TempUrlError> {
    let encoding = match digest {
        // Swift's docs give SHA-512 in base64 form; hex would be 128 characters of URL.
        TempUrlDigest::Sha512 => SignatureEncoding::Base64,
        _ => SignatureEncoding::Hex,
    };
    let sig = sign(key, digest, encoding, method, expires, path)?;
    // Base64 signatures contain ':' (and URL-safe base64 nothing else that needs escaping);
    // percent-encode the colon as Swift's clients do.
    let sig = sig.replace(':', "%3A");
    Ok(format!("temp_url_sig={sig}&temp_url_expires={expires}"))
}

/// A full temp URL: `base` (scheme and authority, e.g. `https://store:8080`) + `path` + query.
pub fn url(
    base: &str,
    key: &TempUrlKey,
    digest: TempUrlDigest,
    method: &str,
    expires: u64,
    path: &str,
) -> Result<String, TempUrlError> {
    Ok(format!(
        "{}{}?{}",
        base.trim_end_matches('/'),
        path,
        query(key, digest, method, expires, path)?
    ))
}

/// The temp URL parameters of a request, as found in its query string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TempUrlParams {
    /// `temp_url_sig`, percent-decoded.
    pub sig: String,
    /// `temp_url_expires`, as Unix seconds.
    pub expires: u64,
}

impl TempUrlParams {
    /// Extracts the parameters from a raw query string (without the `?`).
    pub fn from_query(query: &str) -> Result<Self, TempUrlError> {
        let mut sig = None;
        let mut expires = None;
        for pair in query.split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_encoding::percent_decode_str(v)
                .decode_utf8()
                .map_err(|_| TempUrlError::BadSignature("not UTF-8".into()))?
                .into_owned();
            match k {
                "temp_url_sig" => sig = Some(v),
                "temp_url_expires" => expires = Some(v),
                "temp_url_prefix" => return Err(TempUrlError::Unsupported("temp_url_prefix")),
                "temp_url_ip_range" => return Err(TempUrlError::Unsupported("temp_url_ip_range")),
                _ => {}
            }
        }
        let sig = sig.ok_or(TempUrlError::MissingParameter("temp_url_sig"))?;
        let expires = expires.ok_or(TempUrlError::MissingParameter("temp_url_expires"))?;
        Ok(TempUrlParams {
            sig,
            expires: parse_expiry(&expires)?,
        })
    }
}

/// Parses `temp_url_expires`: Unix seconds, or ISO-8601 `YYYY-MM-DDTHH:MM:SSZ` (UTC).
pub fn parse_expiry(value: &str) -> Result<u64, TempUrlError> {
    let bad = || TempUrlError::BadExpiry(value.chars().take(32).collect());
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value.parse().map_err(|_| bad());
    }
    let b = value.as_bytes();
    if b.len() != 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
        || b[19] != b'Z'
    {
        return Err(bad());
    }
    let num = |range: std::ops::Range<usize>| -> Result<u64, TempUrlError> {
        let s = value.get(range).ok_or_else(bad)?;
        if !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse().map_err(|_| bad())
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if year < 1970 || !(1..=12).contains(&month) || day == 0 || hour > 23 || minute > 59 {
        return Err(bad());
    }
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let month_index = usize::try_from(month - 1).map_err(|_| bad())?;
    if day > month_days[month_index] || second > 60 {
        return Err(bad());
    }
    let year_days: u64 = (1970..year)
        .map(|y| {
            if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 {
                366
            } else {
                365
            }
        })
        .sum();
    let days = year_days + month_days[..month_index].iter().sum::<u64>() + day - 1;
    Ok(days * 86_400 + hour * 3600 + minute * 60 + second)
}

fn decode_signature(sig: &str) -> Result<(TempUrlDigest, Vec<u8>), TempUrlError> {
    if let Some((algo, b64)) = sig.split_once(':') {
        let digest = TempUrlDigest::from_name(algo)
            .ok_or_else(|| TempUrlError::BadSignature(format!("unknown digest {algo:?}")))?;
        let trimmed = b64.trim_end_matches('=');
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(trimmed)
            .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(trimmed))
            .map_err(|_| TempUrlError::BadSignature("invalid base64".into()))?;
        return Ok((digest, bytes));
    }
    let digest = TempUrlDigest::from_hex_len(sig.len()).ok_or_else(|| {
        TempUrlError::BadSignature(format!("hex signature of {} characters", sig.len()))
    })?;
    let bytes = hex::decode(sig).map_err(|_| TempUrlError::BadSignature("invalid hex".into()))?;
    Ok((digest, bytes))
}

/// Checks a request against its temp URL parameters.
///
/// `keys` are the account/container keys (Swift allows two of each for rotation). A `HEAD`
/// request is accepted with a signature made for `GET`, `HEAD` or `PUT`, as Swift does. The
/// comparison is constant-time.
pub fn verify(
    keys: &[TempUrlKey],
    allowed: &[TempUrlDigest],
    method: &str,
    path: &str,
    params: &TempUrlParams,
    now: u64,
) -> Result<TempUrlDigest, TempUrlError> {
    check_method(method)?;
    let (digest, sig) = decode_signature(&params.sig)?;
    if !allowed.contains(&digest) {
        return Err(TempUrlError::DigestNotAllowed(digest.name()));
    }
    if now >= params.expires {
        return Err(TempUrlError::Expired {
            expires: params.expires,
            now,
        });
    }
    let methods: &[&str] = if method == "HEAD" {
        &["HEAD", "GET", "PUT"]
    } else {
        std::slice::from_ref(&method)
    };
    for key in keys {
        for m in methods {
            let message = signed_message(m, params.expires, path);
            let ok = hmac_matches(digest, key.as_bytes(), message.as_bytes(), &sig);
            if ok {
                return Ok(digest);
            }
        }
    }
    Err(TempUrlError::Mismatch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Write as _;
    use std::process::{Command, Stdio};

    const PATH: &str = "/v1/AUTH_test/images/deploy.img";
    const EXPIRES: u64 = 1_764_500_000;

    /// HMAC computed by OpenSSL, the independent reference (`openssl dgst -<algo> -hmac KEY -r`).
    fn openssl_hmac_hex(algo: &str, key: &str, message: &str) -> String {
        let mut child = Command::new("openssl")
            .args(["dgst", &format!("-{algo}"), "-hmac", key, "-r"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("openssl is installed (scripts/setup)");
        child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(message.as_bytes())
            .expect("writing to openssl");
        let out = child.wait_with_output().expect("openssl runs");
        assert!(out.status.success(), "openssl failed");
        String::from_utf8(out.stdout)
            .expect("openssl prints ASCII")
            .split_whitespace()
            .next()
            .expect("openssl prints the digest first")
            .to_owned()
    }

    #[test]
    fn the_key_is_never_printed() {
        let key = TempUrlKey::new("s3cr3tkey");
        assert_eq!(format!("{key:?}"), "TempUrlKey(******)");
        assert!(!format!("{key:#?}").contains("s3cr3t"));
        assert_eq!(key.as_bytes(), b"s3cr3tkey");
    }

    #[test]
    fn signatures_match_openssl_for_every_digest() {
        let key = TempUrlKey::new("s3cr3tkey");
        let message = format!("GET\n{EXPIRES}\n{PATH}");
        for (digest, algo) in [
            (TempUrlDigest::Sha1, "sha1"),
            (TempUrlDigest::Sha256, "sha256"),
            (TempUrlDigest::Sha512, "sha512"),
        ] {
            let ours = sign(&key, digest, SignatureEncoding::Hex, "GET", EXPIRES, PATH)
                .expect("GET signs");
            assert_eq!(
                ours,
                openssl_hmac_hex(algo, "s3cr3tkey", &message),
                "{algo}"
            );
            let b64 = sign(
                &key,
                digest,
                SignatureEncoding::Base64,
                "GET",
                EXPIRES,
                PATH,
            )
            .expect("GET signs");
            let (_, raw) = b64.split_once(':').expect("algo prefix");
            let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(raw)
                .expect("url-safe base64");
            assert_eq!(hex::encode(raw), ours);
        }
    }

    fn params_of(url: &str) -> TempUrlParams {
        let query = url.split_once('?').expect("query").1;
        TempUrlParams::from_query(query).expect("parameters present")
    }

    #[test]
    fn issued_urls_verify_and_tampering_fails() {
        let key = TempUrlKey::new("k1");
        let all = [TempUrlDigest::Sha256, TempUrlDigest::Sha512];
        for digest in all {
            let u = url("https://store:8080/", &key, digest, "GET", EXPIRES, PATH).expect("signs");
            assert!(u.starts_with("https://store:8080/v1/AUTH_test/"));
            let p = params_of(&u);
            assert_eq!(
                verify(
                    std::slice::from_ref(&key),
                    &all,
                    "GET",
                    PATH,
                    &p,
                    EXPIRES - 1
                ),
                Ok(digest)
            );
            assert_eq!(
                verify(
                    std::slice::from_ref(&key),
                    &all,
                    "HEAD",
                    PATH,
                    &p,
                    EXPIRES - 1
                ),
                Ok(digest),
                "HEAD with a GET signature, as Swift allows"
            );
            assert_eq!(
                verify(
                    std::slice::from_ref(&key),
                    &all,
                    "PUT",
                    PATH,
                    &p,
                    EXPIRES - 1
                ),
                Err(TempUrlError::Mismatch)
            );
            assert_eq!(
                verify(
                    std::slice::from_ref(&key),
                    &all,
                    "GET",
                    "/v1/AUTH_test/images/other",
                    &p,
                    0
                ),
                Err(TempUrlError::Mismatch)
            );
            assert_eq!(
                verify(&[TempUrlKey::new("k2")], &all, "GET", PATH, &p, 0),
                Err(TempUrlError::Mismatch)
            );
            assert_eq!(
                verify(
                    &[TempUrlKey::new("k2"), key.clone()],
                    &all,
                    "GET",
                    PATH,
                    &p,
                    0
                ),
                Ok(digest),
                "second key (rotation)"
            );
            assert!(matches!(
                verify(std::slice::from_ref(&key), &all, "GET", PATH, &p, EXPIRES),
                Err(TempUrlError::Expired { .. })
            ));
        }
    }

    #[test]
    fn sha1_only_when_allowed() {
        let key = TempUrlKey::new("k");
        let sig = sign(
            &key,
            TempUrlDigest::Sha1,
            SignatureEncoding::Hex,
            "GET",
            EXPIRES,
            PATH,
        )
        .expect("signs");
        let p = TempUrlParams {
            sig,
            expires: EXPIRES,
        };
        assert_eq!(
            verify(
                std::slice::from_ref(&key),
                &[TempUrlDigest::Sha256],
                "GET",
                PATH,
                &p,
                0
            ),
            Err(TempUrlError::DigestNotAllowed("sha1"))
        );
        assert_eq!(
            verify(&[key], &[TempUrlDigest::Sha1], "GET", PATH, &p, 0),
            Ok(TempUrlDigest::Sha1)
        );
    }

    #[test]
    fn base64_signatures_in_either_alphabet_with_or_without_padding() {
        let key = TempUrlKey::new("k");
        let raw = hmac_bytes(
            TempUrlDigest::Sha512,
            b"k",
            format!("GET\n{EXPIRES}\n{PATH}").as_bytes(),
        );
        for sig in [
            format!(
                "sha512:{}",
                base64::engine::general_purpose::STANDARD.encode(&raw)
            ),
            format!(
                "sha512:{}",
                base64::engine::general_purpose::URL_SAFE.encode(&raw)
            ),
        ] {
            let p = TempUrlParams {
                sig,
                expires: EXPIRES,
            };
            assert_eq!(
                verify(
                    std::slice::from_ref(&key),
                    &[TempUrlDigest::Sha512],
                    "GET",
                    PATH,
                    &p,
                    0
                ),
                Ok(TempUrlDigest::Sha512)
            );
        }
    }

    #[test]
    fn malformed_parameters_are_clear_errors() {
        assert_eq!(
            TempUrlParams::from_query("temp_url_expires=1"),
            Err(TempUrlError::MissingParameter("temp_url_sig"))
        );
        assert_eq!(
            TempUrlParams::from_query("temp_url_sig=ab"),
            Err(TempUrlError::MissingParameter("temp_url_expires"))
        );
        assert!(matches!(
            TempUrlParams::from_query("temp_url_sig=ab&temp_url_expires=soon"),
            Err(TempUrlError::BadExpiry(_))
        ));
        assert_eq!(
            TempUrlParams::from_query("temp_url_sig=ab&temp_url_expires=1&temp_url_prefix=x"),
            Err(TempUrlError::Unsupported("temp_url_prefix"))
        );
        let p = TempUrlParams {
            sig: "abc".into(),
            expires: EXPIRES,
        };
        assert!(matches!(
            verify(&[], &[TempUrlDigest::Sha256], "GET", PATH, &p, 0),
            Err(TempUrlError::BadSignature(_))
        ));
        let p = TempUrlParams {
            sig: "md5:AAAA".into(),
            expires: EXPIRES,
        };
        assert!(matches!(
            verify(&[], &[TempUrlDigest::Sha256], "GET", PATH, &p, 0),
            Err(TempUrlError::BadSignature(_))
        ));
        assert!(sign(
            &TempUrlKey::new("k"),
            TempUrlDigest::Sha256,
            SignatureEncoding::Hex,
            "get",
            1,
            PATH
        )
        .is_err());
    }

    #[test]
    fn iso8601_expiry_matches_date() {
        let out = Command::new("date")
            .args(["-u", "-d", "2026-11-30T10:11:12Z", "+%s"])
            .output()
            .expect("date runs");
        let expected: u64 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("date prints seconds");
        assert_eq!(parse_expiry("2026-11-30T10:11:12Z"), Ok(expected));
        assert_eq!(parse_expiry("1764497472"), Ok(1_764_497_472));
        for bad in [
            "2026-02-30T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-11-30 10:11:12",
            "-1",
            "",
        ] {
            assert!(parse_expiry(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn query_parsing_never_panics(q in "[a-z_=&%0-9A-Fa-f:+/-]{0,200}") {
            if let Ok(p) = TempUrlParams::from_query(&q) {
                let _ = verify(&[TempUrlKey::new("k")], &[TempUrlDigest::Sha256], "GET", PATH, &p, 0);
            }
        }

        #[test]
        fn sign_then_verify(key in proptest::collection::vec(any::<u8>(), 0..80), expires in 1u64..u64::MAX, path in "/v1/[a-zA-Z0-9_/.-]{1,60}") {
            let key = TempUrlKey::new(key);
            for digest in [TempUrlDigest::Sha1, TempUrlDigest::Sha256, TempUrlDigest::Sha512] {
                let q = query(&key, digest, "GET", expires, &path).expect("signs");
                let p = TempUrlParams::from_query(&q).expect("parses");
                prop_assert_eq!(verify(std::slice::from_ref(&key), &[digest], "GET", &path, &p, expires - 1), Ok(digest));
            }
        }
    }
}
