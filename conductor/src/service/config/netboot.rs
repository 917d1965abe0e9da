//! `[netboot]`: the network boot service of `pxe_ilo` ([`crate::netboot`]). Off unless a
//! listener is configured.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{check_url, ConfigError};

/// Keys, for messages.
pub mod keys {
    /// Directory TFTP and HTTP serve (default `<state dir>/netboot`).
    pub const ROOT: &str = "netboot.root";
    /// TFTP listen address (`ip:port`; PXE ROMs ask port 69).
    pub const TFTP_LISTEN: &str = "netboot.tftp_listen";
    /// HTTP listen address for iPXE.
    pub const HTTP_LISTEN: &str = "netboot.http_listen";
    /// The URL nodes reach the HTTP listener at (default from `http_listen`).
    pub const HTTP_URL: &str = "netboot.http_url";
    /// Deploy kernel when a node's `driver_info.pxe_deploy_kernel` is silent.
    pub const DEPLOY_KERNEL: &str = "netboot.deploy_kernel";
    /// Deploy ramdisk when `driver_info.pxe_deploy_ramdisk` is silent.
    pub const DEPLOY_RAMDISK: &str = "netboot.deploy_ramdisk";
    /// Words added to the deploy ramdisk's command line.
    pub const APPEND_PARAMS: &str = "netboot.append_params";
    /// Words added to a netboot instance's command line.
    pub const INSTANCE_APPEND_PARAMS: &str = "netboot.instance_append_params";
}

/// `[netboot]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetbootSection {
    /// `root`.
    pub root: Option<PathBuf>,
    /// `tftp_listen`.
    pub tftp_listen: Option<String>,
    /// `http_listen`.
    pub http_listen: Option<String>,
    /// `http_url`.
    pub http_url: Option<String>,
    /// `deploy_kernel`.
    pub deploy_kernel: Option<String>,
    /// `deploy_ramdisk`.
    pub deploy_ramdisk: Option<String>,
    /// `append_params`.
    pub append_params: Option<String>,
    /// `instance_append_params`.
    pub instance_append_params: Option<String>,
}

/// `[netboot]` checked.
#[derive(Debug, Clone, PartialEq)]
pub struct NetbootSettings {
    /// The boot root.
    pub root: PathBuf,
    /// TFTP listener.
    pub tftp_listen: Option<SocketAddr>,
    /// HTTP listener.
    pub http_listen: Option<SocketAddr>,
    /// The URL of the HTTP listener as nodes reach it (no trailing `/`).
    pub http_url: Option<String>,
    /// Default deploy kernel reference.
    pub deploy_kernel: Option<String>,
    /// Default deploy ramdisk reference.
    pub deploy_ramdisk: Option<String>,
    /// Deploy command-line additions (trimmed).
    pub append_params: String,
    /// Instance command-line additions (trimmed).
    pub instance_append_params: String,
}

fn listen(key: &str, value: Option<String>) -> Result<Option<SocketAddr>, ConfigError> {
    value
        .map(|v| {
            v.parse()
                .map_err(|_| ConfigError::new(key, format!("{v:?} is not an ip:port")))
        })
        .transpose()
}

fn one_line(key: &str, value: Option<String>) -> Result<String, ConfigError> {
    let value = value
        .as_deref()
        .map(str::trim)
        .unwrap_or_default()
        .to_string();
    if value.contains(|c: char| c.is_control() || matches!(c, ';' | '"' | '`' | '$')) {
        return Err(ConfigError::new(
            key,
            "a kernel command line is one line without ; \" ` or $ (boot configurations cannot \
             carry them)",
        ));
    }
    Ok(value)
}

