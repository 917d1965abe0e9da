//! `vmdeploy-conductor import`: the command line, and the run from the source to the report.
//!
//! Exit codes ([`vmdeploy_shared::exit`]): 0 when the dry run or every enrolment succeeded (a
//! node the plan leaves in `enroll` is no failure), 1 when an enrolment with `--apply` failed
//! or an API could not be read, 64 for bad usage (arguments, an unreadable or malformed input
//! file, a bad URL).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::ArgGroup;
use url::Url;
use vmdeploy_shared::exit::UsageError;
use vmdeploy_shared::secret::Secret;

use super::apply::{apply, read_existing};
use super::client::{ApiClient, Auth};
use super::mapping::plan;
use super::report::Report;
use super::source::{
    base_url, nodes_from_json, ports_from_json, read_ironic, SourceNode, SourcePort,
};

/// Arguments of `vmdeploy-conductor import`.
#[derive(clap::Args, Debug)]
#[command(group(ArgGroup::new("source").required(true).args(["from_ironic", "from_json"])))]
pub struct ImportArgs {
    /// Read the nodes and ports from this Ironic API (`http://HOST:6385`).
    #[arg(long, value_name = "URL")]
    pub from_ironic: Option<String>,
    /// With --from-ironic: a file holding a Keystone token (first line), sent as X-Auth-Token.
    // `conflicts_with` the other source rather than `requires` this one: clap takes any member
    // of the source group as meeting a `requires` (clap-rs/clap#4707).
    #[arg(long, value_name = "FILE", conflicts_with = "from_json")]
    pub ironic_token_file: Option<PathBuf>,
    /// Read the nodes from the output of `baremetal node list --long --limit 0 -f json`.
    #[arg(long, value_name = "FILE")]
    pub from_json: Option<PathBuf>,
    /// With --from-json: the ports, from `baremetal port list --long --limit 0 -f json`.
    #[arg(long, value_name = "FILE", conflicts_with = "from_ironic")]
    pub ports_json: Option<PathBuf>,
    /// The vmdeploy conductor's API (`http://127.0.0.1:6385`): what it has already is not
    /// imported again; --apply enrolls into it.
    #[arg(long, value_name = "URL")]
    pub to: String,
    /// The vmdeploy API's user, when it runs `http_basic`.
    #[arg(long, value_name = "USER", requires = "to_password_file")]
    pub to_username: Option<String>,
    /// File holding that user's password (first line).
    #[arg(long, value_name = "FILE", requires = "to_username")]
    pub to_password_file: Option<PathBuf>,
    /// CA certificates (PEM) for https:// APIs whose certificates the system does not trust.
    #[arg(long, value_name = "FILE")]
    pub cacert: Option<PathBuf>,
    /// Enroll the nodes taken over (without it: a dry run that changes nothing).
    #[arg(long)]
    pub apply: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Seconds each API call may take.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub timeout: u64,
    /// Seconds to wait for the nodes' `manage` (vmdeploy checks each BMC's credentials).
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub manage_timeout: u64,
}

/// Where the nodes come from.
enum Source {
    /// A running Ironic.
    Ironic { url: Url, auth: Auth },
    /// JSON exports, already read.
    Files {
        nodes: Vec<SourceNode>,
        ports: Option<Vec<SourcePort>>,
    },
}

/// Everything the command line names, read and checked before any connection.
struct Input {
    source: Source,
    source_label: String,
    to: Url,
    to_auth: Auth,
    timeout: Duration,
}

/// A base URL as the operator wrote it (no final `/`).
fn shown(url: &Url) -> &str {
    url.as_str().trim_end_matches('/')
}

/// The first line of a secret file.
fn read_secret(path: &Path, what: &str) -> anyhow::Result<Secret> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading {what} file {}", path.display()))?;
    let first = text.lines().next().unwrap_or("").trim();
    if first.is_empty() {
        bail!("{what} file {} is empty", path.display());
    }
    Ok(Secret::new(first))
}

