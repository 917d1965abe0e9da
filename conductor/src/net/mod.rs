//! What every network client of the conductor shares: the HTTPS client builder ([`https`]) and
//! the retry policy ([`retry`]). The iLO clients, the Swift client, the image cache and the
//! agent client each state only what differs for them (what they trust, how long they wait,
//! which failures are worth another try). What the conductor's listeners share: connection
//! limits ([`admission`]) and the request body's deadline ([`timed_body`]); what the ramdisk
//! call-backs share: the count of failed secret checks ([`failed_checks`]).

pub mod admission;
pub mod ca_file;
pub mod failed_checks;
pub mod https;
pub mod retry;
pub mod timed_body;

pub use https::{ClientSpec, HttpsClientError, PemCertificates, Timeouts, TlsVerify, Trust};
pub use retry::{RetryError, RetryPolicy, Retrying};
