//! The environment ([`Env`], a map in tests) and the state directory decided from the command
//! line, the file and the environment.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{keys, ConfigError, STATE_SUBDIR};

/// The process environment, or a map in tests.
pub trait Env {
    /// The value of a variable, `None` when unset or empty.
    fn var(&self, name: &str) -> Option<String>;
}

/// The real environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).filter(|v| !v.is_empty()).cloned()
    }
}

/// Where the state directory came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateDirSource {
    /// `--state-dir`.
    CommandLine,
    /// `[state] dir`.
    ConfigFile,
    /// `$STATE_DIRECTORY` (systemd's `StateDirectory=`).
    StateDirectory,
    /// `$XDG_STATE_HOME/vmdeploy`.
    XdgStateHome,
    /// `~/.local/state/vmdeploy`.
    Home,
}

impl std::fmt::Display for StateDirSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StateDirSource::CommandLine => "from --state-dir",
            StateDirSource::ConfigFile => "from state.dir",
            StateDirSource::StateDirectory => "from $STATE_DIRECTORY",
            StateDirSource::XdgStateHome => "from $XDG_STATE_HOME, $STATE_DIRECTORY unset",
            StateDirSource::Home => "~/.local/state, $STATE_DIRECTORY and $XDG_STATE_HOME unset",
        })
    }
}

/// The state directory: `--state-dir`, else `[state] dir`, else `$STATE_DIRECTORY` (its first
/// entry: systemd passes a colon-separated list), else `$XDG_STATE_HOME/vmdeploy` (only when
/// absolute, as the XDG spec asks), else `$HOME/.local/state/vmdeploy`.
pub fn resolve_state_dir(
    command_line: Option<&Path>,
    config: Option<&Path>,
    env: &dyn Env,
) -> Result<(PathBuf, StateDirSource), ConfigError> {
    if let Some(dir) = command_line {
        return Ok((dir.to_path_buf(), StateDirSource::CommandLine));
    }
    if let Some(dir) = config {
        return Ok((dir.to_path_buf(), StateDirSource::ConfigFile));
    }
    if let Some(list) = env.var("STATE_DIRECTORY") {
        if let Some(first) = list.split(':').find(|s| !s.is_empty()) {
            return Ok((PathBuf::from(first), StateDirSource::StateDirectory));
        }
    }
    if let Some(xdg) = env.var("XDG_STATE_HOME") {
        let xdg = PathBuf::from(xdg);
        if xdg.is_absolute() {
            return Ok((xdg.join(STATE_SUBDIR), StateDirSource::XdgStateHome));
        }
    }
    if let Some(home) = env.var("HOME") {
        return Ok((
            PathBuf::from(home).join(".local/state").join(STATE_SUBDIR),
            StateDirSource::Home,
        ));
    }
    Err(ConfigError::new(
        keys::STATE_DIR,
        "no state directory: none of --state-dir, state.dir, $STATE_DIRECTORY, \
         $XDG_STATE_HOME or $HOME is set",
    ))
}
