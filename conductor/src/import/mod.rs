//! `vmdeploy-conductor import`: brings the ProLiant (and Redfish) nodes of an OpenStack Ironic
//! into vmdeploy, for operators whose Ironic lost its `ilo` and `ilo5` hardware types (upstream
//! removed them in 2026; docs/architecture.md §3). Operator guide: docs/import.md.
//!
//! # Design
//! Four steps, each in its own file, so that the decisions are pure and tested apart from I/O:
//! - [`source`] reads the nodes and ports, from a running Ironic (`GET /v1/nodes/detail`,
//!   `/v1/ports/detail`) or from `baremetal node list --long -f json` and `baremetal port list
//!   --long -f json` exports, into one typed form ([`source::SourceNode`],
//!   [`source::SourcePort`]); a field that cannot be read is recorded, never fatal.
//! - [`mapping`] decides per node, with no I/O: the vmdeploy driver (one table,
//!   [`mapping::MAPPING`]), the `driver_info` keys that carry over and those dropped, the other
//!   fields, the ports, and whether the node can be managed once enrolled. Nodes something runs
//!   on (`active`, deploying, an instance associated) are not taken over.
//! - [`apply`] enrolls what the plan takes over through vmdeploy's own API (`POST /v1/nodes`,
//!   `POST /v1/ports`, then `manage`), so every check the API makes applies; nodes end
//!   `manageable` (or `enroll` when a credential is missing), never `available` or `active`.
//! - [`report`] prints what carried over, what did not and why: text, or one JSON object.
//!
//! [`client`] is the HTTP client both APIs are read with; [`cli`] the arguments and the run.
//! The default is a dry run: it reads both sides and changes nothing.
//!
//! # Limitations
//! - Secrets: an Ironic API masks every secret in `driver_info` (`******`) unless its
//!   `show_password` policy allows them, so a node read from an API arrives without its BMC
//!   password. It is enrolled without it and stays `enroll`, and the report says which key to
//!   set; an export file the operator filled in carries them.
//! - vmdeploy's API has no `resource_class`, conductor groups are not carried over, and
//!   `instance_info` describes a past deploy: these are reported, not imported.
//! - The source Ironic is only read: its nodes stay there, and the report reminds the operator
//!   to set them to maintenance there before vmdeploy deploys them.

pub mod apply;
pub mod cli;
pub mod client;
pub mod mapping;
pub mod report;
pub mod source;
