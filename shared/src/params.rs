//! `parameters.txt`: the deploy parameters on the virtual floppy, and the kernel command line.
//!
//! # Format
//! The conductor writes one `key=value` per line (`../shared/reference/ironic-protocols.md` §1.1).
//! Ramdisks split the file on white space, so values can never contain any; keys can never
//! contain `=`. The PXE variant (`pxe_ilo`) carries the same keys on the kernel command line
//! (§1.5), and floppy values override command-line values (§1.4, as IPA does).
//!
//! # Design
//! [`Params`] is the raw, ordered key/value view: unknown keys are kept and rendered back
//! unchanged. [`IscsiDeployParams`] and [`AgentParams`] are typed views over it for the two deploy
//! protocols; [`RootDeviceHints`] parses the `root_device` value.
//!
//! # Limitations
//! The floppy file is parsed strictly (a line without `=`, a duplicate key, control bytes or an
//! oversized file are errors), because it comes from our own conductor and a malformed one means
//! something is wrong. The kernel command line is parsed leniently, as the kernel itself does:
//! bare words are flags and later duplicates win.

use std::fmt;
use std::net::IpAddr;

use base64::Engine as _;
use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Largest `parameters.txt` accepted. The real file is well under 4 KiB (a CA certificate is the
/// largest value, base64 PEM); anything near a floppy's size is not a parameter file.
pub const MAX_FILE_LEN: usize = 64 * 1024;
/// Largest single value accepted (fits a base64 CA bundle of a few certificates).
pub const MAX_VALUE_LEN: usize = 32 * 1024;
/// Largest key accepted.
pub const MAX_KEY_LEN: usize = 128;

/// Keys of the iSCSI deploy (`iscsi_ilo`, `pxe_ilo`), §1.2(a).
pub mod keys {
    /// Node UUID.
    pub const DEPLOYMENT_ID: &str = "deployment_id";
    /// One-time deploy key, sent back in `pass_deploy_info`.
    pub const DEPLOYMENT_KEY: &str = "deployment_key";
    /// Target name the agent serves the disk under (Ironic sends `iqn-<node uuid>`).
    pub const ISCSI_TARGET_IQN: &str = "iscsi_target_iqn";
    /// Conductor API root, without `/v1`.
    pub const IRONIC_API_URL: &str = "ironic_api_url";
    /// Comma-separated candidate disks (`cciss/c0d0,sda,hda,vda`).
    pub const DISK: &str = "disk";
    /// Root device hints, `k=v,k=v`, values percent-encoded.
    pub const ROOT_DEVICE: &str = "root_device";
    /// `local` or `netboot`.
    pub const BOOT_OPTION: &str = "boot_option";
    /// `bios` or `uefi`.
    pub const BOOT_MODE: &str = "boot_mode";
    /// MAC address of the NIC to bring up.
    pub const BOOTIF: &str = "BOOTIF";
    /// Agent API root (IPA), without `/v1`.
    pub const IPA_API_URL: &str = "ipa-api-url";
    /// Pre-generated agent token (IPA).
    pub const IPA_AGENT_TOKEN: &str = "ipa-agent-token";
    /// Driver name (informational).
    pub const IPA_DRIVER_NAME: &str = "ipa-driver-name";
    /// How the ramdisk was booted; `vmedia` means "read the floppy".
    pub const BOOT_METHOD: &str = "boot_method";
    /// vmdeploy: the conductor's CA, PEM, standard base64 (no white space allowed in values).
    pub const IPA_AGENT_CA: &str = "ipa-agent-ca";
    /// vmdeploy: an extra CA for image URLs (e.g. an external object store), PEM, base64;
    /// trusted for image downloads only, together with [`IPA_AGENT_CA`].
    pub const IMAGE_CA: &str = "vmdeploy-image-ca";
    /// vmdeploy: iSCSI CHAP user name the agent's target requires.
    pub const ISCSI_CHAP_USER: &str = "vmdeploy-iscsi-chap-user";
    /// vmdeploy: iSCSI CHAP secret the agent's target requires.
    pub const ISCSI_CHAP_SECRET: &str = "vmdeploy-iscsi-chap-secret";
    /// vmdeploy: static address for DHCP-less deploys, `ADDR/PREFIX`.
    pub const STATIC_IP: &str = "vmdeploy-ip";
    /// vmdeploy: default gateway for DHCP-less deploys.
    pub const STATIC_GATEWAY: &str = "vmdeploy-gateway";
    /// vmdeploy: comma-separated DNS servers for DHCP-less deploys.
    pub const STATIC_DNS: &str = "vmdeploy-dns";
}

/// What went wrong reading or writing deploy parameters.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParamsError {
    /// The file is larger than [`MAX_FILE_LEN`].
    #[error("parameters file is {0} bytes, more than the {MAX_FILE_LEN} allowed")]
    TooLarge(usize),
    /// The file is not UTF-8 text.
    #[error("parameters file is not UTF-8 text (invalid byte at offset {0})")]
    NotUtf8(usize),
    /// A line holds a control character (binary data).
    #[error("line {line}: control character {byte:#04x} in parameters file")]
    ControlChar {
        /// 1-based line number.
        line: usize,
        /// The offending byte.
        byte: u8,
    },
    /// A line has no `=`.
    #[error("line {line}: expected key=value, found {found:?}")]
    MissingEquals {
        /// 1-based line number.
        line: usize,
        /// The line, cut to 64 characters.
        found: String,
    },
    /// A line starts with `=`.
    #[error("line {0}: empty key")]
    EmptyKey(usize),
    /// A key appears twice.
    #[error("line {line}: duplicate key {key:?}")]
    DuplicateKey {
        /// 1-based line number of the second occurrence.
        line: usize,
        /// The key.
        key: String,
    },
    /// A key or value is too long.
    #[error("{what} of {len} bytes for key {key:?} is longer than the {max} allowed")]
    TooLong {
        /// `key` or `value`.
        what: &'static str,
        /// The key (cut to 64 characters).
        key: String,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A key contains a character that cannot be rendered.
    #[error("key {0:?} contains white space, '=' or a control character")]
    BadKey(String),
    /// A value contains white space, which ramdisks would split on.
    #[error("value of {key:?} contains white space or a control character")]
    BadValue {
        /// The key.
        key: String,
    },
    /// A required key is absent.
    #[error("required parameter {0:?} is missing")]
    Missing(&'static str),
    /// A value does not have the form its key needs.
    #[error("parameter {key:?}: {reason}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// Why.
        reason: String,
    },
    /// The `root_device` hints are malformed.
    #[error("root_device hints: {0}")]
    Hints(String),
}

fn cut(s: &str) -> String {
    s.chars().take(64).collect()
}

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
                map.entry(k, &"******");
            } else {
                map.entry(k, v);
            }
        }
        map.finish()
    }
}

