//! Unit tests of the run flow's dispatch and the pass_deploy_info retry policy.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;

use super::iscsi::{choose_disk, is_virtual_media};
use super::report::{pass_deploy_info_url, post_with_retries, RetryPolicy};
use super::*;
use crate::disk::select::BlockDevice;

#[derive(Parser)]
struct Wrapper {
    #[command(flatten)]
    run: RunArgs,
}

fn args(extra: &[&str]) -> RunArgs {
    Wrapper::try_parse_from(std::iter::once("run").chain(extra.iter().copied()))
        .expect("valid arguments")
        .run
}

const ISCSI: &str = "deployment_id=1be26c0b-03f2-4d2e-ae87-c02d7f33c123 \
    deployment_key=0123456789ABCDEFGHIJKLMNOPQRSTUV \
    iscsi_target_iqn=iqn-1be26c0b-03f2-4d2e-ae87-c02d7f33c123 \
    ironic_api_url=http://10.0.0.1:6385";

#[test]
fn defaults_match_the_contract() {
    let a = args(&[]);
    assert!(!a.pid1);
    assert_eq!(a.floppy_wait_secs, 60);
    assert_eq!(a.floppy_label, "ir-vfd-dev");
    assert_eq!(a.agent_listen.to_string(), "0.0.0.0:9999");
    assert_eq!(a.iscsi_listen.to_string(), "0.0.0.0:3260");
    assert_eq!(a.done_listen.to_string(), "0.0.0.0:10000");
    assert_eq!(a.done_timeout_secs, 1800);
    assert!(a.address.is_none() && a.macs.is_empty());
}

#[test]
fn every_flag_parses() {
    let a = args(&[
        "--pid1",
        "--cmdline-file",
        "/tmp/c",
        "--floppy",
        "/tmp/f",
        "--floppy-wait-secs",
        "3",
        "--address",
        "127.0.0.1",
        "--agent-listen",
        "127.0.0.1:1",
        "--iscsi-listen",
        "127.0.0.1:2",
        "--done-listen",
        "127.0.0.1:3",
        "--fail-timeout-secs",
        "4",
        "--mac",
        "52:54:00:12:34:56",
        "--mac",
        "52:54:00:12:34:57",
    ]);
    assert!(a.pid1);
    assert_eq!(a.floppy_wait_secs, 3);
    assert_eq!(a.address, Some("127.0.0.1".parse().expect("ip")));
    assert_eq!(a.done_listen.port(), 3);
    assert_eq!(a.fail_timeout_secs, 4);
    assert_eq!(a.macs.len(), 2);
    assert_eq!(a.macs[1].to_string(), "52:54:00:12:34:57");
    assert!(Wrapper::try_parse_from(["run", "--mac", "nonsense"]).is_err());
    assert!(Wrapper::try_parse_from(["run", "--address", "not-an-ip"]).is_err());
}

#[test]
fn deployment_key_means_iscsi_even_with_ipa_api_url() {
    let p = Params::parse_cmdline(&format!("{ISCSI} ipa-api-url=http://10.0.0.1:6385"));
    assert!(matches!(Mode::from_params(&p), Ok(Mode::Iscsi(_))));
}

#[test]
fn ipa_api_url_alone_means_agent() {
    let p = Params::parse_cmdline("ipa-api-url=http://10.0.0.1:6385 BOOTIF=52:54:00:12:34:56");
    assert!(matches!(Mode::from_params(&p), Ok(Mode::Agent(_))));
}

#[test]
fn neither_key_is_a_clear_error() {
    let p = Params::parse_cmdline("boot_method=vmedia quiet");
    let err = format!("{:#}", Mode::from_params(&p).expect_err("no mode"));
    assert!(
        err.contains("deployment_key") && err.contains("ipa-api-url"),
        "{err}"
    );
}

#[test]
fn a_missing_iscsi_key_is_named() {
    let p = Params::parse_cmdline(&ISCSI.replace("ironic_api_url=http://10.0.0.1:6385", ""));
    let err = format!("{:#}", Mode::from_params(&p).expect_err("no url"));
    assert!(err.contains("\"ironic_api_url\""), "{err}");
    assert!(err.contains("missing"), "{err}");
}

#[test]
fn a_raw_reporter_needs_url_node_and_key() {
    let a = args(&["--address", "127.0.0.1"]);
    let p = Params::parse_cmdline(&format!("{ISCSI} root_device=size=abc"));
    assert!(super::report::Reporter::from_raw(&p, &a).is_some());
    let p = Params::parse_cmdline("deployment_key=X ironic_api_url=http://10.0.0.1:6385");
    assert!(super::report::Reporter::from_raw(&p, &a).is_none());
}

