//! `vmdeploy-conductor serve`: configuration, listeners, TLS, auth, logging, and the drain on
//! SIGTERM (docs/style.md §7, after linkerd2-proxy's main).
//!
//! # Design
//! [`serve`] runs the steps in this order, each with its own module:
//! 1. read and check the configuration without binding anything ([`config`]); a bad file is a
//!    [`vmdeploy_shared::exit::UsageError`] (exit 64) naming the key. `--check-config` stops
//!    here, after loading the files it names (certificates, htpasswd).
//! 2. set up logging (`[log]`), then say where every default came from;
//! 3. create the state directory (0700), make or load certificates ([`tls`]);
//! 4. bind the API's addresses ([`listen::bind`]) and log each; derive `deploy.api_url`;
//! 5. open the node store and the object store, build the [`Manager`], recover and start the
//!    background duties;
//! 6. serve the API router wrapped in [`app`] (request ids, auth, body limit) until SIGTERM or
//!    SIGINT; then drain: stop accepting, let requests in flight finish within
//!    `api.shutdown_grace`, wait for node tasks ([`Manager::drain`]) in what is left of it, stop
//!    the background duties and the object store, and log what was cut.
//!
//! # Log fields (for every module)
//! - Every line logged while serving a request is inside the span `request` with the field
//!   `request_id` (`req-<uuid4>`, the `X-OpenStack-Request-Id` the client got), and `method`,
//!   `path`. Handlers need not add it; spawned tasks keep it only when they are instrumented
//!   with `tracing::Span::current()`.
//! - A line about a node carries the field `node` with its UUID (`node = %uuid`); a node task
//!   opens a span `node_task` with fields `node` and `task` (`deploy`, `power`, ...), so its
//!   lines carry both even after the request returned. Open such spans with
//!   `tracing::error_span!`: a span below the configured level does not exist, and the lines
//!   inside it would lose its fields (an INFO span is gone at `log.level = "warn"`).
//! - Secrets never go in a field: wrap them in `vmdeploy_shared::secret::Secret`, which prints
//!   `******`.
//!
//! In the JSON format (`log.format = "json"`) each line is one object with `fields`, `span`
//! (the innermost span and its fields) and `spans` (all of them), so `request_id` and `node`
//! are found in `spans` whatever the nesting.

pub mod auth;
pub mod config;
pub mod listen;
pub mod request;
pub mod tls;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use vmdeploy_shared::exit::UsageError;

use self::config::{ApiTls, ConfigError, Env, ObjectsSettings, ProcessEnv, Settings};
use self::request::InFlight;
use self::tls::{AutoOutcome, AutoTls, CertifiedKey};
use crate::api::{self, ApiOptions};
use crate::deploy::{DeployConfig, DeployContext};
use crate::manager::{Manager, ManagerConfig};
use crate::net::https::{PemCertificates, Trust};
use crate::objects::ObjectStore;
use crate::store::Store;

/// `serve`'s command line.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// The TOML configuration file (none: every default, see the README).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The state directory (overrides `state.dir` and the environment).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Check the configuration and the files it names, then exit: 0 when good, 64 with the key
    /// and the reason when not.
    #[arg(long)]
    pub check_config: bool,
}

/// Threads tokio's blocking pool may start: file work, bcrypt checks, an iSCSI write's reader
/// and writer, qcow2 conversions. The stores never use it (SQLite has a thread of its own,
/// PostgreSQL is async), so a full pool slows those jobs and never the API's store calls.
pub const MAX_BLOCKING_THREADS: usize = 512;

/// Worker threads of the API's runtime, at most: requests are short; what they start runs on
/// the other runtime.
const MAX_API_THREADS: usize = 4;

