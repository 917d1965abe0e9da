//! Checks of a node's disk that more than one end-to-end test makes.

use super::Lab;
use crate::test_image::TestImage;

fn read(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Whether `bytes` are all zero.
fn zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

/// The node's disk has nothing a firmware or `blkid -p` would find at its start: no partition
/// table, no file-system signature, the first MiB zero. `what` says after what, for the
/// failure message. Returns the disk's bytes.
pub fn assert_nothing_bootable(lab: &Lab, what: &str) -> Vec<u8> {
    let state = lab.emulator_state();
    let disk = std::path::PathBuf::from(
        state["machine"]["disk"]
            .as_str()
            .expect("the emulator names the node's disk file"),
    );
    let probe = std::process::Command::new("blkid")
        .arg("-p")
        .arg(&disk)
        .output()
        .expect("running blkid (apt install util-linux)");
    assert_eq!(
        probe.status.code(),
        Some(2),
        "blkid -p still finds something on the disk after {what}: {}",
        String::from_utf8_lossy(&probe.stdout)
    );
    let bytes = read(&disk);
    assert!(
        zero(&bytes[..1 << 20]),
        "the disk's first MiB is not zero after {what}"
    );
    bytes
}

/// After automated cleaning, with the node off: `erase_devices_metadata` left no partition
/// table and no file-system signature on the node's disk ([`assert_nothing_bootable`]), and the
/// root file system's ext4 magic is gone from where the image put it.
pub fn assert_metadata_erased(lab: &Lab, image: &TestImage) {
    let state = lab.emulator_state();
    assert_eq!(
        state["power"], "OFF",
        "cleaning ends with the node off: {state}"
    );
    let bytes = assert_nothing_bootable(lab, "cleaning");
    // The test image's root partition (ext4) and where its superblock magic was.
    let image_bytes = read(&image.disk_raw);
    let magic_at = (0..4)
        .map(|i| {
            // GPT entries from LBA 2, 128 bytes each; the first LBA at +32.
            let entry = 1024 + 128 * i;
            let lba = u64::from_le_bytes(
                image_bytes[entry + 32..entry + 40]
                    .try_into()
                    .expect("8 bytes"),
            );
            usize::try_from(lba * 512).expect("fits")
        })
        .find(|&start| {
            start > 0 && image_bytes.get(start + 0x438..start + 0x43a) == Some(&[0x53, 0xef][..])
        })
        .expect("the test image's GPT names an ext4 root partition");
    assert_ne!(
        bytes[magic_at + 0x438..magic_at + 0x43a],
        [0x53, 0xef],
        "the root file system's superblock survived cleaning"
    );
}

/// Whether `needle` shows in `haystack`, and where first.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > haystack.len() {
        return None;
    }
    let first = needle[0];
    (0..=haystack.len() - needle.len())
        .filter(|&i| haystack[i] == first)
        .find(|&i| haystack[i..].starts_with(needle))
}

/// Every place a secret shows: `needles` are (what the secret is, its value), `haystacks`
/// (where, the bytes). Each hit is told with a little context, the secret itself replaced by
/// its name, so the failure message does not leak it again.
pub fn find_leaks(needles: &[(String, String)], haystacks: &[(String, Vec<u8>)]) -> Vec<String> {
    let mut hits = Vec::new();
    for (place, bytes) in haystacks {
        for (what, value) in needles {
            let Some(at) = find(bytes, value.as_bytes()) else {
                continue;
            };
            let from = at.saturating_sub(100);
            let to = (at + value.len() + 60).min(bytes.len());
            let context = String::from_utf8_lossy(&bytes[from..to])
                .replace(value.as_str(), &format!("<{what}>"))
                .replace('\n', "⏎");
            hits.push(format!("{place}: {what}: …{context}…"));
        }
    }
    hits
}

/// Files under `dir` (not following links) of at most `max_len` bytes, by path.
fn files_under(dir: &std::path::Path, max_len: u64) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if meta.is_dir() {
                todo.push(entry.path());
            } else if meta.is_file() && meta.len() <= max_len {
                out.push(entry.path());
            }
        }
    }
    out.sort();
    out
}

