//! The conductor's deploy flow (`vmdeploy_conductor::deploy`, `agent_ilo`) against the iLO
//! emulator process: the virtual-media boot (floppy and deploy ISO inserted, boot once from CD,
//! boot mode, power on), its clean-up, validation refusing an unlicensed iLO before anything is
//! powered off, and a whole deploy through the real agent binary writing to a loop device.
//!
//! The node store is the real SQLite store. Test doubles, in this file only: [`HttpObjects`]
//! stands in for the object store (the built-in store is another helper's, not merged here; files in
//! a temp directory served over HTTP with expiring, unguessable URLs and Range reads, as the
//! built-in store serves them); [`ApiStandin`] answers the agent's lookup and heartbeat as the
//! API does and hands each heartbeat to the flow, as the manager does.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use vmdeploy_conductor::deploy::agent::AgentDeploy;
use vmdeploy_conductor::deploy::{
    vmedia, DeployConfig, DeployContext, DeployInterface, DeployStep,
};
use vmdeploy_conductor::manager::HeartbeatRequest;
use vmdeploy_conductor::objects::{
    ObjectBody, ObjectError, ObjectInfo, ObjectPath, ObjectStore, PutOptions,
};
use vmdeploy_conductor::states::ProvisionState;
use vmdeploy_conductor::store::sqlite::SqliteStore;
use vmdeploy_conductor::store::{JsonObject, Node, NodeIdent, Port, Store};
use vmdeploy_integration_tests::http::AcceptLoop;
use vmdeploy_integration_tests::loopdev::{require_loop_devices, LoopDevice, LoopIo};
use vmdeploy_integration_tests::{bin, free_port};

const USER: &str = "deployer";
const PASSWORD: &str = "flow-pass";
const MAC: &str = "52:54:00:12:34:56";
const CONTAINER: &str = "vmdeploy-test";
const FLOPPY_TTL: Duration = Duration::from_secs(600);
const CA_PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIBflowtest\n-----END CERTIFICATE-----\n";

// ---------------------------------------------------------------------------------------------
// The iLO emulator, as a process.

/// A running `ilo-emulator`, killed on drop.
struct Emulator {
    child: Child,
    address: String,
    cert: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Emulator {
    fn start(extra: &[&str]) -> Emulator {
        let dir = tempfile::tempdir().expect("temp dir");
        let cert = dir.path().join("cert.pem");
        let mut child = Command::new(bin("ilo-emulator"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--username",
                USER,
                "--password",
                PASSWORD,
            ])
            .arg("--cert-out")
            .arg(&cert)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting ilo-emulator");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut address = None;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("server 0 https://") {
                    address = Some(url.trim().to_string());
                }
                if line.trim() == "ready" {
                    let _ = tx.send(address.take());
                }
            }
        });
        let address = rx
            .recv_timeout(Duration::from_secs(30))
            .ok()
            .flatten()
            .expect("ilo-emulator printed its address and ready within 30 s");
        Emulator {
            child,
            address,
            cert,
            _dir: dir,
        }
    }

    /// `curl` as a plain HTTPS client of the admin API.
    fn admin(&self, method: &str, path: &str) -> Value {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", "--cacert"])
            .arg(&self.cert)
            .args(["-X", method, &format!("https://{}{path}", self.address)])
            .output()
            .expect("running curl (fix: apt-get install curl)");
        assert!(
            out.status.success(),
            "curl {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    fn state(&self) -> Value {
        self.admin("GET", "/_emulator/state")
    }

    fn driver_info(&self) -> JsonObject {
        obj(json!({
            "ilo_address": self.address,
            "ilo_username": USER,
            "ilo_password": PASSWORD,
            "ilo_verify_ca": self.cert.display().to_string(),
            "ilo_protocol": "ribcl",
        }))
    }

    /// Powers the host on through the conductor's own iLO client.
    async fn power_on(&self) {
        use vmdeploy_conductor::drivers::ilo::IloClient;
        use vmdeploy_conductor::drivers::{Power, PowerAction};
        use vmdeploy_conductor::node::driver_info::{IloDefaults, IloDriverInfo};
        let config = IloDriverInfo::parse(&self.driver_info(), &IloDefaults::default())
            .expect("config")
            .config;
        let client = IloClient::connect(&config).await.expect("connecting");
        client.set_power(PowerAction::On).await.expect("power on");
        assert_eq!(self.state()["power"], "ON");
    }
}

