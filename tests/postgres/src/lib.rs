//! A real PostgreSQL for tests and benchmarks: Debian's `postgresql` package (scripts/setup
//! installs it), a cluster made with `initdb` and run with `pg_ctl` in a temporary directory.
//!
//! # Design
//! [`shared`] starts one cluster per test process and keeps it for the process's life; every
//! test takes a database of its own from it ([`Cluster::create_database`]), so tests do not see
//! each other's rows. nextest runs each test in a process of its own, so `initdb` runs once per
//! machine and PostgreSQL version: its output is kept as a template in the temp directory (made
//! under a file lock, renamed into place whole) and each cluster starts from a copy (about
//! 0.3 s instead of 2 s).
//!
//! A cluster is stopped by a watchdog, a small shell process started before the cluster, that
//! waits for end of file on a pipe only this process holds: when the process ends, however it
//! ends (a passing test, a panic, nextest's SIGKILL of a hung test), the kernel closes the pipe
//! and the watchdog stops PostgreSQL (`-m immediate`) and removes the directory. No cluster
//! outlives its test and holds a port or shared memory.
//!
//! PostgreSQL refuses to run as root. A root test run (CI) starts every PostgreSQL command as
//! the `postgres` user the Debian package creates, in a directory that user owns.
//!
//! What a cluster offers: the superuser `postgres` and the role [`ROLE`] (password
//! [`PASSWORD`], owner of the databases made for tests) over a Unix socket with `trust`
//! authentication, and over TCP on 127.0.0.1 with SCRAM passwords and TLS available (a CA and a
//! server certificate for `127.0.0.1` and `localhost`, made with `openssl`). `fsync` is off: a
//! killed PostgreSQL keeps its committed data in the page cache, which is all a test that
//! restarts it needs, and a test run on a slow disk stays fast. `synchronous_commit` stays on,
//! so an acknowledged commit survives `pg_ctl stop -m immediate`.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

/// The role tests and conductors log in as: owner of each test database, no superuser.
pub const ROLE: &str = "vmdeploy";
/// Its password (SCRAM over TCP; the Unix socket trusts).
pub const PASSWORD: &str = "vmdeploy-test-password";
/// The cluster's superuser.
pub const SUPERUSER: &str = "postgres";

/// The one-line fix for a machine without PostgreSQL.
const FIX: &str = "apt-get install postgresql (scripts/setup does)";

/// A running PostgreSQL cluster, stopped when the process ends.
pub struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    owner: Owner,
    /// The write end of the watchdog's pipe: never written, closed by the process's end.
    _watchdog: Mutex<ChildStdin>,
    databases: AtomicU32,
}

/// The user PostgreSQL runs as: this process's own, or `postgres` when this process is root.
#[derive(Clone, Copy)]
struct Owner {
    uid: u32,
    gid: u32,
    switch: bool,
}

/// The cluster of this process, started on first use. Panics, with the one-line fix, when
/// PostgreSQL is not installed or does not start.
pub fn shared() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(|| match Cluster::start() {
        Ok(cluster) => cluster,
        Err(e) => panic!("starting a PostgreSQL cluster for the tests: {e}"),
    })
}

