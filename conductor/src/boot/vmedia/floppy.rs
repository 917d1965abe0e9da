//! The virtual floppy of a node's deploy ramdisk: `parameters.txt` on a FAT12 image labelled
//! `ir-vfd-dev` (docs/ironic-protocols.md §1.1, §1.2; docs/architecture.md §4).
//!
//! # Design
//! [`agent_params`] gathers the keys from the node, its ports and the settings into a
//! [`Params`]; [`build_image`] renders them with shared's renderer (which refuses any value the
//! ramdisk would split) and writes the image with `shared::fat`. Both are pure, so the tests
//! read the bytes back without an iLO.
//!
//! The agent token is generated here ([`new_agent_token`]) and travels only on the floppy
//! (the iLO fetches it over HTTPS from a temp URL); it is a [`Secret`] everywhere else.

use std::net::IpAddr;

use anyhow::{bail, Context};
use base64::Engine as _;
use serde_json::Value;
use vmdeploy_shared::fat::{self, FLOPPY_LABEL};
use vmdeploy_shared::params::{keys, Params, RootDeviceHints};
use vmdeploy_shared::secret::Secret;

use crate::context::DeployConfig;
use crate::store::{JsonObject, Node, Port};

/// The file the ramdisk reads.
pub const PARAMS_FILE: &str = "parameters.txt";

/// Bytes of randomness in an agent token: 256 bits, above the 128 docs/architecture.md §7 asks for.
const TOKEN_BYTES: usize = 32;

/// A fresh agent token: 32 random bytes, URL-safe base64 without padding (43 characters, the
/// shape of Ironic's `secrets.token_urlsafe()`; IPA wants at least 32).
pub fn new_agent_token() -> anyhow::Result<Secret> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes)
        .map_err(|e| anyhow::anyhow!("reading the system's random source: {e}"))?;
    Ok(Secret::new(
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes),
    ))
}

/// The agent deploy's `parameters.txt` for `node`: `ipa-api-url`, `ipa-agent-token`,
/// `ipa-agent-ca` (when the API speaks TLS), `ipa-driver-name`, `boot_method`, `root_device`
/// from `properties.root_device`, `BOOTIF` from the first PXE-enabled port and the static
/// network from `network_data`.
pub fn agent_params(
    node: &Node,
    ports: &[Port],
    config: &DeployConfig,
    token: &Secret,
) -> anyhow::Result<Params> {
    let mut params = ramdisk_params(node, ports, config)?;
    params
        .set(keys::IPA_AGENT_TOKEN, token.expose())
        .context("putting the agent token on the floppy")?;
    append_params(node, &mut params)?;
    Ok(params)
}

/// The keys both ramdisks read: the API URL and CA, the driver, the boot method, root device
/// hints, BOOTIF and the static network.
fn ramdisk_params(node: &Node, ports: &[Port], config: &DeployConfig) -> anyhow::Result<Params> {
    let mut params = Params::new();
    let mut set = |key: &str, value: &str| {
        params
            .set(key, value)
            .with_context(|| format!("putting {key} on the floppy"))
    };
    let api_url = config.api_url.trim().trim_end_matches('/');
    if !(api_url.starts_with("http://") || api_url.starts_with("https://")) {
        bail!("the API URL for the ramdisk {api_url:?} is not an http(s) URL (deploy.api_url)");
    }
    set(keys::IPA_API_URL, api_url)?;
    if let Some(pem) = &config.api_ca_pem {
        if !pem.trim_start().starts_with("-----BEGIN ") {
            bail!("the API's CA (deploy.api_ca_pem) is not a PEM certificate");
        }
        let b64 = base64::engine::general_purpose::STANDARD.encode(pem.as_bytes());
        set(keys::IPA_AGENT_CA, &b64)?;
    }
    set(keys::IPA_DRIVER_NAME, &node.driver)?;
    set(keys::BOOT_METHOD, "vmedia")?;
    let hints = node.properties.get("root_device").unwrap_or(&Value::Null);
    if let Some(hints) = RootDeviceHints::from_json(hints).context("properties.root_device")? {
        set(keys::ROOT_DEVICE, &hints.render())?;
    }
    if let Some(port) = ports.iter().find(|p| p.pxe_enabled) {
        let mac = vmdeploy_shared::params::MacAddr::parse(&port.address)
            .with_context(|| format!("port {} has address {:?}", port.uuid, port.address))?;
        set(keys::BOOTIF, &mac.to_string())?;
    }
    if let Some(net) = static_network(&node.network_data)? {
        set(
            keys::STATIC_IP,
            &format!("{}/{}", net.address, net.prefix_len),
        )?;
        if let Some(gw) = net.gateway {
            set(keys::STATIC_GATEWAY, &gw.to_string())?;
        }
        if !net.dns.is_empty() {
            let dns: Vec<String> = net.dns.iter().map(ToString::to_string).collect();
            set(keys::STATIC_DNS, &dns.join(","))?;
        }
    }
    Ok(params)
}

