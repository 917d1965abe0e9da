//! The manager against a real SQLite store and the in-process iLO emulator, with a scripted
//! deploy flow standing in for the real ones (`harness`), one file per duty of the manager.

mod harness;

mod bmc;
mod cleaning;
mod heartbeat;
mod management;
mod pass_deploy_info;
mod power;
mod provision;
mod recovery;
mod tasks;
