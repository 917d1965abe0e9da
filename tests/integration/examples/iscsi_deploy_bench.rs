//! The measurement behind `bench/iscsi-deploy.sh`, an example program rather than a test so
//! that the test run neither runs nor lists it (the script builds and runs it in release): an
//! `iscsi_ilo` deploy from `pass_deploy_info` to `active`,
//! next to the conductor's initiator CLI writing the same image raw into the same kind of
//! target in the same run.
//!
//! The real Manager and flow over the built-in store and the iLO emulator; the ramdisk is
//! played by `vmdeploy-agent iscsi-target` (the target the ramdisk runs) and the test posts
//! `pass_deploy_info` itself, so the clock starts at the call-back, not at the ramdisk's boot.
//! Each run writes onto fresh sparse `losetup --direct-io=on` disks (one for the raw write, one
//! for the deploy: a file whose blocks are already allocated is faster to write). A run before
//! the timed ones fills the conductor's image cache and is reported apart (cold cache: the
//! image's copy into the cache and its checksum are part of `pass_deploy_info` here).
//!
//! Environment (set by the script): `VMDEPLOY_BENCH_IMAGE` (the image file), `VMDEPLOY_BENCH_KIND`
//! (`whole-disk` or `partition`), `VMDEPLOY_BENCH_RUNS` (default 3), `VMDEPLOY_BENCH_KERNEL` and
//! `VMDEPLOY_BENCH_RAMDISK` (partition images: the files the boot ISO is built from),
//! `VMDEPLOY_BIN_DIR` (the release binaries).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use vmdeploy_conductor::states::ProvisionState;
use vmdeploy_conductor::store::Store as _;
use vmdeploy_integration_tests::agent_target::AgentTarget;
use vmdeploy_integration_tests::bin;
use vmdeploy_integration_tests::conductor_env::{
    enroll_iscsi, floppy_params, inserted_floppy, IscsiEnv, IscsiOptions,
};
use vmdeploy_integration_tests::loopdev::{LoopDevice, LoopIo};

const STEP: Duration = Duration::from_secs(600);

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The raw write: `vmdeploy-conductor iscsi write IMAGE` into a fresh target, in seconds.
fn raw_write(env: &IscsiEnv, image: &PathBuf, disk_len: u64) -> f64 {
    let disk = LoopDevice::attach(&[], disk_len, LoopIo::Direct);
    let target = AgentTarget::start_on(
        disk.device(),
        "iqn-bench-raw-write",
        env.iscsi_port,
        env.done_port,
        None,
    );
    let started = Instant::now();
    let out = Command::new(bin("vmdeploy-conductor"))
        .args(["iscsi", "write"])
        .arg(image)
        .args(["--portal", &format!("127.0.0.1:{}", env.iscsi_port)])
        .args(["--iqn", "iqn-bench-raw-write"])
        .env("RUST_LOG", "warn")
        .output()
        .expect("running vmdeploy-conductor iscsi write");
    let took = started.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "iscsi write failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(target);
    took
}

