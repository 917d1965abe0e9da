//! `vmdeploy-agent`: the deploy ramdisk's `/init`, and the same pipeline as operator commands.
//!
//! Exit codes ([`vmdeploy_shared::exit`]): 0 on success, 64 for bad usage or configuration, 1 for
//! a failure at run time. `run` as PID 1 never exits (it reboots or powers off).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use vmdeploy_shared::exit;

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
    /// The deploy ramdisk's /init flow: parameters, network, then the iSCSI or agent deploy.
    Run(vmdeploy_agent::deploy::RunArgs),
    /// Test aid: PID-1 setup under a scratch root, JSON report, then reboot(2) (run under unshare).
    #[command(hide = true)]
    Pid1Selftest(vmdeploy_agent::init::selftest::Pid1SelftestArgs),
    /// Debug aid: bring the network up (DHCP or static) and print what was configured.
    #[command(hide = true)]
    NetUp(vmdeploy_agent::net::cli::NetUpArgs),
}

fn main() -> ExitCode {
    vmdeploy_agent::logging::init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // The kernel starts `/init` with no subcommand (maybe with stray words from its command
        // line, e.g. `text`): that is `run --pid1`.
        Err(_) if started_as_init() => {
            let args = InitArgs::parse_from(["/init", "--pid1"]);
            vmdeploy_agent::deploy::run(args.run)
        }
        Err(err) => return clap_exit(&err),
    };
    let result = match cli.command {
        Command::IscsiTarget(args) => vmdeploy_agent::target::cli::run(args),
        Command::WriteImage(args) => vmdeploy_agent::stream::run_write_image(args),
        Command::Run(args) => vmdeploy_agent::deploy::run(args),
        Command::Pid1Selftest(args) => vmdeploy_agent::init::selftest::run(args),
        Command::NetUp(args) => vmdeploy_agent::net::cli::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("vmdeploy-agent: {err:#}");
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

/// `run`'s arguments on their own, for the bare `/init` start.
#[derive(Parser)]
struct InitArgs {
    #[command(flatten)]
    run: vmdeploy_agent::deploy::RunArgs,
}

/// True when the kernel may have started this binary as `/init`: PID 1, or argv[0] is `/init`.
fn started_as_init() -> bool {
    vmdeploy_agent::init::is_pid1() || std::env::args_os().next().is_some_and(|a| a == "/init")
}
