//! The boot ISO store on the built-in object store (a temp state directory, served over TLS
//! as in production). The loaders here are stand-ins the ISO writer accepts; the real ones,
//! as `vmdeploy-image-build loaders` writes them, and real Swift are in
//! `tests/integration/tests/boot_iso_store.rs`.

use std::process::Command;

use super::*;
use crate::objects::builtin::{start_for_tests, BuiltinStore};
use vmdeploy_shared::iso::loaders::{
    SHIM_FILE as SHIM_FILE_NAME, SIGNED_GRUB_EFI_FILE as SIGNED_GRUB_NAME,
};

struct Fixture {
    dir: tempfile::TempDir,
    store: Arc<BuiltinStore>,
    isos: Arc<BootIsos>,
    kernel: PathBuf,
    ramdisk: PathBuf,
    _stop: tokio::sync::watch::Sender<bool>,
}

/// Loaders the ISO writer accepts (sizes and magic numbers of the real ones).
fn write_loaders(dir: &Path) {
    std::fs::create_dir_all(dir).expect("loaders dir");
    std::fs::write(dir.join(ISOLINUX_BIN_FILE), vec![0x90u8; 4096]).expect("isolinux");
    std::fs::write(dir.join(LDLINUX_C32_FILE), b"ldlinux stand-in").expect("ldlinux");
    std::fs::write(
        dir.join(GRUB_EFI_FILE),
        [b"MZ".as_slice(), &[7u8; 3000]].concat(),
    )
    .expect("grub");
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let (store, stop) = start_for_tests(&dir.path().join("objects")).await;
    let loaders = dir.path().join("boot-loaders");
    write_loaders(&loaders);
    let mut kernel_bytes: Vec<u8> = (0..20_000u32).map(|i| (i % 249) as u8).collect();
    kernel_bytes[0x202..0x206].copy_from_slice(b"HdrS");
    let kernel = dir.path().join("vmlinuz");
    std::fs::write(&kernel, &kernel_bytes).expect("kernel");
    let ramdisk = dir.path().join("initrd");
    std::fs::write(&ramdisk, b"ramdisk bytes").expect("ramdisk");
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).expect("scratch");
    let isos = BootIsos::new(store.clone(), "vmdeploy".into(), loaders).with_scratch_dir(scratch);
    Fixture {
        dir,
        store,
        isos: Arc::new(isos),
        kernel,
        ramdisk,
        _stop: stop,
    }
}

fn key(cmdline: &str) -> BootIsoKey {
    BootIsoKey {
        image_ref: "http://images.example/ubuntu.img".into(),
        kernel_ref: "http://images.example/ubuntu.vmlinuz".into(),
        ramdisk_ref: "http://images.example/ubuntu.initrd".into(),
        cmdline: cmdline.into(),
        secure_boot: false,
    }
}

