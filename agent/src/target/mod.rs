//! The agent's iSCSI target: serves the node's disk as LUN 1 (iscsi_ilo, pxe_ilo).

pub mod cli;
