//! The vmdeploy conductor, for now its clients and their operator commands: the iLO client
//! (RIBCL for iLO 4, Redfish for iLO 5 and later) and the iSCSI initiator that writes images to
//! an agent's target. The Ironic-compatible API and the deploy flows that will drive them come
//! later (DESIGN.md).

/// Power and management interfaces and the iLO clients that implement them, with the `ilo` CLI.
pub mod drivers;
/// The iSCSI initiator (login, CHAP, write/read pipelines), with the `iscsi` CLI.
pub mod initiator;
/// Console logging set-up.
pub mod logging;
