//! `vmdeploy-agent write-image` against a real loop device and a local HTTP(S) server: checksum
//! algorithms, compressed and qcow2 sources, checksum mismatch, truncated and dropped downloads,
//! TLS trust.
//!
//! Fixtures are made here with the reference tools (gzip, zstd, xz, qemu-img) from one
//! pseudo-random raw image, so every source must produce the same disk bytes.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

use md5::Md5;
use sha2::{Digest, Sha256, Sha512};
use vmdeploy_integration_tests::bin;
use vmdeploy_integration_tests::http::{ServerConfig, TestHttpServer, TestPki};
use vmdeploy_integration_tests::loopdev::{LoopDevice, LoopIo};

const MIB: usize = 1024 * 1024;
/// The loop device: large enough for a qcow2 spool behind the image.
const DISK_LEN: u64 = 48 * MIB as u64;
/// Byte the disk is filled with before each run, to see what was (not) written.
const FILL: u8 = 0xAA;

/// A fresh disk: a loop device (O_DIRECT, as a real disk) filled with [`FILL`].
fn new_disk() -> LoopDevice {
    LoopDevice::attach(&vec![FILL; DISK_LEN as usize], DISK_LEN, LoopIo::Direct)
}

/// A pseudo-random image with an MBR-like signature in its first sector and compressible runs,
/// `len` bytes (a multiple of 512 so qemu-img's virtual size equals it).
fn make_image(len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if (x >> 60) < 4 {
            // A run of zeros or a repeated byte (so compressors have something to do, and qcow2
            // clusters differ).
            let run = 1 + (x as usize % 20_000);
            let byte = if x & 1 == 0 { 0 } else { (x >> 8) as u8 };
            v.extend(std::iter::repeat_n(byte, run));
        } else {
            v.extend_from_slice(&x.to_le_bytes());
        }
    }
    v.truncate(len);
    v[510] = 0x55;
    v[511] = 0xAA;
    v
}

fn digest_hex(algo: &str, data: &[u8]) -> String {
    match algo {
        "md5" => hex::encode(Md5::digest(data)),
        "sha256" => hex::encode(Sha256::digest(data)),
        "sha512" => hex::encode(Sha512::digest(data)),
        other => panic!("no such algorithm {other}"),
    }
}

fn run_agent(args: &[&str]) -> Output {
    let out = Command::new(bin("vmdeploy-agent"))
        .arg("write-image")
        .args(args)
        .env("RUST_LOG", "info")
        // Short retry pauses keep the failure tests quick; the logic is the same.
        .env("VMDEPLOY_RETRY_BACKOFF_MS", "50")
        .output()
        .expect("running vmdeploy-agent");
    eprintln!(
        "--- agent stderr ---\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn write_image(url: &str, disk: &LoopDevice, extra: &[&str]) -> Output {
    let disk_path = disk.device().to_str().expect("utf-8 path").to_owned();
    let mut args = vec!["--url", url, "--disk", &disk_path];
    args.extend_from_slice(extra);
    run_agent(&args)
}

fn assert_disk_holds(disk: &LoopDevice, image: &[u8], what: &str) {
    let back = disk.contents();
    assert!(
        back[..image.len()] == *image,
        "{what}: the disk does not hold the image"
    );
    assert!(
        back[image.len()..image.len() + 4096]
            .iter()
            .all(|&b| b == FILL),
        "{what}: bytes after the image were touched"
    );
}

fn serve(body: Vec<u8>) -> TestHttpServer {
    TestHttpServer::start(ServerConfig {
        body: Arc::new(body),
        ..Default::default()
    })
}

/// Runs a fixture tool over `input`, returning its output file's bytes.
fn tool(program: &str, args: &[&str], input: &[u8], dir: &Path, out_name: &str) -> Vec<u8> {
    let src = dir.join("image.raw");
    std::fs::write(&src, input).expect("fixture input");
    let out = dir.join(out_name);
    let mut cmd = Command::new(program);
    cmd.args(args);
    match program {
        "qemu-img" => {
            cmd.arg(&src).arg(&out);
        }
        _ => {
            cmd.arg("-c")
                .arg(&src)
                .stdout(std::fs::File::create(&out).expect("fixture output"));
        }
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(status.success(), "{program} failed");
    std::fs::read(&out).expect("fixture output")
}

#[test]
fn every_checksum_algorithm_verifies_and_writes() {
    let image = make_image(5 * MIB + 4096 + 512 + 17);
    let server = serve(image.clone());
    for algo in ["md5", "sha256", "sha512"] {
        let disk = new_disk();
        let checksum = format!("{algo}:{}", digest_hex(algo, &image));
        let out = write_image(&server.url("/img.raw"), &disk, &["--checksum", &checksum]);
        assert!(out.status.success(), "{algo}: write-image failed");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("checksum {checksum} verified")),
            "{algo}: {stderr}"
        );
        // A block device that takes O_DIRECT: the agent's direct path, not the buffered one.
        assert!(stderr.contains("direct=true"), "{algo}: {stderr}");
        assert_disk_holds(&disk, &image, algo);
    }
    // A bare hex digest names its algorithm by length.
    let disk = new_disk();
    let out = write_image(
        &server.url("/img.raw"),
        &disk,
        &["--checksum", &digest_hex("sha512", &image)],
    );
    assert!(out.status.success(), "bare sha512 hex");
    assert_disk_holds(&disk, &image, "bare hex");
}

