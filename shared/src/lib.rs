//! Wire formats and codecs shared by the vmdeploy agent and conductor.
//!
//! Pure code: nothing here opens a socket, a device or a file of its own, and nothing here makes a
//! policy decision. Both ends of every protocol use these types so they cannot drift apart.
#![warn(missing_docs)]

pub mod api;
pub mod cpio;
pub mod driver_pack;
pub mod error;
pub mod exit;
pub mod ext4;
pub mod fat;
pub mod fs_id;
pub mod io;
pub mod iqn;
pub mod iscsi;
pub mod iso;
pub mod json;
pub mod modalias;
pub mod params;
pub mod partition;
pub mod pe;
pub mod qcow2;
pub mod redact;
pub mod secret;
pub mod tempurl;
pub mod tftp;
pub mod ustar;