/// Runs `serve` (the binary's entry point) on two tokio runtimes: one for the API's connections
/// and request handlers, one for everything else (node tasks, background duties, the built-in
/// object store and netboot servers).
///
/// One runtime served both until 1,000 concurrent deploys put thousands of ready tasks in its
/// queues: an operator's `GET` waited its turn behind all of them (p99 in the hundreds of ms).
/// With a runtime of its own, a request waits only for the OS to give its mostly idle thread a
/// core, which a thread waking from sleep gets at once.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
    let api = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.min(MAX_API_THREADS))
        .thread_name("vmdeploy-api")
        .enable_all()
        .build()
        .context("starting the API's async runtime")?;
    let work = tokio::runtime::Builder::new_multi_thread()
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .thread_name("vmdeploy-work")
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let served = work.block_on(serve(args, api.handle().clone()));
    // Connections still open after the drain are cut; the node tasks have drained by now.
    api.shutdown_timeout(Duration::from_secs(1));
    work.shutdown_timeout(Duration::from_secs(1));
    served
}

fn usage(source: Option<&std::path::Path>, err: ConfigError) -> anyhow::Error {
    let err = match source {
        Some(path) => UsageError::new(format!("configuration {}: {err}", path.display())),
        None => UsageError::new(format!("configuration: {err}")),
    };
    anyhow::Error::new(err)
}

/// Reads and checks the configuration named by `args` (step 1).
pub fn load_settings(args: &ServeArgs, env: &dyn Env) -> anyhow::Result<Settings> {
    let file = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                anyhow::Error::new(UsageError::new(format!(
                    "configuration {}: cannot read it: {e}",
                    path.display()
                )))
            })?;
            config::parse(&text).map_err(|e| usage(Some(path), e))?
        }
        None => config::ConfigFile::default(),
    };
    Settings::resolve(file, args.config.as_deref(), args.state_dir.as_deref(), env)
        .map_err(|e| usage(args.config.as_deref(), e))
}

/// What the files named by the configuration hold (step 1, loaded).
#[derive(Debug, Default)]
pub struct LoadedFiles {
    /// The htpasswd users of `http_basic`.
    pub htpasswd: Option<auth::Htpasswd>,
    /// The API's certificate from files.
    pub api_cert: Option<CertifiedKey>,
    /// The built-in store's own certificate from files.
    pub objects_cert: Option<CertifiedKey>,
}

/// Loads the certificates and the htpasswd file the settings name; a file that does not load is
/// a usage error naming its key.
pub fn load_files(settings: &Settings) -> anyhow::Result<LoadedFiles> {
    let source = settings.source.as_deref();
    let mut loaded = LoadedFiles::default();
    if let Some(path) = &settings.htpasswd {
        let users = auth::Htpasswd::load(path).map_err(|e| {
            usage(
                source,
                ConfigError {
                    key: config::keys::AUTH_HTPASSWD.into(),
                    reason: format!("{e:#}"),
                },
            )
        })?;
        loaded.htpasswd = Some(users);
    }
    if let ApiTls::Files(files) = &settings.tls {
        let cert = tls::load_files(&files.cert, &files.key, files.ca.as_deref()).map_err(|e| {
            usage(
                source,
                ConfigError {
                    key: config::keys::API_TLS.into(),
                    reason: format!("{e:#}"),
                },
            )
        })?;
        loaded.api_cert = Some(cert);
    }
    if let ObjectsSettings::Builtin {
        tls: Some(files), ..
    } = &settings.objects
    {
        let cert = tls::load_files(&files.cert, &files.key, files.ca.as_deref()).map_err(|e| {
            usage(
                source,
                ConfigError {
                    key: config::keys::BUILTIN_TLS.into(),
                    reason: format!("{e:#}"),
                },
            )
        })?;
        loaded.objects_cert = Some(cert);
    }
    Ok(loaded)
}

/// The API's layers around `router`, outermost first: request id and span ([`request`]) and
/// auth (`http_basic` only, [`auth`]). The body limit is the router's own
/// ([`ApiOptions::max_body`]).
pub fn app(
    router: axum::Router,
    users: Option<auth::Htpasswd>,
    in_flight: InFlight,
) -> axum::Router {
    let mut app = router;
    if let Some(users) = users {
        app = app.layer(axum::middleware::from_fn_with_state(users, auth::layer));
    }
    app.layer(axum::middleware::from_fn_with_state(
        in_flight,
        request::layer,
    ))
}

