//! Unit tests of the configuration: parsing, key names, state directory, resolution.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::logging::LogFormat;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn resolve(text: &str) -> Result<Settings, ConfigError> {
    let file = parse(text)?;
    Settings::resolve(file, None, None, &env(&[("HOME", "/home/op")]))
}

/// name, --state-dir, state.dir, environment, expected dir, expected source.
type StateDirCase<'a> = (
    &'a str,
    Option<&'a str>,
    Option<&'a str>,
    &'a [(&'a str, &'a str)],
    &'a str,
    StateDirSource,
);

#[test]
fn state_dir_order() {
    let cases: &[StateDirCase] = &[
        (
            "command line first",
            Some("/cli"),
            Some("/conf"),
            &[("STATE_DIRECTORY", "/sd"), ("HOME", "/h")],
            "/cli",
            StateDirSource::CommandLine,
        ),
        (
            "then the file",
            None,
            Some("/conf"),
            &[("STATE_DIRECTORY", "/sd")],
            "/conf",
            StateDirSource::ConfigFile,
        ),
        (
            "then systemd's, first of a list",
            None,
            None,
            &[("STATE_DIRECTORY", "/sd:/other"), ("XDG_STATE_HOME", "/x")],
            "/sd",
            StateDirSource::StateDirectory,
        ),
        (
            "then XDG",
            None,
            None,
            &[
                ("STATE_DIRECTORY", ""),
                ("XDG_STATE_HOME", "/x"),
                ("HOME", "/h"),
            ],
            "/x/vmdeploy",
            StateDirSource::XdgStateHome,
        ),
        (
            "a relative XDG is ignored",
            None,
            None,
            &[("XDG_STATE_HOME", "rel"), ("HOME", "/h")],
            "/h/.local/state/vmdeploy",
            StateDirSource::Home,
        ),
        (
            "then home",
            None,
            None,
            &[("HOME", "/h")],
            "/h/.local/state/vmdeploy",
            StateDirSource::Home,
        ),
    ];
    for (name, cli, conf, vars, want, source) in cases {
        let got = resolve_state_dir(cli.map(Path::new), conf.map(Path::new), &env(vars))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got, (PathBuf::from(want), *source), "{name}");
    }
    let err = resolve_state_dir(None, None, &env(&[])).expect_err("nothing set");
    assert_eq!(err.key, keys::STATE_DIR);
}

#[test]
fn no_file_means_every_default() {
    let s = resolve("").expect("empty file");
    assert_eq!(s.listen, vec![DEFAULT_LISTEN]);
    assert_eq!(s.listen[0].to_string(), "127.0.0.1:6385");
    assert_eq!(s.tls, ApiTls::Off);
    assert_eq!(s.auth, AuthStrategy::Noauth);
    assert_eq!(s.max_body, 1024 * 1024);
    assert_eq!(s.shutdown_grace, Duration::from_secs(30));
    assert_eq!(s.callback_failures.per_client, 10);
    assert_eq!(s.callback_failures.per_node, 20);
    assert_eq!(s.state_dir, PathBuf::from("/home/op/.local/state/vmdeploy"));
    assert_eq!(s.sqlite_path, s.state_dir.join("vmdeploy.sqlite"));
    assert_eq!(s.deploy_callback_timeout, Duration::from_secs(1800));
    assert_eq!(s.deploy_helper_images_ttl, Duration::from_secs(600));
    assert_eq!(s.power_sync_interval, Duration::from_secs(60));
    assert!(!s.agent_allow_plain_http);
    assert!(!s.automated_clean);
    assert_eq!(s.ilo.client_port, 443);
    assert_eq!(s.ilo.verify_ca, VerifyCa::Enabled(true));
    assert_eq!(s.log_format, LogFormat::Human);
    assert_eq!(s.image_cache_dir, s.state_dir.join("images"));
    assert_eq!(s.image_cache_limit, 20 * 1024 * 1024 * 1024);
    match &s.objects {
        ObjectsSettings::Builtin { listen, root, .. } => {
            assert_eq!(*listen, DEFAULT_BUILTIN_LISTEN);
            assert_eq!(*root, s.state_dir.join("objects"));
        }
        other => panic!("builtin expected, got {other:?}"),
    }
    let fell_back: Vec<&str> = s.fallbacks.iter().map(|f| f.key).collect();
    for key in [
        keys::API_LISTEN,
        keys::API_TLS,
        keys::AUTH_STRATEGY,
        keys::STATE_DIR,
        keys::STORE_KIND,
        keys::OBJECTS_KIND,
        keys::BUILTIN_LISTEN,
    ] {
        assert!(fell_back.contains(&key), "{key} missing from {fell_back:?}");
    }
}