/// Keys whose values must never be logged.
pub fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("key") || k.contains("token") || k.contains("secret") || k.contains("password")
}

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

/// `boot_option`: where the instance boots from after the deploy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootOption {
    /// Boot ISO on virtual media (or PXE) on every boot.
    Netboot,
    /// Boot loader on the local disk.
    Local,
}

/// `boot_mode`: the firmware interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootMode {
    /// Legacy BIOS.
    Bios,
    /// UEFI.
    Uefi,
}

impl BootOption {
    fn parse(value: &str) -> Result<Self, ParamsError> {
        match value.to_ascii_lowercase().as_str() {
            "netboot" => Ok(Self::Netboot),
            "local" => Ok(Self::Local),
            other => Err(ParamsError::Invalid {
                key: keys::BOOT_OPTION,
                reason: format!("expected local or netboot, found {:?}", cut(other)),
            }),
        }
    }
}

impl BootMode {
    /// Parses `bios` or `uefi`, in any case.
    pub fn parse(value: &str) -> Result<Self, ParamsError> {
        match value.to_ascii_lowercase().as_str() {
            "bios" => Ok(Self::Bios),
            "uefi" => Ok(Self::Uefi),
            other => Err(ParamsError::Invalid {
                key: keys::BOOT_MODE,
                reason: format!("expected bios or uefi, found {:?}", cut(other)),
            }),
        }
    }

    /// `bios` or `uefi`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bios => "bios",
            Self::Uefi => "uefi",
        }
    }
}

