//! The conductor's iSCSI initiator: writes the node's disk over the network.

pub mod cli;
