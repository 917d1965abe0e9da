//! The raw parameters: ordered `key=value` pairs, parsed from the floppy file or the kernel
//! command line and rendered back.

use std::fmt;

use super::{cut, ParamsError, MAX_FILE_LEN, MAX_KEY_LEN, MAX_VALUE_LEN};
use crate::secret::Secret;

/// Ordered `key=value` pairs; keys are unique.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Params {
    entries: Vec<(String, String)>,
}

impl fmt::Debug for Params {
    /// Secrets are masked: this is what ends up in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for (k, v) in &self.entries {
            if is_secret_key(k) {
                map.entry(k, &Secret::<&str>::new(v.as_str()));
            } else {
                map.entry(k, v);
            }
        }
        map.finish()
    }
}

/// Keys whose values must never be logged: the one list of [`crate::redact`].
pub use crate::redact::is_secret_key;

fn check_key(key: &str) -> Result<(), ParamsError> {
    if key.is_empty()
        || key
            .chars()
            .any(|c| c == '=' || c.is_whitespace() || c.is_control())
    {
        return Err(ParamsError::BadKey(cut(key)));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(ParamsError::TooLong {
            what: "key",
            key: cut(key),
            len: key.len(),
            max: MAX_KEY_LEN,
        });
    }
    Ok(())
}

fn check_value(key: &str, value: &str) -> Result<(), ParamsError> {
    if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ParamsError::BadValue { key: cut(key) });
    }
    if value.len() > MAX_VALUE_LEN {
        return Err(ParamsError::TooLong {
            what: "value",
            key: cut(key),
            len: value.len(),
            max: MAX_VALUE_LEN,
        });
    }
    Ok(())
}

impl Params {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses a `parameters.txt` file strictly (see the module docs).
    ///
    /// Empty lines and a trailing `\r` (a file edited on Windows) are accepted.
    pub fn parse(bytes: &[u8]) -> Result<Self, ParamsError> {
        if bytes.len() > MAX_FILE_LEN {
            return Err(ParamsError::TooLarge(bytes.len()));
        }
        let text = std::str::from_utf8(bytes).map_err(|e| ParamsError::NotUtf8(e.valid_up_to()))?;
        let mut params = Params::new();
        for (index, raw) in text.split('\n').enumerate() {
            let line_no = index + 1;
            let line = raw.strip_suffix('\r').unwrap_or(raw);
            if let Some(byte) = line.bytes().find(|b| b.is_ascii_control() && *b != b'\t') {
                return Err(ParamsError::ControlChar {
                    line: line_no,
                    byte,
                });
            }
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                return Err(ParamsError::MissingEquals {
                    line: line_no,
                    found: cut(line),
                });
            };
            if key.is_empty() {
                return Err(ParamsError::EmptyKey(line_no));
            }
            check_key(key)?;
            check_value(key, value)?;
            if params.get(key).is_some() {
                return Err(ParamsError::DuplicateKey {
                    line: line_no,
                    key: cut(key),
                });
            }
            params.entries.push((key.to_owned(), value.to_owned()));
        }
        Ok(params)
    }

    /// Parses a kernel command line the way the kernel and IPA do: tokens split on white space,
    /// `key=value` split on the first `=`, bare words kept with an empty value, later duplicates
    /// win. Never fails; oversized tokens are dropped.
    pub fn parse_cmdline(cmdline: &str) -> Self {
        let mut params = Params::new();
        for token in cmdline.split_whitespace() {
            if token == "--" {
                continue;
            }
            let (key, value) = token.split_once('=').unwrap_or((token, ""));
            if check_key(key).is_err() || value.len() > MAX_VALUE_LEN {
                continue;
            }
            params.insert_unchecked(key, value);
        }
        params
    }

    /// Sets `key` to `value`, replacing an earlier value in place.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ParamsError> {
        check_key(key)?;
        check_value(key, value)?;
        self.insert_unchecked(key, value);
        Ok(())
    }

    fn insert_unchecked(&mut self, key: &str, value: &str) {
        if let Some(entry) = self.entries.iter_mut().find(|(k, _)| k == key) {
            entry.1 = value.to_owned();
        } else {
            self.entries.push((key.to_owned(), value.to_owned()));
        }
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `key`, or an error naming it.
    pub fn require(&self, key: &'static str) -> Result<&str, ParamsError> {
        match self.get(key) {
            Some(v) if !v.is_empty() => Ok(v),
            _ => Err(ParamsError::Missing(key)),
        }
    }

    /// All pairs in order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `self` with every pair of `overrides` applied on top (floppy over command line).
    pub fn merged_with(&self, overrides: &Params) -> Params {
        let mut merged = self.clone();
        for (k, v) in overrides.iter() {
            merged.insert_unchecked(k, v);
        }
        merged
    }

    /// Renders the file: one `key=value` per line, each ending in `\n`.
    ///
    /// Fails if any key or value could not be read back (white space, `=` in a key), so a
    /// parameter is never silently split or merged by the ramdisk's white-space tokenizer.
    pub fn render(&self) -> Result<String, ParamsError> {
        let mut out = String::new();
        for (k, v) in &self.entries {
            check_key(k)?;
            check_value(k, v)?;
            out.push_str(k);
            out.push('=');
            out.push_str(v);
            out.push('\n');
        }
        if out.len() > MAX_FILE_LEN {
            return Err(ParamsError::TooLarge(out.len()));
        }
        Ok(out)
    }
}

