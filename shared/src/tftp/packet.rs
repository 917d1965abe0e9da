//! TFTP packets (RFC 1350 §5, RFC 2347 for OACK) and their wire form.
//!
//! # Format
//! Every packet starts with a 2-byte big-endian opcode:
//! ```text
//! RRQ/WRQ  | 01/02 | filename | 0 | mode | 0 | opt1 | 0 | value1 | 0 | ...
//! DATA     | 03    | block (2) | payload (0..=blksize bytes)
//! ACK      | 04    | block (2)
//! ERROR    | 05    | code (2) | message | 0
//! OACK     | 06    | opt1 | 0 | value1 | 0 | ...
//! ```
//!
//! # Leniency
//! Where real clients differ, parsing accepts what they send and nothing more:
//! - an option list ends at the end of the packet or at an empty option name; what follows an
//!   empty name is ignored (some ROMs pad their requests with NULs);
//! - an ERROR message without its NUL runs to the end of the packet, and a message that is not
//!   UTF-8 is taken lossily: an error is only ever logged;
//! - an ACK must be exactly 4 bytes: a transfer reads into a small buffer, so a longer datagram
//!   arrives truncated and must not pass for an ACK.

use std::fmt;

/// Length of the opcode field.
const OPCODE_LEN: usize = 2;
/// Offset of the block number in DATA and ACK, and of the error code in ERROR.
const BLOCK_OFFSET: usize = 2;
/// Length of a DATA packet's header (opcode and block number); the payload follows.
pub const DATA_HEADER_LEN: usize = 4;
/// Length of an ACK packet.
const ACK_LEN: usize = 4;
/// Offset of the message in ERROR.
const ERROR_MESSAGE_OFFSET: usize = 4;

/// The opcodes (RFC 1350 §5, RFC 2347 for OACK).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Opcode {
    /// Read request.
    Rrq = 1,
    /// Write request.
    Wrq = 2,
    /// Data.
    Data = 3,
    /// Acknowledgment.
    Ack = 4,
    /// Error.
    Error = 5,
    /// Option acknowledgment (RFC 2347).
    Oack = 6,
}

impl Opcode {
    /// The opcode with this wire value, if any.
    pub fn from_u16(value: u16) -> Option<Opcode> {
        Some(match value {
            1 => Opcode::Rrq,
            2 => Opcode::Wrq,
            3 => Opcode::Data,
            4 => Opcode::Ack,
            5 => Opcode::Error,
            6 => Opcode::Oack,
            _ => return None,
        })
    }
}

/// Transfer modes (RFC 1350 §1); compared case-insensitively on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Text: lines end in CR LF, a bare CR is sent as CR NUL.
    Netascii,
    /// Raw bytes ("binary" in most clients' words).
    Octet,
    /// Obsolete mail delivery (RFC 1350 says it should not be used).
    Mail,
}

impl Mode {
    /// The mode's name as this codec writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Netascii => "netascii",
            Mode::Octet => "octet",
            Mode::Mail => "mail",
        }
    }

    /// The mode named `name`, case-insensitively.
    pub fn from_name(name: &str) -> Option<Mode> {
        [Mode::Netascii, Mode::Octet, Mode::Mail]
            .into_iter()
            .find(|mode| mode.as_str().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// TFTP error codes (RFC 1350 §5 "Error Codes", RFC 2347 for 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// 0: not defined, see the message.
    NotDefined,
    /// 1: file not found.
    FileNotFound,
    /// 2: access violation.
    AccessViolation,
    /// 3: disk full or allocation exceeded.
    DiskFull,
    /// 4: illegal TFTP operation.
    IllegalOperation,
    /// 5: unknown transfer ID.
    UnknownTid,
    /// 6: file already exists.
    FileExists,
    /// 7: no such user.
    NoSuchUser,
    /// 8: the transfer ends because of the option negotiation (RFC 2347).
    OptionsRefused,
    /// A code no RFC defines, kept so a peer's error can be logged as sent.
    Other(u16),
}

impl ErrorCode {
    /// The wire value.
    pub fn to_u16(self) -> u16 {
        match self {
            ErrorCode::NotDefined => 0,
            ErrorCode::FileNotFound => 1,
            ErrorCode::AccessViolation => 2,
            ErrorCode::DiskFull => 3,
            ErrorCode::IllegalOperation => 4,
            ErrorCode::UnknownTid => 5,
            ErrorCode::FileExists => 6,
            ErrorCode::NoSuchUser => 7,
            ErrorCode::OptionsRefused => 8,
            ErrorCode::Other(code) => code,
        }
    }

    /// The code with this wire value (an unknown value becomes [`ErrorCode::Other`]).
    pub fn from_u16(value: u16) -> ErrorCode {
        match value {
            0 => ErrorCode::NotDefined,
            1 => ErrorCode::FileNotFound,
            2 => ErrorCode::AccessViolation,
            3 => ErrorCode::DiskFull,
            4 => ErrorCode::IllegalOperation,
            5 => ErrorCode::UnknownTid,
            6 => ErrorCode::FileExists,
            7 => ErrorCode::NoSuchUser,
            8 => ErrorCode::OptionsRefused,
            other => ErrorCode::Other(other),
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_u16())
    }
}

/// One `name=value` option of a request or an OACK (RFC 2347), as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TftpOption {
    /// The option's name; the RFC makes it case-insensitive.
    pub name: String,
    /// Its value (for the options we know, a decimal number).
    pub value: String,
}

