//! [`Settings::resolve`]: checks the file's values and relations (addresses, loopback without
//! TLS, files that must exist) and fills every default, recording which ones it used; with the
//! checks it shares and the defaults that depend on the host ([`host_name`], [`default_api_url`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use vmdeploy_shared::secret::Secret;

use crate::store::postgres::PostgresConfig;

use super::{
    keys, netboot, resolve_state_dir, ApiTls, AuthStrategy, ConfigError, ConfigFile,
    DatabaseSection, Env, Fallback, IloDefaults, ObjectsKind, ObjectsSettings, Settings,
    StateDirSource, StoreKind, TlsSetting, VerifyCa, BOOT_LOADERS_DIR, DEFAULT_AGENT_CALL_TIMEOUT,
    DEFAULT_BODY_TIMEOUT, DEFAULT_BUILTIN_LISTEN, DEFAULT_CALLBACK_TIMEOUT, DEFAULT_CONTAINER,
    DEFAULT_DATABASE_MAX_CONNECTIONS, DEFAULT_HELPER_TTL, DEFAULT_ILO_PORT, DEFAULT_ILO_TIMEOUT,
    DEFAULT_LISTEN, DEFAULT_MAX_BODY, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
    DEFAULT_POWER_SYNC, DEFAULT_SHUTDOWN_GRACE, IMAGES_DIR, OBJECTS_DIR, SQLITE_FILE,
};

fn parse_addr(key: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    value.parse::<SocketAddr>().map_err(|_| {
        ConfigError::new(
            key,
            format!(
                "{value:?} is not an ip:port address (e.g. \"127.0.0.1:6385\", \"[::1]:6385\")"
            ),
        )
    })
}

fn seconds(key: &str, value: Option<u64>, default: Duration) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(0) => Err(ConfigError::new(key, "must be at least 1 second")),
        Some(s) => Ok(Duration::from_secs(s)),
    }
}

fn port(key: &str, value: Option<u16>, default: u16) -> Result<u16, ConfigError> {
    match value {
        None => Ok(default),
        Some(0) => Err(ConfigError::new(key, "must be a port number, 1-65535")),
        Some(p) => Ok(p),
    }
}

pub(super) fn check_url(key: &str, value: &str) -> Result<(), ConfigError> {
    let url = url::Url::parse(value)
        .map_err(|e| ConfigError::new(key, format!("{value:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(ConfigError::new(
            key,
            format!("{value:?}: an http:// or https:// URL with a host is needed"),
        ));
    }
    Ok(())
}

/// `store.kind` and `[database]`: SQLite in the state directory unless `database.url` names a
/// PostgreSQL server (or `store.kind` asks for one, which then needs the URL).
fn resolve_store(
    kind: Option<StoreKind>,
    database: DatabaseSection,
    sqlite_path: &Path,
    fallbacks: &mut Vec<Fallback>,
) -> Result<(StoreKind, Option<PostgresConfig>), ConfigError> {
    let kind = match (kind, &database.url) {
        (Some(kind), _) => kind,
        (None, Some(_)) => StoreKind::Postgresql,
        (None, None) => StoreKind::Sqlite,
    };
    if kind == StoreKind::Sqlite {
        let stray = [
            (keys::DATABASE_URL, database.url.is_some()),
            (
                keys::DATABASE_PASSWORD_FILE,
                database.password_file.is_some(),
            ),
            (keys::DATABASE_CA_FILE, database.ca_file.is_some()),
            (
                keys::DATABASE_MAX_CONNECTIONS,
                database.max_connections.is_some(),
            ),
        ];
        if let Some((key, _)) = stray.iter().find(|(_, set)| *set) {
            return Err(ConfigError::new(
                *key,
                "is for PostgreSQL, but store.kind is \"sqlite\": remove one of them",
            ));
        }
        fallbacks.push(Fallback {
            key: keys::STORE_KIND,
            value: format!("sqlite at {}", sqlite_path.display()),
        });
        return Ok((kind, None));
    }
    let url = database.url.ok_or_else(|| {
        ConfigError::new(
            keys::DATABASE_URL,
            "store.kind is \"postgresql\": database.url must name the server \
             (postgresql://user@host:port/database)",
        )
    })?;
    crate::store::postgres::parse_url(url.expose())
        .map_err(|e| ConfigError::new(keys::DATABASE_URL, e))?;
    if let Some(path) = &database.password_file {
        check_file(keys::DATABASE_PASSWORD_FILE, path)?;
    }
    if let Some(path) = &database.ca_file {
        check_file(keys::DATABASE_CA_FILE, path)?;
    }
    let max_connections = match database.max_connections {
        None => {
            fallbacks.push(Fallback {
                key: keys::DATABASE_MAX_CONNECTIONS,
                value: DEFAULT_DATABASE_MAX_CONNECTIONS.to_string(),
            });
            DEFAULT_DATABASE_MAX_CONNECTIONS
        }
        Some(0) => {
            return Err(ConfigError::new(
                keys::DATABASE_MAX_CONNECTIONS,
                "must be at least 1",
            ))
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
    };
    Ok((
        kind,
        Some(PostgresConfig {
            url,
            password_file: database.password_file,
            ca_file: database.ca_file,
            max_connections,
        }),
    ))
}

fn check_file(key: &str, path: &Path) -> Result<(), ConfigError> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(()),
        Ok(_) => Err(ConfigError::new(
            key,
            format!("{} is not a file", path.display()),
        )),
        Err(e) => Err(ConfigError::new(
            key,
            format!("cannot read {}: {e}", path.display()),
        )),
    }
}