#[test]
fn floppy_values_override_the_cmdline_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cmdline = dir.path().join("cmdline");
    std::fs::write(&cmdline, format!("{ISCSI} disk=sda boot_method=vmedia\n")).expect("cmdline");
    let floppy = dir.path().join("floppy.img");
    let image = vmdeploy_shared::fat::build_floppy(
        "ir-vfd-dev",
        &[(
            floppy::PARAMS_FILE,
            b"disk=vdb\nboot_option=local".as_slice(),
        )],
    )
    .expect("floppy");
    std::fs::write(&floppy, image).expect("floppy file");
    let a = args(&[
        "--cmdline-file",
        cmdline.to_str().expect("utf-8"),
        "--floppy",
        floppy.to_str().expect("utf-8"),
    ]);
    let loaded = load_params(&a).expect("loading");
    assert_eq!(loaded.params.get("disk"), Some("vdb"));
    assert_eq!(loaded.params.get("boot_option"), Some("local"));
    assert_eq!(
        loaded.params.get("deployment_key"),
        Some("0123456789ABCDEFGHIJKLMNOPQRSTUV")
    );
    assert_eq!(loaded.floppy_device.as_deref(), Some(floppy.as_path()));
}

#[test]
fn without_vmedia_no_floppy_is_searched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cmdline = dir.path().join("cmdline");
    std::fs::write(&cmdline, ISCSI).expect("cmdline");
    let a = args(&[
        "--cmdline-file",
        cmdline.to_str().expect("utf-8"),
        "--floppy-label",
        "nosuchlabel",
    ]);
    let loaded = load_params(&a).expect("PXE form: all on the command line");
    assert!(loaded.floppy_device.is_none());
    assert!(matches!(
        Mode::from_params(&loaded.params),
        Ok(Mode::Iscsi(_))
    ));
}

#[test]
fn a_missing_cmdline_file_is_an_error() {
    let a = args(&["--cmdline-file", "/nonexistent/cmdline"]);
    let err = format!("{:#}", load_params(&a).expect_err("missing"));
    assert!(err.contains("/nonexistent/cmdline"), "{err}");
}

fn dev(name: &str, vendor: &str, model: &str) -> BlockDevice {
    BlockDevice {
        name: name.into(),
        path: PathBuf::from(format!("/dev/{name}")),
        size: 100 << 30,
        model: model.into(),
        vendor: vendor.into(),
        serial: String::new(),
        wwn: String::new(),
        removable: false,
        read_only: false,
    }
}

fn iscsi_params(extra: &str) -> IscsiDeployParams {
    IscsiDeployParams::from_params(&Params::parse_cmdline(&format!("{ISCSI} {extra}")))
        .expect("valid params")
}

#[test]
fn virtual_media_and_the_floppy_are_refused() {
    let disks = [
        dev("sda", "HP", "Virtual Floppy"),
        dev("sdb", "HPE", "Virtual DVD-ROM"),
        dev("sdc", "ATA", "Disk"),
        dev("sdd", "ATA", "Other"),
    ];
    assert!(is_virtual_media(&disks[0]) && is_virtual_media(&disks[1]));
    assert!(!is_virtual_media(&disks[2]));
    // Free choice skips them.
    let d =
        choose_disk(&disks, &iscsi_params(""), Some(Path::new("/dev/sdc")), true).expect("a disk");
    assert_eq!(d.name, "sdd");
    // ... but only as PID 1: on a host the free choice would be the host's own disk.
    let err = choose_disk(&disks, &iscsi_params(""), None, false).expect_err("no free choice");
    assert!(err.to_string().contains("not PID 1"), "{err}");
    // Asked for by name: refused with the reason.
    let err = choose_disk(&disks, &iscsi_params("disk=sda"), None, false).expect_err("refused");
    assert!(err.to_string().contains("virtual media"), "{err}");
    let err = choose_disk(
        &disks,
        &iscsi_params("root_device=name=sdc"),
        Some(Path::new("/dev/sdc")),
        false,
    )
    .expect_err("refused");
    assert!(err.to_string().contains("virtual floppy"), "{err}");
    let err = choose_disk(
        &disks,
        &iscsi_params("root_device=serial=nope"),
        None,
        false,
    )
    .expect_err("no match");
    assert!(err.to_string().contains("root device hints"), "{err}");
}

