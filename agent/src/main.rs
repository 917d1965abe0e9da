//! `vmdeploy-agent`: the deploy ramdisk's `/init`, and the same pipeline as operator commands.

use clap::{Parser, Subcommand};

// musl's allocator maps and unmaps every large buffer, which made the image stream fault on
// every network chunk (bench/agent-stream.sh); mimalloc reuses them.
#[cfg(target_env = "musl")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Stream an image from an HTTP(S) URL to a disk: decompress, verify, first MiB last.
    WriteImage(vmdeploy_agent::stream::WriteImageArgs),
}

fn main() -> std::process::ExitCode {
    vmdeploy_agent::logging::init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::IscsiTarget(args) => vmdeploy_agent::target::cli::run(args),
        Command::WriteImage(args) => vmdeploy_agent::stream::run_write_image(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("vmdeploy-agent: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