/// A future that resolves on SIGTERM or SIGINT, with the signal's name. The handlers are in
/// place when this returns, not when the future is first polled: a SIGTERM that comes as soon
/// as the API answers must find them (until then it kills the process, exit status 143).
pub fn shutdown_signal(
) -> anyhow::Result<impl std::future::Future<Output = &'static str> + Send + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}

/// `vmdeploy-conductor serve` (module docs).
pub async fn serve(args: ServeArgs, api_runtime: tokio::runtime::Handle) -> anyhow::Result<()> {
    let started = Instant::now();
    // 1. Configuration, without binding anything.
    let settings = load_settings(&args, &ProcessEnv)?;
    let files = load_files(&settings)?;
    if args.check_config {
        println!(
            "configuration {}: good (state directory {})",
            settings.source.as_ref().map_or_else(
                || "(none, defaults)".to_string(),
                |p| p.display().to_string()
            ),
            settings.state_dir.display()
        );
        return Ok(());
    }

    // 2. Logging, then what we fell back to.
    if let Err(err) = crate::logging::init_with(settings.log_format, &settings.log_level) {
        eprintln!("vmdeploy-conductor: {err:#} (keeping the logger already set)");
    }
    match &settings.source {
        Some(path) => tracing::info!(file = %path.display(), "configuration read"),
        None => tracing::info!("no configuration file: running on defaults"),
    }
    for fallback in &settings.fallbacks {
        tracing::info!(key = fallback.key, value = %fallback.value, "default");
    }

    // Signal handlers before anything starts: a SIGTERM during start-up is kept, and the
    // conductor stops as soon as it serves.
    let signalled = shutdown_signal()?;

    // 3. Open-files limit, state directory and certificates.
    raise_open_files_limit();
    create_state_dir(&settings.state_dir)?;
    let certs = certificates(&settings, files.api_cert, files.objects_cert)?;

    // 4. Bind.
    let api_tls = match &certs.api {
        Some(cert) => Some(cert.server_config()?),
        None => None,
    };
    let listeners = listen::bind(&settings.listen, api_tls).await?;
    for bound in &listeners {
        tracing::info!(address = %bound.addr, url = %bound.url(), "API listening");
    }
    let first = listeners
        .first()
        .map(|b| b.addr)
        .context("no API address to listen on")?;
    let api_url = match &settings.api_url {
        Some(url) => url.clone(),
        None => {
            let url =
                config::default_api_url(settings.public_url.as_deref(), first, settings.api_tls());
            tracing::info!(
                key = config::keys::DEPLOY_API_URL,
                value = %url,
                "default (from the API's public URL or first address: the ramdisk must reach it)"
            );
            url
        }
    };

    // 5. Stores, manager, background duties.
    let (duties_tx, duties_rx) = tokio::sync::watch::channel(false);
    let (objects_tx, objects_rx) = tokio::sync::watch::channel(false);
    let store = open_store(&settings, &api_runtime).await?;
    let objects = open_object_store(&settings, certs.objects, objects_rx).await?;
    let images = {
        let policy = crate::image_cache::FetchPolicy {
            extra_ca_pem: certs.api_ca_pem.clone(),
            ..Default::default()
        };
        let (dir, limit) = (settings.image_cache_dir.clone(), settings.image_cache_limit);
        tokio::task::spawn_blocking(move || {
            crate::image_cache::ImageCache::open_with(dir, limit, policy)
        })
        .await
        .context("opening the instance image cache")?
        .with_context(|| {
            format!(
                "opening the instance image cache {}",
                settings.image_cache_dir.display()
            )
        })?
    };
    // Netboot instances' boot ISOs, in the deploy container; the loaders directory is read
    // only when one is built, and ISOs are written next to the image cache, not in /tmp.
    let boot_isos = Arc::new(
        crate::boot::vmedia::boot_iso::BootIsos::new(
            Arc::clone(&objects),
            settings.container.clone(),
            settings.boot_loaders_dir.clone(),
        )
        .with_scratch_dir(settings.state_dir.clone())
        .with_cmdline_append(&settings.boot_iso_append)
        .with_temp_url_ttl(settings.boot_iso_ttl),
    );
    let (netboot_tx, netboot_rx) = tokio::sync::watch::channel(false);
    let netboot = match &settings.netboot {
        Some(netboot) => Some(start_netboot(netboot, netboot_rx).await?),
        None => None,
    };
    let deploy = Arc::new(DeployContext {
        store,
        objects,
        images: Some(images),
        boot_isos: Some(boot_isos),
        netboot,
        config: DeployConfig {
            api_url,
            api_ca_pem: certs.api_ca_pem,
            container: settings.container.clone(),
            deploy_helper_images_ttl: settings.deploy_helper_images_ttl,
            agent_allow_plain_http: settings.agent_allow_plain_http,
            agent_call_timeout: settings.agent_call_timeout,
            agent_power_off_wait: settings.agent_power_off_wait,
            ilo_defaults: settings.ilo.for_nodes(),
            iscsi_port: settings.iscsi_portal_port,
            done_port: settings.iscsi_done_port,
            done: Default::default(),
            iscsi_chap: settings.iscsi_chap.clone(),
        },
    });
    let manager = Arc::new(Manager::new(
        deploy,
        ManagerConfig {
            deploy_callback_timeout: settings.deploy_callback_timeout,
            power_sync_interval: settings.power_sync_interval,
            automated_clean: settings.automated_clean,
            conductor_name: settings.conductor_name.clone(),
            sync_power_state_workers: settings.sync_power_state_workers,
            conductor_group: settings.conductor_group.clone(),
            heartbeat_interval: settings.heartbeat_interval,
            heartbeat_timeout: settings.heartbeat_timeout,
        },
    ));
    // Node actions reach their conductor through its internal URL (crate::cluster::forward);
    // the certificates the ramdisk is given vouch for the other conductors too.
    let internal_url = settings
        .internal_url
        .clone()
        .unwrap_or_else(|| config::default_api_url(None, first, settings.api_tls()));
    let forward_trust = match &manager.deploy_context().config.api_ca_pem {
        Some(pem) => Trust::SystemAnd(PemCertificates::new("the API's CA", pem.clone())),
        None => Trust::System,
    };
    manager
        .enable_forwarding(Some(internal_url.clone()), forward_trust)
        .context("building the client that forwards node actions to other conductors")?;
    tracing::info!(internal_url = %internal_url, "other conductors reach this one at");
    manager
        .start_background(duties_rx)
        .await
        .context("recovering nodes left mid-task and starting the background duties")?;

    // 6. Serve until a signal, then drain.
    let in_flight = InFlight::default();
    let router = api::router(
        manager.clone(),
        ApiOptions {
            public_url: settings.public_url.clone(),
            max_body: settings.max_body,
            max_limit: settings.max_limit,
            callback_failures: settings.callback_failures,
        },
    );
    let app = app(router, files.htpasswd, in_flight.clone());
    tracing::info!(startup_ms = started.elapsed().as_millis() as u64, "serving");
    let shutdown = async move {
        let name = signalled.await;
        tracing::info!(signal = name, "shutting down");
    };
    let grace = settings.shutdown_grace;
    let drain_started = Instant::now();
    let report = listen::run(
        api_runtime.clone(),
        listeners,
        app,
        shutdown,
        grace,
        in_flight,
        settings.api_limits,
    )
    .await;
    if report.clean {
        tracing::info!("every request in flight finished");
    } else {
        for cut in &report.cut {
            tracing::warn!(
                request_id = %cut.id,
                method = %cut.method,
                path = %cut.path,
                running_s = cut.elapsed.as_secs(),
                "request cut at the end of the grace period"
            );
        }
    }
    let left = grace.saturating_sub(drain_started.elapsed());
    manager.drain(left.max(Duration::from_secs(1))).await;
    let _ = duties_tx.send(true);
    let _ = objects_tx.send(true);
    let _ = netboot_tx.send(true);
    // Node tasks have drained and the duties are told to stop: log out the Redfish sessions
    // they shared (a BMC has few session slots; bounded by CLOSE_ALL_WAIT, failures logged).
    crate::drivers::ilo::redfish::RedfishSessions::conductor()
        .close_all()
        .await;
    tracing::info!(requests_cut = report.cut.len(), "stopped");
    Ok(())
}

