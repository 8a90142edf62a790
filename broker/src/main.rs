//! `switchyard`: the broker (`serve`), the all-in-one federation (`up`), the embedded agent
//! (`agent`), and the client commands.
//!
//! The client commands each take the connection options (`--url`, `--token`, `--ca-cert`, also
//! from `SWITCHYARD_URL`, `SWITCHYARD_TOKEN`, `SWITCHYARD_CA_CERT`) and `--json`; the other
//! commands do not. The connection options are also read before the command, where earlier
//! versions took them (`switchyard --url URL jobs`); after the command they win.

use anyhow::Context;
use clap::builder::PossibleValuesParser;
use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use switchyard_broker::http::server;
use switchyard_broker::{cli, config::Config, up};
use switchyard_protocol::api::Role;

#[derive(Parser, Debug)]
#[command(
    name = "switchyard",
    version,
    about = "Multi-cloud GPU federation broker",
    after_help = "Client commands take --url, --token, --ca-cert and --json after the command \
                  name: `switchyard jobs --url URL --json`. Exit status: 0 on success, 1 on an \
                  error, 2 on a usage error; `logs --follow` exits with the job's own code."
)]
struct Args {
    #[command(flatten)]
    before: ConnectionBefore,
    /// Log as JSON lines (`up`, `serve`, `agent`).
    #[arg(long, global = true)]
    json_logs: bool,
    #[command(subcommand)]
    command: Command,
}

/// The connection options where earlier versions took them, before the command
/// (`switchyard --url URL jobs`); hidden from `--help`, which shows them on the client commands.
#[derive(clap::Args, Debug, Default)]
struct ConnectionBefore {
    /// Broker URL (client commands).
    #[arg(long = "url", id = "before_url", hide = true)]
    url: Option<String>,
    /// API token (client commands).
    #[arg(long = "token", id = "before_token", hide = true)]
    token: Option<String>,
    /// CA certificates to trust (client commands).
    #[arg(long = "ca-cert", id = "before_ca_cert", hide = true)]
    ca_cert: Option<PathBuf>,
}

impl ConnectionBefore {
    fn any(&self) -> bool {
        self.url.is_some() || self.token.is_some() || self.ca_cert.is_some()
    }
}

/// How a client command reaches the broker, and whether it prints for machines.
#[derive(clap::Args, Debug, Clone)]
struct ClientArgs {
    /// Broker URL.
    #[arg(
        long,
        env = "SWITCHYARD_URL",
        value_name = "URL",
        default_value = "http://127.0.0.1:8080",
        help_heading = "Connection"
    )]
    url: String,
    /// API token [default: the `admin.token` that `switchyard up` writes in `.switchyard/`].
    #[arg(
        long,
        env = "SWITCHYARD_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN",
        help_heading = "Connection"
    )]
    token: Option<String>,
    /// For an https broker with a private CA: trust only the CA certificates of this PEM file
    /// (the agent's `--ca-cert`).
    #[arg(
        long,
        env = "SWITCHYARD_CA_CERT",
        value_name = "FILE",
        help_heading = "Connection"
    )]
    ca_cert: Option<PathBuf>,
    /// Print JSON for programs instead of text for people (`logs`: one JSON object a line).
    #[arg(long)]
    json: bool,
}

const JOB_STATES: [&str; 8] = [
    "queued",
    "held",
    "provisioning",
    "placed",
    "running",
    "succeeded",
    "failed",
    "cancelled",
];
const PRIORITIES: [&str; 4] = ["critical", "high", "normal", "low"];

