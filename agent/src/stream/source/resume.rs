//! The resume decisions of an image download, made in one place for both clients ([`super::plain`]
//! and [`super::tls`]): what a response means at the current offset, what a body's end means,
//! when to give up. Pure: no I/O, no clock; the clients do the requests and the sleeping.
//!
//! # Design
//! After an error mid-body (or a body shorter than its `Content-Length`) the next request asks for
//! `Range: bytes=<received>-` with `If-Range: <ETag or Last-Modified>` (RFC 9110 §14.2, §13.1.5).
//! A `206` must start exactly at `received` (and carry the same ETag, when it names one); a `200`
//! means the server ignored the range or If-Range found the object changed: with a validator that
//! is a change, and fatal; without one, the body is read again and its first `received` bytes
//! dropped, if its length is unchanged. 5xx and 429 are worth another attempt; [`MAX_RETRIES`]
//! attempts in a row that bring no new byte end the download.

use std::time::Duration;

/// Attempts in a row that may fail without receiving a byte before the download gives up.
pub const MAX_RETRIES: u32 = 5;

/// Longest pause between two attempts.
const MAX_PAUSE: Duration = Duration::from_secs(10);

/// What a response says, as far as resuming is concerned (header values as received).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Answer<'a> {
    /// Status code.
    pub status: u16,
    /// `Content-Length`, when the body is framed by it (not for chunked bodies).
    pub content_length: Option<u64>,
    /// `Content-Range`.
    pub content_range: Option<&'a str>,
    /// `ETag`.
    pub etag: Option<&'a str>,
    /// `Last-Modified`.
    pub last_modified: Option<&'a str>,
}

/// What to do with a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The first response: read its body, which is `total` bytes long when known; later requests
    /// send `validator` in `If-Range`.
    Start {
        /// `Content-Length`.
        total: Option<u64>,
        /// The ETag or Last-Modified, when safe to send back.
        validator: Option<String>,
    },
    /// Read the body, dropping its first `skip` bytes (0 for a `206` that starts where we are).
    Resume {
        /// Bytes of the body already received earlier.
        skip: u64,
    },
    /// Try again after a pause (server trouble).
    Retry(String),
    /// Give up.
    Fail(String),
}

/// What a client does next with a response (a [`Decision`], recorded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Read the body, dropping its first `skip` bytes.
    Read {
        /// Bytes of the body already received earlier.
        skip: u64,
    },
    /// Try again after [`Resume::pause`].
    Retry,
    /// Give up.
    Fail(String),
}

/// How a body ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The whole download is here.
    Complete,
    /// Resume from `received` (with this as the last error).
    Resume(String),
    /// Give up.
    Fail(String),
}

/// The state of one download across its requests.
#[derive(Debug, Clone, Default)]
pub struct Resume {
    /// Body bytes received so far (the offset the next request asks for).
    pub received: u64,
    /// The download's length, when the first response gave it.
    pub total: Option<u64>,
    /// ETag or Last-Modified of the first response.
    pub validator: Option<String>,
    /// Attempts in a row that brought nothing.
    pub failures: u32,
    /// Why the last attempt failed.
    pub last_error: String,
    /// `received` when the current body started.
    attempt_start: u64,
}

/// A header value that may be sent back in a request line: visible ASCII, spaces and tabs only.
fn header_safe(v: &str) -> bool {
    !v.is_empty() && v.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
}

/// The first byte offset of a `Content-Range: bytes START-END/TOTAL` header.
pub fn content_range_start(value: &str) -> Option<u64> {
    let rest = value.trim().strip_prefix("bytes ")?;
    let (start, _) = rest.split_once('-')?;
    start.trim().parse().ok()
}

impl Resume {
    /// `Range` and `If-Range` values for the next request; none for a fresh download.
    pub fn range(&self) -> Option<(String, Option<&str>)> {
        (self.received > 0).then(|| {
            (
                format!("bytes={}-", self.received),
                self.validator.as_deref(),
            )
        })
    }

