//! tgtd (Debian `tgt`) as a real iSCSI target peer: started in the foreground on
//! 127.0.0.1:<free port> with its own control socket, one target with a file-backed LUN 1,
//! optional CHAP account, optional tuning and O_DIRECT backing store.
//!
//! Facts from docs/iscsi-and-swift-peers.md §1: tgtd creates LUN 0 as a controller, so the
//! disk is LUN 1; every `tgtadm` call needs `-C N` for instance N; tgtd ignores SIGTERM and
//! SIGINT, so shutdown is `tgtadm ... target --op delete --force` and then SIGKILL.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::child::ChildGuard;

const TGTD: &str = "/usr/sbin/tgtd";
const TGTADM: &str = "/usr/sbin/tgtadm";
/// tgtd answers `tgtadm --mode sys --op show` about 15 ms after start (docs/iscsi-and-swift-peers.md §1).
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How to set up the target.
#[derive(Clone, Debug)]
pub struct TgtOptions {
    /// Target name.
    pub iqn: String,
    /// Size of the backing file (sparse).
    pub size: u64,
    /// CHAP account `(user, secret)` bound to the target.
    pub chap: Option<(String, String)>,
    /// Outgoing account `(user, secret)`: the target proves it to the initiator (mutual CHAP).
    pub outgoing_chap: Option<(String, String)>,
    /// `--bsoflags direct`: O_DIRECT on the backing file.
    pub direct: bool,
    /// Accept only CRC32C header and data digests (tgtd's default is None).
    pub digests: bool,
    /// The reference tuning: 256 KiB PDUs, FirstBurst 256 KiB, MaxBurst 1 MiB, InitialR2T=No.
    pub tuned: bool,
    /// Directory for the backing file and log (a fresh temporary directory when `None`).
    pub dir: Option<PathBuf>,
}

impl TgtOptions {
    /// A plain target of `size` bytes named `iqn`.
    pub fn new(iqn: impl Into<String>, size: u64) -> TgtOptions {
        TgtOptions {
            iqn: iqn.into(),
            size,
            chap: None,
            outgoing_chap: None,
            direct: false,
            digests: false,
            tuned: false,
            dir: None,
        }
    }
}

/// A running tgtd; stopped (target deleted, then SIGKILL) on drop.
pub struct Tgtd {
    child: Option<ChildGuard>,
    control: u16,
    port: u16,
    iqn: String,
    backing: PathBuf,
    log: PathBuf,
    _tmp: Option<tempfile::TempDir>,
}