impl TftpOption {
    /// An option from its name and value.
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> TftpOption {
        TftpOption {
            name: name.into(),
            value: value.into(),
        }
    }
}

/// A TFTP packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    /// Read request.
    Rrq {
        /// The file asked for, as sent (the server confines it).
        filename: String,
        /// Transfer mode.
        mode: Mode,
        /// Options in the order sent (RFC 2347).
        options: Vec<TftpOption>,
    },
    /// Write request (the conductor's server refuses these).
    Wrq {
        /// The file to write, as sent.
        filename: String,
        /// Transfer mode.
        mode: Mode,
        /// Options in the order sent.
        options: Vec<TftpOption>,
    },
    /// A block of the file.
    Data {
        /// Block number; the first is 1, and it wraps past 65535.
        block: u16,
        /// The block's bytes; fewer than the block size ends the transfer.
        payload: Vec<u8>,
    },
    /// Acknowledges a DATA block (or, with block 0, an OACK).
    Ack {
        /// The block acknowledged.
        block: u16,
    },
    /// Ends the transfer.
    Error {
        /// What went wrong.
        code: ErrorCode,
        /// Human-readable detail.
        message: String,
    },
    /// The options the server accepted (RFC 2347).
    Oack {
        /// Accepted options with their final values.
        options: Vec<TftpOption>,
    },
}

/// Why a datagram is not a TFTP packet, or a packet cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TftpError {
    /// Fewer than the 2 bytes of an opcode.
    #[error("a {len}-byte datagram has no opcode")]
    NoOpcode {
        /// Datagram length.
        len: usize,
    },
    /// The opcode is none of 1..=6.
    #[error("unknown opcode {0}")]
    UnknownOpcode(u16),
    /// The packet ends inside its fixed header.
    #[error("{opcode:?} packet of {len} bytes is shorter than its {need}-byte header")]
    Truncated {
        /// The packet's opcode.
        opcode: Opcode,
        /// Its length.
        len: usize,
        /// The header's length.
        need: usize,
    },
    /// An ACK is exactly 4 bytes.
    #[error("ACK of {len} bytes (an ACK is 4 bytes)")]
    AckLength {
        /// Its length.
        len: usize,
    },
    /// A string field runs to the end of the packet without its NUL.
    #[error("the {field} is not NUL-terminated")]
    Unterminated {
        /// Which field.
        field: &'static str,
    },
    /// A string field is not UTF-8.
    #[error("the {field} is not UTF-8")]
    NotUtf8 {
        /// Which field.
        field: &'static str,
    },
    /// The mode is none of netascii, octet, mail.
    #[error("unknown transfer mode {0:?}")]
    UnknownMode(String),
    /// Encoding: a string field holds a NUL byte, which would end it early on the wire.
    #[error("the {field} contains a NUL byte")]
    NulInField {
        /// Which field.
        field: &'static str,
    },
    /// Encoding: an option without a name would read as the end of the option list.
    #[error("an option has an empty name")]
    EmptyOptionName,
}

/// The header of a DATA packet for `block`: a transfer reads the payload right after it.
pub fn data_header(block: u16) -> [u8; DATA_HEADER_LEN] {
    let [op_hi, op_lo] = (Opcode::Data as u16).to_be_bytes();
    let [block_hi, block_lo] = block.to_be_bytes();
    [op_hi, op_lo, block_hi, block_lo]
}