/// After a deploy watched by [`Lab::watch_secrets`]: no secret it issued, nor the iLO password,
/// shows in any log line (conductor, emulator, QEMU, the node's console where the agent logs),
/// any API response (those seen during the deploy and the final node and port listings), any
/// state file under the lab's directory, or the nodes' `driver_internal_info` and `last_error`
/// in the conductor's database.
pub fn assert_no_secret_leaked(lab: &Lab, node: &str, issued: &super::secrets::Issued) {
    let mut needles: Vec<(String, String)> =
        vec![("the iLO password".into(), super::ILO_PASSWORD.into())];
    for t in &issued.agent_tokens {
        needles.push(("an agent token".into(), t.clone()));
    }
    for k in &issued.deploy_keys {
        needles.push(("a deploy key".into(), k.clone()));
    }
    for s in &issued.signatures {
        needles.push(("a temp URL signature".into(), s.clone()));
    }
    for (key, value) in &issued.other {
        needles.push((format!("the value of {key}"), value.clone()));
    }

    let mut api: Vec<(String, Vec<u8>)> = issued
        .api_responses
        .iter()
        .map(|(path, body)| (format!("API GET {path}"), body.clone().into_bytes()))
        .collect();
    for args in [
        &["node", "show", node, "-f", "json"][..],
        &["node", "list", "--long", "-f", "json"],
        &["port", "list", "--long", "-f", "json"],
    ] {
        api.push((
            format!("baremetal {}", args.join(" ")),
            lab.bm(args).into_bytes(),
        ));
    }
    let mut hits = find_leaks(&needles, &api);

    // Logs and state files: everything the lab's processes wrote (the node's 4 GiB disk
    // excepted: the instance image is not the lab's to check).
    let database = |p: &std::path::Path| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("vmdeploy.sqlite"))
    };
    let files: Vec<(String, Vec<u8>, bool)> = files_under(lab.dir(), 256 << 20)
        .into_iter()
        .map(|p| {
            let name = p
                .strip_prefix(lab.dir())
                .unwrap_or(&p)
                .display()
                .to_string();
            (name, read(&p), database(&p))
        })
        .collect();
    assert!(
        files
            .iter()
            .any(|(n, b, _)| n == "conductor.log" && !b.is_empty())
            && files
                .iter()
                .any(|(n, b, _)| n == "emulator.log" && !b.is_empty())
            && files
                .iter()
                .any(|(n, b, _)| n.ends_with("serial.log") && !b.is_empty()),
        "the lab's logs are missing: {:?}",
        files.iter().map(|(n, _, _)| n).collect::<Vec<_>>()
    );
    for (name, bytes, is_database) in files {
        if !is_database {
            hits.extend(find_leaks(&needles, &[(name, bytes)]));
        }
    }
    // The database holds what the conductor must keep (`driver_info`'s password, the operator's
    // `image_source`, the token while the agent runs; SQLite's journal keeps old pages), so it
    // is read as rows: once the deploy is over, no token or deploy key is left in a node.
    let db = lab.dir().join("conductor").join("vmdeploy.sqlite");
    let out = std::process::Command::new("sqlite3")
        .arg("-readonly")
        .arg(&db)
        .arg("SELECT driver_internal_info, last_error FROM nodes")
        .output()
        .expect("running sqlite3 (apt install sqlite3)");
    assert!(
        out.status.success(),
        "sqlite3 {}: {}",
        db.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = [(
        "the state DB's driver_internal_info and last_error".to_owned(),
        out.stdout,
    )];
    hits.extend(find_leaks(&needles, &rows));
    hits.extend(loose_secret_files(&lab.dir().join("conductor")));
    assert!(
        hits.is_empty(),
        "{} secret(s) leaked ({} agent token(s), {} deploy key(s), {} signature(s) issued):\n{}",
        hits.len(),
        issued.agent_tokens.len(),
        issued.deploy_keys.len(),
        issued.signatures.len(),
        hits.join("\n")
    );
}