#[test]
fn the_url_has_v1_and_the_node() {
    assert_eq!(
        pass_deploy_info_url("http://10.0.0.1:6385/", "1be26c0b-03f2"),
        "http://10.0.0.1:6385/v1/nodes/1be26c0b-03f2/vendor_passthru/pass_deploy_info"
    );
    assert!(pass_deploy_info_url("http://h:1", "a/b?c").contains("/nodes/a%2Fb%3Fc/"));
}

/// A tiny HTTP server answering each request with the next status of `script` (the last one
/// repeats); records the request lines and bodies.
struct Scripted {
    url: String,
    seen: Arc<Mutex<Vec<(String, String)>>>,
}

impl Scripted {
    fn start(script: Vec<u16>) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!(
            "http://{}/v1/nodes/n/vendor_passthru/pass_deploy_info",
            listener.local_addr().expect("addr")
        );
        let seen = Arc::new(Mutex::new(Vec::new()));
        let rec = seen.clone();
        std::thread::spawn(move || {
            for (i, conn) in listener.incoming().enumerate() {
                let Ok(mut conn) = conn else { return };
                let mut reader = BufReader::new(conn.try_clone().expect("clone"));
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let mut len = 0usize;
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
                        break;
                    }
                    if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    if h.to_ascii_lowercase().starts_with("x-auth-token: token") {
                        line.push_str(" +token");
                    }
                }
                let mut body = vec![0u8; len];
                let _ = reader.read_exact(&mut body);
                rec.lock().expect("lock").push((
                    line.trim().to_owned(),
                    String::from_utf8_lossy(&body).into(),
                ));
                let status = script[i.min(script.len() - 1)];
                let text = format!("{{\"status\":{status}}}");
                let _ = write!(
                    conn,
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                );
            }
        });
        Scripted { url, seen }
    }
}

fn fast_policy(total_ms: u64) -> RetryPolicy {
    RetryPolicy {
        first_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(80),
        total: Duration::from_millis(total_ms),
        request_timeout: Duration::from_secs(5),
    }
}

fn body() -> vmdeploy_shared::api::PassDeployInfo {
    vmdeploy_shared::api::PassDeployInfo {
        address: "127.0.0.1".into(),
        key: "KEY".into(),
        iqn: "iqn-x".into(),
        error: None,
    }
}

fn post(url: &str, policy: RetryPolicy) -> anyhow::Result<()> {
    let client = crate::http::build_client(&Default::default()).expect("client");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(post_with_retries(
            &client,
            url,
            Some("TOKEN"),
            &body(),
            policy,
        ))
}

#[test]
fn server_errors_are_retried_until_accepted() {
    let s = Scripted::start(vec![503, 500, 202]);
    post(&s.url, fast_policy(10_000)).expect("accepted on the third try");
    let seen = s.seen.lock().expect("lock");
    assert_eq!(seen.len(), 3);
    assert!(seen[0]
        .0
        .starts_with("POST /v1/nodes/n/vendor_passthru/pass_deploy_info"));
    let json: serde_json::Value = serde_json::from_str(&seen[2].1).expect("json body");
    assert_eq!(json["address"], "127.0.0.1");
    assert_eq!(json["key"], "KEY");
    assert_eq!(json["iqn"], "iqn-x");
    assert!(json.get("error").is_none());
}

#[test]
fn refusals_are_not_retried() {
    for status in [400u16, 403, 409] {
        let s = Scripted::start(vec![status, 202]);
        let err = post(&s.url, fast_policy(10_000)).expect_err("refused");
        let msg = format!("{err:#}");
        assert!(msg.contains(&status.to_string()), "{msg}");
        assert!(
            msg.contains(&format!("{{\"status\":{status}}}")),
            "body logged: {msg}"
        );
        assert_eq!(s.seen.lock().expect("lock").len(), 1, "{status} retried");
    }
}

#[test]
fn retries_stop_within_the_total_budget() {
    let s = Scripted::start(vec![503]);
    let start = Instant::now();
    let err = post(&s.url, fast_policy(400)).expect_err("never accepted");
    let took = start.elapsed();
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(s.seen.lock().expect("lock").len() >= 3);
    assert!(format!("{err:#}").contains("503"), "{err:#}");

    // Nobody listening: connection errors are retried, and bounded too.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let start = Instant::now();
    let err = post(&format!("http://127.0.0.1:{port}/x"), fast_policy(300)).expect_err("refused");
    assert!(start.elapsed() < Duration::from_secs(3));
    assert!(format!("{err:#}").contains("failed"), "{err:#}");
}
