//! Console logging: one line per event, with a timestamp, on stderr (stdout is kept for the
//! operator commands' output, e.g. `--json`).
//!
//! The operator commands (`iscsi`, `ilo`) call [`init`]; `serve` calls [`init_with`] once its
//! configuration is read, with the format and level from `[log]`. `RUST_LOG`, when set, wins
//! over the configured level in both.

use serde::Deserialize;

/// How log lines look.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// `2026-01-01T00:00:00Z  INFO request{request_id=req-..}: message key=value`.
    #[default]
    Human,
    /// One JSON object per line: `timestamp`, `level`, `fields`, `target`, and the spans
    /// (`span`: the innermost, `spans`: all of them, with their fields such as `request_id`).
    Json,
}

/// Sets up `tracing` output; `RUST_LOG` overrides the default `info` level.
pub fn init() {
    let _ = init_with(LogFormat::Human, "info");
}

/// Sets up `tracing` output in `format` with the filter `level` (`info`, or directives such as
/// `info,vmdeploy_conductor::api=debug`); `RUST_LOG` overrides `level`. Fails when a subscriber
/// is already set (tests that start several servers in one process keep the first).
pub fn init_with(format: LogFormat, level: &str) -> anyhow::Result<()> {
    tracing::subscriber::set_global_default(subscriber(format, level, std::io::stderr))
        .map_err(|e| anyhow::anyhow!("setting up logging: {e}"))
}

/// The subscriber [`init_with`] installs, writing to `writer` (tests capture the lines).
pub fn subscriber<W>(
    format: LogFormat,
    level: &str,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(false);
    match format {
        LogFormat::Human => Box::new(builder.finish()),
        LogFormat::Json => Box::new(
            builder
                .json()
                .with_current_span(true)
                .with_span_list(true)
                .finish(),
        ),
    }
}
