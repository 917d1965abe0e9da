//! TFTP codec (RFC 1350) with the option extension (RFC 2347) and the blksize, tsize and timeout
//! options (RFC 2348, RFC 2349), for the conductor's read-only TFTP server (`pxe_ilo`).
//!
//! Pure code: no sockets, no files. The server in `conductor/src/netboot/tftp` owns the I/O and
//! every policy (which files, which limits).
//!
//! # Overview
//! - [`packet`]: [`Packet`] (RRQ, WRQ, DATA, ACK, ERROR, OACK), [`parse`] and
//!   [`Packet::encode`], the [`Mode`]s and the [`ErrorCode`] table. [`parse`] reads untrusted
//!   datagrams: any byte string gives `Ok` or a typed [`TftpError`], never a panic (property
//!   tested).
//! - [`options`]: what a client asked for ([`RequestedOptions`]) and what the server grants
//!   ([`AcceptedOptions`]), which becomes the OACK.
//! - [`netascii`]: the outgoing netascii conversion (LF → CR LF, CR → CR NUL).
//!
//! # Design
//! Strings on the wire (file names, modes, option names and values) must be UTF-8: every client
//! we serve (PXE ROMs, PXELINUX, GRUB, iPXE, tftp-hpa, curl) sends ASCII, and a typed `String`
//! keeps the path confinement in the server simple. Option names are kept as sent (RFC 2347 makes
//! them case-insensitive; [`RequestedOptions`] compares them so).
//!
//! # Limitations
//! The codec does not know the negotiated block size: a DATA packet of any length parses, and
//! the transfer checks lengths. The codec does not enforce RFC 2347's 512-byte request limit;
//! a server reading into a larger buffer simply accepts longer requests.

pub mod netascii;
pub mod options;
pub mod packet;

pub use netascii::netascii_encode;
pub use options::{
    AcceptedOptions, RequestedOptions, DEFAULT_BLKSIZE, MAX_BLKSIZE, MAX_TIMEOUT_SECS, MIN_BLKSIZE,
    MIN_TIMEOUT_SECS, OPT_BLKSIZE, OPT_TIMEOUT, OPT_TSIZE,
};
pub use packet::{
    data_header, parse, ErrorCode, Mode, Opcode, Packet, TftpError, TftpOption, DATA_HEADER_LEN,
};

/// The well-known TFTP port (RFC 1350 §4, "Initial Connection Protocol").
pub const TFTP_PORT: u16 = 69;