impl Cluster {
    /// Starts a cluster of its own (a test that stops and restarts PostgreSQL takes this, not
    /// [`shared`]).
    pub fn start() -> Result<Cluster, String> {
        let bin = bin_dir()?;
        let owner = owner()?;
        let dir = make_dir(owner)?;
        // The watchdog first: from here on, whatever fails, the directory goes when we do.
        let watchdog = Command::new("sh")
            .args([
                "-c",
                "read _ignored; \"$1/pg_ctl\" -D \"$2/data\" -m immediate -w stop \
                 >/dev/null 2>&1; rm -rf \"$2\"",
                "vmdeploy-pg-watchdog",
            ])
            .arg(&bin)
            .arg(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .as_owner(owner)
            .spawn()
            .map_err(|e| format!("starting the cluster's watchdog (sh): {e}"))?;
        let stdin = watchdog.stdin.ok_or("the watchdog has no stdin pipe")?;
        let template = template(&bin, owner)?;
        run(
            Command::new("cp")
                .arg("-a")
                .arg(&template)
                .arg(dir.join("data"))
                .as_owner(owner),
            "copying the cluster template",
        )?;
        make_certificates(&dir, owner)?;
        std::fs::create_dir(dir.join("sock"))
            .map_err(|e| format!("creating {}/sock: {e}", dir.display()))?;
        chown(&dir.join("sock"), owner)?;

        let mut cluster = Cluster {
            bin,
            dir,
            port: 0,
            owner,
            _watchdog: Mutex::new(stdin),
            databases: AtomicU32::new(0),
        };
        let mut last = String::new();
        // Another process may take the port between our probe and PostgreSQL's bind: then the
        // start fails and another port is tried.
        for _ in 0..5 {
            cluster.port = free_port()?;
            match cluster.start_server() {
                Ok(()) => {
                    cluster.psql(
                        "postgres",
                        SUPERUSER,
                        &format!("CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'"),
                    )?;
                    return Ok(cluster);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The directory of the cluster's Unix socket.
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.join("sock")
    }

    /// The TCP port on 127.0.0.1 (also the number in the socket's name).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The CA certificate (PEM) the server's certificate is signed by.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("tls/ca.pem")
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// Makes a new empty database owned by [`ROLE`], named after `hint` and a counter, and
    /// returns its name.
    pub fn create_database(&self, hint: &str) -> String {
        let n = self.databases.fetch_add(1, Ordering::Relaxed);
        let clean: String = hint
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .take(40)
            .collect();
        let name = format!("{clean}_{n}");
        if let Err(e) = self.psql(
            "postgres",
            SUPERUSER,
            &format!("CREATE DATABASE {name} OWNER {ROLE}"),
        ) {
            panic!("creating database {name}: {e}");
        }
        name
    }

    /// A `postgresql://` URL for `database` as [`ROLE`] over the Unix socket (no password).
    pub fn socket_url(&self, database: &str) -> String {
        format!(
            "postgresql:///{database}?host={}&port={}&user={ROLE}",
            self.socket_dir().display(),
            self.port
        )
    }

    /// A `postgresql://` URL for `database` as [`ROLE`] over TCP (needs [`PASSWORD`]; add
    /// `sslmode=require` for TLS).
    pub fn tcp_url(&self, database: &str) -> String {
        format!("postgresql://{ROLE}@127.0.0.1:{}/{database}", self.port)
    }

    /// Runs `sql` with `psql` in `database` as `user` over the socket; returns its output
    /// (unaligned, tuples only).
    pub fn psql(&self, database: &str, user: &str, sql: &str) -> Result<String, String> {
        let out = output(
            Command::new(self.bin.join("psql"))
                .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
                .arg(self.socket_dir())
                .arg("-p")
                .arg(self.port.to_string())
                .args(["-U", user, "-d", database, "-c", sql])
                .as_owner(self.owner),
            "psql",
        )?;
        if !out.status.success() {
            return Err(format!(
                "psql {sql:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// `pg_amcheck` of every table and B-tree index of `database`, heap against indexes: `Ok`
    /// when it finds nothing, else its report.
    pub fn amcheck(&self, database: &str) -> Result<(), String> {
        self.psql(
            database,
            SUPERUSER,
            "CREATE EXTENSION IF NOT EXISTS amcheck",
        )?;
        let out = output(
            Command::new(self.bin.join("pg_amcheck"))
                .arg("-h")
                .arg(self.socket_dir())
                .arg("-p")
                .arg(self.port.to_string())
                .args([
                    "-U",
                    SUPERUSER,
                    "--heapallindexed",
                    "--parent-check",
                    database,
                ])
                .as_owner(self.owner),
            "pg_amcheck",
        )?;
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() && report.trim().is_empty() {
            Ok(())
        } else {
            Err(format!("pg_amcheck {database} ({}): {report}", out.status))
        }
    }

    /// Stops the server the way a crash would (`-m immediate`: no checkpoint, every client cut
    /// off at once).
    pub fn kill(&self) -> Result<(), String> {
        run(
            Command::new(self.bin.join("pg_ctl"))
                .arg("-D")
                .arg(self.dir.join("data"))
                .args(["-m", "immediate", "-w", "stop"])
                .as_owner(self.owner),
            "pg_ctl stop",
        )
    }

    /// Starts the server again after [`Cluster::kill`], on the same port; returns once it
    /// accepts connections (after its crash recovery).
    ///
    /// The port lies below the ephemeral range ([`free_port`]), so no outgoing connection can
    /// hold it; a start that still fails to bind (a socket of the killed server not yet gone)
    /// is tried again for up to 10 s.
    pub fn restart(&self) -> Result<(), String> {
        let mut attempt = 1;
        loop {
            match self.start_server() {
                Err(e) if e.contains("Address already in use") && attempt < 20 => {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(500));
                }
                other => return other,
            }
        }
    }

    fn start_server(&self) -> Result<(), String> {
        let tls = self.dir.join("tls");
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={sock} \
             -c ssl=on -c ssl_cert_file={cert} -c ssl_key_file={key} -c fsync=off \
             -c full_page_writes=off -c max_connections=300 -c shared_buffers=32MB",
            port = self.port,
            sock = self.socket_dir().display(),
            cert = tls.join("server.pem").display(),
            key = tls.join("server.key").display(),
        );
        let out = output(
            Command::new(self.bin.join("pg_ctl"))
                .arg("-D")
                .arg(self.dir.join("data"))
                .arg("-l")
                .arg(self.dir.join("log"))
                .args(["-w", "-t", "60", "-o", &options, "start"])
                .as_owner(self.owner),
            "pg_ctl start",
        )?;
        if !out.status.success() {
            return Err(format!(
                "pg_ctl start failed ({}): {}\n--- server log ---\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim(),
                self.log()
            ));
        }
        Ok(())
    }
}

/// PostgreSQL's programs: `$VMDEPLOY_PG_BINDIR`, else the newest `/usr/lib/postgresql/*/bin`
/// (Debian keeps them off `PATH`).
fn bin_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("VMDEPLOY_PG_BINDIR") {
        let dir = PathBuf::from(dir);
        if dir.join("initdb").is_file() {
            return Ok(dir);
        }
        return Err(format!(
            "VMDEPLOY_PG_BINDIR={} has no initdb",
            dir.display()
        ));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| format!("PostgreSQL is not installed: {FIX}"))?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let major = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((major, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| format!("no PostgreSQL server in /usr/lib/postgresql: {FIX}"))
}

fn owner() -> Result<Owner, String> {
    // SAFETY: geteuid and getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if uid != 0 {
        return Ok(Owner {
            uid,
            gid,
            switch: false,
        });
    }
    let name = c"postgres";
    // SAFETY: getpwnam reads a NUL-terminated name and returns a pointer into static storage
    // (or null), read at once, before any other getpw* call.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    if entry.is_null() {
        return Err(format!(
            "running as root, PostgreSQL must run as the `postgres` user, which does not exist: \
             {FIX}"
        ));
    }
    // SAFETY: non-null, just returned by getpwnam.
    let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
    Ok(Owner {
        uid,
        gid,
        switch: true,
    })
}

trait AsOwner {
    fn as_owner(&mut self, owner: Owner) -> &mut Self;
}

impl AsOwner for Command {
    fn as_owner(&mut self, owner: Owner) -> &mut Command {
        if owner.switch {
            // std drops root's supplementary groups when it sets the uid.
            self.uid(owner.uid).gid(owner.gid);
            // PostgreSQL's tools look at $HOME for their rc files; root's is not readable.
            self.env("HOME", "/tmp");
        }
        self
    }
}

fn chown(path: &Path, owner: Owner) -> Result<(), String> {
    if !owner.switch {
        return Ok(());
    }
    std::os::unix::fs::chown(path, Some(owner.uid), Some(owner.gid))
        .map_err(|e| format!("chown {} to postgres: {e}", path.display()))
}

/// A new private directory for one cluster, owned by the cluster's user.
fn make_dir(owner: Owner) -> Result<PathBuf, String> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let base = std::env::temp_dir();
    for _ in 0..100 {
        let dir = base.join(format!(
            "vmdeploy-pg-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                    .map_err(|e| format!("chmod {}: {e}", dir.display()))?;
                chown(&dir, owner)?;
                return Ok(dir);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("creating {}: {e}", dir.display())),
        }
    }
    Err(format!("no free directory name in {}", base.display()))
}

/// The `initdb` output every cluster starts from, made once per machine, PostgreSQL build and
/// user.
fn template(bin: &Path, owner: Owner) -> Result<PathBuf, String> {
    let version = output(Command::new(bin.join("initdb")).arg("--version"), "initdb")?;
    let version = String::from_utf8_lossy(&version.stdout);
    let tag: String = version
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or("unknown")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '.')
        .collect();
    let base = std::env::temp_dir();
    let template = base.join(format!("vmdeploy-pg-template-{tag}-{}", owner.uid));
    if template.join("PG_VERSION").is_file() {
        return Ok(template);
    }
    // One process makes it; the others wait on the lock and then find it there.
    let lock_path = base.join(format!("vmdeploy-pg-template-{}.lock", owner.uid));
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| format!("opening {}: {e}", lock_path.display()))?;
    // SAFETY: the descriptor is valid while `lock` lives; the kernel drops the lock with it.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(format!(
            "locking {}: {}",
            lock_path.display(),
            std::io::Error::last_os_error()
        ));
    }
    if template.join("PG_VERSION").is_file() {
        return Ok(template);
    }
    let work = make_dir(owner)?;
    let data = work.join("data");
    run(
        Command::new(bin.join("initdb"))
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                SUPERUSER,
                "-E",
                "UTF8",
                "--locale=C",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--no-sync",
                "--no-instructions",
            ])
            .as_owner(owner),
        "initdb",
    )?;
    // Only loopback over TCP, with passwords; the socket trusts (it is in a 0700 directory).
    let hba = "local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n";
    run(
        Command::new("sh")
            .args(["-c", "printf '%s' \"$1\" > \"$2\"", "sh", hba])
            .arg(data.join("pg_hba.conf"))
            .as_owner(owner),
        "writing pg_hba.conf",
    )?;
    std::fs::rename(&data, &template).map_err(|e| {
        format!(
            "moving the template {} to {}: {e}",
            data.display(),
            template.display()
        )
    })?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(template)
}