/// The state files that hold secrets readable by others: the state directory must be 0700, and
/// the database (BMC passwords, tokens while an agent runs), the TLS keys and the built-in
/// store's objects (floppies: agent tokens, deploy keys, CHAP secrets) 0600 or tighter.
fn loose_secret_files(state_dir: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or_else(|e| panic!("reading the mode of {}: {e}", p.display()))
    };
    let mut loose = Vec::new();
    let dir_mode = mode(state_dir);
    if dir_mode != 0o700 {
        loose.push(format!(
            "{}: the state directory is {dir_mode:04o}, not 0700",
            state_dir.display()
        ));
    }
    let secret = |p: &std::path::Path| {
        let rel = p.strip_prefix(state_dir).unwrap_or(p);
        let name = rel.to_string_lossy();
        name.starts_with("vmdeploy.sqlite")
            || name.starts_with("objects/")
            || (name.starts_with("tls/") && name.ends_with("key.pem"))
    };
    let files: Vec<_> = files_under(state_dir, u64::MAX)
        .into_iter()
        .filter(|p| secret(p))
        .collect();
    assert!(
        files.iter().any(|p| p.ends_with("vmdeploy.sqlite")),
        "no database under {}: is this the conductor's state directory?",
        state_dir.display()
    );
    for file in files {
        let file_mode = mode(&file);
        if file_mode & 0o077 != 0 {
            loose.push(format!(
                "{}: a state file with secrets is {file_mode:04o}, not 0600",
                file.display()
            ));
        }
    }
    loose
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_state_files_open_to_others_are_named() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("temp dir");
        let state = dir.path().join("conductor");
        std::fs::create_dir_all(state.join("objects/c")).expect("mkdir");
        std::fs::create_dir_all(state.join("tls")).expect("mkdir");
        std::fs::create_dir_all(state.join("images")).expect("mkdir");
        let files = [
            ("vmdeploy.sqlite", 0o644),
            ("objects/c/floppy", 0o640),
            ("tls/server-key.pem", 0o600),
            ("tls/server.pem", 0o644),
            ("images/cached", 0o644),
        ];
        for (name, mode) in files {
            let path = state.join(name);
            std::fs::write(&path, b"x").expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        }
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let loose = loose_secret_files(&state);
        assert_eq!(loose.len(), 3, "{loose:?}");
        assert!(loose[0].contains("0755"), "{loose:?}");
        assert!(loose[1].contains("objects/c/floppy"), "{loose:?}");
        assert!(loose[2].contains("vmdeploy.sqlite"), "{loose:?}");
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        for name in ["vmdeploy.sqlite", "objects/c/floppy"] {
            std::fs::set_permissions(state.join(name), std::fs::Permissions::from_mode(0o600))
                .expect("chmod");
        }
        assert!(loose_secret_files(&state).is_empty());
    }

    #[test]
    fn a_planted_secret_is_found_and_not_repeated() {
        let needles = vec![
            ("an agent token".to_owned(), "tok-123".to_owned()),
            ("a temp URL signature".to_owned(), "ab12cd".to_owned()),
        ];
        let haystacks = vec![
            (
                "conductor.log".to_owned(),
                b"line 1\nprepare_image: writing url=http://h/o?temp_url_sig=ab12cd&x=1\n".to_vec(),
            ),
            ("clean.log".to_owned(), b"temp_url_sig=******".to_vec()),
            ("state".to_owned(), b"\x00\x01tok-123\xff".to_vec()),
        ];
        let hits = find_leaks(&needles, &haystacks);
        assert_eq!(hits.len(), 2, "{hits:?}");
        assert!(
            hits[0].starts_with("conductor.log: a temp URL signature: "),
            "{hits:?}"
        );
        assert!(
            hits[0].contains("temp_url_sig=<a temp URL signature>&x=1"),
            "{hits:?}"
        );
        assert!(hits[1].starts_with("state: an agent token: "), "{hits:?}");
        assert!(hits
            .iter()
            .all(|h| !h.contains("tok-123") && !h.contains("ab12cd")));
        assert!(find_leaks(&needles, &haystacks[1..2]).is_empty());
    }
}
