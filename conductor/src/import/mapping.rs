//! From a source node to what vmdeploy gets: the driver, the fields that carry over, what is
//! dropped and why, and whether the node can be managed once enrolled. Pure: no I/O, no clock;
//! every input is outside input and none makes it panic.
//!
//! # Design
//! [`MAPPING`] is the one table from Ironic's driver, boot and deploy interfaces to a vmdeploy
//! driver (docs/import.md shows it to operators); its first matching row wins. A row names the
//! [`KeySet`] of its driver: the `driver_info` keys that driver reads (the names of
//! `crate::node::driver_info`, `crate::boot::pxe` and `crate::boot::vmedia`), the keys Ironic
//! spelled differently (`deploy_kernel` is `pxe_deploy_kernel` here), and the three a `manage`
//! needs. Every other key is dropped and listed. A value Ironic's API masked (`******`) cannot
//! carry over: it is listed, and a node missing a credential is enrolled but not managed.
//! What is left is checked by the same parser the conductor runs ([`BmcDriverInfo::parse`]),
//! so a value the conductor would refuse shows in the dry run.
//!
//! A node is taken over only when nothing runs on it: its provision state is one of
//! [`TAKEN_STATES`] and no instance is associated with it. vmdeploy never receives a node
//! `active`: nodes are enrolled and then managed, nothing more.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde_json::{json, Map, Value};

use super::source::{SourceNode, SourcePort};
use crate::boot::pxe::{DEPLOY_KERNEL_FIELD, DEPLOY_RAMDISK_FIELD};
use crate::boot::vmedia::floppy::KERNEL_APPEND_PARAMS;
use crate::node::capabilities::Capabilities;
use crate::node::driver_info::{keys, redfish_keys, BmcDriverInfo, IloDefaults};

/// Which interface names a row of [`MAPPING`] matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    /// Any, or none given (the classic drivers have no interfaces).
    Any,
    /// One of these.
    OneOf(&'static [&'static str]),
}

impl Match {
    fn matches(self, value: Option<&str>) -> bool {
        match self {
            Match::Any => true,
            Match::OneOf(names) => value.is_some_and(|v| names.contains(&v)),
        }
    }

    fn describe(self) -> String {
        match self {
            Match::Any => "any".into(),
            Match::OneOf(names) => names.join("|"),
        }
    }
}

/// The `driver_info` keys one vmdeploy driver reads.
#[derive(Debug, PartialEq, Eq)]
pub struct KeySet {
    /// Carried over unchanged.
    pub carried: &'static [&'static str],
    /// Carried over under vmdeploy's name: (Ironic's, ours).
    pub renamed: &'static [(&'static str, &'static str)],
    /// The BMC's address, user and password: what `manage` needs.
    pub credentials: [&'static str; 3],
    /// The keys naming the deploy ISO, ours first; empty for a network boot.
    pub deploy_iso: &'static [&'static str],
}

/// The iLO drivers booting from virtual media (`agent_ilo`, `iscsi_ilo`).
pub const ILO_VMEDIA_KEYS: KeySet = KeySet {
    carried: &[
        keys::ADDRESS,
        keys::USERNAME,
        keys::PASSWORD,
        keys::CLIENT_PORT,
        keys::CLIENT_TIMEOUT,
        keys::VERIFY_CA,
        keys::DEPLOY_ISO,
        keys::CONSOLE_PORT,
        keys::PROTOCOL,
        "deploy_iso",
        KERNEL_APPEND_PARAMS,
    ],
    // `ca_file` is the older iLO drivers' name of the CA bundle (deprecated for ilo_verify_ca).
    renamed: &[("ca_file", keys::VERIFY_CA)],
    credentials: [keys::ADDRESS, keys::USERNAME, keys::PASSWORD],
    deploy_iso: &[keys::DEPLOY_ISO, "deploy_iso"],
};

/// `pxe_ilo`: the iLO for power and boot device, the deploy kernel and ramdisk from the network.
pub const ILO_PXE_KEYS: KeySet = KeySet {
    carried: &[
        keys::ADDRESS,
        keys::USERNAME,
        keys::PASSWORD,
        keys::CLIENT_PORT,
        keys::CLIENT_TIMEOUT,
        keys::VERIFY_CA,
        keys::CONSOLE_PORT,
        keys::PROTOCOL,
        KERNEL_APPEND_PARAMS,
        DEPLOY_KERNEL_FIELD,
        DEPLOY_RAMDISK_FIELD,
    ],
    // Ironic's network boot has read `deploy_kernel`/`deploy_ramdisk` since Queens.
    renamed: &[
        ("ca_file", keys::VERIFY_CA),
        ("deploy_kernel", DEPLOY_KERNEL_FIELD),
        ("deploy_ramdisk", DEPLOY_RAMDISK_FIELD),
    ],
    credentials: [keys::ADDRESS, keys::USERNAME, keys::PASSWORD],
    deploy_iso: &[],
};

/// `redfish`: Ironic's `redfish_*` keys, read unchanged.
pub const REDFISH_KEYS: KeySet = KeySet {
    carried: &[
        redfish_keys::ADDRESS,
        redfish_keys::SYSTEM_ID,
        redfish_keys::USERNAME,
        redfish_keys::PASSWORD,
        redfish_keys::VERIFY_CA,
        keys::CLIENT_TIMEOUT,
        "redfish_deploy_iso",
        "deploy_iso",
        KERNEL_APPEND_PARAMS,
    ],
    renamed: &[],
    credentials: [
        redfish_keys::ADDRESS,
        redfish_keys::USERNAME,
        redfish_keys::PASSWORD,
    ],
    deploy_iso: &["redfish_deploy_iso", "deploy_iso"],
};

/// What a row of [`MAPPING`] leads to.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    /// A vmdeploy driver.
    Driver {
        /// Its name.
        name: &'static str,
        /// The boot interface set on the node (`None`: the driver's only one).
        boot_interface: Option<&'static str>,
        /// The deploy interface set on the node (`None`: the driver's only one).
        deploy_interface: Option<&'static str>,
        /// The `driver_info` keys it reads.
        keys: &'static KeySet,
        /// What changes for the operator, when something does.
        note: Option<&'static str>,
    },
    /// Not taken over, and why.
    Refused(&'static str),
}

/// One row of [`MAPPING`].
#[derive(Debug, PartialEq, Eq)]
pub struct Route {
    /// Ironic drivers (hardware types, or an old Ironic's classic drivers).
    pub drivers: &'static [&'static str],
    /// Boot interfaces.
    pub boot: Match,
    /// Deploy interfaces.
    pub deploy: Match,
    /// What the node becomes.
    pub target: Target,
}

const ILO: &[&str] = &["ilo", "ilo5"];
const ILO_VMEDIA: Match = Match::OneOf(&["ilo-virtual-media"]);
const NETWORK_BOOT: Match = Match::OneOf(&["ilo-pxe", "ilo-ipxe", "pxe", "ipxe"]);
const DIRECT: Match = Match::OneOf(&["direct"]);
const ISCSI: Match = Match::OneOf(&["iscsi"]);