// ---------------------------------------------------------------------------------------------
// Test doubles: the node store and the object store.

/// A fresh SQLite node store in a temp directory.
fn sqlite() -> (tempfile::TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(&dir.path().join("vmdeploy.sqlite")).expect("opening SQLite");
    (dir, store)
}

/// The node as stored.
async fn stored(store: &SqliteStore, uuid: uuid::Uuid) -> Node {
    store
        .node(&NodeIdent::Uuid(uuid))
        .await
        .expect("the node is stored")
}

/// One request the object server answered.
#[derive(Debug, Clone)]
struct Fetch {
    path: String,
    range: Option<String>,
    status: u16,
}

#[derive(Default)]
struct ObjectsShared {
    /// Signature → (object path, expiry in Unix seconds).
    urls: Mutex<HashMap<String, (String, u64)>>,
    fetches: Mutex<Vec<Fetch>>,
    /// `X-Delete-After` of each put, by object path.
    delete_after: Mutex<HashMap<String, Option<Duration>>>,
}

/// Objects as files in a temp directory, served over HTTP at unguessable expiring URLs with
/// Range reads (test double of the built-in store).
struct HttpObjects {
    root: Arc<PathBuf>,
    shared: Arc<ObjectsShared>,
    accept: AcceptLoop,
    counter: AtomicU64,
    _dir: tempfile::TempDir,
}

impl HttpObjects {
    fn start() -> HttpObjects {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = Arc::new(dir.path().to_path_buf());
        let shared = Arc::new(ObjectsShared::default());
        let accept = {
            let (root, shared) = (Arc::clone(&root), Arc::clone(&shared));
            AcceptLoop::start(move |stream| {
                let _ = serve_object(stream, &root, &shared);
            })
        };
        HttpObjects {
            root,
            shared,
            accept,
            counter: AtomicU64::new(0),
            _dir: dir,
        }
    }

    fn file(&self, path: &ObjectPath) -> PathBuf {
        self.root.join(&path.container).join(&path.object)
    }

    fn exists(&self, path: &ObjectPath) -> bool {
        self.file(path).exists()
    }