/// A CA and a server certificate for 127.0.0.1 and localhost, in `dir/tls`.
fn make_certificates(dir: &Path, owner: Owner) -> Result<(), String> {
    let tls = dir.join("tls");
    std::fs::create_dir(&tls).map_err(|e| format!("creating {}: {e}", tls.display()))?;
    chown(&tls, owner)?;
    let script = "set -e; cd \"$1\"; umask 077
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj /CN=vmdeploy-test-postgres-ca -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
  -subj /CN=localhost -keyout server.key -out server.csr 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > ext
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile ext -out server.pem 2>/dev/null
chmod 644 ca.pem";
    run(
        Command::new("sh")
            .args(["-c", script, "sh"])
            .arg(&tls)
            .as_owner(owner),
        "making the test certificates (openssl)",
    )
}

/// A free port below the kernel's ephemeral range (`ip_local_port_range`). A port from that
/// range can be taken at any moment as the local end of anyone's outgoing connection, and a
/// server restarted on its old port ([`Cluster::restart`]) would then fail to bind; no outgoing
/// connection is given a port below the range.
fn free_port() -> Result<u16, String> {
    const FLOOR: u64 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(32_768);
    if ephemeral_low > FLOOR + 1_000 {
        let span = ephemeral_low - FLOOR;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::from(d.subsec_nanos()));
        let seed = u64::from(std::process::id()).wrapping_mul(2_654_435_761) ^ nanos;
        for i in 0..500u64 {
            let port = FLOOR + seed.wrapping_add(i.wrapping_mul(7_919)) % span;
            let Ok(port) = u16::try_from(port) else {
                continue;
            };
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("finding a free port: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port: {e}"))
}

