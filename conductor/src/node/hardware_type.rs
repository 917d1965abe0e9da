//! Drivers as compositions of interfaces, as Ironic's hardware types are: which boot and deploy
//! interfaces each driver offers, which it uses when the node names none, and the interfaces a
//! node ends up with.
//!
//! # Design
//! A driver is a row of [`HARDWARE_TYPES`]: `agent_ilo` = virtual-media boot + agent (`direct`)
//! deploy, `iscsi_ilo` = virtual-media boot + `iscsi` deploy, `pxe_ilo` = network boot + `iscsi`
//! deploy, `redfish` = virtual-media boot + agent deploy (docs/architecture.md §3). The first
//! entry of each list is the default. A node stores only what its operator chose
//! (`boot_interface`, `deploy_interface`; `None` = the driver's default), so a driver's default
//! can change without rewriting nodes, and [`NodeInterfaces::of`] resolves the pair the flows
//! run. Every interface name maps onto one [`BootMethod`] or [`DeployMethod`]: the flows branch
//! on those, never on a driver's name.
//!
//! # Limitations
//! The agent deploy needs the virtual-media boot (its token travels on the virtual floppy): a
//! network boot with the `direct` deploy is refused when it is set ([`check_pair`]).

use std::fmt;

use crate::store::Node;

/// How a node boots its deploy ramdisk (and, for netboot instances, the instance).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootMethod {
    /// iLO (or Redfish) virtual media: the deploy ISO on the virtual CD, the parameters on the
    /// virtual floppy.
    VirtualMedia,
    /// PXE from the conductor's TFTP/HTTP service, the parameters on the kernel command line.
    Network,
}

/// Who writes the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeployMethod {
    /// The agent streams the image to the disk itself (Ironic's `direct`).
    Agent,
    /// The ramdisk exposes the disk over iSCSI and the conductor writes it.
    Iscsi,
}

impl fmt::Display for BootMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BootMethod::VirtualMedia => "virtual media",
            BootMethod::Network => "network (PXE)",
        })
    }
}

impl fmt::Display for DeployMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeployMethod::Agent => "agent",
            DeployMethod::Iscsi => "iscsi",
        })
    }
}

/// The boot method behind a boot interface name, `None` for a name no driver here offers.
pub fn boot_method(name: &str) -> Option<BootMethod> {
    match name {
        "ilo-virtual-media" | "redfish-virtual-media" => Some(BootMethod::VirtualMedia),
        "pxe" | "ilo-pxe" => Some(BootMethod::Network),
        _ => None,
    }
}

/// The deploy method behind a deploy interface name.
pub fn deploy_method(name: &str) -> Option<DeployMethod> {
    match name {
        "direct" => Some(DeployMethod::Agent),
        "iscsi" => Some(DeployMethod::Iscsi),
        _ => None,
    }
}

/// One driver and the interfaces a node of it may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HardwareType {
    /// Its name.
    pub name: &'static str,
    /// `classic` (a Kilo driver) or `dynamic` (a hardware type), as Ironic ≥ 1.30 lists them.
    pub kind: &'static str,
    /// Boot interfaces offered, the default first.
    pub boot: &'static [&'static str],
    /// Deploy interfaces offered, the default first.
    pub deploy: &'static [&'static str],
    /// Management interface.
    pub management: &'static str,
    /// Power interface.
    pub power: &'static str,
    /// Vendor interface (`pass_deploy_info` and friends).
    pub vendor: &'static str,
}

/// The drivers this conductor serves. The classic drivers are fixed compositions; the hardware
/// types offer what Ironic's `ilo` and `redfish` types offered with these flows.
pub const HARDWARE_TYPES: &[HardwareType] = &[
    HardwareType {
        name: "agent_ilo",
        kind: "classic",
        boot: &["ilo-virtual-media"],
        deploy: &["direct"],
        management: "ilo",
        power: "ilo",
        vendor: "ilo",
    },
    HardwareType {
        name: "iscsi_ilo",
        kind: "classic",
        boot: &["ilo-virtual-media"],
        deploy: &["iscsi"],
        management: "ilo",
        power: "ilo",
        vendor: "ilo",
    },
    HardwareType {
        name: "pxe_ilo",
        kind: "classic",
        boot: &["pxe"],
        deploy: &["iscsi"],
        management: "ilo",
        power: "ilo",
        vendor: "ilo",
    },
    HardwareType {
        name: "ilo",
        kind: "dynamic",
        boot: &["ilo-virtual-media", "ilo-pxe"],
        deploy: &["direct", "iscsi"],
        management: "ilo",
        power: "ilo",
        vendor: "ilo",
    },
    HardwareType {
        name: "redfish",
        kind: "dynamic",
        boot: &["redfish-virtual-media"],
        deploy: &["direct", "iscsi"],
        management: "redfish",
        power: "redfish",
        vendor: "redfish",
    },
];