    fn fetches(&self) -> Vec<Fetch> {
        self.shared.fetches.lock().expect("lock").clone()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[async_trait::async_trait]
impl ObjectStore for HttpObjects {
    async fn put(
        &self,
        path: &ObjectPath,
        body: ObjectBody,
        options: &PutOptions,
    ) -> Result<(), ObjectError> {
        let file = self.file(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        match body {
            ObjectBody::Bytes(b) => std::fs::write(&file, &b)?,
            ObjectBody::File(src) => {
                std::fs::copy(src, &file)?;
            }
        }
        self.shared
            .delete_after
            .lock()
            .expect("lock")
            .insert(path.to_string(), options.delete_after);
        Ok(())
    }
    async fn delete(&self, path: &ObjectPath) -> Result<bool, ObjectError> {
        match std::fs::remove_file(self.file(path)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
    async fn head(&self, path: &ObjectPath) -> Result<ObjectInfo, ObjectError> {
        let meta =
            std::fs::metadata(self.file(path)).map_err(|_| ObjectError::NotFound(path.clone()))?;
        Ok(ObjectInfo {
            size: meta.len(),
            metadata: Default::default(),
            delete_at: None,
        })
    }
    async fn temp_url(&self, path: &ObjectPath, ttl: Duration) -> Result<String, ObjectError> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let sig = hex::encode(Sha256::digest(format!("{path}|{n}|{nanos}").as_bytes()));
        let expires = now_secs() + ttl.as_secs();
        let object_path = format!("/{}/{}", path.container, path.object);
        self.shared
            .urls
            .lock()
            .expect("lock")
            .insert(sig.clone(), (object_path.clone(), expires));
        Ok(format!(
            "http://{}{object_path}?temp_url_sig={sig}&temp_url_expires={expires}",
            self.accept.addr()
        ))
    }
    fn kind(&self) -> &'static str {
        "test-http"
    }
}

fn serve_object(mut stream: TcpStream, root: &Path, shared: &ObjectsShared) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let (method, target, headers, _) = read_request(&mut stream)?;
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let sig = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("temp_url_sig="))
        .unwrap_or_default();
    let range = header(&headers, "range");
    let valid = shared
        .urls
        .lock()
        .expect("lock")
        .get(sig)
        .is_some_and(|(p, exp)| p == path && *exp >= now_secs());
    let file = root.join(path.trim_start_matches('/'));
    let body = if valid {
        std::fs::read(&file).ok()
    } else {
        None
    };
    let status = match (&body, valid) {
        (_, false) => 401,
        (None, true) => 404,
        (Some(_), true) => {
            if range.is_some() {
                206
            } else {
                200
            }
        }
    };
    shared.fetches.lock().expect("lock").push(Fetch {
        path: path.to_owned(),
        range: range.clone(),
        status,
    });
    let Some(body) = body.filter(|_| valid) else {
        return write!(
            stream,
            "HTTP/1.1 {status} No\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
    };
    let len = body.len();
    let (status_line, slice, extra) = match range.as_deref().and_then(parse_range) {
        Some((a, b)) if a < len => {
            let b = b.unwrap_or(len - 1).min(len - 1);
            (
                "206 Partial Content",
                &body[a..=b],
                format!("Content-Range: bytes {a}-{b}/{len}\r\n"),
            )
        }
        _ => ("200 OK", &body[..], String::new()),
    };
    write!(
        stream,
        "HTTP/1.1 {status_line}\r\nContent-Length: {}\r\nAccept-Ranges: bytes\r\n{extra}Connection: close\r\n\r\n",
        slice.len()
    )?;
    if method != "HEAD" {
        stream.write_all(slice)?;
    }
    stream.flush()
}

fn parse_range(spec: &str) -> Option<(usize, Option<usize>)> {
    let (a, b) = spec.trim().strip_prefix("bytes=")?.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()))
}

type Headers = Vec<(String, String)>;

fn header(headers: &Headers, name: &str) -> Option<String> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.clone())
}

fn read_request(stream: &mut TcpStream) -> std::io::Result<(String, String, Headers, Vec<u8>)> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let target = parts.next().unwrap_or_default().to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    let len = header(&headers, "content-length")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len.min(1 << 20)];
    reader.read_exact(&mut body)?;
    Ok((method, target, headers, body))
}

