//! Booting the deploy ramdisk in QEMU (TCG) for end-to-end tests of the agent as a real `/init`
//! (docs/qemu-and-boot.md §5, §8; docs/architecture.md §9, §11).
//!
//! - [`kernel`]: the Debian kernel .deb that scripts/setup downloads into `.cache/kernel`, unpacked
//!   once (`dpkg-deb -x`, then `depmod -b`, since the .deb ships no `modules.dep`) into
//!   `$CARGO_TARGET_DIR/qemu-kernel/<package>/` and reused by later runs.
//! - [`musl_agent`]: the static release agent that scripts/test builds before the tests.
//! - [`build_initramfs`]: `vmdeploy-image-build initramfs`.
//! - [`Qemu`]: a running `qemu-system-x86_64 -accel tcg` whose serial console (stdout) is read
//!   unbuffered by a thread, timestamped from QEMU's start, written to a log file and kept for
//!   waiting on; QEMU is killed on drop.
//! - [`alive`]: whether a process (a QEMU some emulator started) still runs.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::child::ChildGuard;

/// An unpacked kernel package.
#[derive(Debug, Clone)]
pub struct KernelTree {
    /// `boot/vmlinuz-<release>` (for `-kernel`).
    pub vmlinuz: PathBuf,
    /// `lib/modules/<release>` with a `modules.dep`.
    pub modules_dir: PathBuf,
    /// The kernel release, e.g. `6.1.0-57-amd64`.
    pub release: String,
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("target"))
}

fn run_ok(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The kernel from `.cache/kernel/linux-image-*.deb`, unpacked and depmod'ed once.
pub fn kernel() -> KernelTree {
    let deb = crate::deploy_iso::kernel_deb();
    let stem = deb
        .file_stem()
        .and_then(|s| s.to_str())
        .expect("a .deb file name is UTF-8 here")
        .to_owned();
    let root = target_dir().join("qemu-kernel").join(&stem);
    if !root.join(".complete").exists() {
        // Unpack beside the final place and rename, so a crash never leaves half a tree in use.
        let parent = root.parent().expect("root has a parent");
        std::fs::create_dir_all(parent).expect("creating the kernel cache dir");
        let scratch = tempfile::tempdir_in(parent).expect("scratch dir for the kernel");
        run_ok(
            Command::new("dpkg-deb")
                .arg("-x")
                .arg(&deb)
                .arg(scratch.path()),
            "dpkg-deb -x",
        );
        let release = only_release(&scratch.path().join("lib/modules"));
        run_ok(
            Command::new("depmod")
                .arg("-b")
                .arg(scratch.path())
                .arg(&release),
            "depmod -b",
        );
        std::fs::write(scratch.path().join(".complete"), b"").expect("marking complete");
        let unpacked = scratch.keep();
        if std::fs::rename(&unpacked, &root).is_err() {
            // Another run got there first; use its copy.
            let _ = std::fs::remove_dir_all(&unpacked);
        }
    }
    let release = only_release(&root.join("lib/modules"));
    KernelTree {
        vmlinuz: root.join("boot").join(format!("vmlinuz-{release}")),
        modules_dir: root.join("lib/modules").join(&release),
        release,
    }
}

fn only_release(modules: &Path) -> String {
    std::fs::read_dir(modules)
        .unwrap_or_else(|e| panic!("listing {}: {e}", modules.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .unwrap_or_else(|| panic!("no kernel release under {}", modules.display()))
}

/// The static musl release agent: `VMDEPLOY_AGENT_MUSL` (set by scripts/test), else
/// `$CARGO_TARGET_DIR/x86_64-unknown-linux-musl/release/vmdeploy-agent`.
pub fn musl_agent() -> PathBuf {
    let path = std::env::var_os("VMDEPLOY_AGENT_MUSL")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("x86_64-unknown-linux-musl/release/vmdeploy-agent"));
    assert!(
        path.exists(),
        "{} is missing: build the static agent first with `cargo build --release -p \
         vmdeploy-agent --target x86_64-unknown-linux-musl` (scripts/test does)",
        path.display()
    );
    path
}

/// Builds the ramdisk with `vmdeploy-image-build initramfs`; returns its module list.
pub fn build_initramfs(agent: &Path, kernel: &KernelTree, modules: &[&str], out: &Path) -> String {
    let mut cmd = Command::new(crate::bin("vmdeploy-image-build"));
    cmd.arg("initramfs")
        .arg("--agent")
        .arg(agent)
        .arg("--modules-dir")
        .arg(&kernel.modules_dir)
        .arg("-o")
        .arg(out);
    for m in modules {
        cmd.args(["--module", m]);
    }
    let out = cmd
        .output()
        .expect("running vmdeploy-image-build initramfs");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "image-build initramfs failed: {said}");
    said
}

/// One serial console line and when it arrived (since QEMU was started).
#[derive(Debug, Clone)]
pub struct ConsoleLine {
    /// Time since the QEMU process was spawned.
    pub at: Duration,
    /// The line, without the line ending.
    pub text: String,
}

/// A running QEMU; killed (and reaped) on drop, the console's tail printed when a test fails.
pub struct Qemu {
    child: ChildGuard,
    started: Instant,
    lines: Arc<Mutex<Vec<ConsoleLine>>>,
    log_path: PathBuf,
}

impl Qemu {
    /// Starts `qemu-system-x86_64 -accel tcg -nographic -no-reboot <args>`; the serial console
    /// goes to `log_path` (timestamped) and is kept for [`Qemu::wait_for`].
    pub fn start(args: &[String], log_path: &Path) -> Qemu {
        let mut child = Command::new("qemu-system-x86_64")
            .args(["-accel", "tcg", "-nographic", "-no-reboot", "-m", "512"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting qemu-system-x86_64 (scripts/setup installs it)");
        let started = Instant::now();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut log = std::fs::File::create(log_path).expect("creating the serial log");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let sink = lines.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut buf = Vec::new();
            // Read raw bytes: the console may carry non-UTF-8 noise.
            while reader.read_until(b'\n', &mut buf).unwrap_or(0) > 0 {
                let text = String::from_utf8_lossy(&buf)
                    .trim_end_matches(['\r', '\n'])
                    .to_owned();
                let at = started.elapsed();
                let _ = writeln!(log, "{:8.3} {text}", at.as_secs_f64());
                sink.lock()
                    .expect("console lock")
                    .push(ConsoleLine { at, text });
                buf.clear();
            }
        });
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let at = started.elapsed();
                sink.lock().expect("console lock").push(ConsoleLine {
                    at,
                    text: format!("qemu stderr: {line}"),
                });
            }
        });
        Qemu {
            child: ChildGuard::new(child).with_log("serial console", log_path),
            started,
            lines,
            log_path: log_path.to_owned(),
        }
    }

    /// When QEMU was started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Every console line so far.
    pub fn console(&self) -> Vec<ConsoleLine> {
        self.lines.lock().expect("console lock").clone()
    }

    /// The console so far as text (for assertion messages).
    pub fn console_text(&self) -> String {
        self.console()
            .iter()
            .map(|l| format!("{:8.3} {}\n", l.at.as_secs_f64(), l.text))
            .collect()
    }

    /// The first line matching `pred`, waiting up to `timeout`; `None` if QEMU exits or time
    /// runs out first.
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Option<ConsoleLine> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.console().into_iter().find(|l| pred(&l.text)) {
                return Some(l);
            }
            if Instant::now() > deadline || self.exited() {
                // One last look: the reader may have caught up meanwhile.
                std::thread::sleep(Duration::from_millis(200));
                return self.console().into_iter().find(|l| pred(&l.text));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// True once the QEMU process has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Waits up to `timeout` for QEMU to exit by itself; the time since start when it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<Duration> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return Some(self.started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Kills QEMU now (the conductor powering the node off).
    pub fn kill(&mut self) {
        self.child.kill();
    }

    /// Prints the whole console (call before failing).
    pub fn dump(&self) {
        eprintln!(
            "--- serial console ({}) ---\n{}--- end ---",
            self.log_path.display(),
            self.console_text()
        );
    }
}