/// Opens the boot root and starts the netboot listeners (`[netboot]`); they stop when
/// `stop` turns true.
async fn start_netboot(
    settings: &config::netboot::NetbootSettings,
    stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Arc<crate::netboot::Netboot>> {
    let root = {
        let (dir, url) = (settings.root.clone(), settings.http_url.clone());
        tokio::task::spawn_blocking(move || crate::netboot::files::BootRoot::open(dir, url))
            .await
            .context("opening the boot root")??
    };
    let stopped = |mut stop: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    if let Some(addr) = settings.http_listen {
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!("binding the netboot HTTP listener {addr} (netboot.http_listen)")
        })?;
        let bound = listener.local_addr().context("the netboot HTTP address")?;
        tracing::info!(address = %bound, url = settings.http_url.as_deref().unwrap_or(""), root = %settings.root.display(), "netboot HTTP listening");
        tokio::spawn(crate::netboot::http::serve(
            listener,
            settings.root.clone(),
            stopped(stop.clone()),
        ));
    }
    if let Some(addr) = settings.tftp_listen {
        let server = crate::netboot::tftp::TftpServer::bind(
            addr,
            crate::netboot::tftp::TftpConfig::new(settings.root.clone()),
        )
        .await
        .with_context(|| format!("binding the TFTP listener {addr} (netboot.tftp_listen)"))?;
        tracing::info!(address = %server.local_addr(), root = %settings.root.display(), "netboot TFTP listening");
        let stop = stopped(stop.clone());
        tokio::spawn(async move {
            if let Err(e) = server.serve(stop).await {
                tracing::error!(error = %format!("{e:#}"), "netboot TFTP stopped");
            }
        });
    }
    Ok(Arc::new(crate::netboot::Netboot {
        root,
        deploy_kernel: settings.deploy_kernel.clone(),
        deploy_ramdisk: settings.deploy_ramdisk.clone(),
        append_params: settings.append_params.clone(),
        instance_append_params: settings.instance_append_params.clone(),
    }))
}