/// A MAC address, as in `BOOTIF`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// Parses `aa:bb:cc:dd:ee:ff`, `aa-bb-…`, and pxelinux's `01-aa-bb-…` (hardware type 1 prefix).
    pub fn parse(value: &str) -> Result<Self, ParamsError> {
        let invalid = || ParamsError::Invalid {
            key: keys::BOOTIF,
            reason: format!("expected a MAC address, found {:?}", cut(value)),
        };
        let parts: Vec<&str> = value.split([':', '-']).collect();
        let parts = match parts.len() {
            6 => &parts[..],
            7 if parts[0] == "01" => &parts[1..],
            _ => return Err(invalid()),
        };
        let mut mac = [0u8; 6];
        for (byte, part) in mac.iter_mut().zip(parts) {
            if part.len() != 2 {
                return Err(invalid());
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| invalid())?;
        }
        Ok(MacAddr(mac))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

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

/// CHAP credentials for the agent's iSCSI target.
#[derive(Clone, PartialEq, Eq)]
pub struct ChapCredentials {
    /// User name.
    pub user: String,
    /// Secret (RFC 7143 §12.1.3: 12 to 16 bytes recommended).
    pub secret: String,
}

impl fmt::Debug for ChapCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChapCredentials")
            .field("user", &self.user)
            .field("secret", &"******")
            .finish()
    }
}

/// Static network configuration for DHCP-less deploys (vmdeploy keys `vmdeploy-ip`,
/// `vmdeploy-gateway`, `vmdeploy-dns`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticNetwork {
    /// Address of the interface.
    pub address: IpAddr,
    /// Prefix length.
    pub prefix_len: u8,
    /// Default gateway.
    pub gateway: Option<IpAddr>,
    /// DNS servers.
    pub dns: Vec<IpAddr>,
}

fn parse_ip(key: &'static str, value: &str) -> Result<IpAddr, ParamsError> {
    value.parse().map_err(|_| ParamsError::Invalid {
        key,
        reason: format!("expected an IP address, found {:?}", cut(value)),
    })
}

impl StaticNetwork {
    fn from_params(params: &Params) -> Result<Option<Self>, ParamsError> {
        let Some(ip) = params.get(keys::STATIC_IP) else {
            return Ok(None);
        };
        let (addr, prefix) = ip.split_once('/').ok_or_else(|| ParamsError::Invalid {
            key: keys::STATIC_IP,
            reason: format!("expected ADDR/PREFIX, found {:?}", cut(ip)),
        })?;
        let address = parse_ip(keys::STATIC_IP, addr)?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        let prefix_len = prefix
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| ParamsError::Invalid {
                key: keys::STATIC_IP,
                reason: format!("prefix length must be 0..={max}, found {:?}", cut(prefix)),
            })?;
        let gateway = params
            .get(keys::STATIC_GATEWAY)
            .map(|g| parse_ip(keys::STATIC_GATEWAY, g))
            .transpose()?;
        let dns = params
            .get(keys::STATIC_DNS)
            .map(|list| {
                list.split(',')
                    .filter(|s| !s.is_empty())
                    .map(|d| parse_ip(keys::STATIC_DNS, d))
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?
            .unwrap_or_default();
        Ok(Some(StaticNetwork {
            address,
            prefix_len,
            gateway,
            dns,
        }))
    }
}

fn parse_url(key: &'static str, value: &str) -> Result<String, ParamsError> {
    let lower = value.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) || value.len() < 10 {
        return Err(ParamsError::Invalid {
            key,
            reason: format!("expected an http(s) URL, found {:?}", cut(value)),
        });
    }
    Ok(value.trim_end_matches('/').to_owned())
}

/// What both deploy protocols share: the NIC, the disk and optional extras.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommonParams {
    /// NIC to bring up (`BOOTIF`); the first NIC with link when absent.
    pub bootif: Option<MacAddr>,
    /// Root device hints.
    pub root_device: Option<RootDeviceHints>,
    /// Candidate disk names, in order (`disk`).
    pub disks: Vec<String>,
    /// The conductor's CA certificate(s), PEM (`ipa-agent-ca`, base64 on the floppy).
    pub agent_ca_pem: Option<Vec<u8>>,
    /// An extra CA for image URLs only (`vmdeploy-image-ca`, base64 PEM).
    pub image_ca_pem: Option<Vec<u8>>,
    /// Static network configuration; DHCP when absent.
    pub static_network: Option<StaticNetwork>,
}