/// OVMF's code, as Debian's `ovmf` package installs it (4 MiB flash layout).
pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
/// The template of OVMF's variable store; every boot gets its own copy.
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";

/// The arguments of a q35 machine with OVMF: the code read-only and a fresh copy of the variable
/// store in `scratch`. Fails with the fix when OVMF is not installed.
pub fn ovmf_q35_args(scratch: &Path) -> Vec<String> {
    ovmf_args(scratch, OVMF_CODE, OVMF_VARS, &["-machine", "q35"])
}

/// OVMF built with Secure Boot (it needs SMM), Debian's `ovmf` package.
pub const OVMF_CODE_SECURE_BOOT: &str = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd";
/// Its variable store with Microsoft's keys enrolled, as a ProLiant ships: shim signed by
/// Microsoft boots, anything unsigned is refused.
pub const OVMF_VARS_MS: &str = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd";

/// [`ovmf_q35_args`] with Secure Boot on: the Secure Boot firmware, Microsoft's keys in a copy
/// of the variable store in `scratch`, SMM on and the variable flash secure (the firmware runs
/// only so, and the guest cannot write the key store around it).
pub fn ovmf_secure_boot_q35_args(scratch: &Path) -> Vec<String> {
    ovmf_args(
        scratch,
        OVMF_CODE_SECURE_BOOT,
        OVMF_VARS_MS,
        &[
            "-machine",
            "q35,smm=on",
            "-global",
            "driver=cfi.pflash01,property=secure,value=on",
        ],
    )
}

/// `machine` arguments, then `code` read-only and a copy of the `vars` template in `scratch`
/// as the two flash chips.
fn ovmf_args(scratch: &Path, code: &str, vars: &str, machine: &[&str]) -> Vec<String> {
    for f in [code, vars] {
        assert!(
            Path::new(f).exists(),
            "{f} is missing: apt-get install ovmf (scripts/setup does)"
        );
    }
    let name = Path::new(vars).file_name().unwrap_or_default();
    let copy = scratch.join(name);
    std::fs::copy(vars, &copy)
        .unwrap_or_else(|e| panic!("copying {vars} to {}: {e}", copy.display()));
    let mut args: Vec<String> = machine.iter().map(|a| (*a).to_owned()).collect();
    args.extend([
        "-drive".into(),
        format!("if=pflash,format=raw,unit=0,readonly=on,file={code}"),
        "-drive".into(),
        format!("if=pflash,format=raw,unit=1,file={}", copy.display()),
    ]);
    args
}

/// Whether process `pid` still runs; a zombie (exited, not yet reaped by its parent) counts as
/// gone. Tests use it to check that no QEMU an emulator started is left behind.
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}