/// Ironic's deploy key alphabet (`utils.random_alnum`: digits and upper-case letters).
const DEPLOY_KEY_ALPHABET: &[u8; 36] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
/// Characters in a deploy key: 32 of 36 symbols, about 165 bits (Ironic's length; docs/architecture.md
/// §7 asks for at least 128).
pub const DEPLOY_KEY_LEN: usize = 32;
/// What Ironic puts in `disk` when it is not configured (`[pxe]disk_devices`): the ramdisk
/// serves the first of these that exists, unless `root_device` hints choose.
pub const DEFAULT_DISK_DEVICES: &str = "cciss/c0d0,sda,hda,vda";

/// A fresh one-use deploy key for the iSCSI ramdisk: [`DEPLOY_KEY_LEN`] characters of
/// [`DEPLOY_KEY_ALPHABET`], each drawn without modulo bias (bytes of 252 and above are thrown
/// away, 252 being the largest multiple of 36 in a byte).
pub fn new_deploy_key() -> anyhow::Result<Secret> {
    let mut key = String::with_capacity(DEPLOY_KEY_LEN);
    let mut bytes = [0u8; 64];
    while key.len() < DEPLOY_KEY_LEN {
        getrandom::fill(&mut bytes)
            .map_err(|e| anyhow::anyhow!("reading the system's random source: {e}"))?;
        for b in bytes.iter().filter(|&&b| b < 252) {
            if key.len() == DEPLOY_KEY_LEN {
                break;
            }
            key.push(char::from(DEPLOY_KEY_ALPHABET[usize::from(b % 36)]));
        }
    }
    Ok(Secret::new(key))
}

/// What an iSCSI deploy's floppy says beyond the node: its key, where the instance boots from,
/// the firmware, and the CHAP credentials the ramdisk's target must require.
#[derive(Debug, Clone)]
pub struct IscsiFloppy<'a> {
    /// The one-use deploy key ([`new_deploy_key`]).
    pub deploy_key: &'a Secret,
    /// `local` for whole-disk images and `boot_option: local`, else `netboot`.
    pub boot_option: vmdeploy_shared::params::BootOption,
    /// The firmware the instance boots in.
    pub boot_mode: vmdeploy_shared::params::BootMode,
    /// CHAP user and secret, when configured.
    pub chap: Option<(&'a str, &'a Secret)>,
}

/// The iSCSI deploy's `parameters.txt` for `node` (docs/ironic-protocols.md
/// §1.2 a): `deployment_id`, `deployment_key`, `iscsi_target_iqn` (`iqn-<node uuid>`, as Ironic
/// sends it), `ironic_api_url` (no `/v1`), `disk`, `boot_option`, `boot_mode`,
/// `coreos.configdrive=0`, `ipa-api-url`, `ipa-driver-name`, `boot_method=vmedia`, and, as for
/// the agent deploy, `ipa-agent-ca`, `root_device`, `BOOTIF` and the static network.
pub fn iscsi_params(
    node: &Node,
    ports: &[Port],
    config: &DeployConfig,
    floppy: &IscsiFloppy<'_>,
) -> anyhow::Result<Params> {
    // No agent token: the iSCSI ramdisk authenticates with the deploy key.
    let mut params = ramdisk_params(node, ports, config)?;
    let api_url = params
        .get(keys::IPA_API_URL)
        .context("the agent keys carry the API URL")?
        .to_owned();
    let mut set = |key: &str, value: &str| {
        params
            .set(key, value)
            .with_context(|| format!("putting {key} on the floppy"))
    };
    set(keys::DEPLOYMENT_ID, &node.uuid.to_string())?;
    set(keys::DEPLOYMENT_KEY, floppy.deploy_key.expose())?;
    set(keys::ISCSI_TARGET_IQN, &format!("iqn-{}", node.uuid))?;
    set(keys::IRONIC_API_URL, &api_url)?;
    set(keys::DISK, DEFAULT_DISK_DEVICES)?;
    set(
        keys::BOOT_OPTION,
        match floppy.boot_option {
            vmdeploy_shared::params::BootOption::Local => "local",
            vmdeploy_shared::params::BootOption::Netboot => "netboot",
        },
    )?;
    set(keys::BOOT_MODE, floppy.boot_mode.as_str())?;
    set("coreos.configdrive", "0")?;
    if let Some((user, secret)) = floppy.chap {
        set(keys::ISCSI_CHAP_USER, user)?;
        set(keys::ISCSI_CHAP_SECRET, secret.expose())?;
    }
    append_params(node, &mut params)?;
    Ok(params)
}