/// From Ironic's driver and interfaces to a vmdeploy driver: the first row that matches.
pub const MAPPING: &[Route] = &[
    Route {
        drivers: ILO,
        boot: ILO_VMEDIA,
        deploy: DIRECT,
        target: Target::Driver {
            name: "agent_ilo",
            boot_interface: None,
            deploy_interface: None,
            keys: &ILO_VMEDIA_KEYS,
            note: None,
        },
    },
    Route {
        drivers: ILO,
        boot: ILO_VMEDIA,
        deploy: ISCSI,
        target: Target::Driver {
            name: "iscsi_ilo",
            boot_interface: None,
            deploy_interface: None,
            keys: &ILO_VMEDIA_KEYS,
            note: None,
        },
    },
    Route {
        drivers: ILO,
        boot: NETWORK_BOOT,
        deploy: ISCSI,
        target: Target::Driver {
            name: "pxe_ilo",
            boot_interface: None,
            deploy_interface: None,
            keys: &ILO_PXE_KEYS,
            note: None,
        },
    },
    Route {
        drivers: ILO,
        boot: NETWORK_BOOT,
        deploy: DIRECT,
        target: Target::Driver {
            name: "pxe_ilo",
            boot_interface: None,
            deploy_interface: None,
            keys: &ILO_PXE_KEYS,
            note: Some(
                "the deploy changes from direct to iscsi: vmdeploy's network boot runs the \
                 iSCSI deploy only (the agent's token travels on the virtual floppy)",
            ),
        },
    },
    Route {
        drivers: ILO,
        boot: Match::OneOf(&["ilo-uefi-https"]),
        deploy: Match::Any,
        target: Target::Refused(
            "boot interface ilo-uefi-https: vmdeploy has no UEFI HTTPS boot; switch the node \
             to ilo-virtual-media in Ironic and import it again",
        ),
    },
    Route {
        drivers: &["redfish"],
        boot: Match::OneOf(&["redfish-virtual-media"]),
        deploy: DIRECT,
        target: Target::Driver {
            name: "redfish",
            boot_interface: Some("redfish-virtual-media"),
            deploy_interface: Some("direct"),
            keys: &REDFISH_KEYS,
            note: None,
        },
    },
    Route {
        drivers: &["redfish"],
        boot: Match::OneOf(&["redfish-virtual-media"]),
        deploy: ISCSI,
        target: Target::Driver {
            name: "redfish",
            boot_interface: Some("redfish-virtual-media"),
            deploy_interface: Some("iscsi"),
            keys: &REDFISH_KEYS,
            note: None,
        },
    },
    // The classic drivers of an Ironic before Rocky: the same names here.
    Route {
        drivers: &["agent_ilo"],
        boot: Match::Any,
        deploy: Match::Any,
        target: Target::Driver {
            name: "agent_ilo",
            boot_interface: None,
            deploy_interface: None,
            keys: &ILO_VMEDIA_KEYS,
            note: None,
        },
    },
    Route {
        drivers: &["iscsi_ilo"],
        boot: Match::Any,
        deploy: Match::Any,
        target: Target::Driver {
            name: "iscsi_ilo",
            boot_interface: None,
            deploy_interface: None,
            keys: &ILO_VMEDIA_KEYS,
            note: None,
        },
    },
    Route {
        drivers: &["pxe_ilo"],
        boot: Match::Any,
        deploy: Match::Any,
        target: Target::Driver {
            name: "pxe_ilo",
            boot_interface: None,
            deploy_interface: None,
            keys: &ILO_PXE_KEYS,
            note: None,
        },
    },
];

/// Provision states of a node nothing runs on: the only ones taken over.
pub const TAKEN_STATES: &[&str] = &[
    "enroll",
    "manageable",
    "available",
    "clean failed",
    "inspect failed",
    "deploy failed",
];

/// What vmdeploy already has, by UUID, name and port address.
#[derive(Debug, Clone, Default)]
pub struct Existing {
    /// Node UUIDs (lower case).
    pub uuids: HashSet<String>,
    /// Node names.
    pub names: HashSet<String>,
    /// Port address (lower case, colons) → the node that has it.
    pub port_addresses: HashMap<String, String>,
}

/// The source node's driver and interfaces, as shown in the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSummary {
    /// Driver.
    pub driver: Option<String>,
    /// Boot interface.
    pub boot_interface: Option<String>,
    /// Deploy interface.
    pub deploy_interface: Option<String>,
    /// Provision state.
    pub provision_state: Option<String>,
}

/// A port to create.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedPort {
    /// Its MAC (lower case, colons).
    pub address: String,
    /// Whether the node may network boot from it.
    pub pxe_enabled: bool,
    /// The `POST /v1/ports` body without `node_uuid`.
    pub body: Map<String, Value>,
}

/// A node taken over.
#[derive(Debug, Clone, PartialEq)]
pub struct TakeOver {
    /// Our driver.
    pub driver: &'static str,
    /// The boot interface set (`None`: the driver's default).
    pub boot_interface: Option<&'static str>,
    /// The deploy interface set (`None`: the driver's default).
    pub deploy_interface: Option<&'static str>,
    /// The `POST /v1/nodes` body. It holds the carried secrets: never print it.
    pub body: Map<String, Value>,
    /// Its ports.
    pub ports: Vec<PlannedPort>,
    /// What carries over, grouped: `driver_info (ilo_address, ...)`.
    pub carries: Vec<String>,
    /// What does not: `driver_info.snmp_auth_user`, `instance_info (image_source)`.
    pub dropped: Vec<String>,
    /// What the operator should know or do.
    pub notes: Vec<String>,
    /// Why the node is not managed after enrolment (empty: it is).
    pub stays_enroll: Vec<String>,
}

impl TakeOver {
    /// The state the node ends in after `--apply`.
    pub fn ends(&self) -> &'static str {
        if self.stays_enroll.is_empty() {
            "manageable"
        } else {
            "enroll"
        }
    }
}

/// What happens to one source node.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Taken over.
    TakeOver(Box<TakeOver>),
    /// Not taken over, and why.
    Skip(String),
}

/// One node's plan.
#[derive(Debug, Clone, PartialEq)]
pub struct NodePlan {
    /// Its UUID (canonical form when it is one).
    pub uuid: Option<String>,
    /// Its name.
    pub name: Option<String>,
    /// What it was in the source.
    pub source: SourceSummary,
    /// What happens to it.
    pub decision: Decision,
}

impl NodePlan {
    /// The take-over, when the node is taken over.
    pub fn take_over(&self) -> Option<&TakeOver> {
        match &self.decision {
            Decision::TakeOver(t) => Some(t),
            Decision::Skip(_) => None,
        }
    }
}

/// The plan of a whole import.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// One per source node, in the source's order.
    pub nodes: Vec<NodePlan>,
    /// Source ports of no listed node (address, or `?`, and the node UUID they name).
    pub orphan_ports: Vec<String>,
    /// Whether the source listed ports at all.
    pub ports_known: bool,
}

