//! The conductor's shared boot ISO store (`boot::vmedia::boot_iso`) with the real loaders, as
//! `vmdeploy-image-build loaders -o DIR` writes them (isolinux and ldlinux.c32 of this system,
//! GRUB built by grub-mkimage): the conductor reads what the command wrote, builds a BIOS + UEFI
//! ISO with them, and counts nodes in the object's metadata, on the built-in store and on real
//! Swift, where the count is the `X-Object-Meta-Usage-Count` header Swift itself returns.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use vmdeploy_conductor::boot::vmedia::boot_iso::{self, BootIsoKey, BootIsos};
use vmdeploy_conductor::objects::swift::{SwiftAuth, SwiftConfig, SwiftStore};
use vmdeploy_conductor::objects::ObjectStore;
use vmdeploy_integration_tests::bin;
use vmdeploy_integration_tests::swift::{SwiftPeer, KEY, USER};
use vmdeploy_shared::iso::GRUB_EARLY_CONFIG;
use vmdeploy_shared::secret::Secret;

/// Runs `vmdeploy-image-build loaders -o <dir>/boot-loaders`; returns that directory.
fn loaders_dir(dir: &Path) -> PathBuf {
    let out = dir.join("boot-loaders");
    let result = Command::new(bin("vmdeploy-image-build"))
        .arg("loaders")
        .arg("-o")
        .arg(&out)
        .output()
        .expect("vmdeploy-image-build runs");
    assert!(
        result.status.success(),
        "vmdeploy-image-build loaders failed: {}",
        String::from_utf8_lossy(&result.stderr)
    );
    out
}

/// A kernel and ramdisk the ISO writer takes (the x86 boot header is all it checks).
fn kernel_and_ramdisk(dir: &Path) -> (PathBuf, PathBuf) {
    let mut kernel: Vec<u8> = (0..300_000u32).map(|i| (i % 241) as u8).collect();
    kernel[0x202..0x206].copy_from_slice(b"HdrS");
    let (k, r) = (dir.join("vmlinuz"), dir.join("initrd"));
    std::fs::write(&k, kernel).expect("kernel");
    std::fs::write(&r, vec![0x1f; 100_000]).expect("ramdisk");
    (k, r)
}

fn key(root_uuid: &str) -> BootIsoKey {
    BootIsoKey {
        image_ref: "http://images.example/debian.qcow2".into(),
        kernel_ref: "http://images.example/debian.vmlinuz".into(),
        ramdisk_ref: "http://images.example/debian.initrd".into(),
        cmdline: format!("root=UUID={root_uuid} ro"),
        secure_boot: false,
    }
}

#[test]
fn the_loaders_command_writes_what_the_conductor_reads() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = loaders_dir(dir.path());
    let loaders = boot_iso::read_loaders(&out).expect("the conductor reads the directory");
    let system = |p: &str| std::fs::read(p).unwrap_or_else(|e| panic!("{p}: {e}"));
    assert_eq!(
        loaders.isolinux_bin,
        system("/usr/lib/ISOLINUX/isolinux.bin")
    );
    assert_eq!(
        loaders.ldlinux_c32,
        system("/usr/lib/syslinux/modules/bios/ldlinux.c32")
    );
    assert!(loaders.grub_efi.starts_with(b"MZ"), "GRUB is a PE image");
    let early = GRUB_EARLY_CONFIG.as_bytes();
    assert!(
        loaders.grub_efi.windows(early.len()).any(|w| w == early),
        "the GRUB binary does not carry the early config that finds the ISO"
    );
    // The same bytes when written again (grub-mkimage stamps no time).
    let again = loaders_dir(&dir.path().join("again"));
    for name in ["isolinux.bin", "ldlinux.c32", "grubx64.efi"] {
        assert_eq!(
            std::fs::read(out.join(name)).expect(name),
            std::fs::read(again.join(name)).expect(name),
            "{name}"
        );
    }
}

/// `xorriso -report_el_torito plain` shows a BIOS and a UEFI entry.
fn assert_bios_and_uefi(iso: &Path) {
    let out = Command::new("xorriso")
        .arg("-indev")
        .arg(iso)
        .args(["-report_el_torito", "plain"])
        .output()
        .expect("xorriso runs (apt-get install xorriso)");
    assert!(out.status.success(), "xorriso: {out:?}");
    let report = String::from_utf8_lossy(&out.stdout);
    for platform in ["BIOS", "UEFI"] {
        assert!(
            report.lines().any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.starts_with(&["El", "Torito", "boot", "img", ":"]) && w.get(6) == Some(&platform)
            }),
            "no {platform} entry:\n{report}"
        );
    }
}

async fn download(url: &str, to: &Path) {
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .no_proxy()
        .build()
        .expect("client");
    let reply = client.get(url).send().await.expect("GET the temp URL");
    assert_eq!(reply.status().as_u16(), 200, "{url}");
    std::fs::write(to, reply.bytes().await.expect("body")).expect("writing the ISO");
}

