//! The conductor's iSCSI initiator: writes the node's disk over the network (docs/architecture.md §1, the
//! `iscsi_ilo` and `pxe_ilo` flows), in userspace because these kernels have no iSCSI
//! (docs/architecture.md §11).
//!
//! # Design
//! - [`transport`]: PDU framing over a TCP stream (vectored writes, zero-copy reads) with
//!   timeouts.
//! - [`login`]: the login phase: security stage with optional CHAP (one-way or mutual),
//!   operational negotiation ([`vmdeploy_shared::iscsi::Negotiation`]), and discovery
//!   (`SendTargets=All`) on its own session.
//! - [`session`]: the full feature phase. One reader task routes PDUs by Initiator Task Tag to the
//!   command futures; commands wait for the CmdSN window, send immediate and unsolicited data,
//!   answer R2Ts, collect Data-In, and finish on the status. Many commands run at once
//! - [`pipeline`]: whole-image transfers ([`pipeline::write_image`], [`pipeline::read_image`]
//!   keep a queue of commands in flight).
//! - [`blocking`]: a `Read + Write + Seek` view of a LUN for the synchronous partitioning code.
//! - [`cli`]: `vmdeploy-conductor iscsi write|read|capacity|discover`.
//!
//! # Limitations
//! ErrorRecoveryLevel 0 only: any transport error fails the session and every command on it
//! (the caller logs in again). One connection per session; no TLS (plain TCP, as iSCSI is run
//! on a deploy network).

pub mod blocking;
pub mod cli;
pub mod login;
pub mod pipeline;
pub mod session;
pub mod transport;

use std::time::Duration;

use vmdeploy_shared::iscsi::chap::ChapCredentials;
use vmdeploy_shared::iscsi::keys::OperationalParams;
use vmdeploy_shared::iscsi::{KeysError, LoginStatus, PduError};

pub use blocking::BlockingLun;
pub use login::discover;
pub use pipeline::{
    read_image, read_to_file, write_bytes_at, write_file, write_file_ranges, write_image,
};
pub use session::Session;

/// The initiator name used when the caller gives none.
pub const DEFAULT_INITIATOR_NAME: &str = "iqn.2024-01.org.vmdeploy:conductor";