/// Plans the import of `nodes` with their `ports` (`None`: the source gave none) into a
/// vmdeploy that has `existing`.
pub fn plan(nodes: &[SourceNode], ports: Option<&[SourcePort]>, existing: &Existing) -> Plan {
    let mut by_node: BTreeMap<String, Vec<&SourcePort>> = BTreeMap::new();
    for port in ports.unwrap_or_default() {
        let key = port
            .node_uuid
            .as_deref()
            .map(canonical_uuid)
            .unwrap_or_default();
        by_node.entry(key).or_default().push(port);
    }
    let mut seen_uuids = HashSet::new();
    let mut seen_names = HashSet::new();
    let mut claimed_addresses: HashMap<String, String> = existing.port_addresses.clone();
    let mut planned = Vec::with_capacity(nodes.len());
    let mut listed = HashSet::new();
    for node in nodes {
        let uuid = node.uuid.as_deref().map(canonical_uuid);
        if let Some(u) = &uuid {
            listed.insert(u.clone());
        }
        let node_ports = uuid
            .as_ref()
            .and_then(|u| by_node.get(u))
            .cloned()
            .unwrap_or_default();
        // The same node twice in the source: the first taken over wins.
        let duplicate = if uuid.as_ref().is_some_and(|u| seen_uuids.contains(u)) {
            Some("UUID")
        } else if node.name.as_ref().is_some_and(|n| seen_names.contains(n)) {
            Some("name")
        } else {
            None
        };
        let mut p = match duplicate {
            Some(what) => skip(
                uuid.clone(),
                node,
                summary_of(node),
                format!("duplicate: an earlier node of the source has the same {what}"),
            ),
            None => plan_node(node, &node_ports, existing, &mut claimed_addresses),
        };
        if p.take_over().is_some() {
            seen_uuids.extend(uuid.clone());
            seen_names.extend(node.name.clone());
        }
        if ports.is_some() {
            if let Decision::TakeOver(t) = &mut p.decision {
                if t.ports.is_empty() {
                    t.notes.push(
                        "no port: vmdeploy finds a node's agent by its MAC; add one with \
                         `baremetal port create MAC --node UUID`"
                            .into(),
                    );
                }
            }
        }
        planned.push(p);
    }
    let orphan_ports = by_node
        .iter()
        .filter(|(node, _)| !listed.contains(*node))
        .flat_map(|(node, ports)| {
            ports.iter().map(move |p| {
                format!(
                    "{} (node {})",
                    p.address.as_deref().unwrap_or("?"),
                    if node.is_empty() { "?" } else { node }
                )
            })
        })
        .collect();
    Plan {
        nodes: planned,
        orphan_ports,
        ports_known: ports.is_some(),
    }
}

/// A UUID in its canonical form (lower case, hyphens), or the text as given.
fn canonical_uuid(s: &str) -> String {
    uuid::Uuid::parse_str(s.trim())
        .map(|u| u.to_string())
        .unwrap_or_else(|_| s.trim().to_string())
}

/// Whether a value is one the source API masked (`******`; `***` from other tools).
pub fn is_masked(value: &Value) -> bool {
    matches!(value, Value::String(s) if s.len() >= 3 && s.chars().all(|c| c == '*'))
}

/// At most this many characters of a value quoted in a message.
const QUOTE: usize = 64;

fn quote(s: &str) -> String {
    s.chars().take(QUOTE).collect()
}

/// The row of [`MAPPING`] a node's driver and interfaces match, or why none does.
pub fn route(
    driver: &str,
    boot: Option<&str>,
    deploy: Option<&str>,
) -> Result<&'static Target, String> {
    if let Some(row) = MAPPING
        .iter()
        .find(|r| r.drivers.contains(&driver) && r.boot.matches(boot) && r.deploy.matches(deploy))
    {
        return Ok(&row.target);
    }
    let rows: Vec<&Route> = MAPPING
        .iter()
        .filter(|r| r.drivers.contains(&driver))
        .collect();
    if rows.is_empty() {
        let mut known: Vec<&str> = Vec::new();
        for d in MAPPING.iter().flat_map(|r| r.drivers.iter().copied()) {
            if !known.contains(&d) {
                known.push(d);
            }
        }
        return Err(format!(
            "driver {} has no vmdeploy counterpart (taken over: {})",
            quote(driver),
            known.join(", ")
        ));
    }
    let (Some(boot), Some(deploy)) = (boot, deploy) else {
        return Err(format!(
            "the source shows no {} interface: list the nodes with API version 1.31 or later \
             (`baremetal --os-baremetal-api-version 1.31 node list --long --limit 0 -f json`)",
            if boot.is_none() { "boot" } else { "deploy" }
        ));
    };
    let offered: Vec<String> = rows
        .iter()
        .filter(|r| matches!(r.target, Target::Driver { .. }))
        .map(|r| format!("{}/{}", r.boot.describe(), r.deploy.describe()))
        .collect();
    Err(format!(
        "{} with boot interface {} and deploy interface {} has no vmdeploy counterpart \
         (taken over: {})",
        quote(driver),
        quote(boot),
        quote(deploy),
        offered.join(", ")
    ))
}

fn summary_of(node: &SourceNode) -> SourceSummary {
    SourceSummary {
        driver: node.driver.clone(),
        boot_interface: node.boot_interface.clone(),
        deploy_interface: node.deploy_interface.clone(),
        provision_state: node.provision_state.clone(),
    }
}

fn skip(
    uuid: Option<String>,
    node: &SourceNode,
    summary: SourceSummary,
    reason: String,
) -> NodePlan {
    NodePlan {
        uuid,
        name: node.name.clone(),
        source: summary,
        decision: Decision::Skip(reason),
    }
}

