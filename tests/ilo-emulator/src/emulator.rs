//! Starting and stopping a set of emulated iLOs in one process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::config::{EmulatorConfig, TlsSource};
use crate::fault::FaultSpec;
use crate::media_fetch::MediaFetcher;
use crate::server::{Server, ServerSnapshot};
use crate::tls;
use vmdeploy_shared::error::Chain;

/// Each server holds a listener and its clients' connections: raise the soft open-file limit
/// to the hard one when many servers run in one process (the 1000-node scale test).
fn raise_fd_limit(servers: usize) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    let wanted = (servers as u64).saturating_mul(4).saturating_add(256);
    if soft < wanted && soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::info!(from = soft, to = hard, "raised the open-file limit"),
            Err(e) => {
                tracing::warn!(error = %Chain(&e), soft, hard, "could not raise the open-file limit")
            }
        }
    }
}

/// A running emulator; dropping it stops the servers.
pub struct Emulator {
    servers: Vec<Arc<Server>>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    cert_pem: String,
    cert_path: Option<PathBuf>,
    gauge: Arc<crate::server::RequestGauge>,
}

impl std::fmt::Debug for Emulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Emulator")
            .field("addresses", &self.addresses())
            .field("cert_path", &self.cert_path)
            .finish_non_exhaustive()
    }
}

impl Emulator {
    /// Binds every server (server `i` on `listen.port() + i`, or ephemeral ports when the port
    /// is 0) and starts serving. Must run inside a tokio runtime.
    pub async fn start(config: EmulatorConfig) -> anyhow::Result<Emulator> {
        anyhow::ensure!(config.servers > 0, "at least one server is needed");
        raise_fd_limit(config.servers);
        let (material, cert_path) = match &config.tls {
            TlsSource::Pem { cert, key } => (tls::from_pem_files(cert, key)?, Some(cert.clone())),
            TlsSource::SelfSigned { write_cert_to } => {
                let m = tls::self_signed(config.listen.ip())?;
                if let Some(path) = write_cert_to {
                    std::fs::write(path, &m.cert_pem).with_context(|| {
                        format!("writing the certificate to {}", path.display())
                    })?;
                }
                (m, write_cert_to.clone())
            }
        };
        let acceptor = TlsAcceptor::from(material.config);
        let server_config = Arc::new(config.server.clone());
        let mut listeners = Vec::with_capacity(config.servers);
        for i in 0..config.servers {
            let port = if config.listen.port() == 0 {
                0
            } else {
                u16::try_from(usize::from(config.listen.port()) + i)
                    .context("server ports run past 65535")?
            };
            let addr = SocketAddr::new(config.listen.ip(), port);
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding server {i} to {addr}"))?;
            let bound = listener.local_addr().context("reading the bound address")?;
            listeners.push((listener, bound));
        }
        let (shutdown, rx) = watch::channel(false);
        let gauge = Arc::new(crate::server::RequestGauge::default());
        let mut servers = Vec::with_capacity(config.servers);
        let mut tasks = Vec::with_capacity(config.servers);
        for (i, (listener, bound)) in listeners.into_iter().enumerate() {
            let source = media_source(config.listen.ip(), i);
            let fetcher =
                MediaFetcher::from(source).context("building the virtual media HTTP client")?;
            let server = Arc::new(Server::new(
                i,
                bound,
                server_config.clone(),
                (config.backend)(i),
                fetcher,
                Arc::clone(&gauge),
            ));
            server
                .sync_from_backend()
                .await
                .with_context(|| format!("reading server {i}'s firmware boot mode"))?;
            if let Some(mut events) = server.take_machine_events() {
                // A weak reference: the forwarder must not keep the server (and its machine)
                // alive once the emulator is dropped.
                let weak = Arc::downgrade(&server);
                tokio::spawn(async move {
                    while let Some(event) = events.recv().await {
                        let Some(server) = weak.upgrade() else { break };
                        server.machine_event(event).await;
                    }
                });
            }
            if server.console_log().is_some() {
                // The IML's time stamps are when the firmware printed a refusal, to the second.
                let weak = Arc::downgrade(&server);
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
                    loop {
                        tick.tick().await;
                        let Some(server) = weak.upgrade() else { break };
                        server.scan_console();
                    }
                });
            }
            tracing::info!(server = i, address = %bound, product = %server_config.product, "emulated iLO listening");
            tasks.push(tokio::spawn(crate::http::serve(
                server.clone(),
                listener,
                acceptor.clone(),
                rx.clone(),
            )));
            servers.push(server);
        }
        Ok(Emulator {
            servers,
            shutdown,
            tasks,
            cert_pem: material.cert_pem,
            cert_path,
            gauge,
        })
    }

    /// The servers, by index.
    pub fn servers(&self) -> &[Arc<Server>] {
        &self.servers
    }

    /// Requests answered at once across every server (the most since start or reset).
    pub fn requests_at_once(&self) -> &crate::server::RequestGauge {
        &self.gauge
    }

    /// Server `i`.
    pub fn server(&self, i: usize) -> Option<&Arc<Server>> {
        self.servers.get(i)
    }

    /// Every server's address, by index.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.servers.iter().map(|s| s.address).collect()
    }

    /// The TLS certificate (PEM) clients may pin.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Where the certificate was written, if it was.
    pub fn cert_path(&self) -> Option<&std::path::Path> {
        self.cert_path.as_deref()
    }

    /// The state of server `i`.
    pub async fn state(&self, i: usize) -> Option<ServerSnapshot> {
        match self.servers.get(i) {
            Some(s) => Some(s.snapshot().await),
            None => None,
        }
    }

    /// Queues a fault on server `i`; false when there is no such server.
    pub fn inject_fault(&self, i: usize, spec: FaultSpec) -> bool {
        match self.servers.get(i) {
            Some(s) => {
                s.inject_fault(spec);
                true
            }
            None => false,
        }
    }

    /// Stops every server and waits for the accept loops to end.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks.drain(..) {
            let _ = task.await;
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// The address server `index` reads its virtual media from: on a loopback emulator each server
/// its own, `127.1.x.y` (Linux routes all of 127/8 to `lo`), as each real BMC has its own
/// address; elsewhere the system's choice.
fn media_source(listen: std::net::IpAddr, index: usize) -> Option<std::net::IpAddr> {
    match listen {
        std::net::IpAddr::V4(v4) if v4.is_loopback() => {
            let n = u16::try_from(index + 1).ok()?;
            let [hi, lo] = n.to_be_bytes();
            Some(std::net::IpAddr::V4(std::net::Ipv4Addr::new(
                127, 1, hi, lo,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_loopback_server_reads_media_from_its_own_address() {
        let lo = std::net::IpAddr::from([127, 0, 0, 1]);
        assert_eq!(
            media_source(lo, 0),
            Some(std::net::IpAddr::from([127, 1, 0, 1]))
        );
        assert_eq!(
            media_source(lo, 999),
            Some(std::net::IpAddr::from([127, 1, 3, 232]))
        );
        assert_eq!(media_source(std::net::IpAddr::from([10, 0, 0, 5]), 0), None);
        assert_eq!(media_source(lo, 70_000), None);
    }
}