/// Parses one datagram. Never panics, whatever the bytes.
pub fn parse(datagram: &[u8]) -> Result<Packet, TftpError> {
    let Some((opcode, body)) = datagram.split_first_chunk::<OPCODE_LEN>() else {
        return Err(TftpError::NoOpcode {
            len: datagram.len(),
        });
    };
    let raw = u16::from_be_bytes(*opcode);
    let opcode = Opcode::from_u16(raw).ok_or(TftpError::UnknownOpcode(raw))?;
    let truncated = |need: usize| TftpError::Truncated {
        opcode,
        len: datagram.len(),
        need,
    };
    match opcode {
        Opcode::Rrq | Opcode::Wrq => {
            let mut fields = Fields(body);
            let filename = fields.string("file name")?;
            let mode_name = fields.string("mode")?;
            let mode = Mode::from_name(&mode_name).ok_or(TftpError::UnknownMode(mode_name))?;
            let options = fields.options()?;
            Ok(if opcode == Opcode::Rrq {
                Packet::Rrq {
                    filename,
                    mode,
                    options,
                }
            } else {
                Packet::Wrq {
                    filename,
                    mode,
                    options,
                }
            })
        }
        Opcode::Data => {
            let (block, payload) = body
                .split_first_chunk::<2>()
                .ok_or_else(|| truncated(DATA_HEADER_LEN))?;
            Ok(Packet::Data {
                block: u16::from_be_bytes(*block),
                payload: payload.to_vec(),
            })
        }
        Opcode::Ack => {
            if datagram.len() != ACK_LEN {
                return Err(TftpError::AckLength {
                    len: datagram.len(),
                });
            }
            let block = [datagram[BLOCK_OFFSET], datagram[BLOCK_OFFSET + 1]];
            Ok(Packet::Ack {
                block: u16::from_be_bytes(block),
            })
        }
        Opcode::Error => {
            let (code, rest) = body
                .split_first_chunk::<2>()
                .ok_or_else(|| truncated(ERROR_MESSAGE_OFFSET))?;
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            Ok(Packet::Error {
                code: ErrorCode::from_u16(u16::from_be_bytes(*code)),
                message: String::from_utf8_lossy(&rest[..end]).into_owned(),
            })
        }
        Opcode::Oack => Ok(Packet::Oack {
            options: Fields(body).options()?,
        }),
    }
}

/// NUL-terminated strings read one after the other.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn string(&mut self, field: &'static str) -> Result<String, TftpError> {
        let end = self
            .0
            .iter()
            .position(|&b| b == 0)
            .ok_or(TftpError::Unterminated { field })?;
        let text = std::str::from_utf8(&self.0[..end]).map_err(|_| TftpError::NotUtf8 { field })?;
        self.0 = &self.0[end + 1..];
        Ok(text.to_owned())
    }

    /// `name NUL value NUL` pairs up to the end, or up to an empty name (see the module docs).
    fn options(&mut self) -> Result<Vec<TftpOption>, TftpError> {
        let mut options = Vec::new();
        while !self.0.is_empty() {
            let name = self.string("option name")?;
            if name.is_empty() {
                break;
            }
            let value = self.string("option value")?;
            options.push(TftpOption { name, value });
        }
        Ok(options)
    }
}

impl Packet {
    /// The packet's opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            Packet::Rrq { .. } => Opcode::Rrq,
            Packet::Wrq { .. } => Opcode::Wrq,
            Packet::Data { .. } => Opcode::Data,
            Packet::Ack { .. } => Opcode::Ack,
            Packet::Error { .. } => Opcode::Error,
            Packet::Oack { .. } => Opcode::Oack,
        }
    }

    /// An ERROR packet.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Packet {
        Packet::Error {
            code,
            message: message.into(),
        }
    }

    /// The wire form. Fails only when a string holds a NUL byte or an option has no name:
    /// those cannot be represented.
    pub fn encode(&self) -> Result<Vec<u8>, TftpError> {
        let mut out = Vec::new();
        out.extend_from_slice(&(self.opcode() as u16).to_be_bytes());
        match self {
            Packet::Rrq {
                filename,
                mode,
                options,
            }
            | Packet::Wrq {
                filename,
                mode,
                options,
            } => {
                put_string(&mut out, filename, "file name")?;
                put_string(&mut out, mode.as_str(), "mode")?;
                put_options(&mut out, options)?;
            }
            Packet::Data { block, payload } => {
                out.extend_from_slice(&block.to_be_bytes());
                out.extend_from_slice(payload);
            }
            Packet::Ack { block } => out.extend_from_slice(&block.to_be_bytes()),
            Packet::Error { code, message } => {
                out.extend_from_slice(&code.to_u16().to_be_bytes());
                put_string(&mut out, message, "error message")?;
            }
            Packet::Oack { options } => put_options(&mut out, options)?,
        }
        Ok(out)
    }
}

