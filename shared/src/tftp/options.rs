//! Option negotiation (RFC 2347) for blksize (RFC 2348), tsize and timeout (RFC 2349), on the
//! server's side of a read request.
//!
//! # Design
//! [`RequestedOptions::from_options`] reads what the client asked for and drops whatever the
//! server would not accept anyway: unknown options (RFC 2347: "the server should simply omit
//! \[them\] from the OACK"), values that are not decimal numbers, a blksize below 8 and a timeout
//! outside 1..=255 s. A repeated option counts once, at its first occurrence.
//! [`RequestedOptions::accept`] then applies the server's limits: a blksize above the server's
//! maximum is lowered to it (RFC 2348 lets the server answer a smaller value), a timeout above
//! the server's maximum is declined (RFC 2349 has the server take the value as sent or leave
//! the option out; the transfer then runs at the server's own timeout), and tsize is answered
//! with the file's size when the server knows it. What is left is the OACK; when
//! nothing is left the server answers as RFC 1350 does, with DATA 1.

use super::packet::{Packet, TftpOption};

/// The block size without the blksize option (RFC 1350).
pub const DEFAULT_BLKSIZE: u16 = 512;
/// The smallest blksize (RFC 2348).
pub const MIN_BLKSIZE: u16 = 8;
/// The largest blksize (RFC 2348: 65535 less the IP and UDP headers).
pub const MAX_BLKSIZE: u16 = 65464;
/// The shortest timeout (RFC 2349), in seconds.
pub const MIN_TIMEOUT_SECS: u8 = 1;
/// The longest timeout (RFC 2349), in seconds.
pub const MAX_TIMEOUT_SECS: u8 = 255;

/// The blksize option's name (RFC 2348).
pub const OPT_BLKSIZE: &str = "blksize";
/// The tsize option's name (RFC 2349).
pub const OPT_TSIZE: &str = "tsize";
/// The timeout option's name (RFC 2349).
pub const OPT_TIMEOUT: &str = "timeout";

/// The options of a request the server understands, already checked against the RFCs' ranges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestedOptions {
    /// Requested block size, within [`MIN_BLKSIZE`]..=[`MAX_BLKSIZE`] (larger requests are
    /// lowered to [`MAX_BLKSIZE`]).
    pub blksize: Option<u16>,
    /// Whether the client asked for the transfer size.
    pub tsize: bool,
    /// Requested retransmission timeout in seconds, within 1..=255.
    pub timeout_secs: Option<u8>,
}

/// What the server grants: the OACK's content.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AcceptedOptions {
    /// Granted block size.
    pub blksize: Option<u16>,
    /// The transfer size answered to tsize.
    pub tsize: Option<u64>,
    /// Granted timeout in seconds.
    pub timeout_secs: Option<u8>,
}

/// A decimal number of any length; `None` when it has anything but digits, `u64::MAX` when it
/// is too large for a `u64` (a huge blksize is still a request for the largest).
fn decimal(value: &str) -> Option<u64> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(value.parse::<u64>().unwrap_or(u64::MAX))
}

impl RequestedOptions {
    /// The options of a request that the server may accept.
    pub fn from_options(options: &[TftpOption]) -> RequestedOptions {
        let mut requested = RequestedOptions::default();
        let (mut seen_blksize, mut seen_tsize, mut seen_timeout) = (false, false, false);
        for option in options {
            let name = option.name.as_str();
            let value = decimal(&option.value);
            if name.eq_ignore_ascii_case(OPT_BLKSIZE) && !std::mem::replace(&mut seen_blksize, true)
            {
                requested.blksize =
                    value
                        .filter(|&size| size >= u64::from(MIN_BLKSIZE))
                        .map(|size| {
                            u16::try_from(size.min(u64::from(MAX_BLKSIZE))).unwrap_or(MAX_BLKSIZE)
                        });
            } else if name.eq_ignore_ascii_case(OPT_TSIZE)
                && !std::mem::replace(&mut seen_tsize, true)
            {
                // RFC 2349 has a read request send 0; any number is taken as the question.
                requested.tsize = value.is_some();
            } else if name.eq_ignore_ascii_case(OPT_TIMEOUT)
                && !std::mem::replace(&mut seen_timeout, true)
            {
                requested.timeout_secs = value
                    .and_then(|secs| u8::try_from(secs).ok())
                    .filter(|secs| (MIN_TIMEOUT_SECS..=MAX_TIMEOUT_SECS).contains(secs));
            }
        }
        requested
    }

