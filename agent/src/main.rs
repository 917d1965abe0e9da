//! `vmdeploy-agent`: the deploy ramdisk's `/init`, and the same pipeline as operator commands.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "vmdeploy-agent", version, about = "vmdeploy deploy agent")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a block device as LUN 1 of an iSCSI target until killed or told `done`.
    IscsiTarget(vmdeploy_agent::target::cli::IscsiTargetArgs),
}

fn main() -> std::process::ExitCode {
    vmdeploy_agent::logging::init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::IscsiTarget(args) => vmdeploy_agent::target::cli::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("vmdeploy-agent: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