fn put_string(out: &mut Vec<u8>, text: &str, field: &'static str) -> Result<(), TftpError> {
    if text.as_bytes().contains(&0) {
        return Err(TftpError::NulInField { field });
    }
    out.extend_from_slice(text.as_bytes());
    out.push(0);
    Ok(())
}

fn put_options(out: &mut Vec<u8>, options: &[TftpOption]) -> Result<(), TftpError> {
    for option in options {
        if option.name.is_empty() {
            return Err(TftpError::EmptyOptionName);
        }
        put_string(out, &option.name, "option name")?;
        put_string(out, &option.value, "option value")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rrq(filename: &str, mode: Mode, options: &[(&str, &str)]) -> Packet {
        Packet::Rrq {
            filename: filename.into(),
            mode,
            options: options
                .iter()
                .map(|(n, v)| TftpOption::new(*n, *v))
                .collect(),
        }
    }

    #[test]
    fn parses_the_packets_real_clients_send() {
        let cases: &[(&str, &[u8], Packet)] = &[
            (
                "plain RRQ (tftp-hpa)",
                b"\x00\x01pxelinux.0\x00octet\x00",
                rrq("pxelinux.0", Mode::Octet, &[]),
            ),
            (
                "RRQ with options, mode in capitals",
                b"\x00\x01/boot/vmlinuz\x00OCTET\x00tsize\x000\x00blksize\x001468\x00",
                rrq(
                    "/boot/vmlinuz",
                    Mode::Octet,
                    &[("tsize", "0"), ("blksize", "1468")],
                ),
            ),
            (
                "RRQ padded with NULs",
                b"\x00\x01a\x00netascii\x00timeout\x003\x00\x00\x00\x00",
                rrq("a", Mode::Netascii, &[("timeout", "3")]),
            ),
            (
                "WRQ",
                b"\x00\x02up\x00octet\x00",
                Packet::Wrq {
                    filename: "up".into(),
                    mode: Mode::Octet,
                    options: vec![],
                },
            ),
            (
                "empty DATA (end of a file of whole blocks)",
                b"\x00\x03\xff\xff",
                Packet::Data {
                    block: 65535,
                    payload: vec![],
                },
            ),
            (
                "DATA",
                b"\x00\x03\x00\x01abc",
                Packet::Data {
                    block: 1,
                    payload: b"abc".to_vec(),
                },
            ),
            ("ACK", b"\x00\x04\x01\x00", Packet::Ack { block: 256 }),
            (
                "ERROR",
                b"\x00\x05\x00\x08tsize only\x00",
                Packet::error(ErrorCode::OptionsRefused, "tsize only"),
            ),
            (
                "ERROR without its NUL",
                b"\x00\x05\x00\x63bye",
                Packet::error(ErrorCode::Other(99), "bye"),
            ),
            (
                "OACK",
                b"\x00\x06blksize\x00512\x00",
                Packet::Oack {
                    options: vec![TftpOption::new("blksize", "512")],
                },
            ),
        ];
        for (name, wire, expected) in cases {
            assert_eq!(parse(wire).as_ref(), Ok(expected), "{name}");
        }
    }

    #[test]
    fn rejects_malformed_packets_with_the_reason() {
        let cases: &[(&str, &[u8], TftpError)] = &[
            ("empty", b"", TftpError::NoOpcode { len: 0 }),
            ("one byte", b"\x00", TftpError::NoOpcode { len: 1 }),
            ("opcode 0", b"\x00\x00", TftpError::UnknownOpcode(0)),
            ("opcode 7", b"\x00\x07abc", TftpError::UnknownOpcode(7)),
            (
                "RRQ without NUL",
                b"\x00\x01file",
                TftpError::Unterminated { field: "file name" },
            ),
            (
                "RRQ without mode",
                b"\x00\x01file\x00",
                TftpError::Unterminated { field: "mode" },
            ),
            (
                "unknown mode",
                b"\x00\x01file\x00binary\x00",
                TftpError::UnknownMode("binary".into()),
            ),
            (
                "option without value",
                b"\x00\x01f\x00octet\x00blksize\x00",
                TftpError::Unterminated {
                    field: "option value",
                },
            ),
            (
                "file name not UTF-8",
                b"\x00\x01\xff\x00octet\x00",
                TftpError::NotUtf8 { field: "file name" },
            ),
            (
                "short DATA",
                b"\x00\x03\x00",
                TftpError::Truncated {
                    opcode: Opcode::Data,
                    len: 3,
                    need: 4,
                },
            ),
            (
                "short ACK",
                b"\x00\x04\x00",
                TftpError::AckLength { len: 3 },
            ),
            (
                "long ACK",
                b"\x00\x04\x00\x01\x00",
                TftpError::AckLength { len: 5 },
            ),
            (
                "short ERROR",
                b"\x00\x05\x00",
                TftpError::Truncated {
                    opcode: Opcode::Error,
                    len: 3,
                    need: 4,
                },
            ),
        ];
        for (name, wire, expected) in cases {
            assert_eq!(parse(wire).as_ref(), Err(expected), "{name}");
        }
    }

    #[test]
    fn encode_refuses_what_the_wire_cannot_carry() {
        assert_eq!(
            rrq("a\0b", Mode::Octet, &[]).encode(),
            Err(TftpError::NulInField { field: "file name" })
        );
        assert_eq!(
            rrq("a", Mode::Octet, &[("", "1")]).encode(),
            Err(TftpError::EmptyOptionName)
        );
        assert_eq!(
            Packet::error(ErrorCode::NotDefined, "x\0").encode(),
            Err(TftpError::NulInField {
                field: "error message"
            })
        );
    }

    #[test]
    fn data_header_matches_encode() {
        let packet = Packet::Data {
            block: 0x1234,
            payload: vec![],
        };
        assert_eq!(
            packet.encode().expect("encodable").as_slice(),
            data_header(0x1234).as_slice()
        );
    }

    fn text() -> impl Strategy<Value = String> {
        "[^\0]{0,24}"
    }

    fn options() -> impl Strategy<Value = Vec<TftpOption>> {
        prop::collection::vec(
            ("[^\0]{1,12}", text()).prop_map(|(name, value)| TftpOption { name, value }),
            0..5,
        )
    }

    fn packets() -> impl Strategy<Value = Packet> {
        let mode = prop_oneof![Just(Mode::Netascii), Just(Mode::Octet), Just(Mode::Mail)];
        prop_oneof![
            (text(), mode.clone(), options()).prop_map(|(filename, mode, options)| Packet::Rrq {
                filename,
                mode,
                options
            }),
            (text(), mode, options()).prop_map(|(filename, mode, options)| Packet::Wrq {
                filename,
                mode,
                options
            }),
            (any::<u16>(), prop::collection::vec(any::<u8>(), 0..600))
                .prop_map(|(block, payload)| Packet::Data { block, payload }),
            any::<u16>().prop_map(|block| Packet::Ack { block }),
            (any::<u16>(), text()).prop_map(|(code, message)| Packet::Error {
                code: ErrorCode::from_u16(code),
                message
            }),
            options().prop_map(|options| Packet::Oack { options }),
        ]
    }

    proptest! {
        #[test]
        fn any_bytes_parse_or_fail_without_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse(&bytes);
        }

        /// Datagrams that start with a valid opcode reach the deeper parsers more often.
        #[test]
        fn any_body_after_a_valid_opcode_parses_or_fails(op in 0u16..8, body in prop::collection::vec(
            prop_oneof![Just(0u8), Just(b'a'), Just(b'1'), any::<u8>()], 0..64)) {
            let mut datagram = op.to_be_bytes().to_vec();
            datagram.extend_from_slice(&body);
            if let Ok(packet) = parse(&datagram) {
                // Whatever parsed re-encodes (a parsed string never holds a NUL).
                prop_assert!(packet.encode().is_ok());
            }
        }

        #[test]
        fn encode_then_parse_round_trips(packet in packets()) {
            let wire = packet.encode().expect("generated packets are encodable");
            prop_assert_eq!(parse(&wire), Ok(packet));
        }
    }
}