fn read_file(path: &Path, what: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {what} {}", path.display()))
}

impl Input {
    fn read(args: &ImportArgs) -> anyhow::Result<Input> {
        if args.timeout == 0 || args.manage_timeout == 0 {
            bail!("--timeout and --manage-timeout must be at least 1 second");
        }
        if let Some(ca) = &args.cacert {
            std::fs::metadata(ca).with_context(|| format!("reading --cacert {}", ca.display()))?;
        }
        let to = base_url(&args.to, "--to")?;
        let to_auth = match (&args.to_username, &args.to_password_file) {
            (Some(user), Some(file)) => Auth::Basic {
                user: user.clone(),
                password: read_secret(file, "--to-password-file")?,
            },
            _ => Auth::None,
        };
        let (source, source_label) = match (&args.from_ironic, &args.from_json) {
            (Some(url), None) => {
                let auth = match &args.ironic_token_file {
                    Some(file) => Auth::Token(read_secret(file, "--ironic-token-file")?),
                    None => Auth::None,
                };
                let url = base_url(url, "--from-ironic")?;
                let label = shown(&url).to_string();
                (Source::Ironic { url, auth }, label)
            }
            (None, Some(file)) => {
                let what = file.display().to_string();
                let nodes = nodes_from_json(&read_file(file, "--from-json")?, &what)?;
                let ports = match &args.ports_json {
                    Some(p) => Some(ports_from_json(
                        &read_file(p, "--ports-json")?,
                        &p.display().to_string(),
                    )?),
                    None => None,
                };
                (Source::Files { nodes, ports }, what)
            }
            // clap's group makes exactly one of them present.
            _ => bail!("give one of --from-ironic and --from-json"),
        };
        Ok(Input {
            source,
            source_label,
            to,
            to_auth,
            timeout: Duration::from_secs(args.timeout),
        })
    }
}

/// Runs `import`: reads the source and what vmdeploy has, plans, enrolls with `--apply`, prints
/// the report; fails (exit 1) when an enrolment failed.
pub fn run(args: ImportArgs) -> anyhow::Result<()> {
    let Input {
        source,
        source_label,
        to,
        to_auth,
        timeout,
    } = Input::read(&args).map_err(UsageError::wrap)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let cacert = args.cacert.as_ref();
    let (plan, results) = runtime.block_on(async {
        let vmdeploy = ApiClient::connect(to.clone(), to_auth, cacert, timeout)
            .await
            .with_context(|| format!("connecting to vmdeploy at {}", shown(&to)))?;
        let existing = read_existing(&vmdeploy)
            .await
            .with_context(|| format!("reading the nodes vmdeploy at {} has", shown(&to)))?;
        let (nodes, ports) = match source {
            Source::Files { nodes, ports } => (nodes, ports),
            Source::Ironic { url, auth } => {
                let ironic = ApiClient::connect(url.clone(), auth, cacert, timeout)
                    .await
                    .with_context(|| {
                        format!("connecting to the source Ironic at {}", shown(&url))
                    })?;
                let (nodes, ports) = read_ironic(&ironic).await?;
                (nodes, Some(ports))
            }
        };
        let plan = plan(&nodes, ports.as_deref(), &existing);
        let results = if args.apply {
            Some(apply(&vmdeploy, &plan, Duration::from_secs(args.manage_timeout)).await)
        } else {
            None
        };
        anyhow::Ok((plan, results))
    })?;
    let report = Report {
        source: &source_label,
        target: shown(&to),
        plan: &plan,
        results: results.as_deref(),
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report.json()).context("writing the report")?
        );
    } else {
        print!("{}", report.text());
    }
    let counts = report.counts();
    if counts.failed > 0 {
        bail!(
            "{} of {} node(s) taken over failed to import (see the report)",
            counts.failed,
            counts.taken_over
        );
    }
    Ok(())
}
