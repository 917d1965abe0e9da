//! `vmdeploy-conductor`: the service, and operator commands for iSCSI and iLO.

use clap::{Parser, Subcommand};

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

fn main() -> std::process::ExitCode {
    vmdeploy_conductor::logging::init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Iscsi(args) => vmdeploy_conductor::initiator::cli::run(args),
        Command::Ilo(args) => vmdeploy_conductor::drivers::ilo::cli::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("vmdeploy-conductor: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