#[test]
fn errors_name_the_key() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "unknown key",
            "[api]\nlisen = [\"127.0.0.1:1\"]\n",
            "api.lisen",
        ),
        ("unknown table", "[nope]\nx = 1\n", "nope"),
        ("bad type", "[api]\nmax_body = \"big\"\n", "api.max_body"),
        ("bad tls word", "[api]\ntls = \"on\"\n", "api.tls"),
        (
            "bad type inside a multi-line array",
            "[api]\nlisten = [\n  \"127.0.0.1:1\",\n  42,\n]\n",
            "api.listen",
        ),
        (
            "bad type in a sub-table",
            "[objects.builtin]\nlisten = 5\n",
            "objects.builtin.listen",
        ),
        (
            "unknown key in an inline table",
            "[api]\ntls = { cert = \"/c\", key = \"/k\", chain = \"/x\" }\n",
            "api.tls",
        ),
        (
            "bad address",
            "[api]\nlisten = [\"localhost\"]\n",
            "api.listen",
        ),
        (
            "non-loopback without TLS",
            "[api]\nlisten = [\"0.0.0.0:6385\"]\n",
            "api.listen",
        ),
        (
            "missing cert",
            "[api]\ntls = { cert = \"/nonexistent/c.pem\", key = \"/nonexistent/k.pem\" }\n",
            "api.tls.cert",
        ),
        (
            "basic without file",
            "[auth]\nstrategy = \"http_basic\"\n",
            "auth.htpasswd",
        ),
        (
            "bad strategy",
            "[auth]\nstrategy = \"keystone\"\n",
            "auth.strategy",
        ),
        (
            "zero timeout",
            "[deploy]\ndeploy_callback_timeout = 0\n",
            "deploy.deploy_callback_timeout",
        ),
        (
            "relative boot loaders dir",
            "[deploy]\nboot_loaders_dir = \"loaders\"\n",
            "deploy.boot_loaders_dir",
        ),
        (
            "zero image cache limit",
            "[images]\ncache_limit = 0\n",
            "images.cache_limit",
        ),
        (
            "relative image cache dir",
            "[images]\ncache_dir = \"images\"\n",
            "images.cache_dir",
        ),
        ("bad log level", "[log]\nlevel = \"loud\"\n", "log.level"),
        (
            "bad log filter",
            "[log]\nlevel = \"x=loudest\"\n",
            "log.level",
        ),
        (
            "swift without table",
            "[objects]\nkind = \"swift\"\n",
            "objects.swift",
        ),
        (
            "builtin over http",
            "[objects.builtin]\npublic_url = \"http://h:1\"\n",
            "objects.builtin.public_url",
        ),
    ];
    for (name, text, key) in cases {
        let err = resolve(text).expect_err(name);
        assert_eq!(err.key, *key, "{name}: {err}");
    }
    let err = resolve("# comment\n[api]\nlisen = 1\n").expect_err("unknown key");
    assert!(err.reason.ends_with("(line 3)"), "{err}");
    let err = resolve("[api]\nmax_body = \"x\"\n").expect_err("bad type");
    assert!(err.reason.ends_with("(line 2)"), "{err}");
}

#[test]
fn the_words_allow_plain_http_beyond_loopback() {
    let s = resolve("[api]\nlisten = [\"0.0.0.0:6385\"]\ninsecure_listen_without_tls = true\n")
        .expect("allowed in so many words");
    assert_eq!(s.listen[0].to_string(), "0.0.0.0:6385");
    let s = resolve("[api]\nlisten = [\"0.0.0.0:6385\"]\ntls = \"auto\"\n").expect("auto TLS");
    assert_eq!(s.tls, ApiTls::Auto);
}

#[test]
fn boot_loaders_dir_defaults_to_the_state_dir() {
    let s = resolve("").expect("defaults");
    assert_eq!(
        s.boot_loaders_dir,
        PathBuf::from("/home/op/.local/state/vmdeploy/boot-loaders")
    );
    let s = resolve("[deploy]\nboot_loaders_dir = \"/srv/loaders\"\n").expect("given");
    assert_eq!(s.boot_loaders_dir, PathBuf::from("/srv/loaders"));
}

