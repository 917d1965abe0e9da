//! sushy-tools' Redfish emulator (`sushy-emulator`, fake driver) on loopback, over HTTPS with a
//! fresh self-signed certificate and HTTP Basic auth, plus a static HTTP server for the images
//! its InsertMedia downloads (docs/ilo-management.md §4).
//!
//! Both processes are killed when the guard drops, also when a test fails.

use std::io::Write;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::child::ChildGuard;
use crate::{free_port, venv_bin};

/// The fake system's UUID in the emulator config.
pub const SYSTEM_UUID: &str = "27946b59-9e44-4fa7-8e91-f3527a1ef094";

/// A running sushy-emulator and image server.
pub struct SushyEmulator {
    /// `127.0.0.1:PORT` of the Redfish service (HTTPS).
    pub address: String,
    /// The emulator's certificate (PEM), to pass as the CA.
    pub cert_path: PathBuf,
    /// Login name accepted by Basic auth.
    pub username: String,
    /// Password accepted by Basic auth.
    pub password: String,
    /// Base URL of the image server (`http://127.0.0.1:PORT`), serving `boot.iso` and
    /// `floppy.img`.
    pub image_base: String,
    emulator: ChildGuard,
    _images: ChildGuard,
    dir: tempfile::TempDir,
}

fn wait_for_port(port: u16, child: &mut Child, what: &str, limit: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if let Some(status) = child.try_wait().context("polling the child")? {
            bail!("{what} exited early with {status}");
        }
        if start.elapsed() > limit {
            bail!("{what} did not listen on 127.0.0.1:{port} within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl SushyEmulator {
    /// Starts the emulator (fake driver, one system powered off) and the image server.
    pub fn start() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().context("creating the emulator directory")?;
        let root = dir.path();

        // Certificate for 127.0.0.1.
        let key = rcgen::generate_simple_self_signed(vec![
            "127.0.0.1".to_string(),
            "localhost".to_string(),
        ])
        .context("generating the emulator certificate")?;
        let cert_path = root.join("cert.pem");
        let key_path = root.join("key.pem");
        std::fs::write(&cert_path, key.cert.pem()).context("writing cert.pem")?;
        std::fs::write(&key_path, key.signing_key.serialize_pem()).context("writing key.pem")?;

        // htpasswd with a bcrypt hash: the only scheme sushy-tools accepts (docs/ilo-management.md §4).
        let username = "admin".to_string();
        let password = "sushy-pass".to_string();
        let hash = Command::new(venv_bin("python"))
            .args([
                "-c",
                "import bcrypt,sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(4)).decode())",
                &password,
            ])
            .output()
            .context("running python to hash the password")?;
        if !hash.status.success() {
            bail!(
                "hashing the password failed: {}",
                String::from_utf8_lossy(&hash.stderr)
            );
        }
        let auth_path = root.join("htpasswd");
        std::fs::write(
            &auth_path,
            format!(
                "{username}:{}\n",
                String::from_utf8_lossy(&hash.stdout).trim()
            ),
        )
        .context("writing htpasswd")?;

        // Images the emulator downloads on InsertMedia.
        let images = root.join("images");
        std::fs::create_dir_all(&images).context("creating the image directory")?;
        std::fs::write(images.join("boot.iso"), vec![0u8; 64 * 1024])
            .context("writing boot.iso")?;
        std::fs::write(images.join("floppy.img"), vec![0u8; 1440 * 1024])
            .context("writing floppy.img")?;
        let image_port = free_port();
        let image_child = Command::new(venv_bin("python"))
            .args([
                "-m",
                "http.server",
                &image_port.to_string(),
                "--bind",
                "127.0.0.1",
                "--directory",
            ])
            .arg(&images)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the image server")?;
        let mut images_guard = ChildGuard::new(image_child);
        wait_for_port(
            image_port,
            &mut images_guard,
            "image server",
            Duration::from_secs(20),
        )?;

        let port = free_port();
        let config_path = root.join("emulator.conf");
        let mut config = std::fs::File::create(&config_path).context("writing emulator.conf")?;
        writeln!(
            config,
            "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n\
             SUSHY_EMULATOR_LISTEN_PORT = {port}\n\
             SUSHY_EMULATOR_SSL_CERT = '{cert}'\n\
             SUSHY_EMULATOR_SSL_KEY = '{key}'\n\
             SUSHY_EMULATOR_AUTH_FILE = '{auth}'\n\
             SUSHY_EMULATOR_FAKE_DRIVER = True\n\
             SUSHY_EMULATOR_STATE_DIR = '{state}'\n\
             SUSHY_EMULATOR_FAKE_SYSTEMS = [{{'uuid': '{SYSTEM_UUID}', 'name': 'fake-ilo',\n\
             \x20   'power_state': 'Off', 'external_notifier': False,\n\
             \x20   'nics': [{{'mac': '00:5c:52:31:3a:9c', 'ip': '172.22.0.100'}}]}}]",
            cert = cert_path.display(),
            key = key_path.display(),
            auth = auth_path.display(),
            state = root.join("state").display(),
        )
        .context("writing emulator.conf")?;
        drop(config);
        let log = std::fs::File::create(root.join("emulator.log")).context("creating the log")?;
        let child = Command::new(venv_bin("sushy-emulator"))
            .arg("--config")
            .arg(&config_path)
            .stdout(log.try_clone().context("cloning the log handle")?)
            .stderr(log)
            .spawn()
            .context("starting sushy-emulator")?;
        let mut emulator = ChildGuard::new(child);
        if let Err(e) = wait_for_port(
            port,
            &mut emulator,
            "sushy-emulator",
            Duration::from_secs(60),
        ) {
            emulator.kill();
            let log = std::fs::read_to_string(root.join("emulator.log")).unwrap_or_default();
            bail!("{e}; log:\n{log}");
        }
        Ok(Self {
            address: format!("127.0.0.1:{port}"),
            cert_path,
            username,
            password,
            image_base: format!("http://127.0.0.1:{image_port}"),
            emulator,
            _images: images_guard,
            dir,
        })
    }

    /// The emulator's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("emulator.log")).unwrap_or_default()
    }

    /// A file holding the password, for the CLI's `--password-file`.
    pub fn password_file(&self) -> anyhow::Result<PathBuf> {
        let path = self.dir.path().join("password");
        std::fs::write(&path, format!("{}\n", self.password))
            .context("writing the password file")?;
        Ok(path)
    }

    /// Process id of the emulator (for diagnostics).
    pub fn pid(&self) -> u32 {
        self.emulator.id()
    }
}