/// The host name, for certificate names and the conductor's name (`/proc`, no libc call).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

impl Settings {
    /// Checks `file` (`None`: no configuration file) and fills the defaults. `source` is the
    /// file's path, `state_dir` the `--state-dir` option. Files named by the configuration must
    /// exist; their contents are loaded later ([`crate::service::tls`], [`crate::service::auth`]).
    pub fn resolve(
        file: ConfigFile,
        source: Option<&Path>,
        state_dir: Option<&Path>,
        env: &dyn Env,
    ) -> Result<Settings, ConfigError> {
        let mut fallbacks = Vec::new();
        let api = file.api;

        let listen = match &api.listen {
            None => {
                fallbacks.push(Fallback {
                    key: keys::API_LISTEN,
                    value: format!("{DEFAULT_LISTEN} (loopback only)"),
                });
                vec![DEFAULT_LISTEN]
            }
            Some(list) if list.is_empty() => {
                return Err(ConfigError::new(
                    keys::API_LISTEN,
                    "empty: give at least one ip:port",
                ))
            }
            Some(list) => list
                .iter()
                .map(|s| parse_addr(keys::API_LISTEN, s))
                .collect::<Result<Vec<_>, _>>()?,
        };

        let tls = match api.tls {
            TlsSetting::Off => {
                if api.listen.is_none() {
                    fallbacks.push(Fallback {
                        key: keys::API_TLS,
                        value: "off (plain HTTP on loopback)".into(),
                    });
                }
                ApiTls::Off
            }
            TlsSetting::Auto => ApiTls::Auto,
            TlsSetting::Files(files) => {
                check_file(keys::API_TLS_CERT, &files.cert)?;
                check_file(keys::API_TLS_KEY, &files.key)?;
                if let Some(ca) = &files.ca {
                    check_file(keys::API_TLS_CA, ca)?;
                }
                ApiTls::Files(files)
            }
        };

        if tls == ApiTls::Off && !api.insecure_listen_without_tls {
            if let Some(addr) = listen.iter().find(|a| !a.ip().is_loopback()) {
                return Err(ConfigError::new(
                    keys::API_LISTEN,
                    format!(
                        "{addr} is not a loopback address and TLS is off: set {} = \"auto\" (or a \
                         certificate), or {} = true to serve plain HTTP beyond this host",
                        keys::API_TLS,
                        keys::API_INSECURE
                    ),
                ));
            }
        }

        if let Some(url) = &api.public_url {
            check_url(keys::API_PUBLIC_URL, url)?;
        }

        let max_body = match api.max_body {
            None => DEFAULT_MAX_BODY,
            Some(0) => return Err(ConfigError::new(keys::API_MAX_BODY, "must be above 0")),
            Some(n) => n,
        };
        let max_body = usize::try_from(max_body)
            .map_err(|_| ConfigError::new(keys::API_MAX_BODY, "too large"))?;
        let max_limit = match api.max_limit {
            None => crate::api::DEFAULT_MAX_LIMIT,
            Some(0) => return Err(ConfigError::new(keys::API_MAX_LIMIT, "must be above 0")),
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let sync_power_state_workers = match file.conductor.sync_power_state_workers {
            None => {
                fallbacks.push(Fallback {
                    key: keys::CONDUCTOR_SYNC_POWER_STATE_WORKERS,
                    value: crate::manager::DEFAULT_SYNC_POWER_STATE_WORKERS.to_string(),
                });
                crate::manager::DEFAULT_SYNC_POWER_STATE_WORKERS
            }
            Some(0) => {
                return Err(ConfigError::new(
                    keys::CONDUCTOR_SYNC_POWER_STATE_WORKERS,
                    "must be at least 1",
                ))
            }
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let conductor_group = file.conductor.conductor_group.clone().unwrap_or_default();
        if !conductor_group
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
            || conductor_group.len() > 255
        {
            return Err(ConfigError::new(
                keys::CONDUCTOR_GROUP,
                "letters, digits, '-', '.' and '_' only, at most 255 (Ironic's rule)",
            ));
        }
        let heartbeat_interval = seconds(
            keys::CONDUCTOR_HEARTBEAT_INTERVAL,
            file.conductor.heartbeat_interval,
            crate::manager::DEFAULT_HEARTBEAT_INTERVAL,
        )?;
        let heartbeat_timeout = seconds(
            keys::CONDUCTOR_HEARTBEAT_TIMEOUT,
            file.conductor.heartbeat_timeout,
            crate::manager::DEFAULT_HEARTBEAT_TIMEOUT,
        )?;
        if heartbeat_timeout <= heartbeat_interval {
            return Err(ConfigError::new(
                keys::CONDUCTOR_HEARTBEAT_TIMEOUT,
                format!(
                    "must be longer than conductor.heartbeat_interval ({} s), or every \
                     conductor would look dead between two heartbeats",
                    heartbeat_interval.as_secs()
                ),
            ));
        }
        let internal_url = file.conductor.internal_url.clone();
        if let Some(url) = &internal_url {
            check_url(keys::CONDUCTOR_INTERNAL_URL, url)?;
        }
        let shutdown_grace = match api.shutdown_grace {
            None => DEFAULT_SHUTDOWN_GRACE,
            Some(s) => Duration::from_secs(s),
        };
        let positive = |key: &'static str, value: u64| {
            if value == 0 {
                Err(ConfigError::new(key, "must be above 0"))
            } else {
                usize::try_from(value).map_err(|_| ConfigError::new(key, "too large"))
            }
        };
        let api_limits = crate::service::listen::Limits {
            body_timeout: match api.body_timeout {
                None => DEFAULT_BODY_TIMEOUT,
                Some(0) => return Err(ConfigError::new(keys::API_BODY_TIMEOUT, "must be above 0")),
                Some(s) => Duration::from_secs(s),
            },
            max_connections: match api.max_connections {
                None => DEFAULT_MAX_CONNECTIONS,
                Some(n) => positive(keys::API_MAX_CONNECTIONS, n)?,
            },
            max_connections_per_client: match api.max_connections_per_client {
                None => DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
                Some(n) => positive(keys::API_MAX_CONNECTIONS_PER_CLIENT, n)?,
            },
        };
        let per_minute = |key: &'static str, value: Option<u64>, default: u32| match value {
            None => Ok(default),
            Some(0) => Err(ConfigError::new(key, "must be above 0")),
            Some(n) => u32::try_from(n).map_err(|_| ConfigError::new(key, "too large")),
        };
        let callback_failures = crate::net::failed_checks::FailureLimits {
            per_client: per_minute(
                keys::API_CALLBACK_FAILURES_PER_CLIENT,
                api.callback_failures_per_client,
                crate::net::failed_checks::DEFAULT_PER_CLIENT,
            )?,
            per_node: per_minute(
                keys::API_CALLBACK_FAILURES_PER_NODE,
                api.callback_failures_per_node,
                crate::net::failed_checks::DEFAULT_PER_NODE,
            )?,
        };

        let auth = file.auth.strategy;
        let htpasswd = match (auth, file.auth.htpasswd) {
            (AuthStrategy::HttpBasic, Some(path)) => {
                check_file(keys::AUTH_HTPASSWD, &path)?;
                Some(path)
            }
            (AuthStrategy::HttpBasic, None) => {
                return Err(ConfigError::new(
                    keys::AUTH_HTPASSWD,
                    "auth.strategy = \"http_basic\" needs an htpasswd file with bcrypt hashes \
                     (htpasswd -B -c FILE USER)",
                ))
            }
            (AuthStrategy::Noauth, path) => {
                if path.is_some() {
                    return Err(ConfigError::new(
                        keys::AUTH_HTPASSWD,
                        "set, but auth.strategy is \"noauth\": set auth.strategy = \"http_basic\" \
                         or remove it",
                    ));
                }
                fallbacks.push(Fallback {
                    key: keys::AUTH_STRATEGY,
                    value: "noauth (every caller may use the API)".into(),
                });
                None
            }
        };

        let (state_dir, state_dir_source) =
            resolve_state_dir(state_dir, file.state.dir.as_deref(), env)?;
        if !matches!(
            state_dir_source,
            StateDirSource::CommandLine | StateDirSource::ConfigFile
        ) {
            fallbacks.push(Fallback {
                key: keys::STATE_DIR,
                value: format!("{} ({state_dir_source})", state_dir.display()),
            });
        }
        if !state_dir.is_absolute() {
            return Err(ConfigError::new(
                keys::STATE_DIR,
                format!("{} is not an absolute path", state_dir.display()),
            ));
        }

        let sqlite_path = state_dir.join(SQLITE_FILE);
        let (store, postgres) =
            resolve_store(file.store.kind, file.database, &sqlite_path, &mut fallbacks)?;

        let objects = match file.objects.kind {
            ObjectsKind::Builtin => {
                let builtin = file.objects.builtin;
                let listen = match &builtin.listen {
                    Some(s) => parse_addr(keys::BUILTIN_LISTEN, s)?,
                    None => {
                        fallbacks.push(Fallback {
                            key: keys::BUILTIN_LISTEN,
                            value: format!("{DEFAULT_BUILTIN_LISTEN} (loopback, a free port)"),
                        });
                        DEFAULT_BUILTIN_LISTEN
                    }
                };
                if let Some(url) = &builtin.public_url {
                    check_url(keys::BUILTIN_PUBLIC_URL, url)?;
                    if !url.starts_with("https://") {
                        return Err(ConfigError::new(
                            keys::BUILTIN_PUBLIC_URL,
                            "the built-in store serves HTTPS only (the floppy carries secrets)",
                        ));
                    }
                }
                if let Some(files) = &builtin.tls {
                    check_file(keys::BUILTIN_TLS, &files.cert)?;
                    check_file(keys::BUILTIN_TLS, &files.key)?;
                }
                fallbacks.push(Fallback {
                    key: keys::OBJECTS_KIND,
                    value: format!("builtin at {}", state_dir.join(OBJECTS_DIR).display()),
                });
                ObjectsSettings::Builtin {
                    root: state_dir.join(OBJECTS_DIR),
                    listen,
                    public_url: builtin.public_url,
                    tls: builtin.tls,
                }
            }
            ObjectsKind::Swift => {
                let swift = file.objects.swift.ok_or_else(|| {
                    ConfigError::new(
                        "objects.swift",
                        "objects.kind = \"swift\" needs an [objects.swift] table (auth_url, \
                         user, key)",
                    )
                })?;
                check_url(keys::SWIFT_AUTH_URL, &swift.auth_url)?;
                if !matches!(swift.auth_version, 1 | 3) {
                    return Err(ConfigError::new(
                        keys::SWIFT_AUTH_VERSION,
                        "1 (tempauth) or 3 (Keystone)",
                    ));
                }
                if swift.auth_version == 3 && swift.project.is_none() {
                    return Err(ConfigError::new(
                        keys::SWIFT_PROJECT,
                        "Keystone (auth_version = 3) needs a project",
                    ));
                }
                if let Some(VerifyCa::File(ca)) = &swift.verify_ca {
                    check_file(keys::SWIFT_VERIFY_CA, ca)?;
                }
                if swift.timeout == Some(0) {
                    return Err(ConfigError::new(
                        keys::SWIFT_TIMEOUT,
                        "must be at least 1 second",
                    ));
                }
                ObjectsSettings::Swift(swift)
            }
        };

        let ilo = IloDefaults {
            client_port: match file.ilo.client_port {
                Some(0) => return Err(ConfigError::new(keys::ILO_CLIENT_PORT, "must be above 0")),
                Some(p) => p,
                None => DEFAULT_ILO_PORT,
            },
            client_timeout: seconds(
                keys::ILO_CLIENT_TIMEOUT,
                file.ilo.client_timeout,
                DEFAULT_ILO_TIMEOUT,
            )?,
            verify_ca: match file.ilo.verify_ca {
                Some(VerifyCa::File(path)) => {
                    check_file(keys::ILO_VERIFY_CA, &path)?;
                    VerifyCa::File(path)
                }
                Some(v) => v,
                None => VerifyCa::Enabled(true),
            },
        };

        let deploy = file.deploy;
        if let Some(url) = &deploy.api_url {
            check_url(keys::DEPLOY_API_URL, url)?;
        }
        let conductor_name = match deploy.conductor_name {
            Some(n) if n.trim().is_empty() => {
                return Err(ConfigError::new(keys::DEPLOY_CONDUCTOR_NAME, "empty"))
            }
            Some(n) => n,
            None => host_name(),
        };

        let boot_loaders_dir = match deploy.boot_loaders_dir {
            Some(dir) if !dir.is_absolute() => {
                return Err(ConfigError::new(
                    keys::DEPLOY_BOOT_LOADERS_DIR,
                    format!("{} is not an absolute path", dir.display()),
                ))
            }
            Some(dir) => dir,
            None => state_dir.join(BOOT_LOADERS_DIR),
        };
        let boot_iso_append = deploy
            .boot_iso_append
            .as_deref()
            .map(str::trim)
            .unwrap_or_default()
            .to_string();
        if boot_iso_append.contains(['\n', '\r']) {
            return Err(ConfigError::new(
                keys::DEPLOY_BOOT_ISO_APPEND,
                "a kernel command line is one line",
            ));
        }
        let iscsi_chap = iscsi_chap(deploy.iscsi_chap_user, deploy.iscsi_chap_secret)?;
        let image_cache_dir = file
            .images
            .cache_dir
            .unwrap_or_else(|| state_dir.join(IMAGES_DIR));
        if !image_cache_dir.is_absolute() {
            return Err(ConfigError::new(
                keys::IMAGES_CACHE_DIR,
                format!("{} is not an absolute path", image_cache_dir.display()),
            ));
        }
        let image_cache_limit = match file.images.cache_limit {
            None => crate::image_cache::DEFAULT_LIMIT,
            Some(0) => {
                return Err(ConfigError::new(
                    keys::IMAGES_CACHE_LIMIT,
                    "must be above 0",
                ))
            }
            Some(n) => n,
        };

        let log_level = file.log.level.unwrap_or_else(|| "info".to_string());
        // A bare word must be a level: EnvFilter would take "verbose" as a target name and log
        // nothing at all.
        let bare_word_not_a_level = !log_level.contains(['=', ','])
            && !matches!(
                log_level.to_ascii_lowercase().as_str(),
                "off" | "error" | "warn" | "info" | "debug" | "trace"
            );
        if bare_word_not_a_level || tracing_subscriber::EnvFilter::try_new(&log_level).is_err() {
            return Err(ConfigError::new(
                keys::LOG_LEVEL,
                format!("{log_level:?} is not a level (error, warn, info, debug, trace) or filter"),
            ));
        }

        let netboot = netboot::resolve(file.netboot, &state_dir)?;
        Ok(Settings {
            source: source.map(Path::to_path_buf),
            listen,
            tls,
            public_url: api.public_url,
            max_body,
            max_limit,
            sync_power_state_workers,
            conductor_group,
            heartbeat_interval,
            heartbeat_timeout,
            internal_url,
            shutdown_grace,
            api_limits,
            callback_failures,
            auth,
            htpasswd,
            state_dir,
            state_dir_source,
            store,
            sqlite_path,
            postgres,
            objects,
            ilo,
            api_url: deploy.api_url,
            deploy_helper_images_ttl: seconds(
                keys::DEPLOY_HELPER_TTL,
                deploy.deploy_helper_images_ttl,
                DEFAULT_HELPER_TTL,
            )?,
            deploy_callback_timeout: seconds(
                keys::DEPLOY_CALLBACK_TIMEOUT,
                deploy.deploy_callback_timeout,
                DEFAULT_CALLBACK_TIMEOUT,
            )?,
            agent_allow_plain_http: deploy.agent_allow_plain_http,
            agent_call_timeout: seconds(
                keys::DEPLOY_AGENT_CALL_TIMEOUT,
                deploy.agent_call_timeout,
                DEFAULT_AGENT_CALL_TIMEOUT,
            )?,
            agent_power_off_wait: seconds(
                keys::DEPLOY_AGENT_POWER_OFF_WAIT,
                deploy.agent_power_off_wait,
                crate::deploy::agent_session::DEFAULT_AGENT_POWER_OFF_WAIT,
            )?,
            automated_clean: deploy.automated_clean,
            power_sync_interval: seconds(
                keys::DEPLOY_POWER_SYNC,
                deploy.power_sync_interval,
                DEFAULT_POWER_SYNC,
            )?,
            container: deploy
                .container
                .unwrap_or_else(|| DEFAULT_CONTAINER.to_string()),
            conductor_name,
            boot_loaders_dir,
            boot_iso_append,
            boot_iso_ttl: seconds(
                keys::DEPLOY_BOOT_ISO_TTL,
                deploy.boot_iso_ttl,
                crate::boot::vmedia::boot_iso::DEFAULT_TEMP_URL_TTL,
            )?,
            iscsi_portal_port: port(
                keys::DEPLOY_ISCSI_PORTAL_PORT,
                deploy.iscsi_portal_port,
                crate::deploy::ISCSI_PORT,
            )?,
            iscsi_done_port: port(
                keys::DEPLOY_ISCSI_DONE_PORT,
                deploy.iscsi_done_port,
                crate::deploy::DONE_PORT,
            )?,
            iscsi_chap,
            image_cache_dir,
            image_cache_limit,
            log_format: file.log.format,
            log_level,
            netboot,
            fallbacks,
        })
    }
}

