//! `vmdeploy-conductor`: operator commands for iSCSI and iLO (the service comes later).
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
    /// Write, read or size a remote iSCSI LUN with the built-in initiator.
    Iscsi(vmdeploy_conductor::initiator::cli::IscsiArgs),
    /// Drive one iLO (RIBCL or Redfish): power, boot device, boot mode, virtual media, health.
    Ilo(vmdeploy_conductor::drivers::ilo::cli::IloArgs),
}

fn main() -> ExitCode {
    vmdeploy_conductor::logging::init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return clap_exit(&err),
    };
    let result = match cli.command {
        Command::Iscsi(args) => vmdeploy_conductor::initiator::cli::run(args),
        Command::Ilo(args) => vmdeploy_conductor::drivers::ilo::cli::run(args),
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