/// Raises the soft open-files limit to the hard one: every API connection, object-store
/// download, iSCSI session and database handle is a descriptor, and the usual soft limit of
/// 1,024 would make `accept` fail long before the connection limits do. Logs both limits.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        let err = std::io::Error::last_os_error();
        tracing::warn!(error = %err, "reading the open-files limit");
        return;
    }
    let was = limit.rlim_cur;
    if was < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads one rlimit from a struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            let err = std::io::Error::last_os_error();
            tracing::warn!(error = %err, soft = was, hard = limit.rlim_max, "raising the open-files limit");
            return;
        }
    }
    tracing::info!(
        soft = limit.rlim_max,
        hard = limit.rlim_max,
        was,
        "open-files limit"
    );
    tracing::info!(
        workers = tokio::runtime::Handle::try_current()
            .map(|h| h.metrics().num_workers())
            .unwrap_or(0),
        max_blocking = MAX_BLOCKING_THREADS,
        "runtime threads"
    );
}

fn create_state_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating the state directory {}", dir.display()))?;
    // The directory holds the database (BMC passwords) and the floppies (agent tokens, deploy
    // keys, CHAP secrets): private even when it was there already, as systemd's
    // `StateDirectory=` makes it 0755.
    let mode = std::fs::metadata(dir)
        .with_context(|| format!("reading the state directory {}", dir.display()))?
        .permissions()
        .mode()
        & 0o777;
    if mode != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} private (0700)", dir.display()))?;
        tracing::info!(dir = %dir.display(), was = %format!("{mode:04o}"), "state directory made private (0700)");
    }
    Ok(())
}