impl FromIterator<(String, String)> for Params {
    /// Collects pairs without validation; [`Params::render`] validates.
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        let mut params = Params::new();
        for (k, v) in iter {
            params.insert_unchecked(&k, &v);
        }
        params
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::ISCSI_FILE;
    use proptest::prelude::*;

    #[test]
    fn render_then_parse_is_identity() {
        let params = Params::parse(ISCSI_FILE.as_bytes()).expect("valid file");
        let text = params.render().expect("renderable");
        assert_eq!(text, ISCSI_FILE);
        assert_eq!(Params::parse(text.as_bytes()).expect("reparse"), params);
    }

    #[test]
    fn malformed_files_are_errors() {
        type Case = (&'static str, &'static [u8], fn(&ParamsError) -> bool);
        let cases: &[Case] = &[
            ("no equals", b"a=1\njunk\n", |e| {
                matches!(e, ParamsError::MissingEquals { line: 2, .. })
            }),
            ("duplicate", b"a=1\na=2\n", |e| {
                matches!(e, ParamsError::DuplicateKey { line: 2, .. })
            }),
            ("empty key", b"=1\n", |e| {
                matches!(e, ParamsError::EmptyKey(1))
            }),
            ("binary", b"a=\x00\x01\x02\n", |e| {
                matches!(e, ParamsError::ControlChar { line: 1, .. })
            }),
            ("not utf8", b"a=\xff\xfe\n", |e| {
                matches!(e, ParamsError::NotUtf8(2))
            }),
            ("space in value", b"a=b c\n", |e| {
                matches!(e, ParamsError::BadValue { .. })
            }),
        ];
        for (name, input, check) in cases {
            let err = Params::parse(input).expect_err(name);
            assert!(check(&err), "{name}: {err:?}");
        }
    }

    #[test]
    fn one_mebibyte_value_is_refused() {
        let mut file = b"a=".to_vec();
        file.extend(std::iter::repeat_n(b'x', 1 << 20));
        assert_eq!(Params::parse(&file), Err(ParamsError::TooLarge(file.len())));
        let mut big = b"a=".to_vec();
        big.extend(std::iter::repeat_n(b'x', MAX_VALUE_LEN + 1));
        assert!(matches!(
            Params::parse(&big),
            Err(ParamsError::TooLong { what: "value", .. })
        ));
    }

    #[test]
    fn render_refuses_what_would_not_read_back() {
        let mut p = Params::new();
        assert!(matches!(p.set("a=b", "1"), Err(ParamsError::BadKey(_))));
        assert!(matches!(
            p.set("a", "x y"),
            Err(ParamsError::BadValue { .. })
        ));
        let sneaky: Params = [("k".to_string(), "has space".to_string())]
            .into_iter()
            .collect();
        assert!(sneaky.render().is_err());
        let sneaky: Params = [("k=1".to_string(), "v".to_string())].into_iter().collect();
        assert!(sneaky.render().is_err());
    }

    #[test]
    fn cmdline_is_lenient_and_floppy_overrides_it() {
        let cmdline = Params::parse_cmdline(
            "BOOT_IMAGE=/vmlinuz console=ttyS0 quiet boot_method=vmedia ipa-api-url=http://a:1 --",
        );
        assert_eq!(cmdline.get("quiet"), Some(""));
        assert_eq!(cmdline.get("boot_method"), Some("vmedia"));
        let floppy = Params::parse(b"ipa-api-url=https://conductor:6385\n").expect("valid");
        let merged = cmdline.merged_with(&floppy);
        assert_eq!(merged.get("ipa-api-url"), Some("https://conductor:6385"));
        assert_eq!(merged.get("console"), Some("ttyS0"));
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let _ = Params::parse(&bytes);
        }

        #[test]
        fn parse_never_panics_on_line_shaped_input(
            lines in proptest::collection::vec("[a-z=_ \\t\\r\\x00-\\x1f%,.:/-]{0,40}", 0..40)
        ) {
            let text = lines.join("\n");
            if let Ok(params) = Params::parse(text.as_bytes()) {
                // Whatever parses renders and parses back to the same thing.
                let rendered = params.render().expect("parsed params render");
                prop_assert_eq!(Params::parse(rendered.as_bytes()).expect("reparse"), params);
            }
            let _ = Params::parse_cmdline(&text);
        }

        #[test]
        fn valid_pairs_round_trip(
            pairs in proptest::collection::btree_map("[A-Za-z][A-Za-z0-9_.-]{0,20}", "[!-~]{0,60}", 0..20)
        ) {
            let params: Params = pairs.clone().into_iter().collect();
            let rendered = params.render().expect("printable pairs render");
            let parsed = Params::parse(rendered.as_bytes()).expect("rendered parses");
            prop_assert_eq!(parsed.len(), pairs.len());
            for (k, v) in &pairs {
                prop_assert_eq!(parsed.get(k), Some(v.as_str()));
            }
        }
    }
}
