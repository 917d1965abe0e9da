//! The README's configuration table names exactly the keys the conductor accepts: every key of
//! `service::config::keys` and of the `[netboot]` table, once each, and nothing else. The
//! README is read at test time, so a key added to the code without a row (or a row left behind
//! for a key that went) fails here.

use std::collections::BTreeSet;
use std::path::Path;

use vmdeploy_conductor::service::config::keys;
use vmdeploy_conductor::service::config::netboot::keys as netboot;

/// The heading of the table, as README.md writes it.
const HEADING: &str = "### Configuration keys";

/// Every key the conductor's configuration file accepts.
fn accepted_keys() -> BTreeSet<&'static str> {
    let mut all: BTreeSet<&'static str> = keys::ALL.iter().copied().collect();
    all.extend([
        netboot::ROOT,
        netboot::TFTP_LISTEN,
        netboot::HTTP_LISTEN,
        netboot::HTTP_URL,
        netboot::DEPLOY_KERNEL,
        netboot::DEPLOY_RAMDISK,
        netboot::APPEND_PARAMS,
        netboot::INSTANCE_APPEND_PARAMS,
    ]);
    all
}

/// The first column of the first table after `heading`: one backticked key per row.
fn table_keys(readme: &str, heading: &str) -> Result<Vec<String>, String> {
    let start = readme
        .lines()
        .position(|l| l.trim_end() == heading)
        .ok_or_else(|| format!("README.md has no line {heading:?}"))?;
    let table: Vec<&str> = readme
        .lines()
        .skip(start + 1)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .collect();
    if table.len() < 3 {
        return Err(format!("no table under {heading:?}"));
    }
    // Row 0 is the header, row 1 the `|---|` rule.
    table[2..]
        .iter()
        .map(|row| {
            let cell = row.split('|').nth(1).unwrap_or("").trim();
            match cell.strip_prefix('`').and_then(|c| c.strip_suffix('`')) {
                Some(key) if !key.contains('`') && !key.contains(' ') => Ok(key.to_owned()),
                _ => Err(format!(
                    "a row's first cell must be one `key`, not {cell:?} (row {row:?})"
                )),
            }
        })
        .collect()
}

#[test]
fn the_readme_configuration_table_names_exactly_the_accepted_keys() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let rows = table_keys(&readme, HEADING).unwrap_or_else(|e| panic!("{e}"));

    let mut seen = BTreeSet::new();
    let twice: Vec<&String> = rows.iter().filter(|k| !seen.insert(k.as_str())).collect();
    assert!(
        twice.is_empty(),
        "README.md lists these keys twice: {twice:?}"
    );

    let accepted = accepted_keys();
    let undocumented: Vec<&&str> = accepted.difference(&seen).collect();
    let unknown: Vec<&&str> = seen.difference(&accepted).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "README.md's {HEADING:?} table and the conductor disagree:\n  \
         accepted but not in the table: {undocumented:?}\n  \
         in the table but not accepted: {unknown:?}"
    );
}

#[test]
fn the_table_reader_refuses_rows_it_cannot_read() {
    let good = "### Configuration keys\n\n| key | default |\n|---|---|\n| `a.b` | 1 |\n| `c.d` | 2 |\n\nafter\n";
    assert_eq!(
        table_keys(good, HEADING).expect("reads"),
        vec!["a.b".to_owned(), "c.d".to_owned()]
    );
    for bad in [
        "### Configuration keys\n| key |\n|---|\n| `a.b`, `c.d` | x |\n",
        "### Configuration keys\n| key |\n|---|\n| a.b | x |\n",
        "### Configuration keys\n\nno table\n",
        "### Other heading\n| key |\n|---|\n| `a.b` | x |\n",
    ] {
        assert!(table_keys(bad, HEADING).is_err(), "{bad:?}");
    }
}
