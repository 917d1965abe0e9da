//! The vmdeploy conductor.
//!
//! A small tokio service behind an Ironic-compatible REST API. It drives iLO (RIBCL for iLO 4,
//! Redfish for iLO 5 and later), builds the virtual floppy, writes images over iSCSI and cleans up.

pub mod drivers;
pub mod initiator;
pub mod logging;