fn tempauth(swift: &SwiftPeer) -> SwiftConfig {
    SwiftConfig::new(SwiftAuth::TempAuth {
        url: format!("{}/auth/v1.0", swift.base_url),
        user: USER.to_string(),
        key: Secret::new(KEY),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_one_iso_in_real_swift_counted_in_its_metadata() {
    let dir = tempfile::tempdir().expect("temp dir");
    let loaders = loaders_dir(dir.path());
    let (kernel, ramdisk) = kernel_and_ramdisk(dir.path());
    let swift = SwiftPeer::start().expect("Swift starts (scripts/setup installs it)");
    let store: Arc<dyn ObjectStore> = Arc::new(SwiftStore::new(tempauth(&swift)).expect("store"));
    let isos = BootIsos::new(store.clone(), "vmdeploy".into(), loaders)
        .with_scratch_dir(dir.path().to_path_buf());

    let k = key("1b2c3d4e-0000-4000-8000-000000000001");
    let first = isos.acquire(&k, &kernel, &ramdisk).await.expect("node 1");
    let second = isos.acquire(&k, &kernel, &ramdisk).await.expect("node 2");
    assert_eq!((first.usage_count, second.usage_count), (1, 2));
    assert_eq!(first.object, second.object);
    let (status, headers) = swift.raw_head(&first.object.url_path());
    assert_eq!(status, 200, "{headers:?}");
    assert!(
        headers.iter().any(|h| h == "X-Object-Meta-Usage-Count: 2"),
        "Swift does not report the count as X-Object-Meta-Usage-Count: 2: {headers:?}"
    );
    assert!(
        !headers
            .iter()
            .any(|h| h.to_ascii_lowercase().starts_with("x-delete-at")),
        "a boot ISO must not expire: {headers:?}"
    );

    // The stored bytes are a BIOS + UEFI boot ISO, fetched as the iLO would.
    let url = isos
        .temp_url(&first.object, Duration::from_secs(120))
        .await
        .expect("temp URL");
    let iso = dir.path().join("fetched.iso");
    download(&url, &iso).await;
    assert_bios_and_uefi(&iso);

    // Another root UUID: its own ISO.
    let other = isos
        .acquire(
            &key("1b2c3d4e-0000-4000-8000-000000000002"),
            &kernel,
            &ramdisk,
        )
        .await
        .expect("node 3");
    assert_ne!(other.object, first.object);
    assert_eq!(other.usage_count, 1);

    assert_eq!(isos.release(&first.object).await.expect("release"), 1);
    let (_, headers) = swift.raw_head(&first.object.url_path());
    assert!(
        headers.iter().any(|h| h == "X-Object-Meta-Usage-Count: 1"),
        "{headers:?}"
    );
    assert_eq!(isos.release(&first.object).await.expect("release"), 0);
    assert_eq!(swift.raw_head(&first.object.url_path()).0, 404);
    assert_eq!(isos.release(&first.object).await.expect("again"), 0);
    assert_eq!(isos.release(&other.object).await.expect("release"), 0);
    assert_eq!(swift.raw_head(&other.object.url_path()).0, 404);
    // Nothing left behind in the scratch directory either.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(|e| {
            let name = e.expect("entry").file_name().to_string_lossy().into_owned();
            name.ends_with(".iso").then_some(name)
        })
        .filter(|n| n != "fetched.iso")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_built_in_store_serves_a_built_iso_with_real_loaders() {
    let dir = tempfile::tempdir().expect("temp dir");
    let loaders = loaders_dir(dir.path());
    let (kernel, ramdisk) = kernel_and_ramdisk(dir.path());
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).expect("cert");
    let key_der = rustls::pki_types::PrivateKeyDer::Pkcs8(
        rustls::pki_types::PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der()),
    );
    let tls = Arc::new(
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key_der)
            .expect("TLS config"),
    );
    let (_stop, shutdown) = tokio::sync::watch::channel(false);
    let (store, _) = vmdeploy_conductor::objects::builtin::BuiltinStore::start(
        vmdeploy_conductor::objects::builtin::BuiltinConfig {
            root: dir.path().join("objects"),
            listen: "127.0.0.1:0".parse().expect("address"),
            public_url: None,
            temp_url_key: Secret::new("boot-iso-test-key"),
            tls,
        },
        shutdown,
    )
    .await
    .expect("the built-in store starts");
    let isos = BootIsos::new(store.clone(), "vmdeploy".into(), loaders);
    let k = key("1b2c3d4e-0000-4000-8000-0000000000aa");
    let a = isos.acquire(&k, &kernel, &ramdisk).await.expect("node 1");
    let b = isos.acquire(&k, &kernel, &ramdisk).await.expect("node 2");
    assert_eq!((a.usage_count, b.usage_count), (1, 2));
    let info = store.head(&a.object).await.expect("head");
    assert_eq!(
        info.metadata.get("usage-count").map(String::as_str),
        Some("2")
    );
    let url = isos
        .temp_url(&a.object, Duration::from_secs(60))
        .await
        .expect("temp URL");
    let iso = dir.path().join("fetched.iso");
    download(&url, &iso).await;
    assert_eq!(std::fs::metadata(&iso).expect("iso").len(), info.size);
    assert_bios_and_uefi(&iso);
    assert_eq!(isos.release(&a.object).await.expect("release"), 1);
    assert_eq!(isos.release(&a.object).await.expect("release"), 0);
    assert_eq!(isos.usage_count(&a.object).await.expect("count"), None);
}
