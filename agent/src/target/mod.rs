//! The agent's iSCSI target: serves the node's disk as LUN 1 (iscsi_ilo, pxe_ilo).
//!
//! Layers, bottom up: [`backend`] (O_DIRECT block I/O), [`commands`] (SCSI semantics) with
//! [`reservations`] (RESERVE/RELEASE and persistent reservations per I_T nexus),
//! [`framing`] and [`login`] and [`connection`] (iSCSI, RFC 7143; the connection's parts:
//! [`outbox`] for what it sends, [`gather`] for where write data goes, [`budget`] for how much
//! of it may be buffered, [`responses`] for how a command is answered), [`server`]
//! ([`server::Target::start`], accept loop and shutdown), [`done`] (the conductor's "done"
//! notification), [`cli`].

pub mod backend;
pub mod budget;
pub mod cli;
pub mod commands;
pub mod connection;
pub mod done;
pub mod framing;
pub mod gather;
pub mod login;
pub mod outbox;
pub mod reservations;
pub mod responses;
pub mod server;
