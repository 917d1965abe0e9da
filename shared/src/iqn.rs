//! iSCSI names (RFC 3720 §3.2.6, RFC 7143 §4.2.7.2), plus Ironic's literal `iqn-<node uuid>`.
//!
//! Ironic's conductor sends `iscsi_target_iqn=iqn-<node uuid>` (`docs/ironic-protocols.md` §1.2), which
//! is not an RFC 3720 name; docs/architecture.md §4 asks us to accept it wherever a name is validated.

/// Why a string is not an iSCSI name.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{name:?} is not an iSCSI name: {reason}")]
pub struct IqnError {
    /// The rejected name (cut to 80 characters).
    pub name: String,
    /// Why.
    pub reason: &'static str,
}

/// Longest iSCSI name (RFC 7143 §4.2.7.1).
pub const MAX_NAME_LEN: usize = 223;

fn err(name: &str, reason: &'static str) -> IqnError {
    IqnError {
        name: name.chars().take(80).collect(),
        reason,
    }
}

/// Checks an iSCSI name: `iqn.YYYY-MM.reversed.domain[:anything]`, `eui.` + 16 hex digits,
/// `naa.` + 16 or 32 hex digits, or Ironic's `iqn-<anything printable>`.
pub fn validate(name: &str) -> Result<(), IqnError> {
    if name.is_empty() {
        return Err(err(name, "empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(err(name, "longer than 223 bytes"));
    }
    if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '/' || c == '\0')
    {
        return Err(err(name, "contains white space, '/' or control characters"));
    }
    let lower = name.to_ascii_lowercase();
    if let Some(rest) = lower.strip_prefix("iqn-") {
        if rest.is_empty() {
            return Err(err(name, "nothing after iqn-"));
        }
        return Ok(());
    }
    if let Some(rest) = lower.strip_prefix("iqn.") {
        let (date, tail) = rest
            .split_once('.')
            .ok_or_else(|| err(name, "expected iqn.YYYY-MM.naming-authority"))?;
        let date_ok = date.len() == 7
            && date.as_bytes()[4] == b'-'
            && date[..4].bytes().all(|b| b.is_ascii_digit())
            && date[5..].bytes().all(|b| b.is_ascii_digit())
            && matches!(date[5..].parse::<u8>(), Ok(1..=12));
        if !date_ok {
            return Err(err(name, "date must be YYYY-MM"));
        }
        let authority = tail.split(':').next().unwrap_or("");
        if authority.is_empty()
            || !authority
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        {
            return Err(err(name, "naming authority must be a reversed domain name"));
        }
        return Ok(());
    }
    let hex_tail = |prefix: &str, lens: &[usize]| {
        lower.strip_prefix(prefix).is_some_and(|hex| {
            lens.contains(&hex.len()) && hex.bytes().all(|b| b.is_ascii_hexdigit())
        })
    };
    if hex_tail("eui.", &[16]) || hex_tail("naa.", &[16, 32]) {
        return Ok(());
    }
    Err(err(name, "must start with iqn., eui., naa. or iqn-"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_rfc_names_and_ironics_literal_form() {
        for ok in [
            "iqn.2024-01.org.example:study-target",
            "iqn.1994-05.com.redhat:abc",
            "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test",
            "iqn-1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
            "eui.02004567A425678D",
            "naa.52004567BA64678D",
        ] {
            assert_eq!(validate(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn rejects_malformed_names() {
        for bad in [
            "",
            "iqn-",
            "iqn.24-01.org.example",
            "iqn.2024-13.org.example",
            "iqn.2024-01",
            "iqn.2024-01.:x",
            "target",
            "eui.123",
            "iqn.2024-01.org.example:has space",
        ] {
            assert!(validate(bad).is_err(), "{bad}");
        }
        assert!(validate(&format!("iqn-{}", "a".repeat(300))).is_err());
    }

    proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,60}") {
            let _ = validate(&s);
        }
    }
}