impl CommonParams {
    fn from_params(params: &Params) -> Result<Self, ParamsError> {
        let bootif = params
            .get(keys::BOOTIF)
            .filter(|v| !v.is_empty())
            .map(MacAddr::parse)
            .transpose()?;
        let root_device = params
            .get(keys::ROOT_DEVICE)
            .filter(|v| !v.is_empty())
            .map(RootDeviceHints::parse)
            .transpose()?;
        let disks = params
            .get(keys::DISK)
            .map(|d| {
                d.split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let agent_ca_pem = decode_pem_param(params, keys::IPA_AGENT_CA)?;
        let image_ca_pem = decode_pem_param(params, keys::IMAGE_CA)?;
        Ok(CommonParams {
            bootif,
            root_device,
            disks,
            agent_ca_pem,
            image_ca_pem,
            static_network: StaticNetwork::from_params(params)?,
        })
    }

    /// The CAs trusted for image URLs: the conductor's and the image CA, as one PEM bundle.
    pub fn image_trust_pem(&self) -> Option<Vec<u8>> {
        match (&self.agent_ca_pem, &self.image_ca_pem) {
            (None, None) => None,
            (a, b) => {
                let mut bundle = Vec::new();
                for pem in [a, b].into_iter().flatten() {
                    bundle.extend_from_slice(pem);
                    if !bundle.ends_with(b"\n") {
                        bundle.push(b'\n');
                    }
                }
                Some(bundle)
            }
        }
    }
}

/// A base64-encoded PEM value (values cannot hold white space, so PEM travels encoded).
fn decode_pem_param(params: &Params, key: &'static str) -> Result<Option<Vec<u8>>, ParamsError> {
    let Some(b64) = params.get(key).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let pem = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| ParamsError::Invalid {
            key,
            reason: format!("not base64: {e}"),
        })?;
    if !pem.starts_with(b"-----BEGIN ") {
        return Err(ParamsError::Invalid {
            key,
            reason: "decoded value is not a PEM certificate".into(),
        });
    }
    Ok(Some(pem))
}

/// The iSCSI deploy's parameters (`iscsi_ilo`, `pxe_ilo`).
#[derive(Clone, PartialEq, Eq)]
pub struct IscsiDeployParams {
    /// Node UUID.
    pub deployment_id: String,
    /// One-time deploy key.
    pub deployment_key: String,
    /// Target name to serve the disk under.
    pub iscsi_target_iqn: String,
    /// Conductor API root, without `/v1` and without a trailing `/`.
    pub ironic_api_url: String,
    /// `local` or `netboot`; `netboot` when absent, as Ironic defaults.
    pub boot_option: BootOption,
    /// `bios` or `uefi`; `bios` when absent.
    pub boot_mode: BootMode,
    /// CHAP credentials the target requires, if any.
    pub chap: Option<ChapCredentials>,
    /// NIC, disk, CA, network.
    pub common: CommonParams,
}

impl fmt::Debug for IscsiDeployParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IscsiDeployParams")
            .field("deployment_id", &self.deployment_id)
            .field("deployment_key", &"******")
            .field("iscsi_target_iqn", &self.iscsi_target_iqn)
            .field("ironic_api_url", &self.ironic_api_url)
            .field("boot_option", &self.boot_option)
            .field("boot_mode", &self.boot_mode)
            .field("chap", &self.chap)
            .field("common", &self.common)
            .finish()
    }
}

