//! The `switchyard-agent` binary: logging, flags, and the agent until a signal or a fatal error.
//! No rustls provider is installed here: see the crate docs (reqwest brings its own).

use clap::Parser;
use std::process::ExitCode;
use switchyard_agent::AgentArgs;
use tracing_subscriber::EnvFilter;

#[derive(Parser, Debug)]
#[command(name = "switchyard-agent", version, about)]
struct Cli {
    #[command(flatten)]
    agent: AgentArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match switchyard_agent::run(cli.agent).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchyard-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}