/// One node's plan; `claimed` holds the port addresses vmdeploy has or an earlier node of the
/// source takes, and gets this node's.
fn plan_node(
    node: &SourceNode,
    ports: &[&SourcePort],
    existing: &Existing,
    claimed: &mut HashMap<String, String>,
) -> NodePlan {
    let summary = summary_of(node);
    let unreadable = |field: &str| node.unreadable.iter().find(|u| u.field == field);
    if let Some(u) = unreadable("node") {
        return skip(None, node, summary, format!("unreadable: {}", u.reason));
    }
    // The UUID is kept, so it must be one.
    let uuid = match node.uuid.as_deref() {
        None => {
            let why = unreadable("uuid")
                .map_or("the source gives none".to_string(), |u| u.reason.clone());
            return skip(None, node, summary, format!("no UUID: {why}"));
        }
        Some(text) => match uuid::Uuid::parse_str(text) {
            Ok(u) => u.to_string(),
            Err(_) => {
                let reason = format!("its UUID {:?} is not a UUID", quote(text));
                return skip(Some(text.to_string()), node, summary, reason);
            }
        },
    };
    let skip_with = |reason: String| skip(Some(uuid.clone()), node, summary.clone(), reason);
    match node.provision_state.as_deref() {
        None => return skip_with("its provision state is not shown by the source".into()),
        Some(state) if !TAKEN_STATES.contains(&state) => {
            return skip_with(format!("in use ({})", quote(state)));
        }
        Some(_) => {}
    }
    if let Some(instance) = &node.instance_uuid {
        return skip_with(format!("in use (instance {} is on it)", quote(instance)));
    }
    if existing.uuids.contains(&uuid) {
        return skip_with("already in vmdeploy (same UUID)".into());
    }
    if let Some(name) = node.name.as_ref().filter(|n| existing.names.contains(*n)) {
        return skip_with(format!(
            "already in vmdeploy (a node is named {})",
            quote(name)
        ));
    }
    for field in [
        "driver",
        "driver_info",
        "boot_interface",
        "deploy_interface",
    ] {
        if let Some(u) = unreadable(field) {
            return skip_with(format!("its {field} is unreadable: {}", u.reason));
        }
    }
    let Some(driver) = node.driver.as_deref() else {
        return skip_with("the source shows no driver".into());
    };
    let target = match route(
        driver,
        node.boot_interface.as_deref(),
        node.deploy_interface.as_deref(),
    ) {
        Ok(Target::Refused(reason)) => return skip_with((*reason).to_string()),
        Ok(target) => target,
        Err(reason) => return skip_with(reason),
    };
    let Target::Driver {
        name: driver_name,
        boot_interface,
        deploy_interface,
        keys,
        note,
    } = target
    else {
        return skip_with("no vmdeploy counterpart".into());
    };
    let mut t = TakeOver {
        driver: driver_name,
        boot_interface: *boot_interface,
        deploy_interface: *deploy_interface,
        body: Map::new(),
        ports: Vec::new(),
        carries: Vec::new(),
        dropped: Vec::new(),
        notes: note.iter().map(|n| n.to_string()).collect(),
        stays_enroll: Vec::new(),
    };
    if let Some(name) = &node.name {
        t.carries.push("name".into());
        t.body.insert("name".into(), json!(name));
    }
    let driver_info = carry_driver_info(node, driver_name, keys, &mut t);
    t.body.insert("uuid".into(), json!(uuid));
    t.body.insert("driver".into(), json!(driver_name));
    if let Some(b) = boot_interface {
        t.body.insert("boot_interface".into(), json!(b));
    }
    if let Some(d) = deploy_interface {
        t.body.insert("deploy_interface".into(), json!(d));
    }
    t.body
        .insert("driver_info".into(), Value::Object(driver_info));
    carry_fields(node, &mut t);
    carry_ports(&uuid, ports, claimed, &mut t);
    NodePlan {
        uuid: Some(uuid),
        name: node.name.clone(),
        source: summary,
        decision: Decision::TakeOver(Box::new(t)),
    }
}

/// The `driver_info` vmdeploy gets; fills the take-over's lists.
fn carry_driver_info(
    node: &SourceNode,
    driver: &str,
    keys: &KeySet,
    t: &mut TakeOver,
) -> Map<String, Value> {
    let source = &node.driver_info;
    let present = |key: &str| source.get(key).is_some_and(|v| !v.is_null());
    let mut out = Map::new();
    let mut carried = Vec::new();
    let mut masked = BTreeSet::new();
    for (key, value) in source {
        if value.is_null() {
            continue;
        }
        let ours = if keys.carried.contains(&key.as_str()) {
            key.as_str()
        } else if let Some((_, to)) = keys.renamed.iter().find(|(from, _)| from == key) {
            if present(to) {
                t.dropped.push(format!("driver_info.{key} ({to} is set)"));
                continue;
            }
            to
        } else {
            t.dropped.push(format!("driver_info.{key}"));
            continue;
        };
        if is_masked(value) {
            t.dropped.push(format!("driver_info.{key} (masked)"));
            t.notes.push(format!(
                "{key} is masked by the source API: set it after import \
                 (`baremetal node set NODE --driver-info {ours}=...`)"
            ));
            masked.insert(ours);
            continue;
        }
        if ours == key {
            carried.push(key.clone());
        } else {
            carried.push(format!("{key} as {ours}"));
        }
        out.insert(ours.to_string(), value.clone());
    }
    if !carried.is_empty() {
        t.carries
            .push(format!("driver_info ({})", carried.join(", ")));
    }
    for key in keys.credentials {
        if masked.contains(key) {
            t.stays_enroll.push(format!(
                "manage needs {key} (masked by the source): set it, then manage the node"
            ));
        } else if !out.contains_key(key) {
            t.stays_enroll.push(format!(
                "driver_info.{key} is missing: set it, then manage the node"
            ));
        }
    }
    if t.stays_enroll.is_empty() {
        // The check the conductor runs before it talks to the BMC.
        if let Err(err) = BmcDriverInfo::parse(driver, &out, &IloDefaults::default()) {
            t.stays_enroll
                .push(format!("{err}: fix it, then manage the node"));
        }
    }
    if let Some(first) = keys.deploy_iso.first() {
        if !keys.deploy_iso.iter().any(|k| out.contains_key(*k)) {
            t.notes.push(format!(
                "no deploy ISO: vmdeploy boots a prebuilt deploy ISO (it does not build one from \
                 deploy_kernel/deploy_ramdisk): set {first} before deploying"
            ));
        }
    } else if !out.contains_key(DEPLOY_KERNEL_FIELD) || !out.contains_key(DEPLOY_RAMDISK_FIELD) {
        t.notes.push(format!(
            "no {DEPLOY_KERNEL_FIELD}/{DEPLOY_RAMDISK_FIELD}: the conductor's [netboot] \
             deploy_kernel/deploy_ramdisk are used; set them (or the node's) before deploying"
        ));
    }
    // Paths name files on the Ironic conductor's host.
    for (key, value) in &out {
        let Value::String(s) = value else { continue };
        let s = s.trim();
        let is_ca = key.ends_with("_verify_ca")
            && !s.eq_ignore_ascii_case("true")
            && !s.eq_ignore_ascii_case("false");
        if is_ca || s.starts_with("file://") {
            t.notes.push(format!(
                "{key} names a file ({}): it must exist on the vmdeploy conductor's host",
                quote(s)
            ));
        }
    }
    out
}

/// properties, extra, network_data carry over; instance_info, resource_class and
/// conductor_group do not.
fn carry_fields(node: &SourceNode, t: &mut TakeOver) {
    let unreadable = |field: &str| node.unreadable.iter().find(|u| u.field == field);
    let names = |m: &Map<String, Value>| m.keys().map(|k| quote(k)).collect::<Vec<_>>().join(", ");
    if !node.properties.is_empty() {
        t.carries
            .push(format!("properties ({})", names(&node.properties)));
        if let Some(caps) = node.properties.get("capabilities") {
            let checked = Capabilities::parse(caps).and_then(|c| c.validate().map(|_| c));
            if let Err(err) = checked {
                t.notes.push(format!(
                    "properties.capabilities: {err}: vmdeploy refuses to deploy the node until it \
                     is fixed"
                ));
            }
        }
    }
    t.body
        .insert("properties".into(), Value::Object(node.properties.clone()));
    if !node.extra.is_empty() {
        t.carries.push(format!("extra ({})", names(&node.extra)));
    }
    t.body
        .insert("extra".into(), Value::Object(node.extra.clone()));
    if !node.network_data.is_empty() {
        t.carries.push("network_data".into());
        t.body.insert(
            "network_data".into(),
            Value::Object(node.network_data.clone()),
        );
    }
    for field in ["properties", "extra", "network_data", "instance_info"] {
        if let Some(u) = unreadable(field) {
            t.dropped
                .push(format!("{field} (unreadable: {})", u.reason));
        }
    }
    if !node.instance_info.is_empty() {
        t.dropped
            .push(format!("instance_info ({})", names(&node.instance_info)));
    }
    if let Some(class) = &node.resource_class {
        t.dropped.push("resource_class".into());
        t.notes.push(format!(
            "resource_class {} is not carried over: vmdeploy's API has no resource classes",
            quote(class)
        ));
    }
    if let Some(group) = &node.conductor_group {
        t.dropped.push("conductor_group".into());
        t.notes.push(format!(
            "conductor_group {} is not carried over: the node joins vmdeploy's default group \
             (set it after import if your conductors use groups)",
            quote(group)
        ));
    }
    if node.maintenance {
        t.notes.push(format!(
            "in maintenance in the source{}: vmdeploy enrolls it out of maintenance",
            node.maintenance_reason
                .as_deref()
                .map(|r| format!(" ({})", quote(r)))
                .unwrap_or_default()
        ));
    }
}