impl IscsiDeployParams {
    /// The typed view; fails naming the first missing or malformed key.
    pub fn from_params(params: &Params) -> Result<Self, ParamsError> {
        let chap = match (
            params.get(keys::ISCSI_CHAP_USER),
            params.get(keys::ISCSI_CHAP_SECRET),
        ) {
            (Some(user), Some(secret)) if !user.is_empty() && !secret.is_empty() => {
                Some(ChapCredentials {
                    user: user.to_owned(),
                    secret: secret.to_owned(),
                })
            }
            (None, None) => None,
            _ => {
                return Err(ParamsError::Invalid {
                    key: keys::ISCSI_CHAP_SECRET,
                    reason: "CHAP needs both a user and a secret".into(),
                })
            }
        };
        Ok(IscsiDeployParams {
            deployment_id: params.require(keys::DEPLOYMENT_ID)?.to_owned(),
            deployment_key: params.require(keys::DEPLOYMENT_KEY)?.to_owned(),
            iscsi_target_iqn: params.require(keys::ISCSI_TARGET_IQN)?.to_owned(),
            ironic_api_url: parse_url(keys::IRONIC_API_URL, params.require(keys::IRONIC_API_URL)?)?,
            boot_option: params
                .get(keys::BOOT_OPTION)
                .map(BootOption::parse)
                .transpose()?
                .unwrap_or(BootOption::Netboot),
            boot_mode: params
                .get(keys::BOOT_MODE)
                .map(BootMode::parse)
                .transpose()?
                .unwrap_or(BootMode::Bios),
            chap,
            common: CommonParams::from_params(params)?,
        })
    }
}

/// The agent deploy's parameters (`agent_ilo`, IPA-compatible).
#[derive(Clone, PartialEq, Eq)]
pub struct AgentParams {
    /// Conductor API root, without `/v1`.
    pub api_url: String,
    /// Pre-generated agent token, if the conductor sent one.
    pub agent_token: Option<String>,
    /// NIC, disk, CA, network.
    pub common: CommonParams,
}

impl fmt::Debug for AgentParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentParams")
            .field("api_url", &self.api_url)
            .field("agent_token", &self.agent_token.as_ref().map(|_| "******"))
            .field("common", &self.common)
            .finish()
    }
}

