//! The values `serve` runs with when the configuration does not say, and the names of the
//! state directory's entries.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

/// The API's port when nothing says otherwise (Ironic's).
pub const DEFAULT_PORT: u16 = 6385;
/// The API's address when nothing says otherwise.
pub const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), DEFAULT_PORT);
/// The built-in store's address when nothing says otherwise: loopback, a free port.
pub const DEFAULT_BUILTIN_LISTEN: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
/// Largest request body: the API's own default (1 MiB).
pub const DEFAULT_MAX_BODY: u64 = crate::api::DEFAULT_MAX_BODY as u64;
/// Grace period of the SIGTERM drain.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How long a request body may take: a 1 MiB body at a slow 100 kB/s, with room.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// API connections at once: every CLI, Nova and ramdisk of a large fleet, well below the
/// open-files limit the conductor raises itself to at start.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// API connections at once from one address: a busy Nova compute service or a proxy stays
/// far below it, one client's flood of stalled connections cannot fill the listener.
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 256;
/// The SQLite file in the state directory.
pub const SQLITE_FILE: &str = "vmdeploy.sqlite";
/// PostgreSQL connections one conductor opens at most (`database.max_connections`): enough for
/// the API's concurrent requests and the power sync's workers, well under PostgreSQL's default
/// limit of 100 for several conductors together.
pub const DEFAULT_DATABASE_MAX_CONNECTIONS: usize = 16;
/// The built-in store's directory in the state directory.
pub const OBJECTS_DIR: &str = "objects";
/// The instance image cache in the state directory (`images.cache_dir`'s default).
pub const IMAGES_DIR: &str = "images";
/// Generated certificates in the state directory.
pub const TLS_DIR: &str = "tls";
/// The boot loaders' directory in the state directory (`deploy.boot_loaders_dir`).
pub const BOOT_LOADERS_DIR: &str = "boot-loaders";
/// The state directory's name under `$XDG_STATE_HOME` and `~/.local/state`.
pub const STATE_SUBDIR: &str = "vmdeploy";
/// iLO's HTTPS port.
pub const DEFAULT_ILO_PORT: u16 = 443;
/// One iLO call (Ironic's `ilo.client_timeout`).
pub const DEFAULT_ILO_TIMEOUT: Duration = Duration::from_secs(60);
/// Ironic's `deploy_callback_timeout`.
pub const DEFAULT_CALLBACK_TIMEOUT: Duration = Duration::from_secs(1800);
/// Ironic's `deploy_helper_images_ttl` (10 min).
pub const DEFAULT_HELPER_TTL: Duration = Duration::from_secs(600);
/// One agent command call.
pub const DEFAULT_AGENT_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Ironic's `sync_power_state_interval`.
pub const DEFAULT_POWER_SYNC: Duration = Duration::from_secs(60);
/// The container of floppies and ISOs.
pub const DEFAULT_CONTAINER: &str = "vmdeploy";