/// The node's own ramdisk parameters.
pub const KERNEL_APPEND_PARAMS: &str = "kernel_append_params";

/// `driver_info.kernel_append_params` (Ironic's per-node ramdisk arguments, e.g.
/// `ipa-advertise-host=10.1.2.3 ipa-advertise-port=19999` for a ramdisk behind NAT): every
/// `key=value` word goes on the floppy, since the deploy ISO's kernel command line is the same
/// for every node and the floppy is where a node's parameters travel. Words without `=` (kernel
/// flags such as `nofb`) cannot reach a kernel that has booted already: they are logged and
/// left out. A key the conductor sets itself (the API URL, the token, the deploy key...) is
/// refused, so a node cannot redirect its ramdisk or replace its credentials this way.
fn append_params(node: &Node, params: &mut Params) -> anyhow::Result<()> {
    let Some(value) = node.driver_info.get(KERNEL_APPEND_PARAMS) else {
        return Ok(());
    };
    let text = match value {
        Value::Null => return Ok(()),
        Value::String(text) => text,
        other => bail!("driver_info.{KERNEL_APPEND_PARAMS} must be a string, not {other}"),
    };
    for word in text.split_whitespace() {
        let Some((key, val)) = word.split_once('=') else {
            tracing::info!(
                flag = word,
                "driver_info.{KERNEL_APPEND_PARAMS}: a kernel flag without a value is not put on \
                 the floppy"
            );
            continue;
        };
        if params.get(key).is_some() {
            bail!(
                "driver_info.{KERNEL_APPEND_PARAMS} may not set {key:?}: the conductor sets it \
                 on the floppy itself"
            );
        }
        params
            .set(key, val)
            .with_context(|| format!("driver_info.{KERNEL_APPEND_PARAMS}: {word:?}"))?;
    }
    Ok(())
}

/// The floppy image holding `params` as `parameters.txt`, labelled `ir-vfd-dev`.
pub fn build_image(params: &Params) -> anyhow::Result<Vec<u8>> {
    let text = params.render().context("rendering parameters.txt")?;
    fat::build_floppy(FLOPPY_LABEL, &[(PARAMS_FILE, text.as_bytes())])
        .context("writing the floppy image")
}

/// The static network of a DHCP-less deploy.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StaticNet {
    address: IpAddr,
    prefix_len: u8,
    gateway: Option<IpAddr>,
    dns: Vec<IpAddr>,
}