fn tgtadm(control: u16, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(TGTADM)
        .arg("-C")
        .arg(control.to_string())
        .args(args)
        .output()
        .with_context(|| format!("running {TGTADM} {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "tgtadm {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Tgtd {
    /// Starts tgtd and creates the target.
    pub fn start(options: TgtOptions) -> anyhow::Result<Tgtd> {
        let (tmp, dir) = match &options.dir {
            Some(d) => (None, d.clone()),
            None => {
                let t = tempfile::Builder::new()
                    .prefix("vmdeploy-tgtd-")
                    .tempdir()
                    .context("creating a directory for tgtd")?;
                let p = t.path().to_path_buf();
                (Some(t), p)
            }
        };
        let port = crate::free_port();
        // The control socket number only has to be unique among running tgtds; tgtd takes
        // 0..=32767. Derive it from the (unique) port and step past any tgtd that answers on it.
        // Held until this tgtd answers, so that a test in another process cannot pick the same
        // free number in between.
        let control_lock = crate::lock::ResourceLock::acquire("tgtd-control");
        let mut control = port % 32_000 + 1;
        while tgtadm(control, &["--mode", "sys", "--op", "show"]).is_ok() {
            control = control % 32_000 + 1;
        }
        let backing = dir.join(format!("lun-{port}.img"));
        let file = std::fs::File::create(&backing)
            .with_context(|| format!("creating {}", backing.display()))?;
        file.set_len(options.size)
            .with_context(|| format!("sizing {}", backing.display()))?;
        drop(file);
        let log = dir.join(format!("tgtd-{port}.log"));
        let log_file = std::fs::File::create(&log).context("creating the tgtd log")?;
        let child = Command::new(TGTD)
            .arg("-f")
            .arg("-C")
            .arg(control.to_string())
            .arg("--iscsi")
            .arg(format!("portal=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().context("duplicating the log handle")?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {TGTD} (is the `tgt` package installed?)"))?;
        let mut tgtd = Tgtd {
            child: Some(ChildGuard::new(child)),
            control,
            port,
            iqn: options.iqn.clone(),
            backing,
            log,
            _tmp: tmp,
        };
        tgtd.wait_ready()?;
        drop(control_lock);
        tgtd.configure(&options)
            .with_context(|| format!("configuring tgtd; its log:\n{}", tgtd.log_tail()))?;
        Ok(tgtd)
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            if tgtadm(self.control, &["--mode", "sys", "--op", "show"]).is_ok() {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    bail!(
                        "tgtd exited at start ({status}); its log:\n{}",
                        self.log_tail()
                    );
                }
            }
            if started.elapsed() > READY_TIMEOUT {
                bail!(
                    "tgtd did not come up within {READY_TIMEOUT:?}; log:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn configure(&self, o: &TgtOptions) -> anyhow::Result<()> {
        let c = self.control;
        tgtadm(
            c,
            &[
                "--lld",
                "iscsi",
                "--mode",
                "target",
                "--op",
                "new",
                "--tid",
                "1",
                "--targetname",
                &o.iqn,
            ],
        )?;
        let backing = self.backing.to_string_lossy().into_owned();
        let mut lun = vec![
            "--lld",
            "iscsi",
            "--mode",
            "logicalunit",
            "--op",
            "new",
            "--tid",
            "1",
            "--lun",
            "1",
            "--backing-store",
            &backing,
        ];
        if o.direct {
            lun.extend(["--bsoflags", "direct"]);
        }
        tgtadm(c, &lun)?;
        tgtadm(
            c,
            &[
                "--lld",
                "iscsi",
                "--mode",
                "target",
                "--op",
                "bind",
                "--tid",
                "1",
                "--initiator-address",
                "127.0.0.1",
            ],
        )?;
        // Incoming CHAP: the initiator proves itself; outgoing: the target does (mutual CHAP).
        for (account, outgoing) in [(&o.chap, false), (&o.outgoing_chap, true)] {
            let Some((user, secret)) = account else {
                continue;
            };
            tgtadm(
                c,
                &[
                    "--lld",
                    "iscsi",
                    "--mode",
                    "account",
                    "--op",
                    "new",
                    "--user",
                    user,
                    "--password",
                    secret,
                ],
            )?;
            let mut bind = vec![
                "--lld", "iscsi", "--mode", "account", "--op", "bind", "--tid", "1", "--user", user,
            ];
            if outgoing {
                bind.push("--outgoing");
            }
            tgtadm(c, &bind)?;
        }
        if o.digests {
            for name in ["HeaderDigest", "DataDigest"] {
                tgtadm(
                    c,
                    &[
                        "--lld", "iscsi", "--mode", "target", "--op", "update", "--tid", "1",
                        "--name", name, "--value", "CRC32C",
                    ],
                )?;
            }
        }
        if o.tuned {
            for (name, value) in [
                ("MaxRecvDataSegmentLength", "262144"),
                ("MaxXmitDataSegmentLength", "262144"),
                ("FirstBurstLength", "262144"),
                ("MaxBurstLength", "1048576"),
                ("InitialR2T", "No"),
                ("ImmediateData", "Yes"),
            ] {
                tgtadm(
                    c,
                    &[
                        "--lld", "iscsi", "--mode", "target", "--op", "update", "--tid", "1",
                        "--name", name, "--value", value,
                    ],
                )?;
            }
        }
        Ok(())
    }

    /// `127.0.0.1:PORT`.
    pub fn portal(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The target name.
    pub fn iqn(&self) -> &str {
        &self.iqn
    }

    /// The LUN's backing file.
    pub fn backing_file(&self) -> &Path {
        &self.backing
    }

    /// The last lines of tgtd's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        crate::child::tail(&text, 30)
    }

    /// Kills tgtd at once (SIGKILL), as a crash would: for "target gone" tests.
    pub fn kill(&mut self) {
        drop(self.child.take());
    }
}

impl Drop for Tgtd {
    fn drop(&mut self) {
        if self.child.is_none() {
            return;
        }
        if let Err(e) = tgtadm(
            self.control,
            &[
                "--lld", "iscsi", "--mode", "target", "--op", "delete", "--force", "--tid", "1",
            ],
        ) {
            eprintln!("tgtd cleanup: {e:#}");
        }
        // tgtd ignores SIGTERM (docs/iscsi-and-swift-peers.md §1): after the delete, SIGKILL is the only stop.
        self.kill();
        let _ = std::fs::remove_file(format!("/var/run/tgtd/socket.{}", self.control));
        let _ = std::fs::remove_file(format!("/var/run/tgtd/socket.{}.lock", self.control));
    }
}
