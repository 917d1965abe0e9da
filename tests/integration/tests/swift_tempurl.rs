//! Temp URLs against a real OpenStack Swift: URLs signed by `shared::tempurl` are honoured by
//! Swift's tempurl middleware (full and range reads, as iLO reads virtual media), tampered and
//! expired ones are refused by it, and URLs signed by python-swiftclient pass our verifier.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use vmdeploy_integration_tests::{swift::SwiftPeer, venv_bin};
use vmdeploy_shared::fat;
use vmdeploy_shared::tempurl::{self, TempUrlDigest, TempUrlKey, TempUrlParams};

const TEMP_URL_KEY: &str = "vmdeploy-temp-url-key";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
}

/// `curl` and the HTTP status; the body goes to `out` when given.
fn curl(args: &[&str], out: Option<&std::path::Path>) -> u16 {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--max-time", "10", "-w", "%{http_code}"]);
    match out {
        Some(path) => cmd.arg("-o").arg(path),
        None => cmd.args(["-o", "/dev/null"]),
    };
    let output = cmd.args(args).output().expect("curl runs");
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("curl prints the status")
}

#[test]
fn swift_honours_our_temp_urls_and_we_honour_swiftclients() {
    let swift = SwiftPeer::start().expect("Swift starts");
    let (token, storage_url) = swift.auth().expect("tempauth");
    let auth = format!("X-Auth-Token: {token}");
    let dir = tempfile::tempdir().expect("temp dir");

    // The object a conductor stores: the parameter floppy, expiring on its own.
    let floppy = fat::build_floppy(fat::FLOPPY_LABEL, &[("parameters.txt", b"a=b\n")])
        .expect("floppy builds");
    let floppy_path = dir.path().join("floppy.img");
    std::fs::write(&floppy_path, &floppy).expect("write floppy");
    let container = format!("{storage_url}/vmdeploy");
    let status = curl(&["-X", "PUT", "-H", &auth, &container], None);
    assert_eq!(
        status,
        201,
        "container PUT; Swift's logs:\n{}",
        swift.logs()
    );
    let object_url = format!("{container}/image-node1");
    let floppy_arg = floppy_path.to_str().expect("UTF-8 path");
    assert_eq!(
        curl(
            &[
                "-X",
                "PUT",
                "-H",
                &auth,
                "-H",
                "X-Delete-After: 600",
                "-T",
                floppy_arg,
                &object_url
            ],
            None
        ),
        201
    );
    assert_eq!(
        curl(
            &[
                "-X",
                "POST",
                "-H",
                &auth,
                "-H",
                &format!("X-Account-Meta-Temp-URL-Key: {TEMP_URL_KEY}"),
                &storage_url
            ],
            None
        ),
        204
    );

    let path = object_url
        .strip_prefix(&swift.base_url)
        .expect("storage URL is under the proxy");
    let key = TempUrlKey::new(TEMP_URL_KEY);
    let expires = now() + 300;
    for digest in [
        TempUrlDigest::Sha1,
        TempUrlDigest::Sha256,
        TempUrlDigest::Sha512,
    ] {
        let url = tempurl::url(&swift.base_url, &key, digest, "GET", expires, path).expect("signs");
        let body = dir.path().join(format!("get-{}", digest.name()));
        assert_eq!(curl(&[&url], Some(&body)), 200, "{digest:?} GET {url}");
        assert_eq!(
            std::fs::read(&body).expect("body"),
            floppy,
            "{digest:?} body"
        );

        // iLO and QEMU read virtual media by range.
        let range = dir.path().join(format!("range-{}", digest.name()));
        assert_eq!(curl(&["-H", "Range: bytes=0-511", &url], Some(&range)), 206);
        let sector = std::fs::read(&range).expect("range body");
        assert_eq!(sector.len(), 512);
        assert_eq!(
            fat::fat_label(&sector).expect("FAT boot sector"),
            Some(fat::FLOPPY_LABEL.to_string())
        );

        // HEAD with a GET signature, as the iLO's URL check does.
        assert_eq!(curl(&["-I", &url], None), 200, "{digest:?} HEAD");
    }

    // Tampered signature, other object, expired: Swift says 401 to each.
    let good = tempurl::url(
        &swift.base_url,
        &key,
        TempUrlDigest::Sha256,
        "GET",
        expires,
        path,
    )
    .expect("signs");
    let sig_at = good.find("temp_url_sig=").expect("signature parameter") + "temp_url_sig=".len();
    let flipped = if good.as_bytes()[sig_at] == b'0' {
        "1"
    } else {
        "0"
    };
    let tampered = format!("{}{flipped}{}", &good[..sig_at], &good[sig_at + 1..]);
    assert_eq!(curl(&[&tampered], None), 401, "{tampered}");
    let other = good.replace("image-node1", "image-node2");
    assert_eq!(curl(&[&other], None), 401);
    let past = now() - 10;
    let expired = tempurl::url(
        &swift.base_url,
        &key,
        TempUrlDigest::Sha256,
        "GET",
        past,
        path,
    )
    .expect("signs");
    assert_eq!(curl(&[&expired], None), 401);

    // The other direction: python-swiftclient signs, our verifier (the built-in store's) checks.
    for digest in ["sha256", "sha512"] {
        let script = format!(
            "from swiftclient.utils import generate_temp_url\n\
             print(generate_temp_url({path:?}, 300, {TEMP_URL_KEY:?}, 'GET', digest={digest:?}))"
        );
        let out = Command::new(venv_bin("python"))
            .args(["-c", &script])
            .output()
            .expect("python runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let signed = String::from_utf8(out.stdout).expect("ASCII URL");
        let (signed_path, query) = signed.trim().split_once('?').expect("query string");
        assert_eq!(signed_path, path);
        let params = TempUrlParams::from_query(query).expect("swiftclient's parameters");
        let allowed = [TempUrlDigest::Sha256, TempUrlDigest::Sha512];
        assert_eq!(
            tempurl::verify(
                std::slice::from_ref(&key),
                &allowed,
                "GET",
                path,
                &params,
                now()
            )
            .map(|d| d.name()),
            Ok(digest)
        );
        assert!(tempurl::verify(
            &[TempUrlKey::new("wrong")],
            &allowed,
            "GET",
            path,
            &params,
            now()
        )
        .is_err());
    }
}
