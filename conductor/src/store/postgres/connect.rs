//! From `[database]` to a pool of connections: the URL (libpq's `postgresql://` form, as
//! tokio-postgres reads it), the password file, TLS, the pool's bounds.
//!
//! TLS: tokio-postgres follows the URL's `sslmode` (`disable`, `prefer`, the default, or
//! `require`). Whenever TLS is used, the server's certificate is verified, against
//! `database.ca_file` when it is set, else the system's trust store: stronger than libpq's
//! `require` (which does not verify), like its `verify-full`. A Unix socket never uses TLS.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::config::Host;
use tokio_postgres_rustls::MakeRustlsConnect;
use vmdeploy_shared::secret::Secret;

use crate::store::StoreError;

/// How long a call waits for a free pooled connection, and a new connection may take.
pub(super) const POOL_WAIT: Duration = Duration::from_secs(10);

/// `[database]` for PostgreSQL.
#[derive(Debug, Clone, PartialEq)]
pub struct PostgresConfig {
    /// `postgresql://user@host:port/database?sslmode=...` (a password in the URL works, but
    /// `password_file` keeps it out of the configuration file; masked in `Debug`).
    pub url: Secret,
    /// A file whose content (trailing newline removed) is the password.
    pub password_file: Option<PathBuf>,
    /// CA certificates (PEM) the server's certificate must chain to.
    pub ca_file: Option<PathBuf>,
    /// The most connections this conductor opens.
    pub max_connections: usize,
}

/// The settings of a `postgresql://` URL, which must name a user and a database. The message of
/// an error never repeats the URL (it may hold a password).
pub fn parse_url(url: &str) -> Result<tokio_postgres::Config, String> {
    let pg =
        tokio_postgres::Config::from_str(url).map_err(|e| format!("not a PostgreSQL URL: {e}"))?;
    if pg.get_user().is_none() {
        return Err("names no user (postgresql://USER@host/database)".into());
    }
    if pg.get_dbname().is_none() {
        return Err("names no database (postgresql://user@host/DATABASE)".into());
    }
    Ok(pg)
}

/// The connection settings of `config`, with the password read from its file.
pub(super) fn client_config(config: &PostgresConfig) -> Result<tokio_postgres::Config, StoreError> {
    let mut pg = parse_url(config.url.expose())
        .map_err(|e| StoreError::Database(format!("database.url {e}")))?;
    if let Some(path) = &config.password_file {
        if pg.get_password().is_some() {
            return Err(StoreError::Database(
                "database.url has a password and database.password_file is set: keep one".into(),
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| {
            StoreError::Database(format!(
                "reading database.password_file {}: {e}",
                path.display()
            ))
        })?;
        let password = text.trim_end_matches(['\n', '\r']);
        if password.is_empty() {
            return Err(StoreError::Database(format!(
                "database.password_file {} is empty",
                path.display()
            )));
        }
        pg.password(password);
    }
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(POOL_WAIT);
    }
    if pg.get_application_name().is_none() {
        pg.application_name("vmdeploy-conductor");
    }
    Ok(pg)
}

/// How `database.max_connections` is shared: the writers' pool and, when there are at least
/// two connections, a quarter (at least one) kept for standalone reads.
pub(super) fn split_connections(max: usize) -> (usize, Option<usize>) {
    let max = max.max(1);
    if max < 2 {
        return (max, None);
    }
    let reads = (max / 4).max(1);
    (max - reads, Some(reads))
}

/// Opens connections, and runs each connection's task, on `io` when given (else on the
/// caller's runtime, as deadpool would).
///
/// A tokio-postgres connection is a task that carries every query and answer between the
/// socket and its client. The service gives it the API's runtime (`crate::service::run`): on
/// the runtime of the node tasks, an operator's read waited for that task's turn behind a
/// thousand deploys' ready tasks (p99 385 ms with 1,000 concurrent deploys), however free the
/// connection was. The socket is opened on the same runtime, whose reactor then watches it.
struct ConnectOn {
    tls: MakeRustlsConnect,
    io: Option<tokio::runtime::Handle>,
}

type Connected = (tokio_postgres::Client, tokio::task::JoinHandle<()>);

impl ConnectOn {
    async fn open(
        pg: tokio_postgres::Config,
        tls: MakeRustlsConnect,
    ) -> Result<Connected, tokio_postgres::Error> {
        let (client, connection) = pg.connect(tls).await?;
        let task = tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::warn!(error = %e, "a PostgreSQL connection ended with an error");
            }
        });
        Ok((client, task))
    }
}