    /// What the server grants, given its largest block size (itself kept within the RFC's
    /// range), its longest timeout in seconds, and the file's size (`None` when the server
    /// cannot tell it up front, e.g. a netascii transfer, whose length changes with the
    /// conversion).
    pub fn accept(
        &self,
        max_blksize: u16,
        max_timeout_secs: u8,
        file_size: Option<u64>,
    ) -> AcceptedOptions {
        let max_blksize = max_blksize.clamp(MIN_BLKSIZE, MAX_BLKSIZE);
        AcceptedOptions {
            blksize: self.blksize.map(|size| size.min(max_blksize)),
            tsize: if self.tsize { file_size } else { None },
            // Declined, not lowered: RFC 2349 lets the server only accept the value or leave
            // the option out, and a client may not expect a different value in the OACK.
            timeout_secs: self.timeout_secs.filter(|&secs| secs <= max_timeout_secs),
        }
    }
}

impl AcceptedOptions {
    /// The block size of the transfer.
    pub fn block_size(&self) -> u16 {
        self.blksize.unwrap_or(DEFAULT_BLKSIZE)
    }

    /// Whether no option was accepted (then no OACK is sent).
    pub fn is_empty(&self) -> bool {
        *self == AcceptedOptions::default()
    }

    /// The accepted options as the OACK lists them.
    pub fn to_options(&self) -> Vec<TftpOption> {
        let mut options = Vec::new();
        if let Some(size) = self.blksize {
            options.push(TftpOption::new(OPT_BLKSIZE, size.to_string()));
        }
        if let Some(size) = self.tsize {
            options.push(TftpOption::new(OPT_TSIZE, size.to_string()));
        }
        if let Some(secs) = self.timeout_secs {
            options.push(TftpOption::new(OPT_TIMEOUT, secs.to_string()));
        }
        options
    }