/// The certificates of the API and the built-in store.
struct Certificates {
    /// The API's, when it speaks TLS.
    api: Option<CertifiedKey>,
    /// The CAs the ramdisk trusts: the API's and the built-in store's.
    api_ca_pem: Option<String>,
    /// The built-in store's (always HTTPS), `None` for Swift.
    objects: Option<CertifiedKey>,
}

/// The API's certificate (configured, generated, or none) and the built-in store's (its own
/// configured one, else the API's configured one, else generated by the same CA; docs/architecture.md §6a).
fn certificates(
    settings: &Settings,
    api_files: Option<CertifiedKey>,
    objects_files: Option<CertifiedKey>,
) -> anyhow::Result<Certificates> {
    let builtin = match &settings.objects {
        ObjectsSettings::Builtin {
            listen, public_url, ..
        } => Some((*listen, public_url.clone())),
        ObjectsSettings::Swift(_) => None,
    };
    let api_auto = settings.tls == ApiTls::Auto;
    let objects_auto = builtin.is_some() && objects_files.is_none() && api_files.is_none();

    let mut generated = None;
    if api_auto || objects_auto {
        let mut addrs: Vec<SocketAddr> = Vec::new();
        let mut urls: Vec<&str> = Vec::new();
        if api_auto {
            addrs.extend(&settings.listen);
            urls.extend(settings.public_url.as_deref());
            urls.extend(settings.api_url.as_deref());
        }
        if let Some((listen, url)) = &builtin {
            if objects_auto {
                addrs.push(*listen);
                urls.extend(url.as_deref());
            }
        }
        let names = tls::names_for(&addrs, &urls);
        let auto = AutoTls::new(&settings.state_dir);
        let (cert, outcome) = auto
            .ensure(&names)
            .with_context(|| format!("making certificates in {}", auto.dir().display()))?;
        let names_list = names.iter().cloned().collect::<Vec<_>>().join(",");
        match outcome {
            AutoOutcome::CreatedCa => tracing::info!(
                dir = %auto.dir().display(), names = %names_list,
                "generated a CA and a server certificate (first start)"
            ),
            AutoOutcome::RenewedServer => tracing::info!(
                dir = %auto.dir().display(), names = %names_list,
                "made a new server certificate with the kept CA (names changed or near expiry)"
            ),
            AutoOutcome::Reused => tracing::info!(
                dir = %auto.dir().display(), names = %names_list,
                "reusing the generated CA and server certificate"
            ),
        }
        generated = Some(cert);
    }

    let (api, api_ca_pem) = match (&settings.tls, api_files) {
        (ApiTls::Files(_), Some(cert)) => {
            tracing::info!("API TLS: configured certificate");
            let ca = cert.ca_pem.clone();
            (Some(cert), ca)
        }
        (ApiTls::Auto, _) => {
            let cert = generated
                .as_ref()
                .context("the generated certificate is missing")?;
            tracing::info!("API TLS: auto (generated CA; the ramdisk gets it on its floppy)");
            let copy = CertifiedKey {
                chain: cert.chain.clone(),
                key: cert.key.clone_key(),
                ca_pem: cert.ca_pem.clone(),
            };
            let ca = copy.ca_pem.clone();
            (Some(copy), ca)
        }
        _ => {
            tracing::info!("API TLS: off (plain HTTP)");
            (None, None)
        }
    };

    let objects = if builtin.is_none() {
        None
    } else if let Some(cert) = objects_files {
        tracing::info!("object store TLS: its configured certificate");
        Some(cert)
    } else if objects_auto {
        tracing::info!(
            "object store TLS: generated certificate (same CA; iLOs do not check it, docs/architecture.md §6a)"
        );
        generated
    } else if let Some(cert) = &api {
        tracing::info!("object store TLS: the API's configured certificate");
        Some(CertifiedKey {
            chain: cert.chain.clone(),
            key: cert.key.clone_key(),
            ca_pem: cert.ca_pem.clone(),
        })
    } else {
        anyhow::bail!("no certificate for the built-in object store")
    };
    // The ramdisk trusts only what its floppy carries (`ipa-agent-ca`): the API's CA and,
    // because the agent downloads images from the built-in store's temp URLs over HTTPS, the
    // store's CA too, even when the API itself is plain HTTP on loopback.
    let mut ramdisk_cas: Vec<String> = Vec::new();
    for pem in [
        api_ca_pem,
        objects.as_ref().and_then(|cert| cert.ca_pem.clone()),
    ]
    .into_iter()
    .flatten()
    {
        if !ramdisk_cas.contains(&pem) {
            ramdisk_cas.push(pem);
        }
    }
    let api_ca_pem = (!ramdisk_cas.is_empty()).then(|| ramdisk_cas.concat());
    Ok(Certificates {
        api,
        api_ca_pem,
        objects,
    })
}