impl AgentParams {
    /// The typed view; fails naming the first missing or malformed key.
    pub fn from_params(params: &Params) -> Result<Self, ParamsError> {
        Ok(AgentParams {
            api_url: parse_url(keys::IPA_API_URL, params.require(keys::IPA_API_URL)?)?,
            agent_token: params
                .get(keys::IPA_AGENT_TOKEN)
                .filter(|t| !t.is_empty())
                .map(str::to_owned),
            common: CommonParams::from_params(params)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ISCSI_FILE: &str = "deployment_id=1be26c0b-03f2-4d2e-ae87-c02d7f33c123\n\
        deployment_key=0123456789ABCDEFGHIJKLMNOPQRSTUV\n\
        iscsi_target_iqn=iqn-1be26c0b-03f2-4d2e-ae87-c02d7f33c123\n\
        ironic_api_url=http://10.0.0.1:6385/\n\
        disk=cciss/c0d0,sda,hda,vda\n\
        boot_option=local\n\
        boot_mode=uefi\n\
        coreos.configdrive=0\n\
        root_device=size=100,model=ST%20Model%201,serial=S123\n\
        BOOTIF=52:54:00:12:34:56\n";

    #[test]
    fn iscsi_file_parses_into_the_typed_view() {
        let params = Params::parse(ISCSI_FILE.as_bytes()).expect("valid file");
        assert_eq!(
            params.get("coreos.configdrive"),
            Some("0"),
            "unknown keys kept"
        );
        let typed = IscsiDeployParams::from_params(&params).expect("valid iscsi params");
        assert_eq!(typed.deployment_id, "1be26c0b-03f2-4d2e-ae87-c02d7f33c123");
        assert_eq!(typed.ironic_api_url, "http://10.0.0.1:6385");
        assert_eq!(typed.boot_option, BootOption::Local);
        assert_eq!(typed.boot_mode, BootMode::Uefi);
        assert_eq!(typed.common.disks, ["cciss/c0d0", "sda", "hda", "vda"]);
        assert_eq!(
            typed.common.bootif,
            Some(MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x56]))
        );
        let hints = typed.common.root_device.expect("hints present");
        assert_eq!(hints.size_gib, Some(100));
        assert_eq!(hints.model.as_deref(), Some("st model 1"));
        assert_eq!(hints.serial.as_deref(), Some("s123"));
        assert!(typed.chap.is_none());
    }

    #[test]
    fn debug_output_masks_secrets() {
        let params = Params::parse(ISCSI_FILE.as_bytes()).expect("valid file");
        let shown = format!("{params:?}");
        assert!(!shown.contains("0123456789ABCDEF"), "{shown}");
        let typed = IscsiDeployParams::from_params(&params).expect("valid");
        assert!(!format!("{typed:?}").contains("0123456789ABCDEF"));
    }

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

    #[test]
    fn agent_params_with_ca_and_static_network() {
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let b64 = base64::engine::general_purpose::STANDARD.encode(pem);
        let file = format!(
            "ipa-api-url=https://192.0.2.1:6385\nipa-agent-token=tok\nipa-agent-ca={b64}\n\
             vmdeploy-ip=192.0.2.10/24\nvmdeploy-gateway=192.0.2.1\nvmdeploy-dns=192.0.2.53,2001:db8::53\n\
             BOOTIF=01-52-54-00-aa-bb-cc\n"
        );
        let params = Params::parse(file.as_bytes()).expect("valid");
        let agent = AgentParams::from_params(&params).expect("valid agent params");
        assert_eq!(agent.agent_token.as_deref(), Some("tok"));
        assert_eq!(agent.common.agent_ca_pem.as_deref(), Some(pem.as_bytes()));
        assert!(!format!("{agent:?}").contains("tok\""));
        let net = agent.common.static_network.clone().expect("static network");
        assert_eq!(net.prefix_len, 24);
        assert_eq!(net.dns.len(), 2);
        assert_eq!(
            agent.common.bootif.map(|m| m.to_string()).as_deref(),
            Some("52:54:00:aa:bb:cc")
        );
    }

    #[test]
    fn image_urls_trust_the_conductor_ca_and_the_image_ca() {
        let agent_pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----";
        let image_pem = "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n";
        let enc = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let base = "ipa-api-url=https://192.0.2.1:6385\n";
        let none = AgentParams::from_params(&Params::parse(base.as_bytes()).expect("valid"))
            .expect("valid");
        assert_eq!(none.common.image_trust_pem(), None);
        let file = format!(
            "{base}ipa-agent-ca={}\nvmdeploy-image-ca={}\n",
            enc(agent_pem),
            enc(image_pem)
        );
        let both = AgentParams::from_params(&Params::parse(file.as_bytes()).expect("valid"))
            .expect("valid");
        let bundle =
            String::from_utf8(both.common.image_trust_pem().expect("bundle")).expect("PEM is text");
        assert_eq!(bundle, format!("{agent_pem}\n{image_pem}"));
        let only_image = format!("{base}vmdeploy-image-ca={}\n", enc(image_pem));
        let p = AgentParams::from_params(&Params::parse(only_image.as_bytes()).expect("valid"))
            .expect("valid");
        assert_eq!(
            p.common.image_trust_pem().as_deref(),
            Some(image_pem.as_bytes())
        );
        let bad = format!("{base}vmdeploy-image-ca={}\n", enc("not a certificate"));
        let err = AgentParams::from_params(&Params::parse(bad.as_bytes()).expect("valid"))
            .expect_err("not PEM");
        assert!(err.to_string().contains("vmdeploy-image-ca"), "{err}");
    }

    #[test]
    fn typed_views_name_what_is_missing_or_wrong() {
        let p = Params::parse(b"deployment_id=x\n").expect("valid");
        assert_eq!(
            IscsiDeployParams::from_params(&p),
            Err(ParamsError::Missing(keys::DEPLOYMENT_KEY))
        );
        let p = Params::parse(b"ipa-api-url=ftp://x\n").expect("valid");
        assert!(matches!(
            AgentParams::from_params(&p),
            Err(ParamsError::Invalid {
                key: keys::IPA_API_URL,
                ..
            })
        ));
        let p = Params::parse(b"ipa-api-url=http://conductor\nBOOTIF=zz:zz\n").expect("valid");
        assert!(matches!(
            AgentParams::from_params(&p),
            Err(ParamsError::Invalid {
                key: keys::BOOTIF,
                ..
            })
        ));
    }

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

        #[test]
        fn hints_parser_never_panics(s in "[a-z=,%0-9A-F ]{0,80}") {
            let _ = RootDeviceHints::parse(&s);
        }
    }
}