    /// The OACK to send, or `None` when nothing was accepted.
    pub fn oack(&self) -> Option<Packet> {
        (!self.is_empty()).then(|| Packet::Oack {
            options: self.to_options(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn requested(options: &[(&str, &str)]) -> RequestedOptions {
        let options: Vec<TftpOption> = options
            .iter()
            .map(|(n, v)| TftpOption::new(*n, *v))
            .collect();
        RequestedOptions::from_options(&options)
    }

    #[test]
    fn reads_the_known_options_within_their_ranges() {
        /// A named case: the options sent and what the server reads from them.
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], RequestedOptions);
        let cases: &[Case] = &[
            ("none", &[], RequestedOptions::default()),
            (
                "all three, any case",
                &[("BlkSize", "1468"), ("TSIZE", "0"), ("timeout", "3")],
                RequestedOptions {
                    blksize: Some(1468),
                    tsize: true,
                    timeout_secs: Some(3),
                },
            ),
            (
                "blksize below 8 is ignored",
                &[("blksize", "7")],
                RequestedOptions::default(),
            ),
            (
                "blksize at the bounds",
                &[("blksize", "8")],
                RequestedOptions {
                    blksize: Some(8),
                    ..Default::default()
                },
            ),
            (
                "blksize above the RFC's maximum is lowered to it",
                &[("blksize", "65465")],
                RequestedOptions {
                    blksize: Some(MAX_BLKSIZE),
                    ..Default::default()
                },
            ),
            (
                "a huge blksize too",
                &[("blksize", "99999999999999999999999999999")],
                RequestedOptions {
                    blksize: Some(MAX_BLKSIZE),
                    ..Default::default()
                },
            ),
            (
                "non-numeric values are ignored",
                &[("blksize", "1k"), ("tsize", ""), ("timeout", "-1")],
                RequestedOptions::default(),
            ),
            (
                "timeout outside 1..=255 is ignored",
                &[("timeout", "0")],
                RequestedOptions::default(),
            ),
            (
                "timeout 256 is ignored",
                &[("timeout", "256")],
                RequestedOptions::default(),
            ),
            (
                "timeout 255",
                &[("timeout", "255")],
                RequestedOptions {
                    timeout_secs: Some(255),
                    ..Default::default()
                },
            ),
            (
                "unknown options are ignored",
                &[("windowsize", "8"), ("multicast", "")],
                RequestedOptions::default(),
            ),
            (
                "the first of a repeated option counts",
                &[("blksize", "1024"), ("blksize", "2048"), ("blksize", "x")],
                RequestedOptions {
                    blksize: Some(1024),
                    ..Default::default()
                },
            ),
        ];
        for (name, options, expected) in cases {
            assert_eq!(requested(options), *expected, "{name}");
        }
    }

    #[test]
    fn accept_applies_the_server_limits() {
        let all = requested(&[("blksize", "8192"), ("tsize", "0"), ("timeout", "2")]);
        let accepted = all.accept(1468, 5, Some(12345));
        assert_eq!(
            accepted,
            AcceptedOptions {
                blksize: Some(1468),
                tsize: Some(12345),
                timeout_secs: Some(2),
            }
        );
        assert_eq!(accepted.block_size(), 1468);
        assert_eq!(
            accepted.oack(),
            Some(Packet::Oack {
                options: vec![
                    TftpOption::new("blksize", "1468"),
                    TftpOption::new("tsize", "12345"),
                    TftpOption::new("timeout", "2"),
                ]
            })
        );
        // tsize without a known size (netascii) is left out; a smaller request is kept.
        let small = requested(&[("blksize", "512"), ("tsize", "0")]).accept(1468, 5, None);
        assert_eq!(small.to_options(), vec![TftpOption::new("blksize", "512")]);
        // A server maximum outside the RFC's range is brought back into it.
        assert_eq!(
            requested(&[("blksize", "65464")])
                .accept(u16::MAX, 5, None)
                .blksize,
            Some(MAX_BLKSIZE)
        );
        assert_eq!(
            requested(&[("blksize", "100")]).accept(0, 5, None).blksize,
            Some(MIN_BLKSIZE)
        );
        // Nothing accepted: no OACK, the RFC 1350 block size.
        let none = requested(&[("tsize", "0")]).accept(1468, 5, None);
        assert!(none.is_empty());
        assert_eq!(none.oack(), None);
        assert_eq!(none.block_size(), DEFAULT_BLKSIZE);
    }

    #[test]
    fn a_timeout_above_the_server_maximum_is_declined_not_lowered() {
        let slow = requested(&[("timeout", "255"), ("tsize", "0")]).accept(1468, 5, Some(7));
        assert_eq!(slow.timeout_secs, None);
        assert_eq!(
            slow.oack(),
            Some(Packet::Oack {
                options: vec![TftpOption::new("tsize", "7")]
            })
        );
        // Alone, a declined timeout leaves nothing to acknowledge: no OACK.
        assert_eq!(
            requested(&[("timeout", "6")]).accept(1468, 5, None).oack(),
            None
        );
        // At the maximum it is granted as sent.
        assert_eq!(
            requested(&[("timeout", "5")])
                .accept(1468, 5, None)
                .timeout_secs,
            Some(5)
        );
    }

    proptest! {
        #[test]
        fn granted_values_stay_within_the_rfc_ranges(
            name in prop_oneof![Just("blksize".to_owned()), Just("timeout".to_owned()), Just("tsize".to_owned()), "[a-zA-Z]{1,8}"],
            value in prop_oneof!["[0-9]{1,30}", "[^\0]{0,12}"],
            max in any::<u16>(),
            max_timeout in any::<u8>(),
            size in any::<Option<u64>>(),
        ) {
            let accepted = RequestedOptions::from_options(&[TftpOption::new(name, value)])
                .accept(max, max_timeout, size);
            if let Some(blksize) = accepted.blksize {
                prop_assert!((MIN_BLKSIZE..=MAX_BLKSIZE).contains(&blksize));
                prop_assert!(blksize <= max.max(MIN_BLKSIZE));
            }
            if let Some(secs) = accepted.timeout_secs {
                prop_assert!((MIN_TIMEOUT_SECS..=max_timeout).contains(&secs));
            }
        }
    }
}