/// Opens the node store (`store.kind`): SQLite in the state directory, schema migrated.
/// PostgreSQL's connections run on `io` (the API's runtime; `PostgresStore::open_on`).
async fn open_store(
    settings: &Settings,
    io: &tokio::runtime::Handle,
) -> anyhow::Result<Arc<dyn Store>> {
    match settings.store {
        config::StoreKind::Sqlite => {
            let path = settings.sqlite_path.clone();
            // Opening runs the migrations: blocking work, off the async threads.
            let store =
                tokio::task::spawn_blocking(move || crate::store::sqlite::SqliteStore::open(&path))
                    .await
                    .context("opening the SQLite store")?
                    .with_context(|| {
                        format!(
                            "opening the SQLite store {}",
                            settings.sqlite_path.display()
                        )
                    })?;
            tracing::info!(path = %settings.sqlite_path.display(), "node store: sqlite");
            Ok(store)
        }
        config::StoreKind::Postgresql => {
            let config = settings
                .postgres
                .as_ref()
                .context("store.kind is postgresql but [database] was not resolved")?;
            let store = open_postgres(config, io).await?;
            let (_, max) = store.connections();
            tracing::info!(
                database = %store.target(), max_connections = max,
                "node store: postgresql"
            );
            Ok(store)
        }
    }
}