// Parsed once per process; boxing a variant to shrink it buys nothing here.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Run the whole federation on this machine: broker, SQLite, local agents, priced regions.
    Up {
        /// Port of the broker's API and console on 127.0.0.1.
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// Port of the services gateway on 127.0.0.1 [default: --port + 1].
        #[arg(long)]
        gateway_port: Option<u16>,
        /// Directory for the database, the admin token and the agents' state.
        #[arg(long, default_value = ".switchyard")]
        data_dir: PathBuf,
        /// On-prem agents to start (4 simulated H100 each).
        #[arg(long, default_value_t = 2)]
        agents: u32,
        /// Simulated boot time of local cloud instances (e.g. 3s).
        #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
        boot_delay: Duration,
        /// Terminate burst instances idle this long (e.g. 10s, 5m).
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        idle_ttl: Duration,
        /// The simulated providers' minimum billed time per instance (EC2: 60s).
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        billing_minimum: Duration,
        /// The database: `sqlite://…` (default: `<data-dir>/switchyard.db`) or `postgres://…`
        /// (builds with the `postgres` feature).
        #[arg(long, env = "SWITCHYARD_DATABASE_URL")]
        database_url: Option<String>,
        /// Inject a fault into an on-prem agent's simulated GPU, repeatable:
        /// AGENT/INDEX:KIND@DELAY, the agent numbered from 1 (onprem-1…), its GPU from 0; KIND
        /// one of xid=N (one XID error), ecc=N (N uncorrectable ECC errors), overheat or
        /// overheat=C (above the slowdown threshold, thermal throttling); DELAY from the
        /// agent's start, e.g. 0s, 30s, 2m. Example: 1/2:xid=79@30s.
        #[arg(long = "fake-gpu-fault", value_name = "AGENT/INDEX:KIND@DELAY",
              value_parser = parse_up_fault)]
        fake_gpu_faults: Vec<up::UpFault>,
    },
    /// Run the broker alone.
    Serve {
        /// TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Listen address, e.g. 127.0.0.1:8080.
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Directory for the SQLite database and the admin token (overrides the config's).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// `sqlite://…` (default: `<data-dir>/switchyard.db`) or `postgres://…` (builds with
        /// the `postgres` feature); also `SWITCHYARD_DATABASE_URL`.
        #[arg(long)]
        database_url: Option<String>,
        /// PEM certificate chain to serve HTTPS with (with --tls-key); also `tls_cert` in the
        /// config and `SWITCHYARD_TLS_CERT`. Plain HTTP without.
        #[arg(long, value_name = "FILE", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// PEM private key of --tls-cert; also `tls_key`, `SWITCHYARD_TLS_KEY`.
        #[arg(long, value_name = "FILE", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
    },
    /// Run a services gateway on its own (one per region): routes and reports through the
    /// broker's API, requests straight to the replicas.
    Gateway {
        /// The broker's URL.
        #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:8080")]
        broker: String,
        /// The region this gateway serves (`provider:code`): it prefers replicas there, then
        /// the nearest regions by catalogue latency.
        #[arg(long, value_name = "REGION")]
        region: Option<String>,
        /// Where callers reach it.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8081")]
        listen: std::net::SocketAddr,
        /// A file holding an `admin` or `infra` API token [default: `SWITCHYARD_TOKEN`].
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// The token, from the environment only.
        #[arg(long = "gateway-token", env = "SWITCHYARD_TOKEN", hide = true)]
        token: Option<String>,
        /// For an https broker with a private CA: trust the CA certificates of this PEM file.
        #[arg(long, value_name = "FILE")]
        ca_cert: Option<PathBuf>,
    },
    /// Run an edge agent (the same as the `switchyard-agent` binary).
    Agent(switchyard_agent::AgentArgs),
    /// Submit a job from a .toml or .json spec; prints its id.
    Submit {
        /// The job spec, a `.toml` or `.json` file (name, team, command, resources…).
        file: PathBuf,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List jobs, newest first: state, priority, age, cost, where it runs.
    Jobs {
        /// Only jobs in this state.
        #[arg(long, value_parser = PossibleValuesParser::new(JOB_STATES))]
        state: Option<String>,
        /// Only this team's jobs (developers always see only their own).
        #[arg(long)]
        team: Option<String>,
        /// Only jobs of this priority.
        #[arg(long, value_parser = PossibleValuesParser::new(PRIORITIES))]
        priority: Option<String>,
        /// Only jobs with exactly this name.
        #[arg(long)]
        name: Option<String>,
        /// How many, 1 to 500.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
        limit: u32,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show one job: id and state first, then where it runs, times, cost and command.
    Job {
        /// The job's id (from `submit` or `jobs`).
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Why a job went where it went, or why it waits: the decision and every candidate pool.
    Explain {
        /// The job's id.
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print a job's output (stdout to stdout; stderr and the broker's notes to stderr).
    Logs {
        /// The job's id.
        id: String,
        /// Keep printing until the job finishes, saying on stderr while it waits and why; then
        /// exit with the job's exit code (1 for a failed job without one, 130 for a cancelled
        /// job).
        #[arg(long, short)]
        follow: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Cancel a job: prints "cancel requested" until the job has stopped.
    Cancel {
        /// The job's id.
        id: String,
        /// Wait until the job has stopped, and print the state it ended in.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List pools: GPUs, nodes, free GPUs, prices per GPU-hour, latency.
    Pools {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Change a pool (infra, admin).
    Pool {
        #[command(subcommand)]
        command: PoolCommand,
    },
    /// List GPU nodes: pool, host, GPUs, state, how jobs run, last heartbeat, unhealthy GPUs
    /// and why; `nodes drain ID` / `nodes undrain ID` (infra, admin).
    Nodes {
        #[command(subcommand)]
        command: Option<NodesCommand>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show one GPU node: its GPUs (memory, utilisation, temperature, power) and the jobs on
    /// them.
    Node {
        /// The node's id (from `nodes`).
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Create a one-time token for an agent to join a pool (admin, infra); prints it.
    EnrolmentToken {
        /// The pool the agent joins (from `pools`).
        #[arg(long)]
        pool: String,
        /// Seconds until the token expires, 1 to 604800 (7 days) [default: 900].
        #[arg(long, value_parser = clap::value_parser!(i64).range(1..=604_800))]
        ttl_s: Option<i64>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The tokens of enrolled agents, one per node (admin, infra).
    AgentToken {
        #[command(subcommand)]
        command: AgentTokenCommand,
    },
    /// List regions: provider, latency, egress price, pools and nodes.
    Regions {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List the cloud instances the broker launched, with state, price and cost to date.
    Instances {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Budgets: amount, spent, committed and left in the current period.
    Budgets {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// The audit log, newest first (admin, finance, infra).
    Audit {
        /// Only entries about this target, e.g. `policy:ml` or `token:<id>`.
        #[arg(long)]
        target: Option<String>,
        /// Only entries by this actor, e.g. `finance:alice` or `system`.
        #[arg(long)]
        actor: Option<String>,
        /// Only entries of this action, e.g. `policy.put` or `budget.alert`.
        #[arg(long)]
        action: Option<String>,
        /// Only entries at or after this time (RFC 3339, e.g. 2025-01-01T00:00:00Z).
        #[arg(long)]
        from: Option<String>,
        /// Only entries before this time (RFC 3339).
        #[arg(long)]
        to: Option<String>,
        /// How many, 1 to 500.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=500))]
        limit: u32,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Manage API tokens (admin).
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Read, set or try out a team's cost policy.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Spend from the ledger, grouped (finance, admin, infra: every team; developers: their own).
    Spend {
        /// What one row adds up (`usage`: jobs apart from the boot and idle time of burst
        /// instances, which are the team's overhead).
        #[arg(long, default_value = "team",
              value_parser = PossibleValuesParser::new(
                  ["team", "project", "region", "provider", "pool", "usage"]))]
        group_by: String,
        /// From this time (RFC 3339, e.g. 2025-01-01T00:00:00Z).
        #[arg(long)]
        from: Option<String>,
        /// Up to this time (RFC 3339).
        #[arg(long)]
        to: Option<String>,
        /// One row per bucket (UTC) and key.
        #[arg(long, value_parser = PossibleValuesParser::new(["hour", "day"]))]
        bucket: Option<String>,
        /// Only this team.
        #[arg(long)]
        team: Option<String>,
        /// Print the broker's CSV instead of a table.
        #[arg(long, conflicts_with = "json")]
        csv: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Inference services: deploy from a file, list, read, events, delete.
    Service {
        #[command(subcommand)]
        command: ServiceCommand,
    },
    /// Replay a job trace under Switchyard and the peers' strategies; writes report.json and
    /// SVG plots.
    Simulate(switchyard_broker::simulate::SimulateArgs),
}

#[derive(Subcommand, Debug)]
enum ServiceCommand {
    /// Deploy a service from a `.toml` or `.json` spec (the fields of `POST /services`): create
    /// it, or, when its team has a service of that name, deploy the file as a new version (a
    /// rolling update; the same spec again changes nothing).
    Deploy {
        /// The service spec (name, team, command, resources, replicas, scaling…).
        file: PathBuf,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List services: state, ready of desired replicas, version, cost, endpoint.
    List {
        /// Only this team's services (developers always see only their own).
        #[arg(long)]
        team: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show one service: state, endpoint, desired replicas and why, each replica, traffic,
    /// cost.
    Get {
        /// The service's name (or id).
        name: String,
        /// The service's team, where several teams have one of that name.
        #[arg(long)]
        team: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// A service's events, oldest first: every scaling and placement decision, with its reason.
    Events {
        /// The service's name (or id).
        name: String,
        /// The service's team, where several teams have one of that name.
        #[arg(long)]
        team: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Delete a service: its replicas drain (finishing their requests), then stop.
    Delete {
        /// The service's name (or id).
        name: String,
        /// The service's team, where several teams have one of that name.
        #[arg(long)]
        team: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Subcommand, Debug)]
enum TokenCommand {
    /// Create a token (admin); prints it once.
    Create {
        /// What the token may do.
        #[arg(long, value_enum)]
        role: RoleArg,
        /// The team a developer token acts for.
        #[arg(long)]
        team: Option<String>,
        /// A name to know the token by in `token list` and the audit log.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List API tokens: id, role, team, name, revoked (admin; never the secrets).
    List {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Revoke an API token by id (admin); it stops working at its next request.
    Revoke {
        /// The token's id (from `token list`).
        id: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Subcommand, Debug)]
enum PoolCommand {
    /// Change a pool's node limit, on-demand price or whether nodes may be launched in it;
    /// what is not given stays as it is.
    Set {
        /// The pool's id (from `pools`), e.g. `aws:us-east-1/p5.48xlarge`.
        id: String,
        /// The most nodes the pool may have.
        #[arg(long)]
        node_limit: Option<u32>,
        /// On-demand USD per GPU-hour (on-prem: the internal rate).
        #[arg(long, value_name = "USD")]
        price_per_gpu_hour: Option<f64>,
        /// Whether the broker may launch cloud nodes in the pool.
        #[arg(long, value_name = "BOOL")]
        launchable: Option<bool>,
        /// An owned pool's marginal cost in USD per GPU-hour (power and wear: what the company
        /// pays in cash for an hour of use); finance may set it.
        #[arg(long, value_name = "USD")]
        marginal_per_gpu_hour: Option<f64>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Subcommand, Debug)]
enum NodesCommand {
    /// Stop new work on a node; the jobs running there finish.
    Drain {
        /// The node's id (from `nodes`).
        node: String,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Let a drained node take work again, and clear its GPUs' health marks (you vouch for
    /// them).
    Undrain {
        /// The node's id (from `nodes`).
        node: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Subcommand, Debug)]
enum AgentTokenCommand {
    /// List the enrolled agents: node, pool, host, health, when they enrolled and last spoke.
    List {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Revoke a node's agent token: the node leaves, and its running work goes back to the
    /// queue.
    Revoke {
        /// The node's id (from `agent-token list` or `nodes`).
        node: String,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Subcommand, Debug)]
enum PolicyCommand {
    /// Print the team's (or project's) current policy: version, who saved it, and its rules as
    /// TOML (what `policy set` takes).
    Get {
        /// The team.
        team: String,
        /// The project's own policy instead of the team's.
        #[arg(long)]
        project: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Save a new version of the policy from a `.json` or `.toml` file (finance, admin).
    Set {
        /// The team.
        team: String,
        /// The policy: a `.toml` or `.json` file with the fields of `PUT /policies/{team}`.
        file: PathBuf,
        /// Set the project's own policy instead of the team's.
        #[arg(long)]
        project: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List the stored policies: team, project, version, when and by whom.
    List {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Replay the team's last 30 days of jobs under its current policy and under a draft
    /// (finance, admin): cost, deadlines met, queueing delay, held jobs, and the jobs the draft
    /// treats differently. Saves nothing.
    WhatIf {
        /// The draft policy: a `.toml` or `.json` file, as `policy set` takes.
        file: PathBuf,
        /// The team whose jobs to replay.
        #[arg(long)]
        team: String,
        /// Only this project's jobs, under a draft of the project's own policy.
        #[arg(long)]
        project: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum RoleArg {
    /// Everything.
    Admin,
    /// Policies, budgets, spend, instances and the audit log of every team.
    Finance,
    /// Pools, agents and their enrolment, instances and the audit log.
    Infra,
    /// One team's jobs (needs --team).
    Developer,
}

impl From<RoleArg> for Role {
    fn from(r: RoleArg) -> Role {
        match r {
            RoleArg::Admin => Role::Admin,
            RoleArg::Finance => Role::Finance,
            RoleArg::Infra => Role::Infra,
            RoleArg::Developer => Role::Developer,
        }
    }
}

fn main() -> ExitCode {
    let matches = Args::command().get_matches();
    let args = match Args::from_arg_matches(&matches) {
        Ok(args) => args,
        Err(e) => e.exit(),
    };
    // Logs (and traces, when an OTLP endpoint is set) for the long-running commands; set up
    // outside the runtime so that the exporter's flush at exit runs outside it too.
    let telemetry = match &args.command {
        Command::Up { .. } => Some(("switchyard", "warn,switchyard_broker=info")),
        Command::Serve { .. } => Some(("switchyard", "info")),
        Command::Agent(_) => Some(("switchyard-agent", "info")),
        Command::Gateway { .. } => Some(("switchyard-gateway", "info")),
        _ => None,
    }
    .map(|(service, filter)| switchyard_support::telemetry::init(service, args.json_logs, filter));
    let result = tokio::runtime::Runtime::new()
        .context("starting the async runtime")
        .and_then(|runtime| runtime.block_on(run(args, leaf(&matches))));
    drop(telemetry);
    match result {
        Ok(code) => code,
        // The reader of our output went away (`switchyard jobs | head -1`): not a failure.
        Err(e) if cli::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            use std::io::Write as _;
            // As `main` returning the error would (less a backtrace), without a panic when
            // stderr is closed too.
            let _ = writeln!(std::io::stderr(), "{}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// `up --fake-gpu-fault AGENT/INDEX:KIND@DELAY`: the agent's number, and the rest checked with
/// the agent's own parser (so that `up` refuses what its agents would).
fn parse_up_fault(s: &str) -> Result<up::UpFault, String> {
    let (agent, spec) = s.trim().split_once('/').ok_or_else(|| {
        format!("invalid fault `{s}`: expected AGENT/INDEX:KIND@DELAY such as 1/2:xid=79@30s")
    })?;
    let agent: u32 = agent
        .trim()
        .parse()
        .map_err(|_| format!("invalid fault `{s}`: the agent (`{agent}`) is a number, from 1"))?;
    let fault: switchyard_agent::fakegpu::GpuFault = spec.parse()?;
    Ok(up::UpFault {
        agent,
        gpu: fault.gpu,
        spec: spec.trim().to_string(),
    })
}

/// `Error: …` and what caused it, as anyhow writes an error that `main` returns.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = format!("Error: {e}");
    let causes: Vec<String> = e.chain().skip(1).map(ToString::to_string).collect();
    if !causes.is_empty() {
        text.push_str("\n\nCaused by:");
        for (i, cause) in causes.iter().enumerate() {
            if causes.len() == 1 {
                text.push_str(&format!("\n    {cause}"));
            } else {
                text.push_str(&format!("\n    {i}: {cause}"));
            }
        }
    }
    text
}

/// The matches of the innermost subcommand (`token list` → `list`'s).
fn leaf(matches: &ArgMatches) -> &ArgMatches {
    let mut m = matches;
    while let Some((_, sub)) = m.subcommand() {
        m = sub;
    }
    m
}

/// A client from the command's connection options: given after the command, they win; then
/// those given before it (`switchyard --url URL jobs`); then the environment and defaults.
fn connect(
    c: &ClientArgs,
    before: &ConnectionBefore,
    leaf: &ArgMatches,
) -> anyhow::Result<cli::Client> {
    let given = |id: &str| leaf.value_source(id) == Some(ValueSource::CommandLine);
    let url = match &before.url {
        Some(u) if !given("url") => u.clone(),
        _ => c.url.clone(),
    };
    let token = match &before.token {
        Some(t) if !given("token") => Some(t.clone()),
        _ => c.token.clone(),
    };
    let ca_cert = match &before.ca_cert {
        Some(p) if !given("ca_cert") => Some(p.clone()),
        _ => c.ca_cert.clone(),
    };
    let token = cli::resolve_token(token, &PathBuf::from(".switchyard"))?;
    Ok(cli::Client::with_ca(&url, token, ca_cert.as_deref())?.with_json(c.json))
}

async fn run(args: Args, leaf: &ArgMatches) -> anyhow::Result<ExitCode> {
    let before = args.before;
    if before.any()
        && matches!(
            args.command,
            Command::Up { .. }
                | Command::Serve { .. }
                | Command::Gateway { .. }
                | Command::Agent(_)
                | Command::Simulate(_)
        )
    {
        anyhow::bail!(
            "--url, --token and --ca-cert are options of the client commands (jobs, submit, \
             logs…), not of this one"
        );
    }
    let connect = |c: &ClientArgs| connect(c, &before, leaf);
    let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    match args.command {
        Command::Up {
            port,
            gateway_port,
            data_dir,
            agents,
            boot_delay,
            idle_ttl,
            billing_minimum,
            database_url,
            fake_gpu_faults,
        } => done(
            up::run(up::UpOptions {
                port,
                gateway_port,
                data_dir,
                agents,
                boot_delay,
                idle_ttl,
                billing_minimum,
                database_url,
                fake_gpu_faults,
            })
            .await,
        ),
        Command::Serve {
            config,
            listen,
            data_dir,
            database_url,
            tls_cert,
            tls_key,
        } => done(serve(config, listen, data_dir, database_url, tls_cert, tls_key).await),
        Command::Gateway {
            broker,
            region,
            listen,
            token_file,
            token,
            ca_cert,
        } => done(gateway(broker, region, listen, token_file, token, ca_cert).await),
        Command::Agent(agent_args) => done(switchyard_agent::run(agent_args).await),
        Command::Submit { file, client } => done(cli::submit(&connect(&client)?, &file).await),
        Command::Jobs {
            state,
            team,
            priority,
            name,
            limit,
            client,
        } => {
            let filters = cli::JobFilters {
                state,
                team,
                priority,
                name,
                limit,
            };
            done(cli::jobs(&connect(&client)?, filters).await)
        }
        Command::Job { id, client } => done(cli::job(&connect(&client)?, &id).await),
        Command::Explain { id, client } => done(cli::explain(&connect(&client)?, &id).await),
        Command::Logs { id, follow, client } => cli::logs(&connect(&client)?, &id, follow)
            .await
            .map(ExitCode::from),
        Command::Cancel { id, wait, client } => {
            done(cli::cancel(&connect(&client)?, &id, wait).await)
        }
        Command::Pools { client } => done(cli::pools(&connect(&client)?).await),
        Command::Pool {
            command:
                PoolCommand::Set {
                    id,
                    node_limit,
                    price_per_gpu_hour,
                    launchable,
                    marginal_per_gpu_hour,
                    client,
                },
        } => {
            let edit = cli::PoolEdit {
                node_limit,
                price_per_gpu_hour,
                launchable,
                marginal_per_gpu_hour,
            };
            done(cli::pool_set(&connect(&client)?, &id, edit).await)
        }
        Command::Nodes { command, client } => match command {
            None => done(cli::nodes(&connect(&client)?).await),
            Some(NodesCommand::Drain { node, client }) => {
                done(cli::node_drain(&connect(&client)?, &node, true).await)
            }
            Some(NodesCommand::Undrain { node, client }) => {
                done(cli::node_drain(&connect(&client)?, &node, false).await)
            }
        },
        Command::Node { id, client } => done(cli::node(&connect(&client)?, &id).await),
        Command::EnrolmentToken {
            pool,
            ttl_s,
            client,
        } => done(cli::enrolment_token(&connect(&client)?, &pool, ttl_s).await),
        Command::AgentToken { command } => match command {
            AgentTokenCommand::List { client } => {
                done(cli::agent_token_list(&connect(&client)?).await)
            }
            AgentTokenCommand::Revoke { node, client } => {
                done(cli::agent_token_revoke(&connect(&client)?, &node).await)
            }
        },
        Command::Regions { client } => done(cli::regions(&connect(&client)?).await),
        Command::Instances { client } => done(cli::instances(&connect(&client)?).await),
        Command::Budgets { client } => done(cli::budgets(&connect(&client)?).await),
        Command::Audit {
            target,
            actor,
            action,
            from,
            to,
            limit,
            client,
        } => {
            let filters = cli::AuditFilters {
                target,
                actor,
                action,
                from,
                to,
                limit,
            };
            done(cli::audit(&connect(&client)?, filters).await)
        }
        Command::Token { command } => match command {
            TokenCommand::Create {
                role,
                team,
                name,
                client,
            } => done(cli::token_create(&connect(&client)?, role.into(), team, name).await),
            TokenCommand::List { client } => done(cli::token_list(&connect(&client)?).await),
            TokenCommand::Revoke { id, client } => {
                done(cli::token_revoke(&connect(&client)?, &id).await)
            }
        },
        Command::Policy { command } => match command {
            PolicyCommand::Get {
                team,
                project,
                client,
            } => done(cli::policy_get(&connect(&client)?, &team, project.as_deref()).await),
            PolicyCommand::Set {
                team,
                file,
                project,
                client,
            } => done(cli::policy_set(&connect(&client)?, &team, &file, project.as_deref()).await),
            PolicyCommand::List { client } => done(cli::policy_list(&connect(&client)?).await),
            PolicyCommand::WhatIf {
                file,
                team,
                project,
                client,
            } => done(
                cli::policy_what_if(&connect(&client)?, &team, &file, project.as_deref()).await,
            ),
        },
        Command::Spend {
            group_by,
            from,
            to,
            bucket,
            team,
            csv,
            client,
        } => {
            let query = cli::SpendArgs {
                group_by,
                from,
                to,
                bucket,
                team,
            };
            done(cli::spend(&connect(&client)?, &query, csv).await)
        }
        Command::Service { command } => match command {
            ServiceCommand::Deploy { file, client } => {
                done(cli::service_deploy(&connect(&client)?, &file).await)
            }
            ServiceCommand::List { team, client } => {
                done(cli::service_list(&connect(&client)?, team).await)
            }
            ServiceCommand::Get { name, team, client } => {
                done(cli::service_get(&connect(&client)?, &name, team.as_deref()).await)
            }
            ServiceCommand::Events { name, team, client } => {
                done(cli::service_events(&connect(&client)?, &name, team.as_deref()).await)
            }
            ServiceCommand::Delete { name, team, client } => {
                done(cli::service_delete(&connect(&client)?, &name, team.as_deref()).await)
            }
        },
        Command::Simulate(sim) => {
            switchyard_broker::simulate::run(&sim)?;
            eprintln!(
                "report written to {}",
                sim.out.join("report.json").display()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `switchyard gateway`: a services gateway on its own, until Ctrl-C or SIGTERM.
async fn gateway(
    broker: String,
    region: Option<String>,
    listen: std::net::SocketAddr,
    token_file: Option<PathBuf>,
    token: Option<String>,
    ca_cert: Option<PathBuf>,
) -> anyhow::Result<()> {
    let token = match token_file {
        Some(path) => std::fs::read_to_string(&path)
            .with_context(|| format!("reading the token file {}", path.display()))?
            .trim()
            .to_string(),
        None => token.context("no token: pass --token-file or set SWITCHYARD_TOKEN")?,
    };
    if token.is_empty() {
        anyhow::bail!("the gateway's token is empty");
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding the services gateway on {listen}"))?;
    let bound = listener.local_addr()?;
    eprintln!("services gateway on http://{bound}/svc/TEAM/NAME/ (broker {broker})");
    switchyard_broker::gateway::standalone(
        switchyard_broker::gateway::StandaloneOptions {
            broker,
            token,
            region,
            ca_cert,
        },
        listener,
        server::shutdown_signal(),
    )
    .await
}

/// Adds a cloud provider with its offers (a failure stops the start, naming the provider),
/// and checks its credentials with one `list` call: a failure there is reported (and shown in
/// `GET /regions`) but does not stop the broker, whose other capacity still works.
async fn add_cloud(
    providers: &mut switchyard_broker::app::ProviderSet,
    provider: Arc<dyn switchyard_providers::Provider>,
) -> anyhow::Result<()> {
    let name = provider.name().to_string();
    let offers = provider
        .offers()
        .await
        .with_context(|| format!("[{name}]: reading the offers (catalogue, live prices)"))?;
    eprintln!(
        "{name}: {} pools in {} regions",
        offers.pools.len(),
        offers.regions.len()
    );
    let check = match tokio::time::timeout(CREDENTIALS_CHECK, provider.list()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "no answer within {} s",
            CREDENTIALS_CHECK.as_secs()
        )),
    };
    // A failed check does not stop the start (the other clouds and on-prem still serve), but
    // nothing launches with these credentials: the provider's pools are unlaunchable, with the
    // failure as the reason in `GET /pools` (`ProviderSet::can_launch`).
    if let Err(e) = &check {
        eprintln!(
            "{name}: the credentials check (listing instances) failed: {e}; its {} pools are              unlaunchable until the broker restarts with working credentials",
            offers.pools.len()
        );
    }
    providers.set_credentials(&name, check);
    providers.add_with_offers(provider, offers);
    Ok(())
}

/// How long the start waits for a provider's credentials check.
const CREDENTIALS_CHECK: std::time::Duration = std::time::Duration::from_secs(15);

/// `switchyard serve`: the broker alone, from a config file, the environment and flags.
async fn serve(
    config: Option<PathBuf>,
    listen: Option<std::net::SocketAddr>,
    data_dir: Option<PathBuf>,
    database_url: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
) -> anyhow::Result<()> {
    let mut cfg = match config {
        Some(path) => Config::from_file(&path)?,
        None => Config::default(),
    };
    cfg.apply_env(std::env::vars())?;
    if let Some(l) = listen {
        cfg.listen = l;
    }
    if let Some(d) = data_dir {
        cfg.data_dir = d;
    }
    if let Some(u) = database_url {
        cfg.database_url = Some(u);
    }
    if let (Some(cert), Some(key)) = (tls_cert, tls_key) {
        cfg.tls_cert = Some(cert);
        cfg.tls_key = Some(key);
    }
    cfg.validate()?;
    server::check_tls(&cfg)?;
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("binding {}", cfg.listen))?;
    let mut providers = switchyard_broker::app::ProviderSet::default();
    // The instances' agents trust the broker's private CA, when it has one (the bootstrap
    // writes it next to the agent's settings).
    let ca_pem = match &cfg.agent_ca_cert {
        Some(ca) => Some(
            std::fs::read_to_string(ca)
                .with_context(|| format!("reading agent_ca_cert {}", ca.display()))?,
        ),
        None => None,
    };
    #[cfg(feature = "aws")]
    if let Some(mut aws) = cfg.aws.clone() {
        aws.agent.ca_cert_pem.clone_from(&ca_pem);
        let provider = switchyard_providers::aws::AwsProvider::new(aws)
            .await
            .context("[aws]: setting up the AWS provider")?;
        add_cloud(&mut providers, Arc::new(provider)).await?;
    }
    if let Some(mut gcp) = cfg.gcp.clone() {
        gcp.agent.ca_cert_pem.clone_from(&ca_pem);
        let provider = switchyard_providers::gcp::GcpProvider::new(gcp)
            .await
            .context("[gcp]: setting up the GCP provider")?;
        add_cloud(&mut providers, Arc::new(provider)).await?;
    }
    if let Some(mut azure) = cfg.azure.clone() {
        azure.agent.ca_cert_pem.clone_from(&ca_pem);
        let provider = switchyard_providers::azure::AzureProvider::new(azure)
            .await
            .context("[azure]: setting up the Azure provider")?;
        add_cloud(&mut providers, Arc::new(provider)).await?;
    }
    if let Some(mut lambda) = cfg.lambda.clone() {
        lambda.agent.ca_cert_pem.clone_from(&ca_pem);
        let provider = switchyard_providers::lambda::LambdaProvider::new(lambda)
            .context("[lambda]: setting up the Lambda provider")?;
        add_cloud(&mut providers, Arc::new(provider)).await?;
    }
    let running = switchyard_broker::app::App::start(cfg.clone(), providers).await?;
    if running.created_admin_token.is_some() {
        eprintln!(
            "admin token written to {}",
            cfg.data_dir.join("admin.token").display()
        );
    }
    eprintln!("switchyard listening on {}", cfg.public_url());
    let (stop_gateway, stopped) = tokio::sync::oneshot::channel::<()>();
    let gateway = match cfg.gateway_listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the services gateway on {addr}"))?;
            eprintln!("services gateway on http://{addr}/svc/TEAM/NAME/");
            Some(tokio::spawn(switchyard_broker::gateway::serve(
                running.app.clone(),
                listener,
                async move {
                    let _ = stopped.await;
                },
            )))
        }
        None => None,
    };
    let served = server::serve(running.app.clone(), listener, server::shutdown_signal()).await;
    running.stop().await;
    let _ = stop_gateway.send(());
    if let Some(gateway) = gateway {
        match tokio::time::timeout(std::time::Duration::from_secs(10), gateway).await {
            Ok(Ok(Err(e))) => eprintln!("the services gateway failed: {e:#}"),
            Ok(_) => {}
            Err(_) => eprintln!("the services gateway did not stop within 10 s"),
        }
    }
    served
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Every subcommand, with its path (`token list`).
    fn commands() -> Vec<(String, clap::Command)> {
        fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
            for sub in cmd.get_subcommands() {
                let p = format!("{path} {}", sub.get_name()).trim().to_string();
                out.push((p.clone(), sub.clone()));
                walk(sub, &p, out);
            }
        }
        let mut root = Args::command();
        root.build();
        let mut out = vec![(String::new(), root.clone())];
        walk(&root, "", &mut out);
        out
    }

    #[test]
    fn every_command_and_argument_has_a_description() {
        let mut missing = Vec::new();
        for (path, cmd) in commands() {
            if cmd.get_about().is_none() {
                missing.push(format!("`{path}`"));
            }
            for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("`{path}` {}", arg.get_id()));
                }
            }
        }
        assert!(missing.is_empty(), "undescribed: {missing:?}");
    }

    #[test]
    fn connection_options_are_shown_on_client_commands_only() {
        let servers = ["up", "serve", "simulate", "agent", "gateway"];
        for (path, cmd) in commands() {
            let shown: Vec<String> = cmd
                .get_arguments()
                .filter(|a| !a.is_hide_set())
                .filter_map(|a| a.get_long().map(str::to_string))
                .collect();
            let has_url = shown.iter().any(|l| l == "url");
            // A command whose subcommand is optional (`nodes`, `nodes drain ID`) also acts by
            // itself, as a client.
            let acts = cmd.get_subcommands().next().is_none() || !cmd.is_subcommand_required_set();
            if path.split(' ').any(|w| w == "help") {
                continue;
            }
            if servers.contains(&path.as_str()) || !acts {
                assert!(!has_url, "`{path}` shows --url: {shown:?}");
                assert!(!shown.iter().any(|l| l == "token"), "`{path}`: {shown:?}");
            } else {
                for flag in ["url", "token", "ca-cert", "json"] {
                    assert!(shown.iter().any(|l| l == flag), "`{path}` lacks --{flag}");
                }
            }
        }
    }

    #[test]
    fn the_connection_after_the_command_wins_over_the_one_before() {
        let parse = |argv: &[&str]| {
            let matches = Args::command().try_get_matches_from(argv).unwrap();
            let args = Args::from_arg_matches(&matches).unwrap();
            let Command::Jobs { client, .. } = &args.command else {
                panic!("not jobs");
            };
            let c = connect(client, &args.before, leaf(&matches)).unwrap();
            c.base_url().to_string()
        };
        let t = ["--token", "t"];
        assert_eq!(
            parse(&[&["switchyard", "--url", "http://before:1", "jobs"][..], &t].concat()),
            "http://before:1"
        );
        assert_eq!(
            parse(&[&["switchyard", "jobs", "--url", "http://after:1"][..], &t].concat()),
            "http://after:1"
        );
        assert_eq!(
            parse(
                &[
                    &[
                        "switchyard",
                        "--url",
                        "http://before:1",
                        "jobs",
                        "--url",
                        "http://after:1"
                    ][..],
                    &t
                ]
                .concat()
            ),
            "http://after:1"
        );
    }

    #[test]
    fn enumerations_are_checked_and_listed() {
        let refused =
            Args::command().try_get_matches_from(["switchyard", "jobs", "--priority", "urgent"]);
        let text = refused.unwrap_err().to_string();
        assert!(text.contains("critical") && text.contains("low"), "{text}");
        assert!(
            Args::command()
                .try_get_matches_from([
                    "switchyard",
                    "spend",
                    "--group-by",
                    "pool",
                    "--bucket",
                    "day"
                ])
                .is_ok()
        );
    }
}
