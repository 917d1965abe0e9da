//! `vmdeploy-conductor iscsi write FILE | read OUT | capacity | discover`
//! `--portal ADDR:PORT --iqn IQN [--lun N] [--chap USER:SECRET]`.
//!
//! `write` writes a local image to the LUN from offset 0 (then SYNCHRONIZE CACHE), `read` reads
//! the whole LUN to a file, `capacity` prints the LUN size in bytes, `discover` lists the portal's
//! targets (SendTargets).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use vmdeploy_shared::exit::UsageError;
use vmdeploy_shared::iscsi::chap::ChapCredentials;

use super::pipeline::{read_to_file, write_file, DEFAULT_QUEUE_DEPTH};
use super::{discover, Session, SessionConfig};

/// Arguments of `vmdeploy-conductor iscsi`.
#[derive(clap::Args, Debug)]
pub struct IscsiArgs {
    /// What to do.
    #[command(subcommand)]
    pub op: IscsiOp,
    /// Target portal, `ADDR:PORT`.
    #[arg(long, global = true)]
    pub portal: Option<String>,
    /// Target name (`iqn.yyyy-mm.domain:name`, or Ironic's `iqn-<node uuid>`).
    #[arg(long, global = true)]
    pub iqn: Option<String>,
    /// Logical unit number.
    #[arg(long, global = true, default_value_t = 1)]
    pub lun: u16,
    /// CHAP credentials the target checks, `USER:SECRET`.
    #[arg(
        long,
        global = true,
        env = "VMDEPLOY_ISCSI_CHAP",
        hide_env_values = true
    )]
    pub chap: Option<String>,
    /// Mutual CHAP: credentials the target must prove, `USER:SECRET`.
    #[arg(
        long,
        global = true,
        env = "VMDEPLOY_ISCSI_MUTUAL_CHAP",
        hide_env_values = true
    )]
    pub mutual_chap: Option<String>,
    /// Our initiator name.
    #[arg(long, global = true)]
    pub initiator_name: Option<String>,
    /// Ask for CRC32C header and data digests (the target may still refuse them).
    #[arg(long, global = true)]
    pub digests: bool,
    /// FirstBurstLength to offer (unsolicited bytes per WRITE; the target may lower it).
    #[arg(long, global = true)]
    pub first_burst: Option<u32>,
    /// Commands kept in flight by `write` and `read`.
    #[arg(long, global = true, default_value_t = DEFAULT_QUEUE_DEPTH)]
    pub depth: usize,
}

/// The operations.
#[derive(clap::Subcommand, Debug)]
pub enum IscsiOp {
    /// Write a local image file to the LUN from offset 0.
    Write {
        /// The image (raw).
        file: PathBuf,
    },
    /// Read the whole LUN into a file.
    Read {
        /// Where to write it.
        out: PathBuf,
    },
    /// Print the LUN size in bytes.
    Capacity,
    /// List the portal's targets (SendTargets=All).
    Discover,
}

fn config(args: &IscsiArgs, need_iqn: bool) -> anyhow::Result<SessionConfig> {
    let portal = args
        .portal
        .clone()
        .context("--portal ADDR:PORT is required")?;
    let iqn = match (&args.iqn, need_iqn) {
        (Some(iqn), _) => iqn.clone(),
        (None, true) => anyhow::bail!("--iqn IQN is required"),
        (None, false) => String::new(),
    };
    let mut config = SessionConfig::new(portal, iqn, args.lun);
    if let Some(chap) = &args.chap {
        config.chap = Some(chap.parse::<ChapCredentials>().context("parsing --chap")?);
    }
    if let Some(chap) = &args.mutual_chap {
        anyhow::ensure!(config.chap.is_some(), "--mutual-chap needs --chap as well");
        config.mutual_chap = Some(
            chap.parse::<ChapCredentials>()
                .context("parsing --mutual-chap")?,
        );
    }
    if let Some(bytes) = args.first_burst {
        anyhow::ensure!(
            (512..=(1 << 24) - 1).contains(&bytes),
            "--first-burst must be 512 to 16777215 bytes"
        );
        config.params.first_burst_length = bytes;
        config.params.max_burst_length = config.params.max_burst_length.max(bytes);
    }
    config.params.header_digest = args.digests;
    config.params.data_digest = args.digests;
    if let Some(name) = &args.initiator_name {
        config.initiator_name = name.clone();
    }
    Ok(config)
}

/// Runs an iSCSI operator command.
pub fn run(args: IscsiArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: IscsiArgs) -> anyhow::Result<()> {
    match &args.op {
        IscsiOp::Discover => {
            let config = config(&args, false).map_err(UsageError::wrap)?;
            let targets = discover(&config)
                .await
                .with_context(|| format!("discovering targets at {}", config.portal))?;
            for t in targets {
                println!("{} {}", t.name, t.addresses.join(" "));
            }
            Ok(())
        }
        IscsiOp::Capacity => {
            let config = config(&args, true).map_err(UsageError::wrap)?;
            let session = Session::open(&config)
                .await
                .with_context(|| format!("logging in to {} at {}", config.target, config.portal))?;
            println!("{}", session.size_bytes());
            session.logout().await.context("logging out")?;
            Ok(())
        }
        IscsiOp::Write { file } => {
            let config = config(&args, true).map_err(UsageError::wrap)?;
            // Fail on a missing image before touching the target.
            std::fs::metadata(file).with_context(|| format!("opening {}", file.display()))?;
            let session = Session::open(&config)
                .await
                .with_context(|| format!("logging in to {} at {}", config.target, config.portal))?;
            let started = Instant::now();
            let written = write_file(&session, file, args.depth)
                .await
                .with_context(|| format!("writing {} to {}", file.display(), config.target))?;
            let secs = started.elapsed().as_secs_f64();
            session.logout().await.context("logging out")?;
            println!(
                "wrote {written} bytes in {secs:.2} s ({:.0} MB/s)",
                written as f64 / secs.max(1e-9) / 1e6
            );
            Ok(())
        }
        IscsiOp::Read { out } => {
            let config = config(&args, true).map_err(UsageError::wrap)?;
            let session = Session::open(&config)
                .await
                .with_context(|| format!("logging in to {} at {}", config.target, config.portal))?;
            let started = Instant::now();
            let read = read_to_file(&session, out, args.depth)
                .await
                .with_context(|| format!("reading {} into {}", config.target, out.display()))?;
            let secs = started.elapsed().as_secs_f64();
            session.logout().await.context("logging out")?;
            println!(
                "read {read} bytes in {secs:.2} s ({:.0} MB/s)",
                read as f64 / secs.max(1e-9) / 1e6
            );
            Ok(())
        }
    }
}
