//! `vmdeploy-conductor`: the service (`serve`, the Ironic-compatible API) and operator commands
//! for iSCSI and iLO.
//!
//! Exit codes ([`vmdeploy_shared::exit`]): 0 on success, 64 for bad usage or configuration, 1 for
//! a failure at run time.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use vmdeploy_shared::exit;

#[derive(Parser)]
#[command(name = "vmdeploy-conductor", version, about = "vmdeploy conductor")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the conductor: the Ironic-compatible API on 127.0.0.1:6385 unless configured.
    Serve(vmdeploy_conductor::service::ServeArgs),
    /// Write, read or size a remote iSCSI LUN with the built-in initiator.
    Iscsi(vmdeploy_conductor::initiator::cli::IscsiArgs),
    /// Drive one iLO (RIBCL or Redfish): power, boot device, boot mode, virtual media, health.
    Ilo(vmdeploy_conductor::drivers::ilo::cli::IloArgs),
    /// Bring nodes over from an OpenStack Ironic (its API or `baremetal node list --long -f
    /// json`): a report by default, `--apply` to enroll them (they end `manageable`).
    Import(vmdeploy_conductor::import::cli::ImportArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return clap_exit(&err),
    };
    // serve sets up logging itself, from its configuration's [log] table.
    if !matches!(cli.command, Command::Serve(_)) {
        vmdeploy_conductor::logging::init();
    }
    let result = match cli.command {
        Command::Serve(args) => vmdeploy_conductor::service::run(args),
        Command::Iscsi(args) => vmdeploy_conductor::initiator::cli::run(args),
        Command::Ilo(args) => vmdeploy_conductor::drivers::ilo::cli::run(args),
        Command::Import(args) => vmdeploy_conductor::import::cli::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("vmdeploy-conductor: {err:#}");
            ExitCode::from(exit::code_for(err.chain()))
        }
    }
}

/// clap's own outcome: `--help` and `--version` exit 0, a usage error [`exit::USAGE`] (clap
/// would exit 2).
fn clap_exit(err: &clap::Error) -> ExitCode {
    let _ = err.print();
    if err.use_stderr() {
        ExitCode::from(exit::USAGE)
    } else {
        ExitCode::SUCCESS
    }
}
