//! Typed views over [`Params`] for the two deploy protocols: the iSCSI deploy's
//! ([`IscsiDeployParams`]) and the agent deploy's ([`AgentParams`]), with what both share
//! ([`CommonParams`]).

use std::net::IpAddr;

use base64::Engine as _;

use super::{cut, keys, MacAddr, Params, ParamsError, RootDeviceHints, StaticNetwork};
use crate::iscsi::ChapCredentials;
use crate::secret::Secret;

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
    /// The address to advertise instead of the one the network bring-up got
    /// (`ipa-advertise-host`).
    pub advertise_host: Option<IpAddr>,
    /// The port to advertise instead of the one the command API listens on
    /// (`ipa-advertise-port`).
    pub advertise_port: Option<u16>,
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
        let advertise_host = params
            .get(keys::IPA_ADVERTISE_HOST)
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.parse::<IpAddr>().map_err(|_| ParamsError::Invalid {
                    key: keys::IPA_ADVERTISE_HOST,
                    reason: format!("{v:?} is not an IP address"),
                })
            })
            .transpose()?;
        let advertise_port = params
            .get(keys::IPA_ADVERTISE_PORT)
            .filter(|v| !v.is_empty())
            .map(|v| match v.parse::<u16>() {
                Ok(port) if port > 0 => Ok(port),
                _ => Err(ParamsError::Invalid {
                    key: keys::IPA_ADVERTISE_PORT,
                    reason: format!("{v:?} is not a port number (1-65535)"),
                }),
            })
            .transpose()?;
        Ok(CommonParams {
            bootif,
            root_device,
            disks,
            agent_ca_pem,
            image_ca_pem,
            static_network: StaticNetwork::from_params(params)?,
            advertise_host,
            advertise_port,
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IscsiDeployParams {
    /// Node UUID.
    pub deployment_id: String,
    /// One-time deploy key.
    pub deployment_key: Secret,
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

impl IscsiDeployParams {
    /// The typed view; fails naming the first missing or malformed key.
    pub fn from_params(params: &Params) -> Result<Self, ParamsError> {
        let chap = match (
            params.get(keys::ISCSI_CHAP_USER),
            params.get(keys::ISCSI_CHAP_SECRET),
        ) {
            (Some(user), Some(secret)) if !user.is_empty() && !secret.is_empty() => {
                Some(ChapCredentials::new(user, secret))
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
            deployment_key: Secret::new(params.require(keys::DEPLOYMENT_KEY)?),
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentParams {
    /// Conductor API root, without `/v1`.
    pub api_url: String,
    /// Pre-generated agent token, if the conductor sent one.
    pub agent_token: Option<Secret>,
    /// NIC, disk, CA, network.
    pub common: CommonParams,
}

impl AgentParams {
    /// The typed view; fails naming the first missing or malformed key.
    pub fn from_params(params: &Params) -> Result<Self, ParamsError> {
        Ok(AgentParams {
            api_url: parse_url(keys::IPA_API_URL, params.require(keys::IPA_API_URL)?)?,
            agent_token: params
                .get(keys::IPA_AGENT_TOKEN)
                .filter(|t| !t.is_empty())
                .map(Secret::new),
            common: CommonParams::from_params(params)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::ISCSI_FILE;

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
        let file = format!(
            "{ISCSI_FILE}vmdeploy-iscsi-chap-user=alice\nvmdeploy-iscsi-chap-secret=chapsecret12\n"
        );
        let params = Params::parse(file.as_bytes()).expect("valid file");
        let shown = format!("{params:?} {params:#?}");
        assert!(!shown.contains("0123456789ABCDEF"), "{shown}");
        assert!(!shown.contains("chapsecret12"), "{shown}");
        let typed = IscsiDeployParams::from_params(&params).expect("valid");
        let shown = format!("{typed:?} {typed:#?}");
        assert!(!shown.contains("0123456789ABCDEF"), "{shown}");
        assert!(!shown.contains("chapsecret12"), "{shown}");
        assert!(shown.contains("alice"), "{shown}");
        assert_eq!(
            typed.deployment_key.expose(),
            "0123456789ABCDEFGHIJKLMNOPQRSTUV"
        );
        let chap = typed.chap.expect("CHAP given");
        assert_eq!(chap.secret.expose(), b"chapsecret12");
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
        assert_eq!(
            agent.agent_token.as_ref().map(|t| t.expose().as_str()),
            Some("tok")
        );
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
    fn advertise_host_and_port_are_ips_and_ports() {
        let base = "ipa-api-url=http://conductor\n";
        let p = Params::parse(
            format!("{base}ipa-advertise-host=127.0.0.1\nipa-advertise-port=40123\n").as_bytes(),
        )
        .expect("valid");
        let agent = AgentParams::from_params(&p).expect("agent params");
        assert_eq!(
            agent.common.advertise_host,
            Some(IpAddr::from([127, 0, 0, 1]))
        );
        assert_eq!(agent.common.advertise_port, Some(40123));
        let p = Params::parse(base.as_bytes()).expect("valid");
        let agent = AgentParams::from_params(&p).expect("agent params");
        assert_eq!(
            (agent.common.advertise_host, agent.common.advertise_port),
            (None, None)
        );
        for (line, key) in [
            (
                "ipa-advertise-host=conductor.example",
                keys::IPA_ADVERTISE_HOST,
            ),
            ("ipa-advertise-port=0", keys::IPA_ADVERTISE_PORT),
            ("ipa-advertise-port=65536", keys::IPA_ADVERTISE_PORT),
            ("ipa-advertise-port=x", keys::IPA_ADVERTISE_PORT),
        ] {
            let p = Params::parse(format!("{base}{line}\n").as_bytes()).expect("valid");
            let err = AgentParams::from_params(&p).expect_err(line);
            assert!(
                matches!(&err, ParamsError::Invalid { key: k, .. } if *k == key),
                "{line}: {err}"
            );
        }
    }
}
