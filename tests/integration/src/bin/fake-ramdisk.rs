//! `fake-ramdisk`: the deploy agent of many emulated nodes at once, for benchmarks of the
//! conductor (the library is `vmdeploy_integration_tests::fake_ramdisk`, whose docs say what
//! each node does and how the nodes are told apart).
//!
//! ```text
//! fake-ramdisk (--emulator HOST:PORT [--servers N] | --emulator HOST:PORT ...
//!               | --emulator-list FILE)
//!              [--emulator-cert PEM] [--mac-base MAC] [--listen ADDR:PORT] [--node-net IP]
//!              [--tls auto|off|mixed] [--poll-interval-ms MS] [--poll-concurrency N]
//!              [--heartbeat-scale F] [--boot-delay-ms MS] [--write-delay-ms MS]
//!              [--clean-step-delay-ms MS] [--image-size-mib N] [--verify-image]
//!              [--power-off-grace-ms MS] [--stats-every-secs S] [--stats-out FILE] [--verbose]
//! ```
//!
//! stdout: `listening ADDR`, `nodes FIRST-IP..LAST-IP`, `ready`, then one JSON line of counters
//! every `--stats-every-secs` (0: none) and a last one when it stops (SIGINT/SIGTERM), also
//! written to `--stats-out`. Bad arguments exit 64.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use vmdeploy_integration_tests::fake_ramdisk::{
    mac_plus, servers_from_emulator_output, Config, Harness, ServerSpec, TlsMode,
};
use vmdeploy_shared::exit::{UsageError, USAGE};

/// The deploy agent (IPA protocol) of many nodes of the iLO emulator at once, without booting
/// them.
#[derive(Debug, Parser)]
#[command(name = "fake-ramdisk")]
struct Args {
    /// An emulated iLO (`host:port`); repeat for each server, or give the first with --servers.
    #[arg(long = "emulator", value_name = "HOST:PORT")]
    emulators: Vec<SocketAddr>,
    /// Servers on consecutive ports from the one --emulator (the emulator's `--listen
    /// HOST:PORT --servers N` with a port other than 0).
    #[arg(long, value_name = "N")]
    servers: Option<usize>,
    /// The emulator's stdout (`server <i> https://<host:port>` lines), for ephemeral ports.
    #[arg(long, value_name = "FILE")]
    emulator_list: Option<PathBuf>,
    /// The emulator's certificate (its `--cert-out`); without it any certificate is accepted.
    #[arg(long, value_name = "PEM")]
    emulator_cert: Option<PathBuf>,
    /// Node i's MAC is this + i (the node's port, as enrolled); default: the floppy's BOOTIF.
    #[arg(long, value_name = "MAC")]
    mac_base: Option<String>,
    /// Where every node's command API listens [default: 0.0.0.0:9999].
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<SocketAddr>,
    /// Node i's address is this + 1 + i, in 127.0.0.0/8 [default: 127.77.0.0].
    #[arg(long, value_name = "IP")]
    node_net: Option<Ipv4Addr>,
    /// HTTPS with a certificate per boot (auto), plain HTTP (off), or half and half (mixed)
    /// [default: auto].
    #[arg(long, value_name = "MODE")]
    tls: Option<TlsMode>,
    /// How often each server's state is read [default: 1000].
    #[arg(long, value_name = "MS")]
    poll_interval_ms: Option<u64>,
    /// State reads in flight at once [default: 64].
    #[arg(long, value_name = "N")]
    poll_concurrency: Option<usize>,
    /// Multiplies the agent's heartbeat and lookup pauses [default: 1.0].
    #[arg(long, value_name = "F")]
    heartbeat_scale: Option<f64>,
    /// From the boot seen at the iLO to the floppy read [default: 2000].
    #[arg(long, value_name = "MS")]
    boot_delay_ms: Option<u64>,
    /// How long standby.prepare_image "writes" [default: 2000].
    #[arg(long, value_name = "MS")]
    write_delay_ms: Option<u64>,
    /// How long a clean step runs [default: 1000].
    #[arg(long, value_name = "MS")]
    clean_step_delay_ms: Option<u64>,
    /// The image size reported without --verify-image [default: 1024].
    #[arg(long, value_name = "N")]
    image_size_mib: Option<u64>,
    /// Download each image and check its checksum (no disk is written).
    #[arg(long)]
    verify_image: bool,
    /// The command API stays up this long after standby.power_off [default: 1000].
    #[arg(long, value_name = "MS")]
    power_off_grace_ms: Option<u64>,
    /// Print the counters every S seconds (0: only at the end).
    #[arg(long, value_name = "S", default_value_t = 10)]
    stats_every_secs: u64,
    /// Write the last counters (JSON) here.
    #[arg(long, value_name = "FILE")]
    stats_out: Option<PathBuf>,
    /// Each node's events on stderr.
    #[arg(long)]
    verbose: bool,
}

