//! The dotted names of every configuration key: the one place messages and docs take them
//! from (docs/style.md §4, after linkerd2-proxy's env.rs).

/// API listen addresses (`ip:port`, several allowed).
pub const API_LISTEN: &str = "api.listen";
/// API TLS: `"off"`, `"auto"` or `{ cert, key, ca }`.
pub const API_TLS: &str = "api.tls";
/// API TLS certificate chain (PEM), when `api.tls` is a table.
pub const API_TLS_CERT: &str = "api.tls.cert";
/// API TLS private key (PEM).
pub const API_TLS_KEY: &str = "api.tls.key";
/// CA the ramdisk trusts for the API (PEM; default: the last certificate of `cert`).
pub const API_TLS_CA: &str = "api.tls.ca";
/// The URL clients reach the API at.
pub const API_PUBLIC_URL: &str = "api.public_url";
/// The words that allow a non-loopback listen address without TLS.
pub const API_INSECURE: &str = "api.insecure_listen_without_tls";
/// Largest request body, bytes.
pub const API_MAX_BODY: &str = "api.max_body";
/// The most records one list page holds.
pub const API_MAX_LIMIT: &str = "api.max_limit";
/// Seconds in-flight requests get after SIGTERM.
pub const API_SHUTDOWN_GRACE: &str = "api.shutdown_grace";
/// Seconds a request's body may take to arrive.
pub const API_BODY_TIMEOUT: &str = "api.body_timeout";
/// Connections to the API at once.
pub const API_MAX_CONNECTIONS: &str = "api.max_connections";
/// Connections to the API at once from one client address.
pub const API_MAX_CONNECTIONS_PER_CLIENT: &str = "api.max_connections_per_client";
/// Failed call-back checks a minute from one client address (429 past it).
pub const API_CALLBACK_FAILURES_PER_CLIENT: &str = "api.callback_failures_per_client";
/// Failed call-back checks a minute against one node (its wrong secrets get 429 past it).
pub const API_CALLBACK_FAILURES_PER_NODE: &str = "api.callback_failures_per_node";
/// `noauth` or `http_basic`.
pub const AUTH_STRATEGY: &str = "auth.strategy";
/// The htpasswd file of `http_basic` (bcrypt hashes).
pub const AUTH_HTPASSWD: &str = "auth.htpasswd";
/// The state directory.
pub const STATE_DIR: &str = "state.dir";
/// BMCs a power sync pass reads at once.
pub const CONDUCTOR_SYNC_POWER_STATE_WORKERS: &str = "conductor.sync_power_state_workers";
/// This conductor's group (nodes of a group are run by its conductors).
pub const CONDUCTOR_GROUP: &str = "conductor.conductor_group";
/// Seconds between this conductor's heartbeats in the database.
pub const CONDUCTOR_HEARTBEAT_INTERVAL: &str = "conductor.heartbeat_interval";
/// Seconds after which a conductor without a heartbeat is dead.
pub const CONDUCTOR_HEARTBEAT_TIMEOUT: &str = "conductor.heartbeat_timeout";
/// Where the other conductors on the database reach this one's API (node actions forwarded to
/// their owner); default: the API's first address.
pub const CONDUCTOR_INTERNAL_URL: &str = "conductor.internal_url";
/// The node store: `sqlite` or `postgresql` (the default follows `database.url`).
pub const STORE_KIND: &str = "store.kind";
/// PostgreSQL: `postgresql://user@host:port/database?sslmode=...`.
pub const DATABASE_URL: &str = "database.url";
/// PostgreSQL: a file holding the password.
pub const DATABASE_PASSWORD_FILE: &str = "database.password_file";
/// PostgreSQL: CA certificates (PEM) the server's certificate must chain to.
pub const DATABASE_CA_FILE: &str = "database.ca_file";
/// PostgreSQL: the most connections this conductor opens.
pub const DATABASE_MAX_CONNECTIONS: &str = "database.max_connections";
/// The object store: `builtin` or `swift`.
pub const OBJECTS_KIND: &str = "objects.kind";
/// Where the built-in store listens (`ip:port`, port 0 picks one).
pub const BUILTIN_LISTEN: &str = "objects.builtin.listen";
/// The URL BMCs and agents reach the built-in store at.
pub const BUILTIN_PUBLIC_URL: &str = "objects.builtin.public_url";
/// The built-in store's own certificate `{ cert, key }`.
pub const BUILTIN_TLS: &str = "objects.builtin.tls";
/// Swift: the auth endpoint (`.../auth/v1.0` or Keystone `.../v3`).
pub const SWIFT_AUTH_URL: &str = "objects.swift.auth_url";
/// Swift: auth version, `1` (tempauth) or `3` (Keystone).
pub const SWIFT_AUTH_VERSION: &str = "objects.swift.auth_version";
/// Swift: user (`account:user` for tempauth).
pub const SWIFT_USER: &str = "objects.swift.user";
/// Swift: key or password.
pub const SWIFT_KEY: &str = "objects.swift.key";
/// Swift, Keystone: project name.
pub const SWIFT_PROJECT: &str = "objects.swift.project";
/// Swift, Keystone: the user's domain.
pub const SWIFT_USER_DOMAIN: &str = "objects.swift.user_domain";
/// Swift, Keystone: the project's domain.
pub const SWIFT_PROJECT_DOMAIN: &str = "objects.swift.project_domain";
/// Swift, Keystone: region of the object-store endpoint.
pub const SWIFT_REGION: &str = "objects.swift.region";
/// Swift, Keystone: endpoint interface (`public`, `internal`, `admin`).
pub const SWIFT_INTERFACE: &str = "objects.swift.interface";
/// Swift: the account's temp-URL key (set on the account when missing).
pub const SWIFT_TEMP_URL_KEY: &str = "objects.swift.temp_url_key";
/// Swift: verify its certificate (`true`, `false`, or a CA file; default the system's
/// roots).
pub const SWIFT_VERIFY_CA: &str = "objects.swift.verify_ca";
/// Swift: connect and read timeout, seconds.
pub const SWIFT_TIMEOUT: &str = "objects.swift.timeout";
/// iLO: default port of the iLO's HTTPS interface.
pub const ILO_CLIENT_PORT: &str = "ilo.client_port";
/// iLO: default timeout of one call, seconds.
pub const ILO_CLIENT_TIMEOUT: &str = "ilo.client_timeout";
/// iLO: verify the iLO's certificate (`true`, `false`, or a CA file).
pub const ILO_VERIFY_CA: &str = "ilo.verify_ca";
/// The API URL the ramdisk calls back.
pub const DEPLOY_API_URL: &str = "deploy.api_url";
/// Lifetime of floppies and their temp URLs, seconds.
pub const DEPLOY_HELPER_TTL: &str = "deploy.deploy_helper_images_ttl";
/// How long a node may wait for its ramdisk, seconds.
pub const DEPLOY_CALLBACK_TIMEOUT: &str = "deploy.deploy_callback_timeout";
/// Talk plain HTTP to an agent that offers no certificate.
pub const DEPLOY_AGENT_PLAIN_HTTP: &str = "deploy.agent_allow_plain_http";
/// Timeout of one call to an agent's command API, seconds.
pub const DEPLOY_AGENT_CALL_TIMEOUT: &str = "deploy.agent_call_timeout";
/// Seconds the host may take to power off after the agent's `standby.power_off`.
pub const DEPLOY_AGENT_POWER_OFF_WAIT: &str = "deploy.agent_power_off_wait";
/// Clean nodes through the agent on undeploy and provide.
pub const DEPLOY_AUTOMATED_CLEAN: &str = "deploy.automated_clean";
/// Seconds between power-state syncs.
pub const DEPLOY_POWER_SYNC: &str = "deploy.power_sync_interval";
/// Object-store container of floppies and deploy ISOs.
pub const DEPLOY_CONTAINER: &str = "deploy.container";
/// Name of this conductor (its reservations' prefix; default the host name).
pub const DEPLOY_CONDUCTOR_NAME: &str = "deploy.conductor_name";
/// Directory of the boot loaders instance boot ISOs are built with (written by
/// `vmdeploy-image-build loaders -o DIR`; default `<state dir>/boot-loaders`).
pub const DEPLOY_BOOT_LOADERS_DIR: &str = "deploy.boot_loaders_dir";
/// Kernel arguments after `root=UUID=...` on built instance boot ISOs.
pub const DEPLOY_BOOT_ISO_APPEND: &str = "deploy.boot_iso_append";
/// Lifetime of the temp URL an instance's boot ISO is attached with, seconds.
pub const DEPLOY_BOOT_ISO_TTL: &str = "deploy.boot_iso_ttl";
/// The port the conductor logs in to the iSCSI ramdisk's target at (Ironic's
/// `[iscsi] portal_port`, 3260).
pub const DEPLOY_ISCSI_PORTAL_PORT: &str = "deploy.iscsi_portal_port";
/// The port the conductor sends the iSCSI ramdisk its `done` to (10000).
pub const DEPLOY_ISCSI_DONE_PORT: &str = "deploy.iscsi_done_port";
/// CHAP user the iSCSI ramdisk's target requires (with `iscsi_chap_secret`).
pub const DEPLOY_ISCSI_CHAP_USER: &str = "deploy.iscsi_chap_user";
/// CHAP secret of `iscsi_chap_user` (at least 12 bytes, no white space).
pub const DEPLOY_ISCSI_CHAP_SECRET: &str = "deploy.iscsi_chap_secret";
/// Directory of the instance image cache (default `<state>/images`).
pub const IMAGES_CACHE_DIR: &str = "images.cache_dir";
/// Size limit of the instance image cache, bytes of raw images.
pub const IMAGES_CACHE_LIMIT: &str = "images.cache_limit";
/// Log format: `human` or `json`.
pub const LOG_FORMAT: &str = "log.format";
/// Log level or `tracing` filter directives (`RUST_LOG` wins).
pub const LOG_LEVEL: &str = "log.level";

