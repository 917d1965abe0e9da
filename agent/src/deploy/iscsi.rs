//! The `iscsi_ilo` / `pxe_ilo` flow: serve the node's disk over iSCSI, tell the conductor with
//! `pass_deploy_info`, wait for its `done`, stop, flush
//! (docs/ironic-protocols.md §2.2–2.5, docs/architecture.md §4).
//!
//! # Design
//! Both listeners (the target's and the `done` one) are bound BEFORE `pass_deploy_info` is sent:
//! the conductor logs in the moment it has the address, and connects to port 10000 as soon as it
//! has written the image. Every failure here is sent to the conductor in `error` (a missing disk,
//! a port in use) so the deploy fails at once with a reason instead of after
//! `deploy_callback_timeout`.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use vmdeploy_shared::params::IscsiDeployParams;

use super::report::Reporter;
use crate::disk::select::{self, BlockDevice};
use crate::init::FinalAction;
use crate::target::server::{Target, TargetConfig};

/// Everything the iSCSI flow needs.
#[derive(Debug, Clone)]
pub struct IscsiConfig {
    /// The checked parameters.
    pub params: IscsiDeployParams,
    /// The address the conductor reaches the target at (`address` in pass_deploy_info).
    pub advertise: IpAddr,
    /// The target's listen address (0.0.0.0:3260 in the ramdisk).
    pub iscsi_listen: SocketAddr,
    /// The `done` listener's address (0.0.0.0:10000 in the ramdisk).
    pub done_listen: SocketAddr,
    /// Longest wait for `done` after pass_deploy_info was accepted.
    pub done_timeout: Duration,
    /// The virtual floppy's device: never the install disk.
    pub floppy_device: Option<PathBuf>,
    /// `/sys/class/block`.
    pub sys_class_block: PathBuf,
    /// `/dev`.
    pub dev_dir: PathBuf,
    /// May a disk be picked without hints or a `disk` list? Only as PID 1: on a host (tests,
    /// operators) the first big disk is the host's own.
    pub allow_free_choice: bool,
}

/// iLO's virtual USB media (floppy, CD, USB key) show up as vendor `HP`/`HPE`, model
/// `Virtual ...` (e.g. "Virtual Floppy", "Virtual DVD-ROM").
pub fn is_virtual_media(d: &BlockDevice) -> bool {
    let vendor = d.vendor.trim().to_ascii_lowercase();
    (vendor == "hp" || vendor == "hpe" || vendor == "hp ilo")
        && d.model.to_ascii_lowercase().contains("virtual")
}

fn same_device(a: &Path, b: &Path) -> bool {
    a == b
        || match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        }
}

/// Why `d` must never be written, if it must not.
fn refusal(d: &BlockDevice, floppy: Option<&Path>) -> Option<String> {
    if floppy.is_some_and(|f| same_device(&d.path, f)) {
        return Some(format!(
            "refusing {}: it holds the virtual floppy",
            d.path.display()
        ));
    }
    if is_virtual_media(d) {
        return Some(format!(
            "refusing {}: it is iLO virtual media ({} {})",
            d.path.display(),
            d.vendor,
            d.model
        ));
    }
    None
}

/// Picks the install disk: hints, else the `disk` list, else the first fixed disk; never the
/// floppy, never virtual media, never removable or read-only (select.rs).
pub fn choose_disk(
    disks: &[BlockDevice],
    params: &IscsiDeployParams,
    floppy: Option<&Path>,
    allow_free_choice: bool,
) -> anyhow::Result<BlockDevice> {
    let hints = params.common.root_device.as_ref();
    let list = params.common.disks.join(",");
    let list = (!list.is_empty()).then_some(list.as_str());
    if hints.is_none() && list.is_none() {
        if !allow_free_choice {
            bail!(
                "neither root_device hints nor a disk list given, and not PID 1: refusing to \
                 pick this host's own disk"
            );
        }
        // Free choice: leave the refused devices (and loop devices) out of it.
        let candidates: Vec<BlockDevice> = disks
            .iter()
            .filter(|d| refusal(d, floppy).is_none() && !d.name.starts_with("loop"))
            .cloned()
            .collect();
        return select::select_disk(&candidates, None, None)
            .cloned()
            .map_err(crate::drivers::with_undriven_note);
    }
    let chosen =
        select::select_disk(disks, hints, list).map_err(crate::drivers::with_undriven_note)?;
    if let Some(why) = refusal(chosen, floppy) {
        bail!(why);
    }
    Ok(chosen.clone())
}