/// How long `serve` keeps trying to reach PostgreSQL at start (a conductor started with its
/// database, or while the database restarts, waits for it rather than exiting).
const DATABASE_START_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Opens the PostgreSQL store, retrying while the server cannot be reached (never on a refused
/// login or a schema newer than this binary: waiting would not change those).
async fn open_postgres(
    config: &crate::store::postgres::PostgresConfig,
    io: &tokio::runtime::Handle,
) -> anyhow::Result<Arc<crate::store::postgres::PostgresStore>> {
    use crate::net::retry::{RetryError, RetryPolicy};
    use crate::store::postgres::PostgresStore;
    use crate::store::StoreError;
    let policy = RetryPolicy::new(u32::MAX, std::time::Duration::from_millis(500))
        .capped_at(std::time::Duration::from_secs(5))
        .with_deadline(DATABASE_START_WAIT);
    policy
        .run(
            |e: &StoreError| matches!(e, StoreError::Unavailable(_)),
            |retry| {
                tracing::warn!(
                    error = %retry.error, retry_in_ms = retry.pause.as_millis() as u64,
                    "PostgreSQL not reachable yet"
                )
            },
            |_| PostgresStore::open_on(config, Some(io.clone())),
        )
        .await
        .map_err(|e| match e {
            RetryError::DeadlineExceeded { attempts } => anyhow::anyhow!(
                "opening the PostgreSQL store: not reachable within {} s ({attempts} attempts)",
                DATABASE_START_WAIT.as_secs()
            ),
            other => match other.into_last() {
                Some(e) => anyhow::anyhow!("opening the PostgreSQL store: {e}"),
                None => anyhow::anyhow!("opening the PostgreSQL store failed"),
            },
        })
}

/// The object store of `[objects]`: the built-in store, started here on its own HTTPS port
/// (docs/architecture.md §6a), or a Swift client.
async fn open_object_store(
    settings: &Settings,
    cert: Option<CertifiedKey>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<Arc<dyn ObjectStore>> {
    use crate::net::https::TlsVerify;
    use crate::objects::builtin::{BuiltinConfig, BuiltinStore};
    use crate::objects::swift::{SwiftAuth, SwiftConfig, SwiftStore};
    use vmdeploy_shared::secret::Secret;
    match &settings.objects {
        ObjectsSettings::Builtin {
            root,
            listen,
            public_url,
            ..
        } => {
            let cert = cert.context("no certificate for the built-in object store")?;
            let key = builtin_temp_url_key(&settings.state_dir)?;
            let (store, bound) = BuiltinStore::start(
                BuiltinConfig {
                    root: root.clone(),
                    listen: *listen,
                    public_url: public_url.clone(),
                    temp_url_key: Secret::new(key),
                    tls: cert.server_config()?,
                },
                shutdown,
            )
            .await
            .with_context(|| format!("starting the built-in object store on {listen}"))?;
            tracing::info!(
                address = %bound,
                url = %public_url.clone().unwrap_or_else(|| format!("https://{bound}")),
                dir = %root.display(),
                "object store listening (builtin)"
            );
            Ok(store)
        }
        ObjectsSettings::Swift(swift) => {
            let auth = if swift.auth_version == 1 {
                SwiftAuth::TempAuth {
                    url: swift.auth_url.clone(),
                    user: swift.user.clone(),
                    key: swift.key.clone(),
                }
            } else {
                SwiftAuth::Keystone {
                    auth_url: swift.auth_url.clone(),
                    username: swift.user.clone(),
                    password: swift.key.clone(),
                    project_name: swift.project.clone().unwrap_or_default(),
                    user_domain_name: swift
                        .user_domain
                        .clone()
                        .unwrap_or_else(|| "Default".into()),
                    project_domain_name: swift
                        .project_domain
                        .clone()
                        .unwrap_or_else(|| "Default".into()),
                    region: swift.region.clone(),
                    interface: swift.interface.clone().unwrap_or_else(|| "public".into()),
                }
            };
            let mut config = SwiftConfig::new(auth);
            config.temp_url_key = swift.temp_url_key.clone();
            config.tls = match &swift.verify_ca {
                Some(config::VerifyCa::Enabled(false)) => TlsVerify::Insecure,
                Some(config::VerifyCa::File(path)) => TlsVerify::CaFile(path.clone()),
                Some(config::VerifyCa::Enabled(true)) | None => TlsVerify::System,
            };
            if let Some(seconds) = swift.timeout {
                config.timeout = Duration::from_secs(seconds);
            }
            let store = SwiftStore::new(config).context("setting up the Swift object store")?;
            tracing::info!(auth_url = %swift.auth_url, "object store: swift");
            Ok(Arc::new(store))
        }
    }
}

/// The built-in store's temp-URL key: made at first start (256 random bits, hex) and kept in
/// `<state>/objects-temp-url-key` (0600), so temp URLs handed out before a restart stay valid.
pub fn builtin_temp_url_key(state_dir: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = state_dir.join("objects-temp-url-key");
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => return Ok(text.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("reading random bytes: {e}"))?;
    let key = hex::encode(bytes);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(key.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// systemd's `StateDirectory=` makes the directory 0755 before the conductor starts: it
    /// is made private all the same, and a new one is made private too.
    #[test]
    fn the_state_directory_is_private_however_it_was_found() {
        let base = tempfile::tempdir().expect("temp dir");
        let found = base.path().join("found");
        std::fs::create_dir(&found).expect("mkdir");
        std::fs::set_permissions(&found, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let new = base.path().join("new/state");
        for dir in [&found, &new] {
            create_state_dir(dir).expect("made");
            let mode = std::fs::metadata(dir).expect("stat").permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", dir.display());
        }
    }
}
