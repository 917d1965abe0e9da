//! The iLO refusals the Redfish client answers by rule, written once: a `MessageId` suffix and
//! what to do about it (docs/ilo-firmware.md, "Quirks and what the drivers do").
//!
//! # Design
//! iLO puts its registry version in every message id (`iLO.2.15.InvalidOperationForSystemState`
//! on iLO 5 2.72, `iLO.2.25.` on 3.09, `iLO.2.34.` on iLO 6) and iLO 4's RIS uses a colon
//! (`Base.1.0:PropertyNotWritable`), so only the last part is compared: sushy had to drop a
//! hard-coded `iLO.2.15.` prefix once. [`error::status_error`](super::error::status_error)
//! consults [`REFUSALS`] for every error reply; nothing else in the driver looks at message ids.
//!
//! Only refusals the reference calls transient are retried (the host in POST, a power change
//! still settling, the iLO restarting), with [`SETTLING`]: a state the host passes through
//! within tens of seconds, longer than the transport's own retries.

use std::time::Duration;

use crate::drivers::ilo::http::RetryPolicy;

/// What the client does about a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The host is passing through a state: wait and send the same request again
    /// ([`SETTLING`]); surfaces as [`crate::drivers::DriverError::Busy`].
    WaitAndRetry,
    /// The licence lacks the feature: [`crate::drivers::DriverError::NotLicensed`], whatever
    /// the HTTP status (iLO answers 400).
    NotLicensed,
    /// The iLO's session table is full (sessions leaked by other clients, kept until they
    /// idle out): authenticate each request with Basic instead, whose sessions the iLO closes
    /// itself. Elsewhere than at login it surfaces as
    /// [`crate::drivers::DriverError::Busy`].
    UseBasicAuth,
}

/// One rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The message id's last part.
    pub message: &'static str,
    /// What to do.
    pub answer: Answer,
    /// When the iLO says it, for the log and the docs.
    pub when: &'static str,
}

/// Every rule (docs/ilo-quirks.md §2, §3, §6, §11).
pub const REFUSALS: &[Refusal] = &[
    Refusal {
        message: "InvalidOperationForSystemState",
        answer: Answer::WaitAndRetry,
        when: "a reset within seconds of the previous power change (iLO 5/6)",
    },
    Refusal {
        message: "UnableToModifyDuringSystemPOST",
        answer: Answer::WaitAndRetry,
        when: "a boot setting changed while the host is in POST",
    },
    Refusal {
        message: "ResetInProgress",
        answer: Answer::WaitAndRetry,
        when: "a call while the iLO itself restarts",
    },
    Refusal {
        message: "LicenseKeyRequired",
        answer: Answer::NotLicensed,
        when: "scripted virtual media on an iLO Standard licence",
    },
    Refusal {
        message: "SessionLimitExceeded",
        answer: Answer::UseBasicAuth,
        when: "a session login while the iLO's session table is full",
    },
];

/// Pauses between tries of a [`Answer::WaitAndRetry`] refusal: 1, 2, 4, 8, 8, … s, within the
/// operation's `client_timeout`. Ironic waits 5 s growing to 30 s for POST; a shorter start
/// serves the common case, a power change settling in a few seconds.
pub const SETTLING: RetryPolicy =
    RetryPolicy::new(10, Duration::from_secs(1)).capped_at(Duration::from_secs(8));

/// The last part of a message id: after the last `.` or `:`.
pub fn message_suffix(id: &str) -> &str {
    id.rsplit(['.', ':']).next().unwrap_or(id)
}

/// The rule for the first of `ids` that has one.
pub fn refusal_for<S: AsRef<str>>(ids: &[S]) -> Option<(&'static Refusal, &str)> {
    ids.iter().find_map(|id| {
        let id = id.as_ref();
        let suffix = message_suffix(id);
        REFUSALS
            .iter()
            .find(|r| r.message.eq_ignore_ascii_case(suffix))
            .map(|r| (r, id))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_the_suffix_of_any_registry_version() {
        for id in [
            "iLO.2.15.InvalidOperationForSystemState",
            "iLO.2.34.InvalidOperationForSystemState",
            "iLO.0.10.InvalidOperationForSystemState",
        ] {
            let ids = [id];
            let (rule, matched) = refusal_for(&ids).expect(id);
            assert_eq!(rule.answer, Answer::WaitAndRetry);
            assert_eq!(matched, id);
        }
        assert_eq!(
            message_suffix("Base.1.0:PropertyNotWritable"),
            "PropertyNotWritable"
        );
        let ids = ["Base.1.18.Success", "iLO.2.25.LicenseKeyRequired"];
        let (rule, _) = refusal_for(&ids).expect("licence");
        assert_eq!(rule.answer, Answer::NotLicensed);
        let (rule, _) = refusal_for(&["Base.1.17.SessionLimitExceeded"]).expect("sessions");
        assert_eq!(rule.answer, Answer::UseBasicAuth);
        assert!(refusal_for(&["Base.1.4.PropertyValueNotInList"]).is_none());
        assert!(refusal_for::<&str>(&[]).is_none());
        // A longer name that merely ends the same way is not the rule.
        assert!(refusal_for(&["iLO.2.15.NotInvalidOperationForSystemState"]).is_none());
    }

    #[test]
    fn settling_waits_longer_than_the_transport() {
        let total: Duration = (1..SETTLING.max_attempts())
            .map(|n| SETTLING.pause_after(n))
            .sum();
        assert!(total >= Duration::from_secs(45), "{total:?}");
    }
}