    /// What the response `a` means at the current offset. Pure; [`Resume::apply`] records it.
    pub fn decide(&self, a: &Answer<'_>) -> Decision {
        let status = a.status;
        let retryable = status >= 500 || status == 429;
        if self.received == 0 {
            if status == 200 {
                let validator = a
                    .etag
                    .or(a.last_modified)
                    .map(str::trim)
                    .filter(|v| header_safe(v))
                    .map(str::to_owned);
                return Decision::Start {
                    total: a.content_length,
                    validator,
                };
            }
            if retryable {
                return Decision::Retry(format!("server answered {status}"));
            }
            return Decision::Fail(format!("server answered {status}"));
        }
        match status {
            206 => {
                let start = a.content_range.and_then(content_range_start);
                if start != Some(self.received) {
                    return Decision::Fail(format!(
                        "resumed response starts at {start:?}, expected byte {}",
                        self.received
                    ));
                }
                // An ETag validator must come back unchanged (a weak one cannot be compared).
                let sent = self.validator.as_deref().filter(|v| v.starts_with('"'));
                if let (Some(sent), Some(now)) = (sent, a.etag.map(str::trim)) {
                    if sent != now {
                        return Decision::Fail(
                            "the image changed on the server while downloading".to_owned(),
                        );
                    }
                }
                Decision::Resume { skip: 0 }
            }
            200 => {
                // With If-Range sent, a 200 means the object changed; without a validator the
                // server may just have ignored the range.
                if self.validator.is_some() {
                    return Decision::Fail(
                        "the image changed on the server while downloading".to_owned(),
                    );
                }
                if a.content_length.is_some() && a.content_length != self.total {
                    return Decision::Fail(
                        "the image size changed on the server while downloading".to_owned(),
                    );
                }
                Decision::Resume {
                    skip: self.received,
                }
            }
            _ if retryable => Decision::Retry(format!("server answered {status}")),
            _ => Decision::Fail(format!(
                "server answered {status} when resuming at byte {}",
                self.received
            )),
        }
    }

    /// Records a decision to read a body (`Start` or `Resume`); a `Retry` counts a failure.
    pub fn apply(&mut self, decision: &Decision) {
        match decision {
            Decision::Start { total, validator } => {
                self.total = *total;
                self.validator = validator.clone();
                self.attempt_start = self.received;
            }
            Decision::Resume { .. } => self.attempt_start = self.received,
            Decision::Retry(e) => self.failed(e.clone()),
            Decision::Fail(_) => {}
        }
    }

    /// Decides on the response `a` and records the decision: what the client does next.
    pub fn answer(&mut self, a: &Answer<'_>) -> Next {
        let decision = self.decide(a);
        self.apply(&decision);
        match decision {
            Decision::Start { .. } => Next::Read { skip: 0 },
            Decision::Resume { skip } => Next::Read { skip },
            Decision::Retry(_) => Next::Retry,
            Decision::Fail(e) => Next::Fail(e),
        }
    }

    /// A request failed before a body (connection trouble, a retryable status).
    pub fn failed(&mut self, error: String) {
        self.failures += 1;
        self.last_error = error;
    }

    /// The pause before the next attempt: none for the first, `backoff` doubling per failure in a
    /// row (capped), and an error once [`MAX_RETRIES`] are spent.
    pub fn pause(&self, backoff: Duration) -> Result<Option<Duration>, String> {
        match self.failures {
            0 => Ok(None),
            n if n > MAX_RETRIES => Err(format!(
                "failed after {MAX_RETRIES} retries at byte {}: {}",
                self.received, self.last_error
            )),
            n => Ok(Some(
                backoff.saturating_mul(1 << (n - 1).min(5)).min(MAX_PAUSE),
            )),
        }
    }

    /// The current body ended, cleanly (`error` is `None`: the connection closed or the framing
    /// said so) or with `error`. Records the failure when the download is to be resumed.
    pub fn ended(&mut self, error: Option<String>) -> Ended {
        let ended = decide_end(self.received, self.total, error);
        if let Ended::Resume(e) = &ended {
            // Progress within the attempt starts the count afresh.
            self.failures = if self.received > self.attempt_start {
                1
            } else {
                self.failures + 1
            };
            self.last_error = e.clone();
        }
        ended
    }
}