/// The first static network of `network_data` (Nova's `network_data.json`, which Ironic keeps
/// in the node's `network_data`): `networks[]` of type `ipv4`/`ipv6` with `ip_address` and
/// `netmask` (dotted or a prefix length; or `ip_address` as `ADDR/PREFIX`), the gateway of its
/// default route, DNS servers from `services[]` of type `dns`. `None` when there is no static
/// network (DHCP).
fn static_network(network_data: &JsonObject) -> anyhow::Result<Option<StaticNet>> {
    let Some(networks) = network_data.get("networks") else {
        return Ok(None);
    };
    let networks = networks
        .as_array()
        .context("network_data.networks must be a list")?;
    let Some((index, net)) = networks
        .iter()
        .enumerate()
        .find(|(_, n)| matches!(n.get("type").and_then(Value::as_str), Some("ipv4" | "ipv6")))
    else {
        return Ok(None);
    };
    let field = format!("network_data.networks[{index}]");
    let ip_text = net
        .get("ip_address")
        .and_then(Value::as_str)
        .with_context(|| format!("{field}.ip_address is missing"))?;
    let (addr_text, inline_prefix) = match ip_text.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (ip_text, None),
    };
    let address: IpAddr = addr_text
        .trim()
        .parse()
        .with_context(|| format!("{field}.ip_address {ip_text:?} is not an IP address"))?;
    let max = if address.is_ipv4() { 32 } else { 128 };
    let prefix_len = match (inline_prefix, net.get("netmask")) {
        (Some(p), _) => p.trim().parse::<u8>().ok(),
        (None, Some(Value::String(mask))) => prefix_of(mask),
        (None, Some(Value::Number(n))) => n.as_u64().and_then(|n| u8::try_from(n).ok()),
        (None, _) => None,
    }
    .filter(|p| *p <= max)
    .with_context(|| format!("{field}: no valid netmask or prefix length"))?;
    let mut gateway = None;
    if let Some(routes) = net.get("routes").and_then(Value::as_array) {
        for route in routes {
            let is_default = matches!(
                route.get("network").and_then(Value::as_str),
                Some("0.0.0.0" | "::")
            );
            if let (true, Some(gw)) = (is_default, route.get("gateway").and_then(Value::as_str)) {
                gateway = Some(gw.trim().parse::<IpAddr>().with_context(|| {
                    format!("{field}.routes: gateway {gw:?} is not an IP address")
                })?);
                break;
            }
        }
    }
    let mut dns = Vec::new();
    let services = network_data
        .get("services")
        .and_then(Value::as_array)
        .into_iter()
        .chain(net.get("services").and_then(Value::as_array))
        .flatten();
    for service in services {
        if service.get("type").and_then(Value::as_str) == Some("dns") {
            if let Some(a) = service.get("address").and_then(Value::as_str) {
                let ip: IpAddr = a.trim().parse().with_context(|| {
                    format!("network_data.services: DNS address {a:?} is not an IP address")
                })?;
                if !dns.contains(&ip) {
                    dns.push(ip);
                }
            }
        }
    }
    Ok(Some(StaticNet {
        address,
        prefix_len,
        gateway,
        dns,
    }))
}

