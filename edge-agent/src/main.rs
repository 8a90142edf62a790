//! The `switchyard-agent` binary: logging, flags, and the agent until a signal or a fatal error.
//! No rustls provider is installed here: see the crate docs (reqwest brings its own).

use clap::Parser;
use std::process::ExitCode;
use switchyard_agent::AgentArgs;

#[derive(Parser, Debug)]
#[command(name = "switchyard-agent", version, about)]
struct Cli {
    /// Log as JSON lines (as `switchyard --json-logs` does).
    #[arg(long)]
    json_logs: bool,
    #[command(flatten)]
    agent: AgentArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Outside the runtime, so that the trace exporter's flush at exit runs outside it too.
    let telemetry = switchyard_agent::telemetry::init("switchyard-agent", cli.json_logs, "info");
    let result = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt.block_on(switchyard_agent::run(cli.agent)),
        Err(e) => Err(anyhow::anyhow!("starting the async runtime: {e}")),
    };
    drop(telemetry);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("switchyard-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}