fn config(args: &Args) -> anyhow::Result<Config> {
    let usage = |text: String| anyhow::Error::new(UsageError::new(text));
    let addresses: Vec<SocketAddr> = match (&args.emulator_list, args.emulators.as_slice()) {
        (Some(file), []) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))
                .map_err(|e| usage(format!("{e:#}")))?;
            servers_from_emulator_output(&text).map_err(|e| usage(format!("{e:#}")))?
        }
        (Some(_), _) => {
            return Err(usage(
                "--emulator-list and --emulator exclude each other".into(),
            ))
        }
        (None, []) => {
            return Err(usage(
                "name the servers: --emulator or --emulator-list".into(),
            ))
        }
        (None, [first]) => {
            let n = args.servers.unwrap_or(1);
            (0..n)
                .map(|i| {
                    u16::try_from(usize::from(first.port()) + i)
                        .map(|port| SocketAddr::new(first.ip(), port))
                        .map_err(|_| usage(format!("{n} servers from {first} run past port 65535")))
                })
                .collect::<anyhow::Result<_>>()?
        }
        (None, many) if args.servers.is_none() => many.to_vec(),
        (None, _) => return Err(usage("--servers goes with one --emulator".into())),
    };
    let servers = addresses
        .into_iter()
        .enumerate()
        .map(|(i, emulator)| {
            let macs = match &args.mac_base {
                Some(base) => {
                    vec![mac_plus(base, i).map_err(|e| usage(format!("--mac-base: {e:#}")))?]
                }
                None => Vec::new(),
            };
            Ok(ServerSpec { emulator, macs })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let emulator_ca_pem = args
        .emulator_cert
        .as_ref()
        .map(|p| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display())))
        .transpose()
        .map_err(|e| usage(format!("{e:#}")))?;
    let d = Config::default();
    let ms = |v: Option<u64>, default: Duration| v.map_or(default, Duration::from_millis);
    Ok(Config {
        servers,
        emulator_ca_pem,
        listen: args.listen.unwrap_or(d.listen),
        node_net: args.node_net.unwrap_or(d.node_net),
        tls: args.tls.unwrap_or(d.tls),
        poll_interval: ms(args.poll_interval_ms, d.poll_interval),
        poll_concurrency: args.poll_concurrency.unwrap_or(d.poll_concurrency),
        heartbeat_scale: args.heartbeat_scale.unwrap_or(d.heartbeat_scale),
        boot_delay: ms(args.boot_delay_ms, d.boot_delay),
        write_delay: ms(args.write_delay_ms, d.write_delay),
        clean_step_delay: ms(args.clean_step_delay_ms, d.clean_step_delay),
        image_size: args.image_size_mib.map_or(d.image_size, |m| m << 20),
        verify_image: args.verify_image,
        power_off_grace: ms(args.power_off_grace_ms, d.power_off_grace),
        lookup_timeout: d.lookup_timeout,
        verbose: args.verbose,
    })
}

async fn run(config: Config, every: u64, out: Option<PathBuf>) -> anyhow::Result<()> {
    let n = config.servers.len();
    let (first, last) = (config.node_ip(0), config.node_ip(n.saturating_sub(1)));
    let harness = Harness::start(config)
        .await
        .context("starting the harness")?;
    println!("listening {}", harness.local_addr());
    if let (Some(first), Some(last)) = (first, last) {
        println!("nodes {first}..{last}");
    }
    println!("ready");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    let period = Duration::from_secs(every.max(1));
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    loop {
        tokio::select! {
            _ = ticker.tick(), if every > 0 => println!("{}", harness.stats().to_json()),
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        }
    }
    let last = harness.stats().to_json();
    println!("{last}");
    if let Some(path) = out {
        std::fs::write(&path, format!("{last:#}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    harness.shutdown().await;
    Ok(())
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) if !e.use_stderr() => {
            // --help, --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(USAGE);
        }
    };
    let outcome = config(&args).and_then(|config| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the async runtime")?
            .block_on(run(config, args.stats_every_secs, args.stats_out.clone()))
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fake-ramdisk: {e:#}");
            ExitCode::from(vmdeploy_shared::exit::code_for(e.chain()))
        }
    }
}
