//! iSCSI codec (RFC 7143), shared by the agent's target and the conductor's initiator.
//!
//! Pure code: PDUs, login/text key negotiation, CHAP, digests, SCSI CDBs and sense data.
//! No sockets.