/// Checks `section`; `None` when neither listener is configured (the service is off).
pub fn resolve(
    section: NetbootSection,
    state_dir: &Path,
) -> Result<Option<NetbootSettings>, ConfigError> {
    let tftp_listen = listen(keys::TFTP_LISTEN, section.tftp_listen)?;
    let http_listen = listen(keys::HTTP_LISTEN, section.http_listen)?;
    if tftp_listen.is_none() && http_listen.is_none() {
        for (key, set) in [
            (keys::ROOT, section.root.is_some()),
            (keys::HTTP_URL, section.http_url.is_some()),
            (keys::DEPLOY_KERNEL, section.deploy_kernel.is_some()),
            (keys::DEPLOY_RAMDISK, section.deploy_ramdisk.is_some()),
        ] {
            if set {
                return Err(ConfigError::new(
                    key,
                    "set, but the network boot service is off: give netboot.tftp_listen or \
                     netboot.http_listen too",
                ));
            }
        }
        return Ok(None);
    }
    let root = section.root.unwrap_or_else(|| state_dir.join("netboot"));
    if !root.is_absolute() {
        return Err(ConfigError::new(
            keys::ROOT,
            format!("{} is not an absolute path", root.display()),
        ));
    }
    let http_url = match (http_listen, section.http_url) {
        (None, Some(_)) => {
            return Err(ConfigError::new(
                keys::HTTP_URL,
                "set without netboot.http_listen",
            ))
        }
        (None, None) => None,
        (Some(_), Some(url)) => {
            check_url(keys::HTTP_URL, &url)?;
            Some(url.trim_end_matches('/').to_string())
        }
        (Some(addr), None) if addr.ip().is_unspecified() => {
            return Err(ConfigError::new(
                keys::HTTP_URL,
                format!(
                    "needed: netboot.http_listen is {addr}, which names no address a node \
                     can reach"
                ),
            ))
        }
        (Some(addr), None) => Some(format!("http://{addr}")),
    };
    if section.deploy_kernel.is_some() != section.deploy_ramdisk.is_some() {
        return Err(ConfigError::new(
            keys::DEPLOY_KERNEL,
            "netboot.deploy_kernel and netboot.deploy_ramdisk go together",
        ));
    }
    Ok(Some(NetbootSettings {
        root,
        tftp_listen,
        http_listen,
        http_url,
        deploy_kernel: section.deploy_kernel,
        deploy_ramdisk: section.deploy_ramdisk,
        append_params: one_line(keys::APPEND_PARAMS, section.append_params)?,
        instance_append_params: one_line(
            keys::INSTANCE_APPEND_PARAMS,
            section.instance_append_params,
        )?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Option<NetbootSettings>, ConfigError> {
        let section: NetbootSection = toml::from_str(text).expect("toml");
        resolve(section, Path::new("/var/lib/vmdeploy"))
    }

    #[test]
    fn off_unless_a_listener_is_set() {
        assert_eq!(parse("").expect("empty"), None);
        let err = parse("deploy_kernel = \"file:///k\"\ndeploy_ramdisk = \"file:///r\"\n")
            .expect_err("no listener");
        assert!(err.to_string().contains("tftp_listen"), "{err}");
    }

    #[test]
    fn defaults_and_checks() {
        let s = parse("tftp_listen = \"0.0.0.0:69\"\nhttp_listen = \"10.0.0.5:8080\"\n")
            .expect("ok")
            .expect("on");
        assert_eq!(s.root, Path::new("/var/lib/vmdeploy/netboot"));
        assert_eq!(s.http_url.as_deref(), Some("http://10.0.0.5:8080"));
        let err = parse("http_listen = \"0.0.0.0:8080\"\n").expect_err("unreachable");
        assert!(err.to_string().contains("netboot.http_url"), "{err}");
        let s = parse("http_listen = \"0.0.0.0:8080\"\nhttp_url = \"http://boot.example:8080/\"\n")
            .expect("ok")
            .expect("on");
        assert_eq!(s.http_url.as_deref(), Some("http://boot.example:8080"));
        for bad in [
            "tftp_listen = \"69\"",
            "tftp_listen = \":69\"\nroot = \"rel\"",
            "tftp_listen = \"127.0.0.1:69\"\nhttp_url = \"http://x\"",
            "tftp_listen = \"127.0.0.1:69\"\ndeploy_kernel = \"file:///k\"",
            "tftp_listen = \"127.0.0.1:69\"\nappend_params = \"a;b\"",
            "tftp_listen = \"127.0.0.1:69\"\nroot = \"rel\"",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