fn output(command: &mut Command, what: &str) -> Result<Output, String> {
    command.stdin(Stdio::null()).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!("{what} is not installed: {FIX}")
        } else {
            format!("starting {what}: {e}")
        }
    })
}

fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let out = output(command, what)?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_serves_a_database_to_its_role() {
        let cluster = shared();
        let db = cluster.create_database("smoke");
        cluster
            .psql(
                &db,
                ROLE,
                "CREATE TABLE t (v int); INSERT INTO t VALUES (41)",
            )
            .expect("writing as the owner role");
        assert_eq!(
            cluster
                .psql(&db, ROLE, "SELECT v + 1 FROM t")
                .expect("reading"),
            "42"
        );
        assert!(cluster.ca_file().is_file());
        cluster
            .amcheck(&db)
            .expect("a sound database passes pg_amcheck");
    }

    #[test]
    fn a_private_cluster_survives_a_kill_with_its_commits() {
        let cluster = Cluster::start().expect("a private cluster");
        let db = cluster.create_database("restart");
        cluster
            .psql(
                &db,
                ROLE,
                "CREATE TABLE t (v int); INSERT INTO t VALUES (7)",
            )
            .expect("writing");
        cluster.kill().expect("killing");
        assert!(
            cluster.psql(&db, ROLE, "SELECT 1").is_err(),
            "down after kill"
        );
        cluster.restart().expect("restarting");
        assert_eq!(
            cluster.psql(&db, ROLE, "SELECT v FROM t").expect("reading"),
            "7"
        );
    }
}
