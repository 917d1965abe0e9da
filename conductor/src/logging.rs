//! Console logging: one line per event, with a timestamp, on stderr (stdout is kept for the
//! operator commands' output, e.g. `--json`).

/// Sets up `tracing` output; `RUST_LOG` overrides the default `info` level.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
