//! `parameters.txt`: the deploy parameters on the virtual floppy, and the kernel command line.
//!
//! # Format
//! The conductor writes one `key=value` per line (`docs/ironic-protocols.md` §1.1).
//! Ramdisks split the file on white space, so values can never contain any; keys can never
//! contain `=`. The PXE variant (`pxe_ilo`) carries the same keys on the kernel command line
//! (§1.5), and floppy values override command-line values (§1.4, as IPA does).
//!
//! # Design
//! [`Params`] ([`raw`]) is the raw, ordered key/value view: unknown keys are kept and rendered
//! back unchanged. [`IscsiDeployParams`] and [`AgentParams`] ([`typed`]) are typed views over it
//! for the two deploy protocols, sharing [`CommonParams`]; [`network`] holds the NIC and static
//! network extras and [`hints`] parses the `root_device` value ([`RootDeviceHints`]).
//!
//! # Limitations
//! The floppy file is parsed strictly (a line without `=`, a duplicate key, control bytes or an
//! oversized file are errors), because it comes from our own conductor and a malformed one means
//! something is wrong. The kernel command line is parsed leniently, as the kernel itself does:
//! bare words are flags and later duplicates win.

pub mod hints;
pub mod network;
pub mod raw;
pub mod typed;

pub use hints::RootDeviceHints;
pub use network::{MacAddr, StaticNetwork};
pub use raw::{is_secret_key, Params};
pub use typed::{AgentParams, BootMode, BootOption, CommonParams, IscsiDeployParams};

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
    /// `1` (or `true`): the ramdisk logs at debug level (IPA's `ipa-debug`).
    pub const IPA_DEBUG: &str = "ipa-debug";
    /// Driver name (informational).
    pub const IPA_DRIVER_NAME: &str = "ipa-driver-name";
    /// Whether the agent serves its command API over HTTPS with a certificate it generates at
    /// boot and sends in its heartbeats (IPA's `enable_auto_tls` option, default on). `0`,
    /// `false`, `no` or `off` turn it off: the command API is then plain HTTP.
    pub const IPA_ENABLE_AUTO_TLS: &str = "ipa-enable-auto-tls";
    /// The address the agent puts in its callback URL (`callback_url` of the heartbeat, the
    /// `address` of `pass_deploy_info`) instead of the one its network bring-up got (IPA's
    /// `ipa-advertise-host`): for a ramdisk the conductor reaches through NAT or a port forward.
    pub const IPA_ADVERTISE_HOST: &str = "ipa-advertise-host";
    /// The port the agent puts in its callback URL instead of the one it listens on (IPA's
    /// `ipa-advertise-port`, default 9999).
    pub const IPA_ADVERTISE_PORT: &str = "ipa-advertise-port";
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

/// `s` cut to 64 characters, for error messages.
fn cut(s: &str) -> String {
    s.chars().take(64).collect()
}

/// An iSCSI deploy's floppy file as Ironic writes it, for the tests of every view.
#[cfg(test)]
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