/// A MAC address in the API's canonical form (lower case, colons), `None` when it is none.
pub fn canonical_mac(s: &str) -> Option<String> {
    let parts: Vec<&str> = s.trim().split([':', '-']).collect();
    let ok = parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
    ok.then(|| parts.join(":").to_ascii_lowercase())
}

fn carry_ports(
    node_uuid: &str,
    ports: &[&SourcePort],
    claimed: &mut HashMap<String, String>,
    t: &mut TakeOver,
) {
    let mut shown = Vec::new();
    for port in ports {
        let label = port
            .address
            .as_deref()
            .or(port.uuid.as_deref())
            .map(quote)
            .unwrap_or_else(|| "?".into());
        if let Some(u) = port.unreadable.first() {
            t.dropped.push(format!(
                "port {label} (its {} is unreadable: {})",
                u.field, u.reason
            ));
            continue;
        }
        let Some(address) = port.address.as_deref().and_then(canonical_mac) else {
            t.dropped.push(format!("port {label} (no MAC address)"));
            continue;
        };
        if let Some(owner) = claimed.get(&address) {
            t.dropped.push(format!(
                "port {address} (the address is already on node {})",
                quote(owner)
            ));
            continue;
        }
        claimed.insert(address.clone(), node_uuid.to_string());
        let pxe_enabled = port.pxe_enabled.unwrap_or(true);
        let mut body = Map::new();
        if let Some(uuid) = port
            .uuid
            .as_deref()
            .and_then(|u| uuid::Uuid::parse_str(u).ok())
        {
            body.insert("uuid".into(), json!(uuid.to_string()));
        }
        body.insert("address".into(), json!(address));
        body.insert("pxe_enabled".into(), json!(pxe_enabled));
        if !port.extra.is_empty() {
            body.insert("extra".into(), Value::Object(port.extra.clone()));
        }
        for (field, present) in [
            (
                "local_link_connection",
                !port.local_link_connection.is_empty(),
            ),
            ("physical_network", port.physical_network.is_some()),
            ("portgroup_uuid", port.portgroup_uuid.is_some()),
            ("name", port.name.is_some()),
        ] {
            if present {
                t.dropped.push(format!("port {address} {field}"));
            }
        }
        shown.push(if pxe_enabled {
            address.clone()
        } else {
            format!("{address} no-pxe")
        });
        t.ports.push(PlannedPort {
            address,
            pxe_enabled,
            body,
        });
    }
    if !shown.is_empty() {
        t.carries.push(format!("ports ({})", shown.join(", ")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::source::{nodes_from_json, ports_from_json};

    const U1: &str = "6f1d0b52-3a4e-4c8b-9d7a-1e2f3a4b5c6d";
    const U2: &str = "0c9e8d7f-6a5b-4c3d-8e2f-1a0b9c8d7e6f";

    fn node(v: Value) -> SourceNode {
        SourceNode::from_json(&v)
    }

    fn ilo(boot: &str, deploy: &str, state: &str) -> Value {
        json!({
            "uuid": U1, "name": "gen9-1", "driver": "ilo", "boot_interface": boot,
            "deploy_interface": deploy, "provision_state": state,
            "driver_info": {
                "ilo_address": "10.0.0.11", "ilo_username": "Administrator",
                "ilo_password": "pw", "client_port": "443", "ilo_deploy_iso": "http://i/d.iso",
            },
        })
    }

    fn one(v: Value) -> NodePlan {
        let p = plan(&[node(v)], None, &Existing::default());
        p.nodes.into_iter().next().expect("one node")
    }

    fn taken(v: Value) -> TakeOver {
        match one(v).decision {
            Decision::TakeOver(t) => *t,
            Decision::Skip(why) => panic!("skipped: {why}"),
        }
    }

    fn skipped(v: Value) -> String {
        match one(v).decision {
            Decision::Skip(why) => why,
            Decision::TakeOver(t) => panic!("taken over as {}", t.driver),
        }
    }

    /// `driver/boot/deploy` (`-`: not shown) → our driver, or the start of the refusal.
    #[test]
    fn the_mapping_table() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("ilo/ilo-virtual-media/direct", Ok("agent_ilo")),
            ("ilo5/ilo-virtual-media/direct", Ok("agent_ilo")),
            ("ilo/ilo-virtual-media/iscsi", Ok("iscsi_ilo")),
            ("ilo5/ilo-virtual-media/iscsi", Ok("iscsi_ilo")),
            ("ilo/ilo-pxe/iscsi", Ok("pxe_ilo")),
            ("ilo/ilo-pxe/direct", Ok("pxe_ilo")),
            ("ilo/ipxe/direct", Ok("pxe_ilo")),
            ("ilo5/pxe/iscsi", Ok("pxe_ilo")),
            ("ilo/ilo-ipxe/iscsi", Ok("pxe_ilo")),
            ("redfish/redfish-virtual-media/direct", Ok("redfish")),
            ("redfish/redfish-virtual-media/iscsi", Ok("redfish")),
            ("agent_ilo/-/-", Ok("agent_ilo")),
            ("iscsi_ilo/-/-", Ok("iscsi_ilo")),
            ("pxe_ilo/-/-", Ok("pxe_ilo")),
            (
                "ilo/ilo-uefi-https/direct",
                Err("boot interface ilo-uefi-https"),
            ),
            (
                "ilo/ilo-virtual-media/ramdisk",
                Err("ilo with boot interface"),
            ),
            (
                "ilo/ilo-virtual-media/anaconda",
                Err("ilo with boot interface"),
            ),
            ("redfish/redfish-https/direct", Err("redfish with boot")),
            ("redfish/pxe/direct", Err("redfish with boot")),
            ("ilo/-/direct", Err("the source shows no boot interface")),
            ("ilo/ilo-virtual-media/-", Err("the source shows no deploy")),
            ("ipmi/pxe/direct", Err("driver ipmi has no vmdeploy")),
            ("fake-hardware/fake/fake", Err("driver fake-hardware")),
            ("/-/-", Err("driver  has no")),
        ];
        for (case, want) in cases {
            let parts: Vec<Option<&str>> = case
                .split('/')
                .map(|p| if p == "-" { None } else { Some(p) })
                .collect();
            let [Some(driver), boot, deploy] = parts[..] else {
                panic!("{case}: driver/boot/deploy");
            };
            let got = route(driver, boot, deploy);
            match (want, got) {
                (Ok(name), Ok(Target::Driver { name: got, .. })) => {
                    assert_eq!(got, name, "{case}")
                }
                (Err(start), Ok(Target::Refused(why))) => {
                    assert!(why.starts_with(start), "{case}: {why}")
                }
                (Err(start), Err(why)) => assert!(why.starts_with(start), "{case}: {why}"),
                (want, got) => panic!("{case}: want {want:?}, got {got:?}"),
            }
        }
    }

    /// docs/import.md's mapping table, as the rows of [`MAPPING`] render.
    fn doc_row(route: &Route) -> String {
        let names = |list: &[&str]| {
            list.iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let matched = |m: Match| match m {
            Match::Any => "any".to_string(),
            Match::OneOf(list) => names(list),
        };
        let (target, note) = match &route.target {
            Target::Driver {
                name,
                boot_interface,
                deploy_interface,
                note,
                ..
            } => {
                let mut target = format!("`{name}`");
                if let (Some(b), Some(d)) = (boot_interface, deploy_interface) {
                    target.push_str(&format!(" (`{b}`/`{d}`)"));
                }
                (target, note.unwrap_or_default())
            }
            Target::Refused(why) => ("not taken over".to_string(), *why),
        };
        let note = if note.is_empty() {
            " ".to_string()
        } else {
            format!(" {note} ")
        };
        format!(
            "| {} | {} | {} | {target} |{note}|",
            names(route.drivers),
            matched(route.boot),
            matched(route.deploy)
        )
    }

    #[test]
    fn the_operators_table_is_the_mapping() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/import.md");
        let doc = std::fs::read_to_string(path).expect("docs/import.md");
        let table: Vec<&str> = doc
            .lines()
            .skip_while(|l| !l.starts_with("<!-- mapping table"))
            .skip(3) // the marker, the header, the rule
            .take_while(|l| l.starts_with('|'))
            .collect();
        let want: Vec<String> = MAPPING.iter().map(doc_row).collect();
        assert_eq!(
            table, want,
            "docs/import.md's mapping table differs from MAPPING"
        );
    }

    #[test]
    fn every_target_is_a_driver_vmdeploy_serves_with_interfaces_it_offers() {
        use crate::node::hardware_type;
        for row in MAPPING {
            if let Target::Driver {
                name,
                boot_interface,
                deploy_interface,
                ..
            } = &row.target
            {
                hardware_type::resolve(name, *boot_interface, *deploy_interface)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
    }

    #[test]
    fn every_key_a_driver_reads_is_carried_by_its_key_set() {
        for set in [&ILO_VMEDIA_KEYS, &ILO_PXE_KEYS, &REDFISH_KEYS] {
            for key in set.credentials.iter().chain(set.deploy_iso) {
                assert!(set.carried.contains(key), "{key}");
            }
            for (_, to) in set.renamed {
                assert!(set.carried.contains(to), "{to}");
            }
        }
    }

    #[test]
    fn an_ilo_node_carries_what_agent_ilo_reads_and_drops_the_rest() {
        let mut v = ilo("ilo-virtual-media", "direct", "available");
        v["driver_info"]["snmp_auth_user"] = json!("snmp");
        v["driver_info"]["console_port"] = json!(5001);
        v["driver_info"]["ca_file"] = json!("/etc/ironic/ilo.pem");
        v["driver_info"]["deploy_kernel"] = json!("http://i/k");
        v["driver_info"]["ipmi_terminal_port"] = Value::Null;
        v["properties"] = json!({"cpus": 8, "memory_mb": 65536, "local_gb": 500,
            "cpu_arch": "x86_64", "capabilities": "boot_mode:uefi"});
        v["extra"] = json!({"rack": "r1"});
        v["instance_info"] = json!({"image_source": "glance://x"});
        v["resource_class"] = json!("gen9");
        let t = taken(v);
        assert_eq!(t.driver, "agent_ilo");
        assert_eq!(t.ends(), "manageable", "{:?}", t.stays_enroll);
        let info = &t.body["driver_info"];
        assert_eq!(info["ilo_address"], "10.0.0.11");
        assert_eq!(info["ilo_password"], "pw");
        assert_eq!(info["console_port"], 5001);
        assert_eq!(
            info["ilo_verify_ca"], "/etc/ironic/ilo.pem",
            "ca_file is renamed"
        );
        assert!(info.get("snmp_auth_user").is_none());
        assert!(info.get("deploy_kernel").is_none());
        assert!(
            info.get("ipmi_terminal_port").is_none(),
            "nulls are skipped"
        );
        assert_eq!(t.body["uuid"], U1);
        assert_eq!(t.body["name"], "gen9-1");
        assert_eq!(t.body["properties"]["cpus"], 8);
        assert_eq!(t.body["extra"]["rack"], "r1");
        assert!(t.body.get("instance_info").is_none());
        assert!(t.body.get("resource_class").is_none());
        assert!(t.body.get("boot_interface").is_none(), "agent_ilo has one");
        assert!(t
            .dropped
            .contains(&"driver_info.snmp_auth_user".to_string()));
        assert!(t.dropped.contains(&"driver_info.deploy_kernel".to_string()));
        assert!(t
            .dropped
            .contains(&"instance_info (image_source)".to_string()));
        assert!(t.dropped.contains(&"resource_class".to_string()));
        assert!(
            t.carries
                .iter()
                .any(|c| c.contains("ca_file as ilo_verify_ca")),
            "{:?}",
            t.carries
        );
        assert!(
            t.notes
                .iter()
                .any(|n| n.contains("ilo_verify_ca names a file")),
            "{:?}",
            t.notes
        );
        assert!(t.notes.iter().any(|n| n.starts_with("resource_class gen9")));
    }

    #[test]
    fn a_masked_password_is_dropped_and_keeps_the_node_in_enroll() {
        let mut v = ilo("ilo-virtual-media", "iscsi", "manageable");
        v["driver_info"]["ilo_password"] = json!("******");
        let t = taken(v);
        assert_eq!(t.driver, "iscsi_ilo");
        assert_eq!(t.ends(), "enroll");
        assert!(t.body["driver_info"].get("ilo_password").is_none());
        assert!(t.notes.iter().any(
            |n| n.starts_with("ilo_password is masked by the source API: set it after import")
        ));
        assert!(t
            .dropped
            .contains(&"driver_info.ilo_password (masked)".to_string()));
        assert_eq!(t.stays_enroll.len(), 1, "{:?}", t.stays_enroll);
        // Other masked secrets are dropped too, without blocking manage.
        let mut v = ilo("ilo-virtual-media", "iscsi", "manageable");
        v["driver_info"]["kernel_append_params"] = json!("***");
        let t = taken(v);
        assert_eq!(t.ends(), "manageable");
        assert!(t.body["driver_info"].get("kernel_append_params").is_none());
    }

    #[test]
    fn missing_or_invalid_credentials_keep_the_node_in_enroll() {
        let mut v = ilo("ilo-virtual-media", "direct", "enroll");
        v["driver_info"]
            .as_object_mut()
            .expect("object")
            .remove("ilo_username");
        let t = taken(v);
        assert_eq!(t.ends(), "enroll");
        assert!(t.stays_enroll[0].starts_with("driver_info.ilo_username is missing"));
        let mut v = ilo("ilo-virtual-media", "direct", "enroll");
        v["driver_info"]["ilo_address"] = json!("http://10.0.0.11");
        v["driver_info"]["client_port"] = json!("443x");
        let t = taken(v);
        assert_eq!(t.ends(), "enroll");
        assert!(
            t.stays_enroll[0].starts_with("driver_info.client_port"),
            "{:?}",
            t.stays_enroll
        );
    }

    #[test]
    fn network_boot_renames_the_deploy_kernel() {
        let mut v = ilo("ilo-pxe", "direct", "clean failed");
        v["driver_info"]["deploy_kernel"] = json!("http://i/k");
        v["driver_info"]["deploy_ramdisk"] = json!("http://i/r");
        let t = taken(v);
        assert_eq!(t.driver, "pxe_ilo");
        assert_eq!(t.body["driver_info"]["pxe_deploy_kernel"], "http://i/k");
        assert_eq!(t.body["driver_info"]["pxe_deploy_ramdisk"], "http://i/r");
        assert!(t.body["driver_info"].get("ilo_deploy_iso").is_none());
        assert!(t
            .dropped
            .contains(&"driver_info.ilo_deploy_iso".to_string()));
        assert!(t.notes[0].starts_with("the deploy changes from direct to iscsi"));
        // Without them, the conductor's defaults are named.
        let t = taken(ilo("ilo-pxe", "iscsi", "manageable"));
        assert!(t
            .notes
            .iter()
            .any(|n| n.starts_with("no pxe_deploy_kernel")));
    }

    #[test]
    fn a_redfish_node_keeps_its_redfish_keys_and_interfaces() {
        let t = taken(json!({
            "uuid": U1, "driver": "redfish", "boot_interface": "redfish-virtual-media",
            "deploy_interface": "direct", "provision_state": "enroll",
            "driver_info": {
                "redfish_address": "https://10.0.0.12", "redfish_system_id": "/redfish/v1/Systems/1",
                "redfish_username": "admin", "redfish_password": "******",
                "redfish_verify_ca": "False", "deploy_kernel": "http://k", "deploy_ramdisk": "http://r",
            },
        }));
        assert_eq!(t.driver, "redfish");
        assert_eq!(t.body["boot_interface"], "redfish-virtual-media");
        assert_eq!(t.body["deploy_interface"], "direct");
        assert_eq!(
            t.body["driver_info"]["redfish_system_id"],
            "/redfish/v1/Systems/1"
        );
        assert!(t.body.get("name").is_none());
        assert_eq!(t.ends(), "enroll");
        assert!(t
            .notes
            .iter()
            .any(|n| n.starts_with("redfish_password is masked")));
        assert!(t.notes.iter().any(|n| n.starts_with("no deploy ISO")));
        assert!(
            !t.notes.iter().any(|n| n.contains("names a file")),
            "False is no path: {:?}",
            t.notes
        );
    }

    #[test]
    fn nodes_in_use_are_not_taken_over() {
        for state in [
            "active",
            "deploying",
            "wait call-back",
            "cleaning",
            "error",
            "rescue",
        ] {
            let why = skipped(ilo("ilo-virtual-media", "direct", state));
            assert_eq!(why, format!("in use ({state})"));
        }
        let mut v = ilo("ilo-virtual-media", "direct", "available");
        v["instance_uuid"] = json!(U2);
        assert_eq!(skipped(v), format!("in use (instance {U2} is on it)"));
        for state in TAKEN_STATES {
            let p = one(ilo("ilo-virtual-media", "direct", state));
            assert!(p.take_over().is_some(), "{state}");
        }
    }

    #[test]
    fn odd_nodes_are_skipped_with_a_reason_never_a_panic() {
        let cases: &[(Value, &str)] = &[
            (json!(42), "unreadable: expected a JSON object"),
            (json!({}), "no UUID: the source gives none"),
            (json!({"uuid": 7}), "no UUID: expected a string"),
            (
                json!({"uuid": "node-1"}),
                "its UUID \"node-1\" is not a UUID",
            ),
            (json!({"uuid": U1}), "its provision state is not shown"),
            (
                json!({"uuid": U1, "provision_state": "available"}),
                "the source shows no driver",
            ),
            (
                json!({"uuid": U1, "provision_state": "available", "driver": "ilo",
                       "driver_info": [1]}),
                "its driver_info is unreadable",
            ),
            (
                json!({"uuid": U1, "provision_state": "available", "driver": ["ilo"]}),
                "its driver is unreadable",
            ),
        ];
        for (v, want) in cases {
            let why = skipped(v.clone());
            assert!(why.starts_with(want), "{v}: {why}");
        }
        // A node with no driver_info at all is taken over and stays enroll.
        let t = taken(
            json!({"uuid": U1, "provision_state": "enroll", "driver": "ilo",
            "boot_interface": "ilo-virtual-media", "deploy_interface": "direct"}),
        );
        assert_eq!(t.stays_enroll.len(), 3);
        // Wrong-typed side fields are dropped, not fatal.
        let mut v = ilo("ilo-virtual-media", "direct", "available");
        v["properties"] = json!("cpus=8");
        v["extra"] = json!(5);
        let t = taken(v);
        assert!(t
            .dropped
            .iter()
            .any(|d| d.starts_with("properties (unreadable")));
        assert!(t.dropped.iter().any(|d| d.starts_with("extra (unreadable")));
        // Bad capabilities are noted.
        let mut v = ilo("ilo-virtual-media", "direct", "available");
        v["properties"] = json!({"capabilities": "boot_mode:floppy"});
        let t = taken(v);
        assert!(t
            .notes
            .iter()
            .any(|n| n.starts_with("properties.capabilities")));
    }

    #[test]
    fn what_vmdeploy_has_is_not_imported_again() {
        let mut existing = Existing::default();
        existing.uuids.insert(U1.into());
        let p = plan(
            &[node(ilo("ilo-virtual-media", "direct", "available"))],
            None,
            &existing,
        );
        assert_eq!(
            p.nodes[0].decision,
            Decision::Skip("already in vmdeploy (same UUID)".into())
        );
        let mut existing = Existing::default();
        existing.names.insert("gen9-1".into());
        let p = plan(
            &[node(ilo("ilo-virtual-media", "direct", "available"))],
            None,
            &existing,
        );
        assert!(matches!(&p.nodes[0].decision, Decision::Skip(w) if w.contains("named gen9-1")));
        // The UUID is compared in its canonical form.
        let mut existing = Existing::default();
        existing.uuids.insert(U1.into());
        let mut v = ilo("ilo-virtual-media", "direct", "available");
        v["uuid"] = json!(U1.to_uppercase());
        let p = plan(&[node(v)], None, &existing);
        assert!(p.nodes[0].take_over().is_none());
    }

    #[test]
    fn ports_follow_their_node() {
        let nodes = nodes_from_json(
            &json!([
                ilo("ilo-virtual-media", "direct", "available"),
                {"UUID": U2, "Provisioning State": "active", "Driver": "ilo"},
            ])
            .to_string(),
            "nodes",
        )
        .expect("nodes");
        let ports = ports_from_json(
            &json!([
                {"Address": "52:54:00:AA:00:01", "Node UUID": U1, "PXE boot enabled": true,
                 "UUID": "a1b2c3d4-0000-4000-8000-000000000001",
                 "Local Link Connection": {"switch_id": "0a:1b:2c:3d:4e:5f", "port_id": "Eth1"}},
                {"Address": "52-54-00-aa-00-02", "Node UUID": U1.to_uppercase(),
                 "PXE boot enabled": false, "Extra": {"slot": "2"}},
                {"Address": "not-a-mac", "Node UUID": U1},
                {"Address": "52:54:00:aa:00:03", "Node UUID": U2},
                {"Address": "52:54:00:aa:00:04", "Node UUID": "ffffffff-0000-4000-8000-000000000000"},
                {"Address": "52:54:00:aa:00:01", "Node UUID": U1},
            ])
            .to_string(),
            "ports",
        )
        .expect("ports");
        let p = plan(&nodes, Some(&ports), &Existing::default());
        let t = p.nodes[0].take_over().expect("taken over");
        let addresses: Vec<(&str, bool)> = t
            .ports
            .iter()
            .map(|p| (p.address.as_str(), p.pxe_enabled))
            .collect();
        assert_eq!(
            addresses,
            [("52:54:00:aa:00:01", true), ("52:54:00:aa:00:02", false)]
        );
        assert_eq!(
            t.ports[0].body["uuid"],
            "a1b2c3d4-0000-4000-8000-000000000001"
        );
        assert_eq!(t.ports[1].body["extra"]["slot"], "2");
        assert!(t
            .dropped
            .contains(&"port 52:54:00:aa:00:01 local_link_connection".to_string()));
        assert!(t
            .dropped
            .contains(&"port not-a-mac (no MAC address)".to_string()));
        assert!(t.dropped.iter().any(|d| d.contains("already on node")));
        assert!(t
            .carries
            .contains(&"ports (52:54:00:aa:00:01, 52:54:00:aa:00:02 no-pxe)".to_string()));
        assert_eq!(
            p.orphan_ports,
            ["52:54:00:aa:00:04 (node ffffffff-0000-4000-8000-000000000000)"]
        );
        assert!(p.nodes[1].take_over().is_none());
        // A port vmdeploy has already is not created again.
        let mut existing = Existing::default();
        existing
            .port_addresses
            .insert("52:54:00:aa:00:02".into(), "some-node".into());
        let p = plan(&nodes, Some(&ports), &existing);
        let t = p.nodes[0].take_over().expect("taken over");
        assert_eq!(t.ports.len(), 1);
    }

    #[test]
    fn duplicates_in_the_source_keep_the_first() {
        let a = node(ilo("ilo-virtual-media", "direct", "available"));
        let mut v = ilo("ilo-virtual-media", "direct", "available");
        v["uuid"] = json!(U2);
        let b = node(v);
        let p = plan(&[a.clone(), a, b], Some(&[]), &Existing::default());
        assert!(p.nodes[0].take_over().is_some());
        assert!(matches!(&p.nodes[1].decision, Decision::Skip(w) if w.contains("same UUID")));
        assert!(matches!(&p.nodes[2].decision, Decision::Skip(w) if w.contains("same name")));
        let t = p.nodes[0].take_over().expect("taken over");
        assert!(t.notes.iter().any(|n| n.starts_with("no port")));
    }

    #[test]
    fn masks_and_macs() {
        assert!(is_masked(&json!("******")));
        assert!(is_masked(&json!("***")));
        assert!(!is_masked(&json!("*")));
        assert!(!is_masked(&json!("pa**")));
        assert!(!is_masked(&json!(null)));
        assert_eq!(
            canonical_mac("52:54:00:AA:BB:CC").as_deref(),
            Some("52:54:00:aa:bb:cc")
        );
        assert_eq!(
            canonical_mac("52-54-00-aa-bb-cc").as_deref(),
            Some("52:54:00:aa:bb:cc")
        );
        for bad in [
            "",
            "52:54:00:aa:bb",
            "52:54:00:aa:bb:cc:dd",
            "52:54:00:aa:bb:cg",
            "525400aabbcc",
        ] {
            assert_eq!(canonical_mac(bad), None, "{bad}");
        }
    }

    fn arb_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            ".{0,12}".prop_map(Value::String),
            prop_oneof![
                Just(U1),
                Just("ilo"),
                Just("ilo5"),
                Just("redfish"),
                Just("ilo-virtual-media"),
                Just("ilo-pxe"),
                Just("redfish-virtual-media"),
                Just("direct"),
                Just("iscsi"),
                Just("available"),
                Just("active"),
                Just("******"),
                Just("52:54:00:aa:bb:cc"),
                Just("{\"a\": 1}"),
            ]
            .prop_map(|s| Value::String(s.to_string())),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(
                    prop_oneof![
                        Just("ilo_address".to_string()),
                        Just("ilo_password".to_string()),
                        Just("redfish_address".to_string()),
                        Just("capabilities".to_string()),
                        ".{0,8}",
                    ],
                    inner,
                    0..6
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn arb_record(
        columns: &'static [crate::import::source::Column],
    ) -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let key = prop_oneof![
            proptest::sample::select(columns).prop_map(|c| c.field.to_string()),
            proptest::sample::select(columns).prop_map(|c| c.title.to_string()),
            ".{0,8}",
        ];
        proptest::collection::btree_map(key, arb_json(), 0..14)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_sources_never_panic(
            nodes in proptest::collection::vec(
                proptest::prop_oneof![arb_record(crate::import::source::NODE_COLUMNS), arb_json()],
                0..5,
            ),
            ports in proptest::collection::vec(arb_record(crate::import::source::PORT_COLUMNS), 0..5),
        ) {
            let nodes: Vec<SourceNode> = nodes.iter().map(SourceNode::from_json).collect();
            let ports: Vec<SourcePort> = ports.iter().map(SourcePort::from_json).collect();
            let p = plan(&nodes, Some(&ports), &Existing::default());
            proptest::prop_assert_eq!(p.nodes.len(), nodes.len());
            for node in &p.nodes {
                if let Some(t) = node.take_over() {
                    // Whatever is taken over has a real UUID, a driver vmdeploy serves and a
                    // state nothing runs in.
                    let uuid = node.uuid.as_deref().unwrap_or_default();
                    proptest::prop_assert!(uuid::Uuid::parse_str(uuid).is_ok());
                    proptest::prop_assert!(crate::node::hardware_type::find(t.driver).is_some());
                    let state = node.source.provision_state.as_deref().unwrap_or_default();
                    proptest::prop_assert!(TAKEN_STATES.contains(&state));
                    for port in &t.ports {
                        proptest::prop_assert!(canonical_mac(&port.address).is_some());
                    }
                }
            }
            let report = crate::import::report::Report {
                source: "s", target: "t", plan: &p, results: None,
            };
            let _ = report.text();
            let _ = report.json();
        }
    }
}