/// One deploy of `image` onto a fresh disk: seconds from `pass_deploy_info` to `active`.
async fn deploy(
    env: &IscsiEnv,
    image_path: &std::path::Path,
    image: &[u8],
    disk_len: u64,
    partition: Option<(&str, &str)>,
) -> f64 {
    let disk = LoopDevice::attach(&[], disk_len, LoopIo::Direct);
    let (mut node, _media) =
        enroll_iscsi(&env.conductor, &env.emulator, image, &disk, |_| {}).await;
    // Every run names the same file, so the cache filled by the first run serves the others.
    node.instance_info.insert(
        "image_source".into(),
        json!(format!("file://{}", image_path.display())),
    );
    if let Some((kernel, ramdisk)) = partition {
        // A partition image: root last, grown to the image (docs/architecture.md §5); netboot from the
        // boot ISO built from this kernel and ramdisk.
        let root_gb = (image.len() as u64).div_ceil(1 << 30);
        for (k, v) in [
            ("kernel", json!(format!("file://{kernel}"))),
            ("ramdisk", json!(format!("file://{ramdisk}"))),
            ("root_gb", json!(root_gb)),
        ] {
            node.instance_info.insert(k.into(), v);
        }
    }
    env.conductor
        .nodes
        .update_node(&node)
        .await
        .expect("the node's image");
    let waiting = env.conductor.deploy(node.uuid, STEP).await;
    assert_eq!(
        waiting.provision_state,
        ProvisionState::WaitCallBack,
        "last_error {:?}",
        waiting.last_error
    );
    let key = floppy_params(&inserted_floppy(&env.emulator))
        .get("deployment_key")
        .expect("a deploy key")
        .to_owned();
    let iqn = format!("iqn-{}", node.uuid);
    let target = AgentTarget::start_on(disk.device(), &iqn, env.iscsi_port, env.done_port, None);
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a client");
    let started = Instant::now();
    let reply = client
        .post(format!(
            "{}/v1/nodes/{}/vendor_passthru/pass_deploy_info",
            env.api_url, node.uuid
        ))
        .json(&json!({"address": "127.0.0.1", "key": key, "iqn": iqn}))
        .send()
        .await
        .expect("the API answers");
    assert_eq!(reply.status().as_u16(), 202);
    let node = loop {
        let n = env.conductor.node(node.uuid).await;
        if matches!(
            n.provision_state,
            ProvisionState::Active | ProvisionState::DeployFailed
        ) && n.reservation.is_none()
        {
            break n;
        }
        assert!(started.elapsed() < STEP, "no end of the deploy");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let took = started.elapsed().as_secs_f64();
    assert_eq!(
        node.provision_state,
        ProvisionState::Active,
        "last_error {:?}",
        node.last_error
    );
    drop(target);
    if partition.is_none() {
        assert!(
            disk.contents()[..image.len()] == image[..],
            "the disk holds the image byte for byte"
        );
    }
    env.conductor.forget_ports(node.uuid).await;
    took
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let image_path = PathBuf::from(
        var("VMDEPLOY_BENCH_IMAGE").expect("VMDEPLOY_BENCH_IMAGE (bench/iscsi-deploy.sh sets it)"),
    );
    let partition = match var("VMDEPLOY_BENCH_KIND").as_deref() {
        Some("whole-disk") | None => false,
        Some("partition") => true,
        Some(other) => panic!("VMDEPLOY_BENCH_KIND {other:?}: whole-disk or partition"),
    };
    let runs: usize = var("VMDEPLOY_BENCH_RUNS")
        .map(|r| r.parse().expect("VMDEPLOY_BENCH_RUNS is a number"))
        .unwrap_or(3);
    let kernel = var("VMDEPLOY_BENCH_KERNEL");
    let ramdisk = var("VMDEPLOY_BENCH_RAMDISK");
    let boot_files = if partition {
        Some((
            kernel
                .as_deref()
                .expect("VMDEPLOY_BENCH_KERNEL for a partition image"),
            ramdisk
                .as_deref()
                .expect("VMDEPLOY_BENCH_RAMDISK for a partition image"),
        ))
    } else {
        None
    };
    let image = std::fs::read(&image_path).expect("reading the image");
    // Room for the partition table and alignment around a partition image's root.
    let disk_len = image.len() as u64 + (64 << 20);
    let env = IscsiEnv::start_with(IscsiOptions {
        netboot: boot_files.is_some(),
        ..IscsiOptions::new(STEP)
    })
    .await;

    let cold = deploy(&env, &image_path, &image, disk_len, boot_files).await;
    println!("BENCH cold-cache deploy {cold:.2} s (includes the image's copy into the cache)");
    let (mut writes, mut deploys) = (Vec::new(), Vec::new());
    for run in 1..=runs {
        let write = raw_write(&env, &image_path, disk_len);
        let deployed = deploy(&env, &image_path, &image, disk_len, boot_files).await;
        println!(
            "BENCH run {run}: raw write {write:.2} s ({:.0} MB/s), deploy {deployed:.2} s, \
             deploy / raw write {:.2}",
            image.len() as f64 / write / 1e6,
            deployed / write
        );
        writes.push(write);
        deploys.push(deployed);
    }
    let (write, deployed) = (median(writes), median(deploys));
    println!(
        "BENCH median: raw write {write:.2} s ({:.0} MB/s), pass_deploy_info -> active {deployed:.2} s, \
         deploy / raw write {:.2}",
        image.len() as f64 / write / 1e6,
        deployed / write
    );
    assert!(deployed > 0.0 && write > 0.0);
}