/// The prefix length of a dotted netmask (`255.255.255.0` → 24) or of a number in a string.
fn prefix_of(mask: &str) -> Option<u8> {
    let mask = mask.trim();
    if let Ok(p) = mask.parse::<u8>() {
        return Some(p);
    }
    let ip: IpAddr = mask.parse().ok()?;
    let (bits, width) = match ip {
        IpAddr::V4(v4) => (u128::from(u32::from(v4)) << 96, 32u32),
        IpAddr::V6(v6) => (u128::from(v6), 128u32),
    };
    let ones = bits.leading_ones();
    // A netmask is contiguous ones then zeros.
    if bits.checked_shl(ones).unwrap_or(0) != 0 || ones > width {
        return None;
    }
    u8::try_from(ones).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::states::ProvisionState;
    use serde_json::json;
    use std::io::Cursor;
    use std::time::Duration;
    use uuid::Uuid;
    use vmdeploy_shared::params::AgentParams;

    const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";

    fn config(ca: Option<&str>) -> DeployConfig {
        DeployConfig {
            api_url: "https://192.0.2.1:6385/".into(),
            api_ca_pem: ca.map(str::to_owned),
            agent_allow_plain_http: false,
            agent_call_timeout: Duration::from_secs(60),
            ..DeployConfig::for_tests()
        }
    }

    fn obj(v: Value) -> JsonObject {
        match v {
            Value::Object(o) => o,
            _ => JsonObject::new(),
        }
    }

    fn port(node: Uuid, mac: &str, pxe: bool) -> Port {
        Port {
            uuid: Uuid::new_v4(),
            address: mac.into(),
            node_uuid: node,
            pxe_enabled: pxe,
            extra: JsonObject::new(),
            created_at: time::OffsetDateTime::now_utc(),
            updated_at: None,
        }
    }

    #[test]
    fn deploy_keys_are_32_upper_alnum_and_differ() {
        let keys: Vec<String> = (0..50)
            .map(|_| new_deploy_key().expect("key").expose().clone())
            .collect();
        for k in &keys {
            assert_eq!(k.len(), DEPLOY_KEY_LEN, "{k}");
            assert!(
                k.bytes()
                    .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase()),
                "{k}"
            );
        }
        let distinct: std::collections::BTreeSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), keys.len(), "two keys repeated");
    }

    /// The iSCSI floppy carries the keys of docs/ironic-protocols.md §1.2 (a), spelled as written
    /// there, and shared's typed view (what the agent reads) agrees with them.
    #[test]
    fn iscsi_floppy_has_ironics_keys_and_the_agent_reads_them() {
        let uuid = Uuid::parse_str("1be26c0b-03f2-4d2e-ae87-c02d7f33c123").expect("uuid");
        let mut node = Node::new(uuid, "iscsi_ilo", ProvisionState::Deploying);
        node.properties = obj(json!({"root_device": {"serial": "S1"}}));
        let ports = [port(uuid, "52:54:00:12:34:56", true)];
        let key = new_deploy_key().expect("key");
        let chap_secret = Secret::new("chap-secret-123456".to_string());
        let params = iscsi_params(
            &node,
            &ports,
            &config(Some(CA)),
            &IscsiFloppy {
                deploy_key: &key,
                boot_option: vmdeploy_shared::params::BootOption::Local,
                boot_mode: vmdeploy_shared::params::BootMode::Uefi,
                chap: Some(("chap-user", &chap_secret)),
            },
        )
        .expect("params");
        let back = read_back(&build_image(&params).expect("image"));
        for (k, v) in [
            ("deployment_id", "1be26c0b-03f2-4d2e-ae87-c02d7f33c123"),
            ("deployment_key", key.expose().as_str()),
            (
                "iscsi_target_iqn",
                "iqn-1be26c0b-03f2-4d2e-ae87-c02d7f33c123",
            ),
            ("ironic_api_url", "https://192.0.2.1:6385"),
            ("ipa-api-url", "https://192.0.2.1:6385"),
            ("ipa-driver-name", "iscsi_ilo"),
            ("disk", "cciss/c0d0,sda,hda,vda"),
            ("boot_option", "local"),
            ("boot_mode", "uefi"),
            ("coreos.configdrive", "0"),
            ("boot_method", "vmedia"),
            ("BOOTIF", "52:54:00:12:34:56"),
        ] {
            assert_eq!(back.get(k), Some(v), "{k}");
        }
        assert_eq!(
            back.get("ipa-agent-token"),
            None,
            "no agent token on an iSCSI floppy"
        );
        let typed = vmdeploy_shared::params::IscsiDeployParams::from_params(&back)
            .expect("the agent's typed view");
        assert_eq!(typed.deployment_key, key);
        assert_eq!(typed.boot_mode, vmdeploy_shared::params::BootMode::Uefi);
        assert_eq!(
            typed.boot_option,
            vmdeploy_shared::params::BootOption::Local
        );
        assert!(typed.chap.is_some(), "CHAP credentials reach the ramdisk");
        assert_eq!(typed.common.disks, ["cciss/c0d0", "sda", "hda", "vda"]);
        assert!(typed.common.root_device.is_some());
        assert!(typed.common.agent_ca_pem.is_some());
    }

    /// Reads `parameters.txt` back from the image bytes with shared's FAT reader.
    fn read_back(image: &[u8]) -> Params {
        let text = fat::read_root_file(Cursor::new(image), PARAMS_FILE, 64 * 1024)
            .expect("parameters.txt on the floppy");
        Params::parse(&text).expect("a valid parameters file")
    }

    #[test]
    fn floppy_carries_every_key_and_reads_back() {
        let mut node = Node::new(Uuid::new_v4(), "agent_ilo", ProvisionState::Deploying);
        node.properties = obj(json!({"root_device": {"serial": "S123 ", "size": 100}}));
        node.network_data = obj(json!({
            "links": [{"id": "p0", "type": "phy", "ethernet_mac_address": "52:54:00:aa:bb:cc"}],
            "networks": [{"id": "n0", "type": "ipv4", "link": "p0",
                          "ip_address": "192.0.2.10", "netmask": "255.255.255.0",
                          "routes": [{"network": "10.0.0.0", "netmask": "255.0.0.0",
                                      "gateway": "192.0.2.254"},
                                     {"network": "0.0.0.0", "netmask": "0.0.0.0",
                                      "gateway": "192.0.2.1"}]}],
            "services": [{"type": "dns", "address": "192.0.2.53"}]
        }));
        let ports = [
            port(node.uuid, "52:54:00:00:00:01", false),
            port(node.uuid, "52:54:00:AA:BB:CC", true),
        ];
        let token = new_agent_token().expect("token");
        let params = agent_params(&node, &ports, &config(Some(CA)), &token).expect("params");
        let image = build_image(&params).expect("image");
        assert_eq!(image.len(), fat::FLOPPY_SIZE);
        assert_eq!(
            fat::fat_label(&image[..512]).expect("FAT").as_deref(),
            Some("ir-vfd-dev")
        );
        let back = read_back(&image);
        assert_eq!(back.get("ipa-api-url"), Some("https://192.0.2.1:6385"));
        assert_eq!(back.get("ipa-agent-token"), Some(token.expose().as_str()));
        assert_eq!(back.get("BOOTIF"), Some("52:54:00:aa:bb:cc"));
        assert_eq!(back.get("root_device"), Some("size=100,serial=s123"));
        assert_eq!(back.get("vmdeploy-ip"), Some("192.0.2.10/24"));
        assert_eq!(back.get("vmdeploy-gateway"), Some("192.0.2.1"));
        assert_eq!(back.get("vmdeploy-dns"), Some("192.0.2.53"));
        assert_eq!(back.get("boot_method"), Some("vmedia"));
        assert_eq!(back.get("ipa-driver-name"), Some("agent_ilo"));
        // The agent's own typed view accepts it, and decodes the CA to the same PEM.
        let agent = AgentParams::from_params(&back).expect("the agent's view");
        assert_eq!(agent.common.agent_ca_pem.as_deref(), Some(CA.as_bytes()));
        assert_eq!(agent.common.static_network.map(|n| n.prefix_len), Some(24));
        assert!(!format!("{params:?}").contains(token.expose().as_str()));
    }

    #[test]
    fn plain_http_api_has_no_ca_and_dhcp_has_no_static_keys() {
        let node = Node::new(Uuid::new_v4(), "agent_ilo", ProvisionState::Deploying);
        let mut cfg = config(None);
        cfg.api_url = "http://127.0.0.1:6385".into();
        let token = Secret::new("t".repeat(43));
        let params = agent_params(&node, &[], &cfg, &token).expect("params");
        let keys: Vec<&str> = params.iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "ipa-api-url",
                "ipa-driver-name",
                "boot_method",
                "ipa-agent-token"
            ]
        );
    }

    #[test]
    fn bad_node_fields_are_named() {
        let mut node = Node::new(Uuid::new_v4(), "agent_ilo", ProvisionState::Deploying);
        let token = Secret::new("x".repeat(43));
        node.properties = obj(json!({"root_device": {"colour": "red"}}));
        let err = agent_params(&node, &[], &config(None), &token).expect_err("unknown hint");
        let msg = format!("{err:#}");
        assert!(msg.contains("properties.root_device"), "{msg}");
        assert!(msg.contains("colour: unknown hint"), "{msg}");
        node.properties = obj(json!({"root_device": {"size": ">= 100"}}));
        let err = agent_params(&node, &[], &config(None), &token).expect_err("operator");
        assert!(format!("{err:#}").contains("operator \">=\""), "{err:#}");
        // The same rules as the agent's: spaces inside a value and Ironic's equality operator.
        node.properties = obj(json!({"root_device": {"model": "s== LOGICAL VOLUME"}}));
        let params = agent_params(&node, &[], &config(None), &token).expect("model hint");
        assert_eq!(params.get("root_device"), Some("model=logical%20volume"));
        node.properties = JsonObject::new();
        node.network_data = obj(
            json!({"networks": [{"type": "ipv4", "ip_address": "10.0.0.5",
                                                     "netmask": "255.0.255.0"}]}),
        );
        let err = agent_params(&node, &[], &config(None), &token).expect_err("bad mask");
        assert!(
            format!("{err:#}").contains("network_data.networks[0]"),
            "{err:#}"
        );
        let mut cfg = config(None);
        cfg.api_url = "ftp://x".into();
        node.network_data = JsonObject::new();
        assert!(agent_params(&node, &[], &cfg, &token).is_err());
    }

    #[test]
    fn kernel_append_params_go_on_the_floppy_but_cannot_replace_the_conductors_keys() {
        let mut node = Node::new(Uuid::new_v4(), "agent_ilo", ProvisionState::Deploying);
        let token = Secret::new("t".repeat(43));
        node.driver_info = obj(json!({
            "kernel_append_params": "nofb ipa-advertise-host=127.0.0.1  ipa-advertise-port=40123"
        }));
        let params = agent_params(&node, &[], &config(None), &token).expect("params");
        let back = read_back(&build_image(&params).expect("image"));
        assert_eq!(back.get("ipa-advertise-host"), Some("127.0.0.1"));
        assert_eq!(back.get("ipa-advertise-port"), Some("40123"));
        assert_eq!(
            back.get("nofb"),
            None,
            "a flag without a value stays off the floppy"
        );
        let agent = AgentParams::from_params(&back).expect("the agent's view");
        assert_eq!(agent.common.advertise_port, Some(40123));

        for taken in [
            "ipa-api-url=http://evil:1",
            "ipa-agent-token=mine",
            "boot_method=pxe",
        ] {
            node.driver_info = obj(json!({ "kernel_append_params": taken }));
            let err = agent_params(&node, &[], &config(None), &token).expect_err(taken);
            assert!(format!("{err:#}").contains("may not set"), "{err:#}");
        }
        let key = Secret::new("K".repeat(32));
        node.driver_info = obj(json!({ "kernel_append_params": "deployment_key=mine" }));
        let floppy = IscsiFloppy {
            deploy_key: &key,
            boot_option: vmdeploy_shared::params::BootOption::Local,
            boot_mode: vmdeploy_shared::params::BootMode::Bios,
            chap: None,
        };
        let err = iscsi_params(&node, &[], &config(None), &floppy).expect_err("deploy key");
        assert!(format!("{err:#}").contains("may not set"), "{err:#}");
        node.driver_info = obj(json!({ "kernel_append_params": 7 }));
        let err = agent_params(&node, &[], &config(None), &token).expect_err("a number");
        assert!(format!("{err:#}").contains("must be a string"), "{err:#}");
        node.driver_info = obj(json!({ "kernel_append_params": "a=b\u{7}" }));
        assert!(agent_params(&node, &[], &config(None), &token).is_err());
    }

    #[test]
    fn tokens_are_long_random_and_url_safe() {
        let a = new_agent_token().expect("token");
        let b = new_agent_token().expect("token");
        assert_eq!(a.expose().len(), 43);
        assert_ne!(a.expose(), b.expose());
        assert!(a
            .expose()
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    }

    #[test]
    fn netmasks() {
        assert_eq!(prefix_of("255.255.255.0"), Some(24));
        assert_eq!(prefix_of("255.255.255.255"), Some(32));
        assert_eq!(prefix_of("0.0.0.0"), Some(0));
        assert_eq!(prefix_of("ffff:ffff:ffff:ffff::"), Some(64));
        assert_eq!(prefix_of("16"), Some(16));
        assert_eq!(prefix_of("255.0.255.0"), None);
        assert_eq!(prefix_of("x"), None);
    }

    /// The image passes the system's own FAT tools: `fsck.vfat` finds nothing to fix and
    /// `mtype` (mtools) reads the same parameters back.
    #[test]
    fn system_fat_tools_accept_the_image() {
        let node = Node::new(Uuid::new_v4(), "agent_ilo", ProvisionState::Deploying);
        let token = new_agent_token().expect("token");
        let params = agent_params(&node, &[], &config(Some(CA)), &token).expect("params");
        let image = build_image(&params).expect("image");
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("floppy.img");
        std::fs::write(&path, &image).expect("writing the image");
        let img = path.display().to_string();
        let run = |tool: &str, args: &[&str]| {
            let out = std::process::Command::new(tool)
                .args(args)
                .env("MTOOLS_SKIP_CHECK", "1")
                .output()
                .unwrap_or_else(|e| {
                    panic!("running {tool}: {e} (fix: apt-get install dosfstools mtools)")
                });
            assert!(
                out.status.success(),
                "{tool} {args:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            out.stdout
        };
        run("fsck.vfat", &["-n", &img]);
        let label =
            String::from_utf8_lossy(&run("mlabel", &["-s", "-i", &img, "::"])).to_lowercase();
        assert!(label.contains("ir-vfd-dev"), "mlabel -s: {label}");
        let out = run("mtype", &["-i", &img, "::parameters.txt"]);
        let back = Params::parse(&out).expect("mtype output parses");
        assert_eq!(back.get("ipa-agent-token"), Some(token.expose().as_str()));
    }
}
