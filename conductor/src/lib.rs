//! The vmdeploy conductor: the service a scheduler calls through an Ironic-compatible API
//! (`serve`), the deploy flows it runs, and the clients they use: the iLO client (RIBCL for
//! iLO 4, Redfish for iLO 5 and later), the object stores, and the iSCSI initiator that writes
//! images to an agent's target (docs/architecture.md §2).

/// The Ironic-compatible REST API.
pub mod api;
/// One node's BMC, built from its `driver_info`: the only way the manager and the flows reach it.
pub mod bmc;
/// The boot interfaces: virtual media and network boot of the ramdisk and the instance.
pub mod boot;
/// Several conductors on one database: membership, the hash ring of node owners, forwarding.
pub mod cluster;
/// What the boot and deploy interfaces work with: stores, settings, image references.
pub mod context;
/// The deploy interfaces (agent, iSCSI) and cleaning on top of them.
pub mod deploy;
/// Power, management, virtual media and inventory interfaces, the iLO clients, the `ilo` CLI.
pub mod drivers;
/// The local cache of instance images (raw, verified, LRU) the iscsi_ilo flow writes from.
pub mod image_cache;
/// `import`: nodes and ports of an OpenStack Ironic brought into vmdeploy (dry run, `--apply`).
pub mod import;
/// The iSCSI initiator (login, CHAP, write/read pipelines), with the `iscsi` CLI.
pub mod initiator;
/// Console logging set-up.
pub mod logging;
/// Carries out API requests on nodes: tasks, reservations, background duties.
pub mod manager;
/// What the network clients share: the HTTPS client builder and the retry policy.
pub mod net;
/// The network boot service of `pxe_ilo`: TFTP, HTTP, per-node boot configuration.
pub mod netboot;
/// Typed views of a node's JSON fields.
pub mod node;
/// Object stores (built-in, Swift) and their temp URLs.
pub mod objects;
/// The `serve` command: configuration, listeners, TLS, auth.
pub mod service;
/// Provision and power states and the provision state machine.
pub mod states;
/// Node and port records and the store that keeps them.
pub mod store;