/// The driver called `name`.
pub fn find(name: &str) -> Option<&'static HardwareType> {
    HARDWARE_TYPES.iter().find(|d| d.name == name)
}

/// Which of the two settable interfaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterfaceKind {
    /// `boot_interface`.
    Boot,
    /// `deploy_interface`.
    Deploy,
}

impl InterfaceKind {
    /// `boot` or `deploy`, as Ironic names the interface type.
    pub fn as_str(self) -> &'static str {
        match self {
            InterfaceKind::Boot => "boot",
            InterfaceKind::Deploy => "deploy",
        }
    }
}

/// Why an interface choice is refused, in Ironic's words where Ironic has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InterfaceError {
    /// The driver does not offer this interface (Ironic's `IncompatibleInterface`).
    Incompatible {
        /// `boot` or `deploy`.
        kind: InterfaceKind,
        /// The value asked for.
        value: String,
        /// The driver.
        driver: String,
        /// What the driver offers.
        offered: &'static [&'static str],
    },
    /// Both are offered, but no flow boots this way and deploys that way.
    NoFlow {
        /// The boot interface.
        boot: String,
        /// The deploy interface.
        deploy: String,
    },
    /// The node's driver is not served here.
    UnknownDriver(String),
}

impl fmt::Display for InterfaceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InterfaceError::Incompatible {
                kind,
                value,
                driver,
                offered,
            } => write!(
                f,
                "{} interface implementation '{value}' is not supported by hardware type \
                 {driver}. Supported: {}.",
                kind.as_str(),
                offered.join(", ")
            ),
            InterfaceError::NoFlow { boot, deploy } => write!(
                f,
                "boot interface '{boot}' cannot be used with deploy interface '{deploy}': the \
                 agent deploy needs a virtual-media boot (its token travels on the virtual \
                 floppy); use deploy interface 'iscsi' or a virtual-media boot interface."
            ),
            InterfaceError::UnknownDriver(driver) => {
                write!(f, "driver {driver:?} is not served by this conductor")
            }
        }
    }
}

impl std::error::Error for InterfaceError {}

/// The boot and deploy interfaces a node runs with, resolved against its driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeInterfaces {
    /// The driver's row.
    pub hardware_type: &'static HardwareType,
    /// The boot interface's name.
    pub boot: &'static str,
    /// The deploy interface's name.
    pub deploy: &'static str,
}

impl NodeInterfaces {
    /// The node's interfaces: its own choice where it made one, else its driver's default.
    pub fn of(node: &Node) -> Result<NodeInterfaces, InterfaceError> {
        resolve(
            &node.driver,
            node.boot_interface.as_deref(),
            node.deploy_interface.as_deref(),
        )
    }

    /// The interfaces the API shows for `node`: [`NodeInterfaces::of`] where they resolve, else
    /// its driver's defaults (a stored choice the driver no longer offers), or the first
    /// driver's for a driver this conductor does not serve. A node must always render, and a
    /// node whose interfaces do not resolve never runs a flow (`no_flow_reason` says why).
    pub fn shown(node: &Node) -> NodeInterfaces {
        NodeInterfaces::of(node).unwrap_or_else(|_| {
            NodeInterfaces::defaults(find(&node.driver).unwrap_or(&HARDWARE_TYPES[0]))
        })
    }

    /// A driver's default interfaces.
    pub fn defaults(hardware_type: &'static HardwareType) -> NodeInterfaces {
        NodeInterfaces {
            hardware_type,
            boot: hardware_type.boot[0],
            deploy: hardware_type.deploy[0],
        }
    }

    /// How the node boots its ramdisk.
    pub fn boot_method(&self) -> BootMethod {
        // Every name in the table maps; the table's own test keeps it so.
        boot_method(self.boot).unwrap_or(BootMethod::VirtualMedia)
    }

    /// Who writes the image.
    pub fn deploy_method(&self) -> DeployMethod {
        deploy_method(self.deploy).unwrap_or(DeployMethod::Agent)
    }
}

/// Why no flow runs `node`, in words an operator can act on (for when none is found).
pub fn no_flow_reason(node: &Node) -> String {
    match NodeInterfaces::of(node) {
        Err(e) => format!("node {}: {e}", node.uuid),
        Ok(i) => format!(
            "node {}: no flow on this conductor boots with '{}' and deploys with '{}' (driver {})",
            node.uuid, i.boot, i.deploy, node.driver
        ),
    }
}