/// A GET of `url` on 127.0.0.1 over plain HTTP: status and body.
fn http_get(url: &str) -> (u16, Vec<u8>) {
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (host, path) = rest.split_once('/').expect("a path");
    let mut stream = TcpStream::connect(host).expect("connecting to the object server");
    write!(
        stream,
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .expect("sending the request");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("reading the answer");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    (status, raw[split + 4..].to_vec())
}

// ---------------------------------------------------------------------------------------------
// The rig.

fn obj(v: Value) -> JsonObject {
    match v {
        Value::Object(o) => o,
        other => panic!("not an object: {other}"),
    }
}

struct Rig {
    emulator: Emulator,
    objects: Arc<HttpObjects>,
    nodes: Arc<SqliteStore>,
    deploy: AgentDeploy,
    node: Node,
    dir: tempfile::TempDir,
    _db: tempfile::TempDir,
}

/// A node on a fresh emulator with a conductor-local deploy ISO and instance image, one
/// PXE-enabled port, and the given `properties`.
async fn rig(emulator_args: &[&str], api_url: &str, image: &[u8], properties: Value) -> Rig {
    let (db, nodes) = sqlite();
    rig_in(
        db,
        nodes,
        uuid::Uuid::new_v4(),
        emulator_args,
        api_url,
        image,
        properties,
    )
    .await
}

/// [`rig`] with a given node store and node UUID.
async fn rig_in(
    db: tempfile::TempDir,
    nodes: Arc<SqliteStore>,
    node_uuid: uuid::Uuid,
    emulator_args: &[&str],
    api_url: &str,
    image: &[u8],
    properties: Value,
) -> Rig {
    let emulator = Emulator::start(emulator_args);
    let objects = Arc::new(HttpObjects::start());
    let dir = tempfile::tempdir().expect("temp dir");
    let iso = dir.path().join("deploy.iso");
    std::fs::write(&iso, vec![0x5a; 64 * 1024]).expect("writing the deploy ISO stand-in");
    let image_path = dir.path().join("instance.raw");
    std::fs::write(&image_path, image).expect("writing the image");

    let mut node = Node::new(node_uuid, "agent_ilo", ProvisionState::Deploying);
    node.driver_info = emulator.driver_info();
    node.driver_info.insert(
        "ilo_deploy_iso".into(),
        json!(format!("file://{}", iso.display())),
    );
    node.instance_info = obj(json!({
        "image_source": format!("file://{}", image_path.display()),
        "image_os_hash_algo": "sha256",
        "image_os_hash_value": hex::encode(Sha256::digest(image)),
        "image_disk_format": "raw",
    }));
    node.properties = obj(properties);
    node.network_data = obj(json!({
        "networks": [{"id": "n0", "type": "ipv4", "ip_address": "192.0.2.10",
                      "netmask": "255.255.255.0",
                      "routes": [{"network": "0.0.0.0", "netmask": "0.0.0.0",
                                  "gateway": "192.0.2.1"}]}],
        "services": [{"type": "dns", "address": "192.0.2.53"}]
    }));
    nodes.create_node(&node).await.expect("node");
    nodes
        .create_port(&Port {
            uuid: uuid::Uuid::new_v4(),
            address: MAC.into(),
            node_uuid: node.uuid,
            pxe_enabled: true,
            extra: JsonObject::new(),
            created_at: time::OffsetDateTime::now_utc(),
            updated_at: None,
        })
        .await
        .expect("port");
    let store: Arc<dyn Store> = Arc::clone(&nodes) as Arc<dyn Store>;
    let object_store: Arc<dyn ObjectStore> = Arc::clone(&objects) as Arc<dyn ObjectStore>;
    let ctx = Arc::new(DeployContext {
        store,
        objects: object_store,
        config: DeployConfig {
            api_url: api_url.into(),
            api_ca_pem: api_url.starts_with("https").then(|| CA_PEM.to_owned()),
            container: CONTAINER.into(),
            deploy_helper_images_ttl: FLOPPY_TTL,
            agent_allow_plain_http: true,
            agent_call_timeout: Duration::from_secs(30),
        },
    });
    let deploy = AgentDeploy::new(ctx).with_agent_power_off_wait(Duration::from_secs(2));
    Rig {
        emulator,
        objects,
        nodes,
        deploy,
        node,
        dir,
        _db: db,
    }
}

/// The parameters on the floppy behind `url`, read back from the image bytes.
fn floppy_params(url: &str) -> vmdeploy_shared::params::Params {
    let (status, image) = http_get(url);
    assert_eq!(status, 200, "the floppy's temp URL still answers");
    assert_eq!(
        vmdeploy_shared::fat::fat_label(&image[..512])
            .expect("a FAT image")
            .as_deref(),
        Some("ir-vfd-dev")
    );
    let text = vmdeploy_shared::fat::read_root_file(
        std::io::Cursor::new(image),
        "parameters.txt",
        64 * 1024,
    )
    .expect("parameters.txt on the floppy");
    vmdeploy_shared::params::Params::parse(&text).expect("a valid parameters file")
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_boots_the_ramdisk_from_virtual_media_and_clean_up_undoes_it() {
    let mut rig = rig(
        &[],
        "https://192.0.2.1:6385/",
        &[7u8; 4096],
        json!({"capabilities": "boot_mode:uefi", "root_device": {"serial": "S123"}}),
    )
    .await;
    rig.emulator.power_on().await;
    let step = rig
        .deploy
        .deploy(&mut rig.node)
        .await
        .expect("deploy starts");
    assert_eq!(step, DeployStep::Wait);

    let state = rig.emulator.state();
    assert_eq!(state["power"], "ON", "{state}");
    assert_eq!(state["boot_mode"]["current"], "UEFI", "{state}");
    assert_eq!(state["last_boot"]["device"], "CDROM", "{state}");
    assert_eq!(state["last_boot"]["reason"], "one_time", "{state}");
    assert!(state["last_boot"]["media_read_error"].is_null(), "{state}");
    let floppy = &state["vmedia"]["FLOPPY"];
    let cdrom = &state["vmedia"]["CDROM"];
    assert_eq!(floppy["inserted"], true, "{state}");
    assert_eq!(cdrom["inserted"], true, "{state}");
    assert_eq!(cdrom["image_size"], 64 * 1024, "{state}");

    // The emulator read both media by range, as an iLO does.
    let floppy_object = vmedia::floppy_object(CONTAINER, rig.node.uuid);
    let floppy_path = format!("/{floppy_object}");
    let fetches = rig.objects.fetches();
    assert!(
        fetches
            .iter()
            .any(|f| f.path == floppy_path && f.range.is_some() && f.status == 206),
        "the emulator fetched the floppy: {fetches:?}"
    );
    assert!(
        fetches
            .iter()
            .any(|f| f.path.contains("/file-") && f.path.ends_with("deploy.iso")),
        "the emulator fetched the deploy ISO from the store: {fetches:?}"
    );
    assert_eq!(
        rig.objects.shared.delete_after.lock().expect("lock")[&floppy_object.to_string()],
        Some(FLOPPY_TTL)
    );

    // What the emulator was given is the node's floppy, with the node's values.
    let url = floppy["url"].as_str().expect("floppy URL");
    let params = floppy_params(url);
    let stored = stored(&rig.nodes, rig.node.uuid).await;
    let token = stored.driver_internal_info["agent_secret_token"]
        .as_str()
        .expect("the token is stored before the node boots");
    assert!(token.len() >= 43, "a token of at least 256 bits");
    assert_eq!(params.get("ipa-agent-token"), Some(token));
    assert_eq!(params.get("ipa-api-url"), Some("https://192.0.2.1:6385"));
    assert_eq!(params.get("BOOTIF"), Some(MAC));
    assert_eq!(params.get("root_device"), Some("serial=s123"));
    assert_eq!(params.get("vmdeploy-ip"), Some("192.0.2.10/24"));
    assert_eq!(params.get("vmdeploy-gateway"), Some("192.0.2.1"));
    assert_eq!(params.get("vmdeploy-dns"), Some("192.0.2.53"));
    let agent = vmdeploy_shared::params::AgentParams::from_params(&params).expect("agent view");
    assert_eq!(
        agent.common.agent_ca_pem.as_deref(),
        Some(CA_PEM.as_bytes())
    );

    rig.deploy.clean_up(&mut rig.node).await;
    let state = rig.emulator.state();
    assert_eq!(state["vmedia"]["FLOPPY"]["inserted"], false, "{state}");
    assert_eq!(state["vmedia"]["CDROM"]["inserted"], false, "{state}");
    assert_eq!(state["power"], "OFF", "{state}");
    assert!(!rig.objects.exists(&floppy_object), "floppy object deleted");
    assert!(!rig
        .node
        .driver_internal_info
        .contains_key("agent_secret_token"));
    let (status, _) = http_get(url);
    assert_eq!(status, 404, "the floppy URL no longer serves it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlicensed_ilo_is_refused_before_anything_is_powered_off() {
    let mut rig = rig(
        &["--license", "standard"],
        "http://127.0.0.1:6385",
        &[1u8; 512],
        json!({}),
    )
    .await;
    rig.emulator.power_on().await;
    let err = rig
        .deploy
        .validate(&rig.node)
        .await
        .expect_err("standard licence");
    assert!(format!("{err:#}").contains("Advanced licence"), "{err:#}");
    let err = rig
        .deploy
        .deploy(&mut rig.node)
        .await
        .expect_err("standard licence");
    assert!(format!("{err:#}").contains("Advanced licence"), "{err:#}");
    let state = rig.emulator.state();
    assert_eq!(state["power"], "ON", "nothing was powered off: {state}");
    assert_eq!(state["vmedia"]["FLOPPY"]["inserted"], false, "{state}");
    assert!(
        !rig.objects
            .exists(&vmedia::floppy_object(CONTAINER, rig.node.uuid)),
        "no floppy stored"
    );
    assert!(stored(&rig.nodes, rig.node.uuid)
        .await
        .driver_internal_info
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tear_down_powers_off_ejects_and_forgets_the_agent() {
    let mut rig = rig(&[], "http://127.0.0.1:6385", &[3u8; 1024], json!({})).await;
    assert_eq!(
        rig.deploy
            .deploy(&mut rig.node)
            .await
            .expect("deploy starts"),
        DeployStep::Wait
    );
    assert_eq!(rig.emulator.state()["power"], "ON");
    // As a heartbeat would have left it.
    rig.node
        .driver_internal_info
        .insert("agent_url".into(), json!("https://127.0.0.1:9999"));
    rig.node
        .driver_internal_info
        .insert("agent_verify_ca".into(), json!(CA_PEM));
    rig.deploy
        .tear_down(&mut rig.node)
        .await
        .expect("tear down");
    let state = rig.emulator.state();
    assert_eq!(state["power"], "OFF", "{state}");
    assert_eq!(state["vmedia"]["FLOPPY"]["inserted"], false, "{state}");
    assert_eq!(state["vmedia"]["CDROM"]["inserted"], false, "{state}");
    assert!(!rig
        .objects
        .exists(&vmedia::floppy_object(CONTAINER, rig.node.uuid)));
    for gone in ["agent_secret_token", "agent_url", "agent_verify_ca"] {
        assert!(
            !rig.node.driver_internal_info.contains_key(gone),
            "{gone} forgotten"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_names_the_field_of_a_missing_deploy_iso_or_image() {
    let mut rig = rig(&[], "http://127.0.0.1:6385", &[1u8; 512], json!({})).await;
    rig.node
        .driver_info
        .insert("ilo_deploy_iso".into(), json!("swift://isos/missing.iso"));
    let err = rig
        .deploy
        .validate(&rig.node)
        .await
        .expect_err("no such object");
    assert!(
        format!("{err:#}").contains("driver_info.ilo_deploy_iso"),
        "{err:#}"
    );
    rig.node.driver_info.insert(
        "ilo_deploy_iso".into(),
        json!(format!(
            "file://{}",
            rig.dir.path().join("deploy.iso").display()
        )),
    );
    rig.deploy.validate(&rig.node).await.expect("valid again");
    rig.node.instance_info.remove("image_os_hash_value");
    let err = rig
        .deploy
        .validate(&rig.node)
        .await
        .expect_err("no checksum");
    assert!(
        format!("{err:#}").contains("image_os_hash_value"),
        "{err:#}"
    );
    rig.node
        .driver_info
        .insert("ilo_password".into(), json!("wrong"));
    rig.node
        .instance_info
        .insert("image_os_hash_value".into(), json!("0".repeat(64)));
    let err = rig
        .deploy
        .validate(&rig.node)
        .await
        .expect_err("bad credentials");
    assert!(
        format!("{err:#}").to_lowercase().contains("login"),
        "{err:#}"
    );
    assert_eq!(rig.emulator.state()["power"], "OFF");
}

// ---------------------------------------------------------------------------------------------
// The whole deploy, through the agent binary.

/// The API's ramdisk endpoints: `GET /`, `GET /v1/lookup`, `POST /v1/heartbeat/{node}` with
/// the token checked against the stored node, as the manager checks it. Heartbeats are handed
/// to the test, which runs the flow on them.
struct ApiStandin {
    accept: AcceptLoop,
    heartbeats: std::sync::mpsc::Receiver<HeartbeatRequest>,
    refused: Arc<Mutex<Vec<String>>>,
}

fn respond(stream: &mut TcpStream, status: u16, body: &Value) -> std::io::Result<()> {
    let text = body.to_string();
    write!(
        stream,
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nX-OpenStack-Ironic-API-Version: 1.72\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    )?;
    stream.flush()
}

impl ApiStandin {
    fn start(nodes: Arc<SqliteStore>, node: uuid::Uuid) -> ApiStandin {
        let runtime = tokio::runtime::Handle::current();
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = Mutex::new(tx);
        let refused = Arc::new(Mutex::new(Vec::new()));
        let refusals = Arc::clone(&refused);
        let accept = AcceptLoop::start(move |mut stream| {
            let Ok((method, target, _headers, body)) = read_request(&mut stream) else {
                return;
            };
            let path = target.split('?').next().unwrap_or_default().to_owned();
            let stored = runtime.block_on(stored(&nodes, node));
            let (status, reply) = match (method.as_str(), path.as_str()) {
                ("GET", "/") => (
                    200,
                    json!({"name": "vmdeploy flow test", "default_version":
                           {"id": "v1", "version": "1.72", "min_version": "1.1",
                            "status": "CURRENT"}, "versions": [{"id": "v1"}]}),
                ),
                ("GET", "/v1/lookup") => (
                    200,
                    json!({"node": {"uuid": node.to_string(), "properties": stored.properties,
                                    "instance_info": {}, "driver_internal_info": {}},
                           "config": {"heartbeat_timeout": 2, "agent_token": "******",
                                      "agent_token_required": true}}),
                ),
                ("POST", p) if p == format!("/v1/heartbeat/{node}") => {
                    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    let s = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
                    let expected = stored
                        .driver_internal_info
                        .get("agent_secret_token")
                        .and_then(Value::as_str);
                    if expected.is_none() || s("agent_token").as_deref() != expected {
                        refusals
                            .lock()
                            .expect("lock")
                            .push("wrong agent token".into());
                        (
                            401,
                            json!({"error_message": "Invalid or missing agent token"}),
                        )
                    } else {
                        let hb = HeartbeatRequest {
                            callback_url: s("callback_url").unwrap_or_default(),
                            agent_token: s("agent_token"),
                            agent_version: s("agent_version"),
                            agent_verify_ca: s("agent_verify_ca"),
                            agent_status_message: s("agent_status_message"),
                        };
                        let _ = tx.lock().expect("lock").send(hb);
                        (202, json!({}))
                    }
                }
                (m, p) => (404, json!({"error_message": format!("no route {m} {p}")})),
            };
            let _ = respond(&mut stream, status, &reply);
        });
        ApiStandin {
            accept,
            heartbeats: rx,
            refused,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.accept.addr())
    }
}

/// The agent process, killed on drop; its log printed when the test fails.
struct AgentProcess {
    child: Child,
    log: PathBuf,
}

impl AgentProcess {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- agent log ---\n{}", self.log());
        }
    }
}

/// A pseudo-random image whose first sector is an MBR with one partition.
fn make_image(len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v[..512].fill(0);
    v[440..444].copy_from_slice(&0x1234_5678u32.to_le_bytes());
    v[446 + 4] = 0x83;
    v[446 + 8..446 + 12].copy_from_slice(&2048u32.to_le_bytes());
    v[446 + 12..446 + 16].copy_from_slice(&4096u32.to_le_bytes());
    v[510] = 0x55;
    v[511] = 0xAA;
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_ilo_deploy_writes_the_image_through_the_agent_and_boots_from_disk() {
    require_loop_devices();
    const DISK_LEN: u64 = 32 * 1024 * 1024;
    let image = make_image(6 * 1024 * 1024 + 4096);
    let disk = LoopDevice::attach(&vec![0xAA; DISK_LEN as usize], DISK_LEN, LoopIo::Direct);
    let disk_name = disk.device().display().to_string();

    // The API URL goes on the floppy, so the stand-in starts before the deploy; it reads the
    // token from the store at each call.
    let (db, nodes) = sqlite();
    let node_uuid = uuid::Uuid::new_v4();
    let api = ApiStandin::start(Arc::clone(&nodes), node_uuid);
    let rig = rig_in(
        db,
        Arc::clone(&nodes),
        node_uuid,
        &[],
        &api.url(),
        &image,
        json!({"root_device": {"name": disk_name}}),
    )
    .await;
    let deploy = &rig.deploy;
    let mut node = rig.node.clone();
    assert_eq!(
        deploy.deploy(&mut node).await.expect("deploy starts"),
        DeployStep::Wait
    );
    nodes.update_node(&node).await.expect("saving");

    // The node "boots": the agent reads the floppy the emulator was given.
    let state = rig.emulator.state();
    let floppy_url = state["vmedia"]["FLOPPY"]["url"]
        .as_str()
        .expect("floppy inserted");
    let (status, floppy) = http_get(floppy_url);
    assert_eq!(status, 200);
    let floppy_file = rig.dir.path().join("floppy.img");
    std::fs::write(&floppy_file, floppy).expect("writing the floppy");
    let cmdline = rig.dir.path().join("cmdline");
    std::fs::write(&cmdline, "console=ttyS0 boot_method=vmedia\n").expect("cmdline");
    let log = rig.dir.path().join("agent.log");
    let listen = format!("127.0.0.1:{}", free_port());
    let child = Command::new(bin("vmdeploy-agent"))
        .arg("run")
        .arg("--cmdline-file")
        .arg(&cmdline)
        .arg("--floppy")
        .arg(&floppy_file)
        .args(["--floppy-label", "ir-vfd-dev", "--floppy-wait-secs", "5"])
        .args([
            "--address",
            "127.0.0.1",
            "--agent-listen",
            &listen,
            "--mac",
            MAC,
        ])
        .args(["--fail-timeout-secs", "1"])
        .env("RUST_LOG", "info")
        .env("VMDEPLOY_LOOKUP_TIMEOUT_SECS", "60")
        .env("VMDEPLOY_POWER_OFF_GRACE_MS", "200")
        .env("VMDEPLOY_RETRY_BACKOFF_MS", "50")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).expect("log file"))
        .stderr(
            std::fs::OpenOptions::new()
                .append(true)
                .open(&log)
                .expect("log file"),
        )
        .spawn()
        .expect("starting vmdeploy-agent run");
    let mut agent = AgentProcess { child, log };

    // The manager's part: each heartbeat runs the flow on the stored node.
    let started = Instant::now();
    let mut heartbeats = 0;
    let mut saw_progress = false;
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no deploy within 120 s after {heartbeats} heartbeats"
        );
        let Ok(hb) = api.heartbeats.recv_timeout(Duration::from_secs(1)) else {
            continue;
        };
        heartbeats += 1;
        let mut node = stored(&nodes, node_uuid).await;
        let step = deploy
            .heartbeat(&mut node, &hb)
            .await
            .unwrap_or_else(|e| panic!("heartbeat {heartbeats}: {e:#}"));
        saw_progress |= node.driver_internal_info.contains_key("deploy_progress");
        nodes.update_node(&node).await.expect("saving");
        if step == DeployStep::Done {
            break;
        }
    }
    assert!(
        api.refused.lock().expect("lock").is_empty(),
        "every heartbeat had the floppy's token"
    );
    assert!(
        heartbeats >= 2,
        "prepare_image on the first heartbeat, done on a later one"
    );

    // The disk holds the image, the node boots from it, and nothing of the deploy is left.
    let written = disk.contents();
    assert_eq!(
        &written[..image.len()],
        &image[..],
        "the image is on the disk"
    );
    let node = stored(&nodes, node_uuid).await;
    let info = &node.driver_internal_info;
    assert!(info.contains_key("partition_uuids"), "{info:?}");
    for gone in ["agent_secret_token", "agent_url", "agent_verify_ca"] {
        assert!(!info.contains_key(gone), "{gone} wiped: {info:?}");
    }
    assert!(saw_progress, "heartbeats carried the write progress");
    let progress = &info["deploy_progress"];
    assert_eq!(progress["written"], image.len(), "{progress}");
    assert_eq!(progress["total"], image.len(), "{progress}");
    assert!(
        progress["rate"].as_u64().is_some_and(|r| r > 0),
        "{progress}"
    );
    let state = rig.emulator.state();
    assert_eq!(state["power"], "ON", "{state}");
    assert_eq!(state["persistent_boot"][0], "HDD", "{state}");
    assert_eq!(state["vmedia"]["FLOPPY"]["inserted"], false, "{state}");
    assert_eq!(state["vmedia"]["CDROM"]["inserted"], false, "{state}");
    assert!(
        !rig.objects
            .exists(&vmedia::floppy_object(CONTAINER, node_uuid)),
        "floppy object deleted"
    );
    assert_eq!(
        agent.wait_exit(Duration::from_secs(30)),
        Some(0),
        "the agent powered off (exited) on standby.power_off"
    );
}
