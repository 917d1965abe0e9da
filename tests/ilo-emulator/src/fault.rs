//! Injectable faults: the admin API (`POST /_emulator/faults`) queues them, the next requests of
//! the server consume them.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// What goes wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Answer normally after `seconds`.
    Delay,
    /// Accept the request and never answer (the connection is dropped after `seconds`, default
    /// 600 s, so abandoned connections do not pile up).
    Timeout,
    /// HTTP 500.
    Http500,
    /// A RIBCL error status (Redfish: 400 with a Base error).
    RibclError,
    /// iLO busy (RIBCL status; Redfish: 503 with Retry-After).
    Busy,
    /// Credentials rejected even when right.
    LoginFail,
    /// The reply stops half-way (the chunked body is cut, no terminating chunk).
    Truncated,
    /// HTTP 200 with an HTML page instead of XML/JSON.
    NonXml,
    /// An XML document whose root is not RIBCL.
    WrongRoot,
}

/// A fault as posted to the admin API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// What goes wrong.
    pub kind: FaultKind,
    /// How many of the next requests it hits (default 1).
    #[serde(default = "one")]
    pub count: u32,
    /// Seconds for `delay` and `timeout`.
    #[serde(default)]
    pub seconds: f64,
    /// RIBCL STATUS for `ribcl_error`/`busy` (e.g. "0x0001"); a default is used when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// RIBCL MESSAGE for `ribcl_error`/`busy`; a default is used when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

fn one() -> u32 {
    1
}

/// The fault queue of one server.
#[derive(Debug, Default)]
pub struct FaultQueue {
    queue: VecDeque<FaultSpec>,
}

impl FaultQueue {
    /// Queues a fault (after those already queued).
    pub fn push(&mut self, spec: FaultSpec) {
        if spec.count > 0 {
            self.queue.push_back(spec);
        }
    }

    /// Takes the fault that applies to the request now arriving, if any.
    pub fn take_next(&mut self) -> Option<FaultSpec> {
        let front = self.queue.front_mut()?;
        front.count -= 1;
        let mut hit = front.clone();
        hit.count = 1;
        if front.count == 0 {
            self.queue.pop_front();
        }
        Some(hit)
    }

    /// Drops every queued fault.
    pub fn clear(&mut self) {
        self.queue.clear();
    }

    /// The queued faults.
    pub fn pending(&self) -> Vec<FaultSpec> {
        self.queue.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_apply_to_the_next_n_requests_in_order() {
        let mut q = FaultQueue::default();
        q.push(serde_json::from_str(r#"{"kind":"http500","count":2}"#).expect("valid json"));
        q.push(serde_json::from_str(r#"{"kind":"delay","seconds":0.5}"#).expect("valid json"));
        assert_eq!(q.take_next().map(|f| f.kind), Some(FaultKind::Http500));
        assert_eq!(q.take_next().map(|f| f.kind), Some(FaultKind::Http500));
        let delay = q.take_next().expect("third");
        assert_eq!((delay.kind, delay.seconds), (FaultKind::Delay, 0.5));
        assert_eq!(q.take_next(), None);
    }

    #[test]
    fn unknown_kind_is_rejected() {
        assert!(serde_json::from_str::<FaultSpec>(r#"{"kind":"explode"}"#).is_err());
    }
}