#[test]
fn boot_iso_settings_have_defaults_and_refuse_what_cannot_work() {
    let s = resolve("").expect("defaults");
    assert_eq!(s.boot_iso_append, "");
    assert_eq!(s.boot_iso_ttl, Duration::from_secs(86_400));
    let s = resolve("[deploy]\nboot_iso_append = \" console=ttyS0 nofb \"\nboot_iso_ttl = 900\n")
        .expect("given");
    assert_eq!(s.boot_iso_append, "console=ttyS0 nofb");
    assert_eq!(s.boot_iso_ttl, Duration::from_secs(900));
    assert_eq!((s.iscsi_portal_port, s.iscsi_done_port), (3260, 10000));
    let s =
        resolve("[deploy]\niscsi_portal_port = 13260\niscsi_done_port = 20000\n").expect("ports");
    assert_eq!((s.iscsi_portal_port, s.iscsi_done_port), (13260, 20000));
    for bad in ["iscsi_portal_port = 0", "iscsi_done_port = 70000"] {
        let err = resolve(&format!("[deploy]\n{bad}\n")).expect_err(bad);
        assert!(err.to_string().contains("iscsi_"), "{bad}: {err}");
    }
    let err = resolve("[deploy]\nboot_iso_ttl = 0\n").expect_err("zero");
    assert!(err.to_string().contains(keys::DEPLOY_BOOT_ISO_TTL), "{err}");
    let err = resolve("[deploy]\nboot_iso_append = \"a\\nb\"\n").expect_err("two lines");
    assert!(
        err.to_string().contains(keys::DEPLOY_BOOT_ISO_APPEND),
        "{err}"
    );
}

#[test]
fn iscsi_chap_is_both_keys_or_neither_and_its_secret_is_never_shown() {
    let s = resolve("").expect("defaults");
    assert!(s.iscsi_chap.is_none());
    let s = resolve(
        "[deploy]\niscsi_chap_user = \"deployer\"\niscsi_chap_secret = \"chap-secret-4567\"\n",
    )
    .expect("both given");
    let chap = s.iscsi_chap.as_ref().expect("CHAP configured");
    assert_eq!(chap.user, "deployer");
    assert_eq!(chap.secret.expose(), "chap-secret-4567");
    assert!(!format!("{s:?}").contains("chap-secret-4567"));
    for (text, key, words) in [
        (
            "[deploy]\niscsi_chap_user = \"deployer\"\n",
            keys::DEPLOY_ISCSI_CHAP_SECRET,
            "needs a secret",
        ),
        (
            "[deploy]\niscsi_chap_secret = \"chap-secret-4567\"\n",
            keys::DEPLOY_ISCSI_CHAP_USER,
            "needs a user",
        ),
        (
            "[deploy]\niscsi_chap_user = \"deployer\"\niscsi_chap_secret = \"short-5\"\n",
            keys::DEPLOY_ISCSI_CHAP_SECRET,
            "at least 12",
        ),
        (
            "[deploy]\niscsi_chap_user = \"deployer\"\niscsi_chap_secret = \"chap secret 4567\"\n",
            keys::DEPLOY_ISCSI_CHAP_SECRET,
            "white space",
        ),
        (
            "[deploy]\niscsi_chap_user = \"de ployer\"\niscsi_chap_secret = \"chap-secret-4567\"\n",
            keys::DEPLOY_ISCSI_CHAP_USER,
            "white space",
        ),
    ] {
        let err = resolve(text).expect_err(text);
        assert_eq!(err.key, key, "{text}");
        assert!(err.reason.contains(words), "{text}: {err}");
        assert!(!err.to_string().contains("secret 4567"), "{err}");
        assert!(!err.to_string().contains("short-5"), "{err}");
    }
}

#[test]
fn sync_power_state_workers_defaults_to_ironics_eight_and_refuses_zero() {
    let s = resolve("").expect("defaults");
    assert_eq!(s.sync_power_state_workers, 8);
    let s = resolve("[conductor]\nsync_power_state_workers = 32\n").expect("32");
    assert_eq!(s.sync_power_state_workers, 32);
    let err = resolve("[conductor]\nsync_power_state_workers = 0\n").expect_err("zero");
    assert_eq!(err.key, keys::CONDUCTOR_SYNC_POWER_STATE_WORKERS);
}