/// Resolves a driver and the node's optional choices to the interfaces it runs, refusing a
/// choice the driver does not offer or a pair no flow runs.
pub fn resolve(
    driver: &str,
    boot: Option<&str>,
    deploy: Option<&str>,
) -> Result<NodeInterfaces, InterfaceError> {
    let hardware_type = find(driver).ok_or_else(|| InterfaceError::UnknownDriver(driver.into()))?;
    let boot = pick(hardware_type, InterfaceKind::Boot, hardware_type.boot, boot)?;
    let deploy = pick(
        hardware_type,
        InterfaceKind::Deploy,
        hardware_type.deploy,
        deploy,
    )?;
    check_pair(boot, deploy)?;
    Ok(NodeInterfaces {
        hardware_type,
        boot,
        deploy,
    })
}

fn pick(
    hardware_type: &HardwareType,
    kind: InterfaceKind,
    offered: &'static [&'static str],
    wanted: Option<&str>,
) -> Result<&'static str, InterfaceError> {
    match wanted {
        None => Ok(offered[0]),
        Some(w) => {
            offered
                .iter()
                .copied()
                .find(|o| *o == w)
                .ok_or_else(|| InterfaceError::Incompatible {
                    kind,
                    value: w.to_string(),
                    driver: hardware_type.name.to_string(),
                    offered,
                })
        }
    }
}

/// Refuses a boot/deploy pair no flow runs.
pub fn check_pair(boot: &str, deploy: &str) -> Result<(), InterfaceError> {
    match (boot_method(boot), deploy_method(deploy)) {
        (Some(BootMethod::Network), Some(DeployMethod::Agent)) => Err(InterfaceError::NoFlow {
            boot: boot.into(),
            deploy: deploy.into(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_offered_interface_maps_to_a_method() {
        for t in HARDWARE_TYPES {
            assert!(!t.boot.is_empty() && !t.deploy.is_empty(), "{}", t.name);
            for b in t.boot {
                assert!(boot_method(b).is_some(), "{}: boot {b}", t.name);
            }
            for d in t.deploy {
                assert!(deploy_method(d).is_some(), "{}: deploy {d}", t.name);
            }
            // The default pair always runs.
            check_pair(t.boot[0], t.deploy[0]).expect(t.name);
        }
    }

    #[test]
    fn the_seed_drivers_are_the_compositions_the_architecture_names() {
        let methods = |driver: &str| {
            let i = resolve(driver, None, None).expect(driver);
            (i.boot_method(), i.deploy_method())
        };
        use BootMethod::*;
        use DeployMethod::*;
        assert_eq!(methods("agent_ilo"), (VirtualMedia, Agent));
        assert_eq!(methods("iscsi_ilo"), (VirtualMedia, Iscsi));
        assert_eq!(methods("pxe_ilo"), (Network, Iscsi));
        assert_eq!(methods("redfish"), (VirtualMedia, Agent));
        assert_eq!(methods("ilo"), (VirtualMedia, Agent));
    }

    #[test]
    fn shown_interfaces_fall_back_to_the_drivers_defaults_then_the_first_drivers() {
        let mut node = Node::new(
            uuid::Uuid::new_v4(),
            "ilo",
            crate::states::ProvisionState::Enroll,
        );
        node.boot_interface = Some("ilo-pxe".into());
        node.deploy_interface = Some("iscsi".into());
        let chosen = NodeInterfaces::shown(&node);
        assert_eq!((chosen.boot, chosen.deploy), ("ilo-pxe", "iscsi"));
        // A pair no flow runs shows the driver's defaults.
        node.deploy_interface = Some("direct".into());
        let ilo = find("ilo").expect("ilo");
        assert_eq!(NodeInterfaces::shown(&node), NodeInterfaces::defaults(ilo));
        // A driver not served here shows the first driver's defaults.
        node.driver = "fake-hardware".into();
        assert_eq!(
            NodeInterfaces::shown(&node),
            NodeInterfaces::defaults(&HARDWARE_TYPES[0])
        );
    }

    #[test]
    fn a_choice_the_driver_lacks_is_refused_in_ironics_words() {
        let err = resolve("agent_ilo", None, Some("iscsi")).expect_err("fixed driver");
        assert_eq!(
            err.to_string(),
            "deploy interface implementation 'iscsi' is not supported by hardware type \
             agent_ilo. Supported: direct."
        );
        let i = resolve("redfish", None, Some("iscsi")).expect("offered");
        assert_eq!(i.deploy_method(), DeployMethod::Iscsi);
        assert!(matches!(
            resolve("ilo", Some("ilo-pxe"), None),
            Err(InterfaceError::NoFlow { .. })
        ));
        let i = resolve("ilo", Some("ilo-pxe"), Some("iscsi")).expect("runs");
        assert_eq!(i.boot_method(), BootMethod::Network);
        assert!(matches!(
            resolve("nope", None, None),
            Err(InterfaceError::UnknownDriver(_))
        ));
    }
}