/// Runs the iSCSI deploy; reports every failure to the conductor before returning it.
pub fn run(cfg: IscsiConfig, reporter: &Reporter) -> anyhow::Result<FinalAction> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(serve_until_done(&cfg, reporter));
    runtime.shutdown_timeout(Duration::from_secs(1));
    let disk = result?;
    flush(&disk);
    Ok(FinalAction::Reboot)
}

/// The part that may fail before the conductor has the address: reported as `error`.
async fn prepare(cfg: &IscsiConfig) -> anyhow::Result<(PathBuf, tokio::net::TcpListener, Target)> {
    let disks = select::list_disks(&cfg.sys_class_block, &cfg.dev_dir, true)
        .context("listing the disks")?;
    tracing::info!(
        disks = ?disks.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        "disks found"
    );
    let disk = choose_disk(
        &disks,
        &cfg.params,
        cfg.floppy_device.as_deref(),
        cfg.allow_free_choice,
    )
    .context("choosing the install disk")?;
    tracing::info!(
        disk = %disk.path.display(),
        size = disk.size,
        model = %disk.model,
        "install disk chosen"
    );
    let iqn = &cfg.params.iscsi_target_iqn;
    vmdeploy_shared::iqn::validate(iqn)
        .with_context(|| format!("checking iscsi_target_iqn {iqn:?}"))?;
    let chap = cfg.params.chap.clone();
    let done = tokio::net::TcpListener::bind(cfg.done_listen)
        .await
        .with_context(|| format!("listening for done on {}", cfg.done_listen))?;
    let target = Target::start(TargetConfig {
        iqn: iqn.clone(),
        disk: disk.path.clone(),
        listen: cfg.iscsi_listen,
        chap,
        buffered: false,
    })
    .await
    .with_context(|| format!("starting the iSCSI target for iscsi_target_iqn {iqn:?}"))?;
    tracing::info!(listen = %cfg.iscsi_listen, done_listen = %cfg.done_listen, %iqn, "iSCSI target ready");
    Ok((disk.path, done, target))
}

async fn serve_until_done(cfg: &IscsiConfig, reporter: &Reporter) -> anyhow::Result<PathBuf> {
    let (disk, done, target) = match prepare(cfg).await {
        Ok(p) => p,
        Err(err) => {
            reporter
                .report_error(Some(cfg.advertise), &format!("{err:#}"))
                .await;
            return Err(err);
        }
    };

    let outcome = async {
        reporter
            .report_ready(cfg.advertise)
            .await
            .context("telling the conductor the disk is ready")?;
        tracing::info!(
            timeout_secs = cfg.done_timeout.as_secs(),
            "waiting for the conductor to write the image and send done"
        );
        match tokio::time::timeout(cfg.done_timeout, crate::target::done::wait_for_done(done)).await
        {
            Ok(r) => r,
            Err(_) => bail!(
                "no done notification from the conductor within {} s",
                cfg.done_timeout.as_secs()
            ),
        }
    }
    .await;

    tracing::info!("stopping the iSCSI target");
    let stopped = target.stop().await;
    outcome?;
    stopped.context("stopping the target")?;
    Ok(disk)
}

/// fsync and a partition table re-read, so the new partitions are seen before the reboot
/// (§2.2 step 8). Failures are logged: the target already flushed through its own handle.
fn flush(disk: &Path) {
    match crate::disk::Disk::open_buffered(disk) {
        Ok(w) => {
            match w.sync() {
                Ok(()) => tracing::info!(disk = %disk.display(), "disk flushed"),
                Err(e) => tracing::error!(disk = %disk.display(), "flushing the disk failed: {e}"),
            }
            w.reread_partition_table();
        }
        Err(e) => {
            tracing::error!(disk = %disk.display(), "reopening the disk to flush failed: {e}")
        }
    }
}