#[test]
fn compressed_and_qcow2_sources_give_identical_disks() {
    let image = make_image(9 * MIB + 3 * 512);
    let dir = tempfile::tempdir_in("/var/tmp").expect("fixture dir");
    let fixtures = [
        (
            "gzip",
            tool("gzip", &["-6"], &image, dir.path(), "image.gz"),
        ),
        (
            "zstd",
            tool("zstd", &["-q", "-3"], &image, dir.path(), "image.zst"),
        ),
        ("xz", tool("xz", &["-6"], &image, dir.path(), "image.xz")),
        (
            "qcow2",
            tool(
                "qemu-img",
                &["convert", "-f", "raw", "-O", "qcow2"],
                &image,
                dir.path(),
                "image.qcow2",
            ),
        ),
        (
            "qcow2-deflate",
            tool(
                "qemu-img",
                &["convert", "-c", "-f", "raw", "-O", "qcow2"],
                &image,
                dir.path(),
                "image-c.qcow2",
            ),
        ),
    ];
    for (name, fixture) in fixtures {
        // gzip of a qcow2 for the last case is covered by the decode-then-sniff order below.
        let checksum = format!("sha256:{}", digest_hex("sha256", &fixture));
        let server = serve(fixture);
        let disk = new_disk();
        let out = write_image(&server.url("/image"), &disk, &["--checksum", &checksum]);
        assert!(out.status.success(), "{name}: write-image failed");
        assert_disk_holds(&disk, &image, name);
    }
    // A gzipped qcow2: decompressed, then recognised as qcow2 and converted.
    let qcow2 = std::fs::read(dir.path().join("image.qcow2")).expect("qcow2 fixture");
    let gz = tool("gzip", &["-1"], &qcow2, dir.path(), "image.qcow2.gz");
    let server = serve(gz);
    let disk = new_disk();
    let out = write_image(&server.url("/image"), &disk, &[]);
    assert!(out.status.success(), "qcow2.gz: write-image failed");
    assert_disk_holds(&disk, &image, "qcow2.gz");
}

#[test]
fn checksum_mismatch_zeroes_the_first_mib_and_says_so() {
    let image = make_image(3 * MIB + 100);
    let server = serve(image.clone());
    let disk = new_disk();
    let wrong = "0".repeat(64);
    let out = write_image(
        &server.url("/img"),
        &disk,
        &["--checksum", &format!("sha256:{wrong}")],
    );
    assert!(!out.status.success(), "a wrong checksum must fail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!(
        "image checksum mismatch: expected sha256:{wrong}, got sha256:{}",
        digest_hex("sha256", &image)
    );
    assert!(stderr.contains(&expected), "stderr lacks {expected:?}");
    let back = disk.contents();
    assert!(back[..MIB].iter().all(|&b| b == 0), "first MiB zeroed");
}