/// Everything that can go wrong talking to a target. Each message says what an operator can
/// check.
#[derive(Debug, thiserror::Error)]
pub enum InitiatorError {
    /// The TCP connection could not be made (refused, unreachable, timed out).
    #[error("connecting to iSCSI portal {portal}: {source}")]
    Connect {
        /// `ADDR:PORT`.
        portal: String,
        /// The socket error.
        source: std::io::Error,
    },
    /// A wait ran over its limit.
    #[error("timed out after {0:?} {1}")]
    Timeout(Duration, &'static str),
    /// The target refused the login.
    #[error("login to {target} rejected by the target: {status}")]
    LoginRejected {
        /// The target name.
        target: String,
        /// Status-Class/Detail.
        status: LoginStatus,
    },
    /// CHAP failed on this side (mutual CHAP: the target's answer was wrong, or CHAP values
    /// were malformed).
    #[error("CHAP authentication failed: {0}")]
    Authentication(String),
    /// Operational negotiation failed.
    #[error("login negotiation failed: {0}")]
    Negotiation(#[from] KeysError),
    /// The target broke the protocol.
    #[error("iSCSI protocol error: {0}")]
    Protocol(String),
    /// A PDU could not be decoded.
    #[error("bad PDU from the target: {0}")]
    Pdu(#[from] PduError),
    /// The session ended while work was outstanding.
    #[error("connection to the target lost: {0}")]
    ConnectionLost(String),
    /// A SCSI command ended in CHECK CONDITION.
    #[error("{op} failed: CHECK CONDITION, {sense}")]
    CheckCondition {
        /// The command.
        op: &'static str,
        /// The decoded sense, in words.
        sense: String,
        /// The sense key, when the sense data could be decoded.
        key: Option<vmdeploy_shared::iscsi::scsi::SenseKey>,
    },
    /// A SCSI command ended with another non-GOOD status.
    #[error("{op} failed: SCSI status {status:#04x}")]
    ScsiStatus {
        /// The command.
        op: &'static str,
        /// The SCSI status.
        status: u8,
    },
    /// The target reported a target failure (iSCSI Response 0x01) or rejected a PDU.
    #[error("{op} failed: {reason}")]
    CommandFailed {
        /// The command.
        op: &'static str,
        /// What the target said.
        reason: String,
    },
    /// The target name is not an iSCSI name.
    #[error("invalid target name: {0}")]
    Name(#[from] vmdeploy_shared::iqn::IqnError),
    /// A request the LUN cannot satisfy (past its end, not block aligned).
    #[error("{0}")]
    Range(String),
    /// Local I/O failed (image file, output file).
    #[error("{0}: {1}")]
    Io(&'static str, std::io::Error),
}

/// Time limits for every network wait (common.md: timeouts on every wait).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// TCP connect.
    pub connect: Duration,
    /// Each login request → response.
    pub login: Duration,
    /// A command with no PDU from the target for this long fails (the target is gone or hung).
    pub command: Duration,
    /// Writing one PDU (a target that stops reading makes writes block).
    pub write: Duration,
    /// Logout.
    pub logout: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(10),
            login: Duration::from_secs(20),
            command: Duration::from_secs(60),
            write: Duration::from_secs(60),
            logout: Duration::from_secs(10),
        }
    }
}

/// How to reach and log in to one target.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// `ADDR:PORT` of the portal.
    pub portal: String,
    /// Target name (`iqn.…`, `eui.…`, `naa.…` or Ironic's `iqn-<uuid>`).
    pub target: String,
    /// LUN to address (Ironic's deploy ramdisk exports LUN 1).
    pub lun: u16,
    /// Our initiator name.
    pub initiator_name: String,
    /// CHAP credentials the target checks; `None` for no authentication.
    pub chap: Option<ChapCredentials>,
    /// Mutual CHAP: the credentials the target must prove it knows.
    pub mutual_chap: Option<ChapCredentials>,
    /// What to negotiate (see [`SessionConfig::new`] for the defaults and why).
    pub params: OperationalParams,
    /// Time limits.
    pub timeouts: Timeouts,
}

impl SessionConfig {
    /// A configuration with the defaults: 256 KiB PDUs to us, 1 MiB bursts, up to 1 MiB of
    /// unsolicited data (InitialR2T=No, ImmediateData=Yes). The reference measurements tuned
    /// tgtd with 256 KiB PDUs, FirstBurst 256 KiB and MaxBurst 1 MiB for ≈2× the write
    /// throughput of the RFC defaults (docs/iscsi-and-swift-peers.md §3); offering a
    /// FirstBurst of a whole MaxBurst costs nothing there (the target lowers it, the Minimum
    /// rule) and lets a target that accepts it take a 1 MiB WRITE without an R2T round trip
    /// (measured 5-10 % faster into the agent's target).
    pub fn new(portal: impl Into<String>, target: impl Into<String>, lun: u16) -> SessionConfig {
        SessionConfig {
            portal: portal.into(),
            target: target.into(),
            lun,
            initiator_name: DEFAULT_INITIATOR_NAME.to_string(),
            chap: None,
            mutual_chap: None,
            params: OperationalParams {
                max_recv_data_segment_length: 256 * 1024,
                max_burst_length: 1024 * 1024,
                first_burst_length: 1024 * 1024,
                initial_r2t: false,
                immediate_data: true,
                max_outstanding_r2t: 1,
                default_time2wait: 0,
                default_time2retain: 0,
                ..OperationalParams::default()
            },
            timeouts: Timeouts::default(),
        }
    }
}

/// `fut` with a time limit, turning the elapsed case into [`InitiatorError::Timeout`].
pub(crate) async fn with_timeout<T>(
    limit: Duration,
    what: &'static str,
    fut: impl std::future::Future<Output = Result<T, InitiatorError>>,
) -> Result<T, InitiatorError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(result) => result,
        Err(_) => Err(InitiatorError::Timeout(limit, what)),
    }
}