impl Fixture {
    /// Objects in the deploy container, by name.
    fn objects(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.store.root().join("vmdeploy"))
            .map(|d| {
                d.map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                    .filter_map(|n| n.strip_suffix(".data").map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    fn scratch_is_empty(&self) -> bool {
        std::fs::read_dir(self.dir.path().join("scratch"))
            .expect("scratch")
            .count()
            == 0
    }

    /// The whole error chain of an `acquire` of `key` that must fail (`why`).
    async fn acquire_err(&self, key: &BootIsoKey, why: &str) -> String {
        let err = self
            .isos
            .acquire(key, &self.kernel, &self.ramdisk)
            .await
            .expect_err(why);
        format!("{err:#}")
    }

    async fn acquire(&self, key: &BootIsoKey) -> BootIsoLease {
        self.isos
            .acquire(key, &self.kernel, &self.ramdisk)
            .await
            .expect("acquire")
    }
}

#[test]
fn object_names_frame_every_field() {
    let k = key("root=UUID=1 ro");
    let name = k.object_name();
    assert_eq!(name, key("root=UUID=1 ro").object_name(), "deterministic");
    let hex = name.strip_prefix("boot-").expect("prefix");
    assert_eq!(hex.len(), 64);
    assert!(hex
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    let mut names = std::collections::HashSet::from([name]);
    let shifted = |i: &str, kr: &str, r: &str, c: &str| BootIsoKey {
        image_ref: i.into(),
        kernel_ref: kr.into(),
        ramdisk_ref: r.into(),
        cmdline: c.into(),
        secure_boot: false,
    };
    // Same concatenation, other boundaries; each field alone; the command line alone.
    for other in [
        shifted("ab", "c", "", ""),
        shifted("a", "bc", "", ""),
        shifted("a", "b", "c", ""),
        shifted("", "", "", "abc"),
        shifted("abc", "", "", ""),
        key("root=UUID=2 ro"),
        key("root=UUID=1 ro "),
        BootIsoKey {
            secure_boot: true,
            ..key("root=UUID=1 ro")
        },
    ] {
        assert!(names.insert(other.object_name()), "{other:?} collides");
    }
    // The names of ISOs without Secure Boot are what they were before the field existed
    // (ISOs already stored keep being shared): the tag and the four framed fields, no more.
    let k = key("root=UUID=1 ro");
    let mut before = Sha256::new();
    before.update(b"vmdeploy boot ISO v1\0");
    for field in [&k.image_ref, &k.kernel_ref, &k.ramdisk_ref, &k.cmdline] {
        before.update((field.len() as u64).to_be_bytes());
        before.update(field.as_bytes());
    }
    assert_eq!(
        k.object_name(),
        format!("boot-{}", hex::encode(before.finalize()))
    );
}

#[test]
fn choose_follows_ironics_order() {
    let cases = [
        (
            Some("http://a/x.iso"),
            Some("http://b/y.iso"),
            Some("http://a/x.iso"),
        ),
        (None, Some(" http://b/y.iso "), Some("http://b/y.iso")),
        (Some("  "), Some("http://b/y.iso"), Some("http://b/y.iso")),
        (Some(""), None, None),
        (None, None, None),
    ];
    for (instance, image, expected) in cases {
        let got = choose(instance, image);
        match expected {
            Some(r) => assert!(
                matches!(got, BootIsoSource::Given { reference, .. } if reference == r),
                "{instance:?} {image:?} -> {got:?}"
            ),
            None => assert_eq!(got, BootIsoSource::Build, "{instance:?} {image:?}"),
        }
    }
    assert_eq!(
        choose(Some("u"), None),
        BootIsoSource::Given {
            field: "instance_info.ilo_boot_iso",
            reference: "u"
        }
    );
}

#[test]
fn a_missing_loaders_directory_names_the_command() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("boot-loaders");
    let err = read_loaders(&missing).expect_err("missing").to_string();
    assert!(
        err.contains(&format!(
            "vmdeploy-image-build loaders -o {}",
            missing.display()
        )),
        "{err}"
    );
    write_loaders(&missing);
    std::fs::remove_file(missing.join(GRUB_EFI_FILE)).expect("rm");
    let err = read_loaders(&missing).expect_err("no GRUB").to_string();
    assert!(err.contains("grubx64.efi is missing"), "{err}");
    assert!(err.contains("vmdeploy-image-build loaders -o"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_share_one_iso_and_the_last_release_deletes_it() {
    let f = fixture().await;
    let k = key("root=UUID=6a1b ro");
    let first = f.acquire(&k).await;
    assert_eq!(first.usage_count, 1);
    assert_eq!(first.object, ObjectPath::new("vmdeploy", k.object_name()));
    let second = f.acquire(&k).await;
    assert_eq!(
        second,
        BootIsoLease {
            object: first.object.clone(),
            usage_count: 2
        }
    );
    assert_eq!(f.objects(), vec![k.object_name()], "one object for both");
    let info = f.store.head(&first.object).await.expect("head");
    assert_eq!(
        info.metadata.get("usage-count").map(String::as_str),
        Some("2")
    );
    assert_eq!(info.delete_at, None, "a boot ISO does not expire");
    assert!(
        f.scratch_is_empty(),
        "the scratch ISO is removed once stored"
    );

    // Served by temp URL, byte for byte what is stored.
    let url = f
        .isos
        .temp_url(&first.object, Duration::from_secs(60))
        .await
        .expect("temp URL");
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .no_proxy()
        .build()
        .expect("client");
    let body = client
        .get(&url)
        .send()
        .await
        .expect("GET")
        .bytes()
        .await
        .expect("body");
    assert_eq!(body.len() as u64, info.size);

    assert_eq!(f.isos.release(&first.object).await.expect("release"), 1);
    assert_eq!(
        f.isos.usage_count(&first.object).await.expect("count"),
        Some(1)
    );
    assert_eq!(f.isos.release(&first.object).await.expect("release"), 0);
    assert!(f.objects().is_empty(), "deleted at zero: {:?}", f.objects());
    assert_eq!(
        f.isos.usage_count(&first.object).await.expect("count"),
        None
    );
    // Again: a logged no-op, so a repeated tear-down does not fail.
    assert_eq!(f.isos.release(&first.object).await.expect("release"), 0);
    assert_eq!(f.isos.locks.len(), 0, "no lock outlives its users");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_command_line_is_another_iso() {
    let f = fixture().await;
    let a = f.acquire(&key("root=UUID=aaaa ro")).await;
    let b = f.acquire(&key("root=UUID=bbbb ro")).await;
    assert_ne!(a.object, b.object);
    assert_eq!((a.usage_count, b.usage_count), (1, 1));
    assert_eq!(f.objects().len(), 2);
    assert_eq!(f.isos.release(&a.object).await.expect("release"), 0);
    assert_eq!(f.objects(), vec![b.object.object.clone()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_and_releases_lose_no_count() {
    let f = fixture().await;
    let k = key("root=UUID=cccc ro");

    // From nothing, ten at once: one build, every count handed out once.
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (isos, k, kernel, ramdisk) = (
                f.isos.clone(),
                k.clone(),
                f.kernel.clone(),
                f.ramdisk.clone(),
            );
            tokio::spawn(async move { isos.acquire(&k, &kernel, &ramdisk).await })
        })
        .collect();
    let mut counts = Vec::new();
    for t in tasks {
        counts.push(t.await.expect("task").expect("acquire").usage_count);
    }
    counts.sort_unstable();
    assert_eq!(counts, (1..=10).collect::<Vec<u64>>());
    let object = f.isos.object_path(&k);
    for _ in 0..10 {
        f.acquire(&k).await;
    }
    assert_eq!(f.isos.usage_count(&object).await.expect("count"), Some(20));

    // 20 acquires and 20 releases interleaved: the count never reaches zero before the 20th
    // release, so it ends where it started whatever the order.
    let mut tasks = Vec::new();
    for i in 0..40 {
        let (isos, k, kernel, ramdisk, object) = (
            f.isos.clone(),
            k.clone(),
            f.kernel.clone(),
            f.ramdisk.clone(),
            object.clone(),
        );
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                isos.acquire(&k, &kernel, &ramdisk)
                    .await
                    .map(|l| l.usage_count)
            } else {
                isos.release(&object).await
            }
        }));
    }
    for t in tasks {
        t.await.expect("task").expect("acquire or release");
    }
    assert_eq!(f.isos.usage_count(&object).await.expect("count"), Some(20));

    // 20 releases at once: deleted, exactly one of them saw zero.
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let (isos, object) = (f.isos.clone(), object.clone());
            tokio::spawn(async move { isos.release(&object).await })
        })
        .collect();
    let mut left = Vec::new();
    for t in tasks {
        left.push(t.await.expect("task").expect("release"));
    }
    left.sort_unstable();
    assert_eq!(left, (0..20).collect::<Vec<u64>>());
    assert!(f.objects().is_empty());
    assert_eq!(f.isos.locks.len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_that_do_not_parse_and_foreign_objects_are_errors() {
    let f = fixture().await;
    let k = key("root=UUID=dddd ro");
    let object = f.isos.object_path(&k);
    for (metadata, expected) in [
        (
            vec![("usage-count", "two")],
            "\"two\", which is not a count",
        ),
        (vec![("usage-count", "-1")], "\"-1\", which is not a count"),
        (vec![("purpose", "x")], "has no usage-count metadata"),
    ] {
        f.store
            .put(
                &object,
                ObjectBody::Bytes(bytes::Bytes::from_static(b"not ours")),
                &PutOptions {
                    delete_after: None,
                    metadata: metadata
                        .iter()
                        .map(|(a, b)| (a.to_string(), b.to_string()))
                        .collect(),
                },
            )
            .await
            .expect("put");
        let err = format!(
            "{:#}",
            f.isos
                .acquire(&k, &f.kernel, &f.ramdisk)
                .await
                .expect_err("acquire")
        );
        assert!(
            err.contains(expected) && err.contains(&object.to_string()),
            "{err}"
        );
        let err = format!("{:#}", f.isos.release(&object).await.expect_err("release"));
        assert!(
            err.contains(expected) && err.contains(&object.to_string()),
            "{err}"
        );
    }
    // Still there, untouched: an error never deletes.
    assert_eq!(f.store.head(&object).await.expect("head").size, 8);

    for foreign in [
        ObjectPath::new("vmdeploy", "node-1-floppy"),
        ObjectPath::new("other", object.object.clone()),
    ] {
        let err = f.isos.release(&foreign).await.expect_err("foreign");
        assert!(err.to_string().contains("is not a boot ISO"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_loaders_nothing_is_stored() {
    let f = fixture().await;
    // No directory, and nothing on this "system" to make it from.
    let isos = BootIsos::new(
        f.store.clone(),
        "vmdeploy".into(),
        f.dir.path().join("no-loaders"),
    )
    .with_loader_sources(LoaderSources {
        isolinux_bin: "/nonexistent/isolinux.bin".into(),
        ldlinux_c32: "/nonexistent/ldlinux.c32".into(),
        grub_efi_modules: "/nonexistent/x86_64-efi".into(),
    })
    .with_scratch_dir(f.dir.path().join("scratch"));
    assert!(isos.check_loaders(false).is_err());
    let err = format!(
        "{:#}",
        isos.acquire(&key("root=UUID=eeee ro"), &f.kernel, &f.ramdisk)
            .await
            .expect_err("no loaders")
    );
    assert!(err.contains("vmdeploy-image-build loaders -o"), "{err}");
    // A kernel that is not one: the writer's own check, named.
    let bad = f.dir.path().join("not-a-kernel");
    std::fs::write(&bad, b"text").expect("write");
    let err = format!(
        "{:#}",
        f.isos
            .acquire(&key("root=UUID=eeee ro"), &bad, &f.ramdisk)
            .await
            .expect_err("bad kernel")
    );
    assert!(err.contains("not an x86 bzImage"), "{err}");
    assert!(f.objects().is_empty());
    assert!(f.scratch_is_empty());
}

/// The stored ISO as xorriso (an independent reader) sees it: a BIOS and a UEFI El Torito
/// entry, and the key's command line in both loaders' configs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stored_iso_boots_bios_and_uefi_with_the_command_line() {
    let f = fixture().await;
    let k = key("root=UUID=0f3c2d1e-aaaa-bbbb-cccc-000000000001 ro nofb");
    let lease = f.acquire(&k).await;
    let iso = f
        .store
        .root()
        .join("vmdeploy")
        .join(format!("{}.data", lease.object.object));
    let run = |args: &[&str]| {
        let out = Command::new("xorriso")
            .args(args)
            .output()
            .expect("xorriso runs (apt-get install xorriso)");
        assert!(out.status.success(), "xorriso {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let isop = iso.to_str().expect("UTF-8 path");
    let report = run(&["-indev", isop, "-report_el_torito", "plain"]);
    for platform in ["BIOS", "UEFI"] {
        assert!(
            report.lines().any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.starts_with(&["El", "Torito", "boot", "img", ":"]) && w.get(6) == Some(&platform)
            }),
            "no {platform} entry:\n{report}"
        );
    }
    let out = f.dir.path().join("extracted");
    std::fs::create_dir(&out).expect("dir");
    let grub = out.join("grub.cfg");
    let isolinux = out.join("isolinux.cfg");
    run(&[
        "-osirrox",
        "on",
        "-indev",
        isop,
        "-extract",
        "/BOOT/GRUB/GRUB.CFG",
        grub.to_str().expect("UTF-8"),
        "-extract",
        "/ISOLINUX/ISOLINUX.CFG",
        isolinux.to_str().expect("UTF-8"),
    ]);
    for cfg in [grub, isolinux] {
        let text = std::fs::read_to_string(&cfg).expect("config");
        assert!(text.contains(&k.cmdline), "{}: {text}", cfg.display());
    }
}

/// A Secure Boot node needs Debian's signed shim and CD GRUB in the loaders directory:
/// `validate`'s check names them and the command that writes them, and an ISO built for it
/// has shim as `\EFI\BOOT\BOOTX64.EFI` with the signed GRUB beside it; the unsigned ISO of
/// the same command line is another object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secure_boot_iso_takes_the_signed_loaders_or_says_what_is_missing() {
    let f = fixture().await;
    let sb = BootIsoKey {
        secure_boot: true,
        ..key("root=UUID=5ec0b007-0000-4000-8000-000000000001 ro")
    };
    let err = format!("{:#}", f.isos.check_loaders(true).expect_err("no shim"));
    for needed in [
        "shimx64.efi",
        "gcdx64.efi",
        "vmdeploy-image-build loaders --signed-loaders ROOT",
        "shim-signed grub-efi-amd64-signed",
    ] {
        assert!(err.contains(needed), "{needed} not in: {err}");
    }
    let err = f.acquire_err(&sb, "no signed loaders").await;
    assert!(err.contains("lacks Debian's signed loaders"), "{err}");
    assert!(f.objects().is_empty());
    f.isos
        .check_loaders(false)
        .expect("the unsigned ISO can still be built");

    let loaders = f.dir.path().join("boot-loaders");
    let shim = [b"MZ shim".as_slice(), &[5u8; 2000]].concat();
    let signed_grub = [b"MZ signed grub".as_slice(), &[6u8; 2500]].concat();
    std::fs::write(loaders.join(SHIM_FILE_NAME), &shim).expect("shim");
    std::fs::write(loaders.join(SIGNED_GRUB_NAME), b"not a PE image").expect("grub");
    let err = f.acquire_err(&sb, "not PE").await;
    assert!(err.contains("is not an EFI (PE) image"), "{err}");
    std::fs::write(loaders.join(SIGNED_GRUB_NAME), &signed_grub).expect("grub");
    f.isos.check_loaders(true).expect("complete");
    let lease = f.acquire(&sb).await;
    let unsigned = f.acquire(&key(&sb.cmdline)).await;
    assert_ne!(lease.object, unsigned.object);

    // The EFI image of the stored ISO holds shim and the signed GRUB, byte for byte.
    let iso = f
        .store
        .root()
        .join("vmdeploy")
        .join(format!("{}.data", lease.object.object));
    let out = f.dir.path().join("efi.img");
    let run = Command::new("xorriso")
        .args(["-osirrox", "on", "-indev"])
        .arg(&iso)
        .args(["-extract", "/BOOT/EFI.IMG"])
        .arg(&out)
        .output()
        .expect("xorriso runs (apt-get install xorriso)");
    assert!(run.status.success(), "{run:?}");
    let mcopy = |path: &str| {
        let o = Command::new("mcopy")
            .arg("-i")
            .arg(&out)
            .arg(format!("::{path}"))
            .arg("-")
            .output()
            .expect("mcopy runs (apt-get install mtools)");
        assert!(o.status.success(), "mcopy {path}: {o:?}");
        o.stdout
    };
    assert_eq!(mcopy("/EFI/BOOT/BOOTX64.EFI"), shim);
    assert_eq!(mcopy("/EFI/BOOT/grubx64.efi"), signed_grub);
}