/// What a body's end at `received` means for a download of `total` bytes.
fn decide_end(received: u64, total: Option<u64>, error: Option<String>) -> Ended {
    match (total, error) {
        (Some(t), _) if received > t => Ended::Fail(format!(
            "received {received} bytes, more than the announced {t}"
        )),
        (Some(t), None) if received < t => {
            Ended::Resume(format!("connection closed at byte {received} of {t}"))
        }
        (_, None) => Ended::Complete,
        (Some(_), Some(e)) => Ended::Resume(e),
        // Without a length there is no way to know where a resumed body must end.
        (None, Some(e)) => Ended::Fail(format!(
            "connection lost at byte {received} and the server gave no length to resume against: {e}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(received: u64, total: Option<u64>, validator: Option<&str>) -> Resume {
        Resume {
            received,
            total,
            validator: validator.map(str::to_owned),
            ..Default::default()
        }
    }

    fn answer(status: u16) -> Answer<'static> {
        Answer {
            status,
            ..Default::default()
        }
    }

    fn fail(msg: &str) -> Decision {
        Decision::Fail(msg.to_owned())
    }

    #[test]
    fn decisions_for_every_kind_of_response() {
        const CHANGED: &str = "the image changed on the server while downloading";
        let full = Answer {
            status: 200,
            content_length: Some(100),
            ..Default::default()
        };
        let cases: Vec<(&str, Resume, Answer<'static>, Decision)> = vec![
            (
                "fresh 200 with ETag and Last-Modified: the ETag is the validator",
                at(0, None, None),
                Answer {
                    etag: Some(" \"v1\" "),
                    last_modified: Some("Tue, 01 Dec 2026 10:00:00 GMT"),
                    ..full
                },
                Decision::Start {
                    total: Some(100),
                    validator: Some("\"v1\"".into()),
                },
            ),
            (
                "fresh 200 with Last-Modified only",
                at(0, None, None),
                Answer {
                    last_modified: Some("Tue, 01 Dec 2026 10:00:00 GMT"),
                    ..full
                },
                Decision::Start {
                    total: Some(100),
                    validator: Some("Tue, 01 Dec 2026 10:00:00 GMT".into()),
                },
            ),
            (
                "fresh 200 whose ETag cannot be sent back (control bytes): no validator",
                at(0, None, None),
                Answer {
                    etag: Some("\"a\r\nX-Injected: 1\""),
                    ..full
                },
                Decision::Start {
                    total: Some(100),
                    validator: None,
                },
            ),
            (
                "fresh chunked 200: no length",
                at(0, None, None),
                answer(200),
                Decision::Start {
                    total: None,
                    validator: None,
                },
            ),
            (
                "fresh 206 (no range was asked for)",
                at(0, None, None),
                answer(206),
                fail("server answered 206"),
            ),
            (
                "fresh 404",
                at(0, None, None),
                answer(404),
                fail("server answered 404"),
            ),
            (
                "fresh 503 is retried",
                at(0, None, None),
                answer(503),
                Decision::Retry("server answered 503".into()),
            ),
            (
                "fresh 429 is retried",
                at(0, None, None),
                answer(429),
                Decision::Retry("server answered 429".into()),
            ),
            (
                "a redirect that reached here was not followed",
                at(0, None, None),
                answer(302),
                fail("server answered 302"),
            ),
            (
                "206 starting where we are, same ETag",
                at(40, Some(100), Some("\"v1\"")),
                Answer {
                    status: 206,
                    content_range: Some("bytes 40-99/100"),
                    etag: Some("\"v1\""),
                    ..Default::default()
                },
                Decision::Resume { skip: 0 },
            ),
            (
                "206 without an ETag header",
                at(40, Some(100), Some("\"v1\"")),
                Answer {
                    status: 206,
                    content_range: Some("bytes 40-99/100"),
                    ..Default::default()
                },
                Decision::Resume { skip: 0 },
            ),
            (
                "206 with a changed ETag",
                at(40, Some(100), Some("\"v1\"")),
                Answer {
                    status: 206,
                    content_range: Some("bytes 40-99/100"),
                    etag: Some("\"v2\""),
                    ..Default::default()
                },
                fail(CHANGED),
            ),
            (
                "206 at the wrong offset",
                at(40, Some(100), None),
                Answer {
                    status: 206,
                    content_range: Some("bytes 0-99/100"),
                    ..Default::default()
                },
                fail("resumed response starts at Some(0), expected byte 40"),
            ),
            (
                "206 without Content-Range",
                at(40, Some(100), None),
                answer(206),
                fail("resumed response starts at None, expected byte 40"),
            ),
            (
                "200 after If-Range: the image changed",
                at(40, Some(100), Some("\"v1\"")),
                full,
                fail(CHANGED),
            ),
            (
                "200 without a validator, same length: skip what we have",
                at(40, Some(100), None),
                full,
                Decision::Resume { skip: 40 },
            ),
            (
                "200 without a validator, other length",
                at(40, Some(100), None),
                Answer {
                    content_length: Some(101),
                    ..full
                },
                fail("the image size changed on the server while downloading"),
            ),
            (
                "resumed 502 is retried",
                at(40, Some(100), None),
                answer(502),
                Decision::Retry("server answered 502".into()),
            ),
            (
                "resumed 416",
                at(40, Some(100), None),
                answer(416),
                fail("server answered 416 when resuming at byte 40"),
            ),
            (
                "resumed redirect",
                at(40, Some(100), None),
                answer(301),
                fail("server answered 301 when resuming at byte 40"),
            ),
        ];
        for (what, state, a, want) in cases {
            assert_eq!(state.decide(&a), want, "{what}");
        }
    }

    #[test]
    fn ends_of_a_body() {
        let lost = || Some("reset by peer".to_owned());
        // (what, received, total, error, how it ends)
        type Case = (&'static str, u64, Option<u64>, Option<String>, Ended);
        let cases: Vec<Case> = vec![
            ("complete", 100, Some(100), None, Ended::Complete),
            (
                "short body, clean close",
                60,
                Some(100),
                None,
                Ended::Resume("connection closed at byte 60 of 100".into()),
            ),
            (
                "short body, error",
                60,
                Some(100),
                lost(),
                Ended::Resume("reset by peer".into()),
            ),
            (
                "longer than announced",
                101,
                Some(100),
                None,
                Ended::Fail("received 101 bytes, more than the announced 100".into()),
            ),
            ("no length, clean close", 60, None, None, Ended::Complete),
            (
                "no length, error",
                60,
                None,
                lost(),
                Ended::Fail(
                    "connection lost at byte 60 and the server gave no length to resume against: reset by peer"
                        .into(),
                ),
            ),
        ];
        for (what, received, total, error, want) in cases {
            assert_eq!(decide_end(received, total, error), want, "{what}");
        }
    }

    #[test]
    fn retries_back_off_and_progress_resets_the_count() {
        let backoff = Duration::from_millis(500);
        let mut r = at(0, None, None);
        assert_eq!(r.range(), None);
        assert_eq!(r.pause(backoff), Ok(None));
        let first = Answer {
            status: 200,
            content_length: Some(100),
            etag: Some("\"e\""),
            ..Default::default()
        };
        assert_eq!(r.answer(&first), Next::Read { skip: 0 });
        assert_eq!(
            (r.total, r.validator.as_deref()),
            (Some(100), Some("\"e\""))
        );
        r.received = 30;
        assert!(matches!(r.ended(None), Ended::Resume(_)));
        assert_eq!(r.failures, 1);
        assert_eq!(r.range(), Some(("bytes=30-".to_owned(), Some("\"e\""))));
        assert_eq!(r.pause(backoff), Ok(Some(backoff)));
        for n in 2..=MAX_RETRIES {
            r.failed(format!("attempt {n}"));
            assert_eq!(
                r.pause(backoff),
                Ok(Some((backoff * (1 << (n - 1))).min(MAX_PAUSE)))
            );
        }
        assert_eq!(r.answer(&answer(503)), Next::Retry);
        assert_eq!(r.last_error, "server answered 503");
        assert_eq!(
            r.pause(backoff),
            Err(format!(
                "failed after {MAX_RETRIES} retries at byte 30: server answered 503"
            ))
        );
        // A body that brings bytes starts the count at one again.
        r.apply(&Decision::Resume { skip: 0 });
        r.received = 31;
        assert!(matches!(r.ended(Some("reset".into())), Ended::Resume(_)));
        assert_eq!(r.failures, 1);
    }

    #[test]
    fn content_range_start_parses() {
        assert_eq!(content_range_start("bytes 100-199/200"), Some(100));
        assert_eq!(content_range_start(" bytes 0-0/*"), Some(0));
        assert_eq!(content_range_start("bytes */200"), None);
        assert_eq!(content_range_start("items 1-2/3"), None);
    }
}