#[test]
fn a_database_url_chooses_postgresql_and_its_password_is_never_shown() {
    let s = resolve("").expect("defaults");
    assert_eq!(s.store, StoreKind::Sqlite);
    assert!(s.postgres.is_none());

    let s =
        resolve("[database]\nurl = \"postgresql://vm:db-pass-8642@db.example:5432/vmdeploy\"\n")
            .expect("a URL alone");
    assert_eq!(s.store, StoreKind::Postgresql);
    let pg = s.postgres.as_ref().expect("PostgreSQL settings");
    assert_eq!(pg.max_connections, DEFAULT_DATABASE_MAX_CONNECTIONS);
    assert!(s
        .fallbacks
        .iter()
        .any(|f| f.key == keys::DATABASE_MAX_CONNECTIONS));
    assert!(
        !format!("{s:?}").contains("db-pass-8642"),
        "the URL is masked"
    );

    let dir = tempfile::TempDir::new().expect("temp dir");
    let password = dir.path().join("password");
    std::fs::write(&password, "pw\n").expect("writing");
    let s = resolve(&format!(
        "[store]\nkind = \"postgresql\"\n[database]\nurl = \"postgresql://vm@db/vmdeploy\"\n\
         password_file = \"{}\"\nmax_connections = 4\n",
        password.display()
    ))
    .expect("all keys");
    let pg = s.postgres.as_ref().expect("PostgreSQL settings");
    assert_eq!(pg.max_connections, 4);
    assert_eq!(pg.password_file.as_deref(), Some(password.as_path()));

    for (text, key, words) in [
        (
            "[store]\nkind = \"postgresql\"\n",
            keys::DATABASE_URL,
            "must name the server",
        ),
        (
            "[store]\nkind = \"sqlite\"\n[database]\nurl = \"postgresql://vm@db/x\"\n",
            keys::DATABASE_URL,
            "is for PostgreSQL",
        ),
        (
            "[database]\nurl = \"mysql://vm:db-pass-8642@db/x\"\n",
            keys::DATABASE_URL,
            "not a PostgreSQL URL",
        ),
        (
            "[database]\nurl = \"postgresql://db/x\"\n",
            keys::DATABASE_URL,
            "names no user",
        ),
        (
            "[database]\nurl = \"postgresql://vm@db/x\"\npassword_file = \"/nonexistent/pw\"\n",
            keys::DATABASE_PASSWORD_FILE,
            "/nonexistent/pw",
        ),
        (
            "[database]\nurl = \"postgresql://vm@db/x\"\nmax_connections = 0\n",
            keys::DATABASE_MAX_CONNECTIONS,
            "at least 1",
        ),
        ("[store]\nkind = \"mysql\"\n", keys::STORE_KIND, "mysql"),
    ] {
        let err = resolve(text).expect_err(text);
        assert_eq!(err.key, key, "{text}");
        assert!(err.to_string().contains(words), "{text}: {err}");
        assert!(!err.to_string().contains("db-pass-8642"), "{err}");
    }
}

#[test]
fn the_example_file_parses_and_names_every_key() {
    let text = include_str!("../../../vmdeploy-conductor.example.toml");
    parse(text).expect("the example parses");
    // Keys may appear commented out; each must be written as `name =` under its table.
    for key in keys::ALL {
        let (table, name) = key.rsplit_once('.').expect("dotted");
        let (table, name) = match table {
            // api.tls.cert etc. are inline-table members.
            "api.tls" => ("api", name),
            t => (t, name),
        };
        assert!(
            text.contains(&format!("[{table}]")),
            "table [{table}] of {key} missing from the example"
        );
        assert!(
            text.contains(&format!("{name} =")),
            "{key} missing from the example"
        );
    }
}

#[test]
fn api_url_from_the_bound_address() {
    let bound: SocketAddr = "127.0.0.1:41000".parse().expect("addr");
    assert_eq!(
        default_api_url(None, bound, false),
        "http://127.0.0.1:41000"
    );
    assert_eq!(
        default_api_url(None, bound, true),
        "https://127.0.0.1:41000"
    );
    assert_eq!(
        default_api_url(Some("https://c.example:6385/"), bound, true),
        "https://c.example:6385"
    );
    let v6: SocketAddr = "[::1]:6385".parse().expect("addr");
    assert_eq!(default_api_url(None, v6, false), "http://[::1]:6385");
}
