//! `ilo-emulator`: emulated iLOs (RIBCL + Redfish over HTTPS) for tests and demos.
//!
//! ```text
//! ilo-emulator --listen ADDR:PORT [--servers N] [--username U --password P]
//!              [--tls-cert PEM --tls-key PEM] [--license standard|advanced] [--product NAME]
//! ```
//! Server i of N answers on PORT+i. Without a certificate a self-signed one is made (SAN = the
//! listen IP), written to a file, and its path printed. See README.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use vmdeploy_ilo_emulator::backend::{Backend, InMemoryBackend};
use vmdeploy_ilo_emulator::config::{EmulatorConfig, ServerConfig, TlsSource, DEFAULT_PRODUCT};
use vmdeploy_ilo_emulator::state::{BootMode, License};
use vmdeploy_ilo_emulator::Emulator;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LicenseArg {
    Standard,
    Advanced,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BootModeArg {
    Legacy,
    Uefi,
}

/// Emulated HP iLOs: RIBCL and Redfish over HTTPS, one port per server.
#[derive(Debug, Parser)]
#[command(name = "ilo-emulator", version)]
struct Args {
    /// Address of server 0; server i listens on PORT+i (PORT 0: ephemeral ports).
    #[arg(long)]
    listen: SocketAddr,
    /// Number of emulated servers.
    #[arg(long, default_value_t = 1)]
    servers: usize,
    /// Login accepted by every server.
    #[arg(long, default_value = "Administrator", requires = "password")]
    username: String,
    /// Password accepted by every server.
    #[arg(long, default_value = "password")]
    password: String,
    /// TLS certificate chain (PEM); without it a self-signed certificate is made.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Where to write the self-signed certificate (default: a file in the temp directory).
    #[arg(long, conflicts_with = "tls_cert")]
    cert_out: Option<PathBuf>,
    /// Installed licence: standard has no virtual media, as on real iLO.
    #[arg(long, value_enum, default_value = "advanced")]
    license: LicenseArg,
    /// Product name (GET_PRODUCT_NAME); keep "Gen9"/"Gen10" out of it to keep proliantutils on RIBCL.
    #[arg(long, default_value = DEFAULT_PRODUCT)]
    product: String,
    /// Boot mode of a fresh server.
    #[arg(long, value_enum, default_value = "legacy")]
    boot_mode: BootModeArg,
}

fn main() -> std::process::ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            // Bad configuration exits 64 (EX_USAGE), help/version exit 0.
            return std::process::ExitCode::from(if e.use_stderr() { 64 } else { 0 });
        }
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ilo-emulator: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ilo-emulator: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let tls = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => TlsSource::Pem { cert, key },
        _ => TlsSource::SelfSigned {
            write_cert_to: Some(args.cert_out.unwrap_or_else(|| {
                std::env::temp_dir().join(format!("ilo-emulator-{}-cert.pem", std::process::id()))
            })),
        },
    };
    let config = EmulatorConfig {
        listen: args.listen,
        servers: args.servers,
        server: ServerConfig {
            username: args.username,
            password: args.password,
            product: args.product,
            license: match args.license {
                LicenseArg::Standard => License::Standard,
                LicenseArg::Advanced => License::Advanced,
            },
            boot_mode: match args.boot_mode {
                BootModeArg::Legacy => BootMode::Legacy,
                BootModeArg::Uefi => BootMode::Uefi,
            },
            ..ServerConfig::default()
        },
        tls,
        backend: Arc::new(|_| Arc::new(InMemoryBackend) as Arc<dyn Backend>),
    };
    let emulator = Emulator::start(config)
        .await
        .context("starting the emulated iLOs")?;
    // Machine-readable start-up lines on stdout (tests wait for "ready").
    if let Some(path) = emulator.cert_path() {
        println!("tls-cert {}", path.display());
    }
    for (i, addr) in emulator.addresses().iter().enumerate() {
        println!("server {i} https://{addr}");
    }
    println!("ready");
    wait_for_signal().await?;
    tracing::info!("shutting down");
    emulator.shutdown().await;
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C"),
        _ = term.recv() => Ok(()),
    }
}