/// Every key, for the docs test.
pub const ALL: &[&str] = &[
    API_LISTEN,
    API_TLS,
    API_TLS_CERT,
    API_TLS_KEY,
    API_TLS_CA,
    API_PUBLIC_URL,
    API_INSECURE,
    API_MAX_BODY,
    API_MAX_LIMIT,
    API_SHUTDOWN_GRACE,
    API_BODY_TIMEOUT,
    API_MAX_CONNECTIONS,
    API_MAX_CONNECTIONS_PER_CLIENT,
    API_CALLBACK_FAILURES_PER_CLIENT,
    API_CALLBACK_FAILURES_PER_NODE,
    AUTH_STRATEGY,
    AUTH_HTPASSWD,
    STATE_DIR,
    CONDUCTOR_SYNC_POWER_STATE_WORKERS,
    CONDUCTOR_GROUP,
    CONDUCTOR_HEARTBEAT_INTERVAL,
    CONDUCTOR_HEARTBEAT_TIMEOUT,
    CONDUCTOR_INTERNAL_URL,
    STORE_KIND,
    DATABASE_URL,
    DATABASE_PASSWORD_FILE,
    DATABASE_CA_FILE,
    DATABASE_MAX_CONNECTIONS,
    OBJECTS_KIND,
    BUILTIN_LISTEN,
    BUILTIN_PUBLIC_URL,
    BUILTIN_TLS,
    SWIFT_AUTH_URL,
    SWIFT_AUTH_VERSION,
    SWIFT_USER,
    SWIFT_KEY,
    SWIFT_PROJECT,
    SWIFT_USER_DOMAIN,
    SWIFT_PROJECT_DOMAIN,
    SWIFT_REGION,
    SWIFT_INTERFACE,
    SWIFT_TIMEOUT,
    SWIFT_TEMP_URL_KEY,
    SWIFT_VERIFY_CA,
    ILO_CLIENT_PORT,
    ILO_CLIENT_TIMEOUT,
    ILO_VERIFY_CA,
    DEPLOY_API_URL,
    DEPLOY_HELPER_TTL,
    DEPLOY_CALLBACK_TIMEOUT,
    DEPLOY_AGENT_PLAIN_HTTP,
    DEPLOY_AGENT_CALL_TIMEOUT,
    DEPLOY_AGENT_POWER_OFF_WAIT,
    DEPLOY_AUTOMATED_CLEAN,
    DEPLOY_POWER_SYNC,
    DEPLOY_CONTAINER,
    DEPLOY_CONDUCTOR_NAME,
    DEPLOY_ISCSI_CHAP_USER,
    DEPLOY_ISCSI_CHAP_SECRET,
    DEPLOY_BOOT_LOADERS_DIR,
    DEPLOY_BOOT_ISO_APPEND,
    DEPLOY_BOOT_ISO_TTL,
    DEPLOY_ISCSI_PORTAL_PORT,
    DEPLOY_ISCSI_DONE_PORT,
    IMAGES_CACHE_DIR,
    IMAGES_CACHE_LIMIT,
    LOG_FORMAT,
    LOG_LEVEL,
];
