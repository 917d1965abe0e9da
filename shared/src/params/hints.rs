//! Root device hints (`root_device`): which disk to deploy to.

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::{cut, ParamsError};

/// Root device hints (`root_device`): which disk to deploy to.
///
/// Values are percent-decoded, trimmed and, except `name`, compared case-insensitively (IPA
/// lowercases them); `size` is in GiB.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RootDeviceHints {
    /// Size in GiB (whole GiB, as Ironic computes it: bytes / 2^30 rounded down).
    pub size_gib: Option<u64>,
    /// Disk model, lowercased.
    pub model: Option<String>,
    /// Disk vendor, lowercased.
    pub vendor: Option<String>,
    /// Serial number, lowercased.
    pub serial: Option<String>,
    /// World wide name, lowercased.
    pub wwn: Option<String>,
    /// Device name, e.g. `/dev/sda` or `sda`.
    pub name: Option<String>,
}

/// Characters left unencoded in rendered hint values: RFC 3986 unreserved, as Python's `quote`.
const HINT_ENCODE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

impl RootDeviceHints {
    /// Parses `k=v,k=v`. Unknown hints are errors: guessing could pick the wrong disk.
    pub fn parse(value: &str) -> Result<Self, ParamsError> {
        let mut hints = RootDeviceHints::default();
        for item in value.split(',').filter(|s| !s.trim().is_empty()) {
            let Some((key, raw)) = item.split_once('=') else {
                return Err(ParamsError::Hints(format!(
                    "expected hint=value, found {:?}",
                    cut(item)
                )));
            };
            let decoded = percent_decode_str(raw)
                .decode_utf8()
                .map_err(|_| ParamsError::Hints(format!("value of {key:?} is not UTF-8")))?;
            let decoded = decoded.trim();
            if decoded.is_empty() {
                return Err(ParamsError::Hints(format!("empty value for {key:?}")));
            }
            let lower = decoded.to_lowercase();
            let key = key.trim();
            let slot = match key {
                "size" => {
                    let size = decoded.parse::<u64>().map_err(|_| {
                        ParamsError::Hints(format!(
                            "size must be a whole number of GiB, found {:?}",
                            cut(decoded)
                        ))
                    })?;
                    if hints.size_gib.replace(size).is_some() {
                        return Err(ParamsError::Hints("size given twice".into()));
                    }
                    continue;
                }
                "model" => &mut hints.model,
                "vendor" => &mut hints.vendor,
                "serial" => &mut hints.serial,
                "wwn" => &mut hints.wwn,
                "name" => {
                    if hints.name.replace(decoded.to_owned()).is_some() {
                        return Err(ParamsError::Hints("name given twice".into()));
                    }
                    continue;
                }
                other => {
                    return Err(ParamsError::Hints(format!(
                        "unknown hint {:?} (known: size, model, vendor, serial, wwn, name)",
                        cut(other)
                    )))
                }
            };
            if slot.replace(lower).is_some() {
                return Err(ParamsError::Hints(format!("{key} given twice")));
            }
        }
        if hints == RootDeviceHints::default() {
            return Err(ParamsError::Hints("no hints given".into()));
        }
        Ok(hints)
    }

    /// Renders `k=v,k=v` with percent-encoded values, in a fixed order.
    pub fn render(&self) -> String {
        let mut parts = Vec::new();
        if let Some(size) = self.size_gib {
            parts.push(format!("size={size}"));
        }
        let text = [
            ("model", &self.model),
            ("vendor", &self.vendor),
            ("serial", &self.serial),
            ("wwn", &self.wwn),
            ("name", &self.name),
        ];
        for (key, value) in text {
            if let Some(v) = value {
                parts.push(format!("{key}={}", utf8_percent_encode(v, HINT_ENCODE)));
            }
        }
        parts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn root_device_hints_round_trip_and_reject_unknown() {
        let hints = RootDeviceHints::parse("size=20,vendor=HP%20Inc,wwn=0x5000C5,name=/dev/sda")
            .expect("valid hints");
        assert_eq!(hints.vendor.as_deref(), Some("hp inc"));
        assert_eq!(hints.name.as_deref(), Some("/dev/sda"));
        assert_eq!(RootDeviceHints::parse(&hints.render()), Ok(hints));
        for bad in [
            "size=big",
            "colour=red",
            "model",
            "size=1,size=2",
            "",
            "model=%20",
        ] {
            assert!(RootDeviceHints::parse(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn hints_parser_never_panics(s in "[a-z=,%0-9A-F ]{0,80}") {
            let _ = RootDeviceHints::parse(&s);
        }
    }
}