#[test]
fn truncated_download_fails_and_leaves_no_bootable_disk() {
    let image = make_image(4 * MIB);
    let server = TestHttpServer::start(ServerConfig {
        body: Arc::new(image.clone()),
        truncate_at: Some(2 * MIB as u64 + 1234),
        ..Default::default()
    });
    let disk = new_disk();
    let out = write_image(&server.url("/img"), &disk, &[]);
    assert!(!out.status.success(), "a truncated download must fail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("failed after 5 retries at byte 2098386"),
        "stderr names the retries and the offset"
    );
    let back = disk.contents();
    assert!(back[..MIB].iter().all(|&b| b == 0), "first MiB zeroed");
    let ranged = server
        .requests
        .lock()
        .expect("log")
        .iter()
        .filter(|r| r.range.as_deref() == Some("bytes=2098386-"))
        .count();
    assert!(ranged >= 1, "resume attempts used Range");
}

#[test]
fn dropped_connection_is_resumed_with_range() {
    let image = make_image(6 * MIB + 333);
    let server = TestHttpServer::start(ServerConfig {
        body: Arc::new(image.clone()),
        drop_once_at: Some(3 * MIB as u64 + 77),
        etag: Some("\"v1\"".to_owned()),
        ..Default::default()
    });
    let disk = new_disk();
    let checksum = format!("sha512:{}", digest_hex("sha512", &image));
    let out = write_image(&server.url("/img"), &disk, &["--checksum", &checksum]);
    assert!(out.status.success(), "the download must resume");
    assert_disk_holds(&disk, &image, "resumed");
    let log = server.requests.lock().expect("log").clone();
    assert_eq!(log.len(), 2, "one drop, one resume: {log:?}");
    let resumed = &log[1];
    assert_eq!(resumed.range.as_deref(), Some("bytes=3145805-"));
    assert_eq!(resumed.if_range.as_deref(), Some("\"v1\""));
}

#[test]
fn tls_trusts_only_the_given_ca() {
    let image = make_image(2 * MIB + 5);
    let pki = TestPki::new();
    let server = TestHttpServer::start(ServerConfig {
        body: Arc::new(image.clone()),
        tls: Some(Arc::clone(&pki.server_config)),
        ..Default::default()
    });
    let dir = tempfile::tempdir().expect("ca dir");
    let good_ca = dir.path().join("ca.pem");
    std::fs::write(&good_ca, &pki.ca_pem).expect("ca file");
    let other_ca = dir.path().join("other.pem");
    let other_pem = TestPki::new().ca_pem;
    std::fs::write(&other_ca, &other_pem).expect("ca file");
    // A bundle (the conductor's CA, then the image store's) is trusted as a whole.
    let bundle = dir.path().join("bundle.pem");
    std::fs::write(&bundle, format!("{other_pem}{}", pki.ca_pem)).expect("ca file");

    let disk = new_disk();
    let checksum = format!("md5:{}", digest_hex("md5", &image));
    let url = server.url("/img");
    let ca = good_ca.to_str().expect("utf-8");
    let out = write_image(&url, &disk, &["--checksum", &checksum, "--ca", ca]);
    assert!(out.status.success(), "https with the right CA");
    assert_disk_holds(&disk, &image, "https");

    let disk = new_disk();
    let ca = bundle.to_str().expect("utf-8");
    let out = write_image(&url, &disk, &["--checksum", &checksum, "--ca", ca]);
    assert!(
        out.status.success(),
        "https with the right CA second in a bundle"
    );
    assert_disk_holds(&disk, &image, "https, CA bundle");

    let disk = new_disk();
    let ca = other_ca.to_str().expect("utf-8");
    let out = write_image(&url, &disk, &["--ca", ca]);
    assert!(!out.status.success(), "an unknown CA must be refused");
    let stderr = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(
        stderr.contains("certificate") || stderr.contains("issuer"),
        "says why"
    );
    assert!(
        disk.contents()[..MIB].iter().all(|&b| b == 0),
        "nothing bootable left"
    );
}
