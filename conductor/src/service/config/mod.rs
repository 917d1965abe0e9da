//! The conductor's configuration: the TOML file as written ([`ConfigFile`], serde,
//! `deny_unknown_fields`), and what `serve` runs with after checking it ([`Settings`]).
//!
//! # Design
//! Two steps, so that `serve --check-config` runs exactly what `serve` runs and binds nothing:
//! [`parse`] turns text into a [`ConfigFile`] (a syntax or type error names its key, found from
//! the error's position in the text), and [`Settings::resolve`] checks values and relations
//! (addresses, loopback without TLS, files that must exist) and fills every default, saying
//! which ones it used ([`Fallback`]), so the first log lines can tell the operator.
//!
//! Every key's dotted name is a constant in [`keys`], the one place messages and docs take them
//! from (docs/style.md §4, after linkerd2-proxy's env.rs); a unit test checks each constant against
//! the example file. The environment comes through the [`Env`] trait, with a map for tests
//! (docs/style.md §7).
//!
//! Durations are whole seconds. Sizes are bytes.
//!
//! # Layout
//! [`keys`] names the keys, `file.rs` holds the tables as written and [`parse`], `state_dir.rs`
//! the environment and the state directory, `settings.rs` the checked [`Settings`],
//! `resolve.rs` [`Settings::resolve`] and its checks, `defaults.rs` the values used when a key is
//! unset, and [`netboot`] the `[netboot]` table from end to end.

mod defaults;
mod error;
mod file;
pub mod keys;
pub mod netboot;
mod resolve;
mod settings;
mod state_dir;
#[cfg(test)]
mod tests;

pub use defaults::*;
pub use error::ConfigError;
pub use file::{
    parse, ApiSection, AuthSection, AuthStrategy, BuiltinSection, ConductorSection, ConfigFile,
    DatabaseSection, DeploySection, IloSection, ImagesSection, LogSection, ObjectsKind,
    ObjectsSection, StateSection, StoreKind, StoreSection, SwiftSection, TlsFiles, TlsSetting,
    VerifyCa,
};
// `netboot` checks its URLs as the other tables do.
use resolve::check_url;
pub use resolve::{default_api_url, host_name};
pub use settings::{ApiTls, Fallback, IloDefaults, ObjectsSettings, Settings};
pub use state_dir::{resolve_state_dir, Env, ProcessEnv, StateDirSource};