/// `deploy.iscsi_chap_user` and `iscsi_chap_secret`: both or neither. They go on the floppy,
/// whose values cannot hold white space (docs/ironic-protocols.md §1.4), and RFC 7143 §9.2.1 wants a CHAP
/// secret of at least 96 bits.
fn iscsi_chap(
    user: Option<String>,
    secret: Option<Secret>,
) -> Result<Option<crate::deploy::IscsiChap>, ConfigError> {
    let (user, secret) = match (user, secret) {
        (None, None) => return Ok(None),
        (Some(user), Some(secret)) => (user, secret),
        (Some(_), None) => {
            return Err(ConfigError::new(
                keys::DEPLOY_ISCSI_CHAP_SECRET,
                "missing: iscsi_chap_user needs a secret",
            ))
        }
        (None, Some(_)) => {
            return Err(ConfigError::new(
                keys::DEPLOY_ISCSI_CHAP_USER,
                "missing: iscsi_chap_secret needs a user",
            ))
        }
    };
    if user.is_empty() || user.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ConfigError::new(
            keys::DEPLOY_ISCSI_CHAP_USER,
            "empty or contains white space (it goes on the ramdisk's floppy)",
        ));
    }
    let text = secret.expose();
    // The reasons never quote the secret.
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ConfigError::new(
            keys::DEPLOY_ISCSI_CHAP_SECRET,
            "contains white space (it goes on the ramdisk's floppy)",
        ));
    }
    if text.len() < 12 {
        return Err(ConfigError::new(
            keys::DEPLOY_ISCSI_CHAP_SECRET,
            format!(
                "{} bytes: a CHAP secret needs at least 12 (RFC 7143 §9.2.1)",
                text.len()
            ),
        ));
    }
    Ok(Some(crate::deploy::IscsiChap { user, secret }))
}

/// The API URL the ramdisk calls back when `deploy.api_url` is not set: `api.public_url`, else
/// the first bound address (an unspecified address `0.0.0.0` is replaced by the host name).
pub fn default_api_url(public_url: Option<&str>, bound: SocketAddr, tls: bool) -> String {
    if let Some(url) = public_url {
        return url.trim_end_matches('/').to_string();
    }
    let scheme = if tls { "https" } else { "http" };
    let host = match bound.ip() {
        IpAddr::V4(ip) if ip == Ipv4Addr::UNSPECIFIED => host_name(),
        IpAddr::V6(ip) if ip == Ipv6Addr::UNSPECIFIED => host_name(),
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
    };
    format!("{scheme}://{host}:{}", bound.port())
}