impl deadpool_postgres::Connect for ConnectOn {
    fn connect(
        &self,
        pg: &tokio_postgres::Config,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Connected, tokio_postgres::Error>> + Send + '_>,
    > {
        let (pg, tls) = (pg.clone(), self.tls.clone());
        let io = self.io.clone();
        Box::pin(async move {
            if let Some(io) = io {
                // A join error means that runtime is shutting down: open it here instead.
                if let Ok(opened) = io.spawn(Self::open(pg.clone(), tls.clone())).await {
                    return opened;
                }
            }
            Self::open(pg, tls).await
        })
    }
}

/// A pool of at most `size` connections over `pg`, verifying TLS against `ca_file` or the
/// system's trust store; connections run on `io` ([`ConnectOn`]).
pub(super) fn pool(
    pg: tokio_postgres::Config,
    config: &PostgresConfig,
    size: usize,
    io: Option<tokio::runtime::Handle>,
) -> Result<Pool, StoreError> {
    crate::net::https::install_crypto_provider();
    let tls = match &config.ca_file {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                StoreError::Database(format!("reading database.ca_file {}: {e}", path.display()))
            })?;
            let mut roots = rustls::RootCertStore::empty();
            let mut found = 0;
            use rustls_pki_types::pem::PemObject as _;
            for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| {
                    StoreError::Database(format!("database.ca_file {}: {e}", path.display()))
                })?;
                roots.add(cert).map_err(|e| {
                    StoreError::Database(format!("database.ca_file {}: {e}", path.display()))
                })?;
                found += 1;
            }
            if found == 0 {
                return Err(StoreError::Database(format!(
                    "database.ca_file {} holds no PEM certificate",
                    path.display()
                )));
            }
            rustls::ClientConfig::builder()
                .with_root_certificates(roots)
                .with_no_client_auth()
        }
        None => {
            use rustls_platform_verifier::ConfigVerifierExt as _;
            rustls::ClientConfig::with_platform_verifier().map_err(|e| {
                StoreError::Database(format!("loading the system's trusted certificates: {e}"))
            })?
        }
    };
    let connect = ConnectOn {
        tls: MakeRustlsConnect::new(tls),
        io,
    };
    let manager = Manager::from_connect(
        pg,
        connect,
        ManagerConfig {
            // A connection the server closed is noticed at checkout (`is_closed`); one that died
            // silently fails its next statement, which is then `Unavailable`.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size.max(1))
        .wait_timeout(Some(POOL_WAIT))
        .create_timeout(Some(POOL_WAIT))
        .recycle_timeout(Some(POOL_WAIT))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| StoreError::Database(format!("building the connection pool: {e}")))
}

/// `user@host:port/database` of `pg`, without its password: for logs and errors.
pub fn describe(pg: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = pg
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = pg
                .get_ports()
                .get(i)
                .or(pg.get_ports().first())
                .copied()
                .unwrap_or(5432);
            match host {
                Host::Tcp(name) => format!("{name}:{port}"),
                Host::Unix(path) => format!("{}/.s.PGSQL.{port}", path.display()),
            }
        })
        .collect();
    format!(
        "{}@{}/{}",
        pg.get_user().unwrap_or("?"),
        if hosts.is_empty() {
            "localhost:5432".to_string()
        } else {
            hosts.join(",")
        },
        pg.get_dbname().unwrap_or("?")
    )
}
