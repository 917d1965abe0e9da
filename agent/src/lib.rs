//! The vmdeploy deploy agent.
//!
//! One statically linked binary that the kernel starts as `/init` of the deploy ISO. It reads the
//! virtual floppy, brings up the network, and then either exposes the node's disk over iSCSI
//! (`iscsi_ilo`, `pxe_ilo`) or streams the image to disk itself (`agent_ilo`).

pub mod api;
pub mod deploy;
pub mod disk;
pub mod drivers;
pub mod firmware;
pub mod floppy;
pub mod http;
pub mod init;
pub mod install;
pub mod logging;
pub mod net;
pub mod stream;
mod sys;
pub mod target;
