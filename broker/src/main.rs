//! `switchyard`: the broker (`serve`), the all-in-one federation (`up`), the embedded agent
//! (`agent`), and the client commands.

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;
use switchyard_broker::{cli, config::Config, server, up};
use switchyard_protocol::api::Role;

#[derive(Parser, Debug)]
#[command(
    name = "switchyard",
    version,
    about = "Multi-cloud GPU federation broker"
)]
struct Args {
    /// Broker URL for client commands.
    #[arg(
        long,
        global = true,
        env = "SWITCHYARD_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    url: String,
    /// API token for client commands (default: `<data-dir>/admin.token`).
    #[arg(long, global = true, env = "SWITCHYARD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// For client commands against an https broker with a private CA: trust only the CA
    /// certificates of this PEM file (the agent's `--ca-cert`).
    #[arg(long, global = true, env = "SWITCHYARD_CA_CERT")]
    ca_cert: Option<PathBuf>,
    /// Log as JSON lines.
    #[arg(long, global = true)]
    json_logs: bool,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process; boxing a variant to shrink it buys nothing here.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Run the whole federation on this machine: broker, SQLite, local agents, priced regions.
    Up {
        #[arg(long, default_value_t = 8080)]
        port: u16,
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
    },
    /// Run the broker alone.
    Serve {
        /// TOML configuration file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Listen address, e.g. 127.0.0.1:8080.
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
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
    /// Run an edge agent (the same as the `switchyard-agent` binary).
    Agent(switchyard_agent::AgentArgs),
    /// Submit a job from a .toml or .json spec; prints its id.
    Submit { file: PathBuf },
    /// List jobs, newest first.
    Jobs {
        /// Only jobs in this state: queued, held, provisioning, placed, running, succeeded,
        /// failed or cancelled.
        #[arg(long)]
        state: Option<String>,
        /// Only this team's jobs (developers always see only their own).
        #[arg(long)]
        team: Option<String>,
        /// Only jobs of this priority: critical, high, normal or low.
        #[arg(long)]
        priority: Option<String>,
        /// Only jobs with exactly this name.
        #[arg(long)]
        name: Option<String>,
        /// How many, 1 to 500.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List the cloud instances the broker launched, with state, price and cost to date.
    Instances {
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Budgets: amount, spent, committed and left in the current period.
    Budgets {
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The audit log, newest first (admin, finance, infra).
    Audit {
        /// Only entries about this target, e.g. `policy:ml` or `token:<id>`.
        #[arg(long)]
        target: Option<String>,
        /// How many, 1 to 500.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one job as JSON.
    Job { id: String },
    /// Print a job's output.
    Logs {
        id: String,
        /// Keep printing until the job finishes.
        #[arg(long, short)]
        follow: bool,
    },
    /// Cancel a job.
    Cancel { id: String },
    /// List pools with price, latency and free GPUs.
    Pools {
        #[arg(long)]
        json: bool,
    },
    /// Manage API tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Read or set a team's cost policy.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Spend from the ledger, grouped (finance, admin, infra: every team; developers: their own).
    Spend {
        /// team, project, region, provider or pool.
        #[arg(long, default_value = "team")]
        group_by: String,
        /// From this time (RFC 3339).
        #[arg(long)]
        from: Option<String>,
        /// Up to this time (RFC 3339).
        #[arg(long)]
        to: Option<String>,
        /// hour or day: one row per bucket and key.
        #[arg(long)]
        bucket: Option<String>,
        /// Only this team.
        #[arg(long)]
        team: Option<String>,
        /// Print CSV instead of a table.
        #[arg(long)]
        csv: bool,
    },
    /// Replay a job trace under Switchyard and the peers' strategies; writes report.json and
    /// SVG plots.
    Simulate(switchyard_broker::simulate::SimulateArgs),
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
    },
    /// List API tokens: id, role, team, name, revoked (admin; never the secrets).
    List {
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revoke an API token by id (admin); it stops working at its next request.
    Revoke {
        /// The token's id (from `token list`).
        id: String,
        /// Print the API's JSON instead of a line.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum PolicyCommand {
    /// Print the team's (or project's) current policy as JSON.
    Get {
        team: String,
        #[arg(long)]
        project: Option<String>,
    },
    /// Save a new version of the policy from a `.json` or `.toml` file (finance, admin).
    Set {
        team: String,
        file: PathBuf,
        #[arg(long)]
        project: Option<String>,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum RoleArg {
    Admin,
    Finance,
    Infra,
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

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Logs (and traces, when an OTLP endpoint is set) for the long-running commands; set up
    // outside the runtime so that the exporter's flush at exit runs outside it too.
    let telemetry = match &args.command {
        Command::Up { .. } => Some(("switchyard", "warn,switchyard_broker=info")),
        Command::Serve { .. } => Some(("switchyard", "info")),
        Command::Agent(_) => Some(("switchyard-agent", "info")),
        _ => None,
    }
    .map(|(service, filter)| switchyard_agent::telemetry::init(service, args.json_logs, filter));
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let result = runtime.block_on(run(args));
    drop(runtime);
    drop(telemetry);
    match result {
        // The reader of our output went away (`switchyard jobs | head -1`): not a failure.
        Err(e) if cli::is_broken_pipe(&e) => Ok(()),
        other => other,
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let client = |data_dir: PathBuf| -> anyhow::Result<cli::Client> {
        let token = cli::resolve_token(args.token.clone(), &data_dir)?;
        cli::Client::with_ca(&args.url, token, args.ca_cert.as_deref())
    };
    let default_dir = || PathBuf::from(".switchyard");
    match args.command {
        Command::Up {
            port,
            data_dir,
            agents,
            boot_delay,
            idle_ttl,
            billing_minimum,
            database_url,
        } => {
            up::run(up::UpOptions {
                port,
                data_dir,
                agents,
                boot_delay,
                idle_ttl,
                billing_minimum,
                database_url,
            })
            .await
        }
        Command::Serve {
            config,
            listen,
            data_dir,
            database_url,
            tls_cert,
            tls_key,
        } => {
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
            if let Some(mut aws) = cfg.aws.clone() {
                use switchyard_providers::Provider;
                if let Some(ca) = &cfg.agent_ca_cert {
                    // The instances' agents trust the broker's private CA (cloud-init).
                    let pem = std::fs::read_to_string(ca)
                        .with_context(|| format!("reading agent_ca_cert {}", ca.display()))?;
                    aws.agent.ca_cert_pem = Some(pem);
                }
                let provider = switchyard_providers::aws::AwsProvider::new(aws)
                    .await
                    .context("setting up the AWS provider")?;
                let offers = provider
                    .offers()
                    .await
                    .context("reading AWS offers (catalogue, spot prices, instance types)")?;
                eprintln!(
                    "aws: {} pools in {} regions",
                    offers.pools.len(),
                    offers.regions.len()
                );
                providers.add_with_offers(std::sync::Arc::new(provider), offers);
            }
            let running = switchyard_broker::app::App::start(cfg.clone(), providers).await?;
            if running.created_admin_token.is_some() {
                eprintln!(
                    "admin token written to {}",
                    cfg.data_dir.join("admin.token").display()
                );
            }
            eprintln!("switchyard listening on {}", cfg.public_url());
            let served =
                server::serve(running.app.clone(), listener, server::shutdown_signal()).await;
            running.stop().await;
            served
        }
        Command::Agent(agent_args) => switchyard_agent::run(agent_args).await,
        Command::Submit { file } => cli::submit(&client(default_dir())?, &file).await,
        Command::Jobs {
            state,
            team,
            priority,
            name,
            limit,
            json,
        } => {
            let filters = cli::JobFilters {
                state,
                team,
                priority,
                name,
                limit,
            };
            cli::jobs(&client(default_dir())?, filters, json).await
        }
        Command::Instances { json } => cli::instances(&client(default_dir())?, json).await,
        Command::Budgets { json } => cli::budgets(&client(default_dir())?, json).await,
        Command::Audit {
            target,
            limit,
            json,
        } => cli::audit(&client(default_dir())?, target, limit, json).await,
        Command::Token {
            command: TokenCommand::List { json },
        } => cli::token_list(&client(default_dir())?, json).await,
        Command::Token {
            command: TokenCommand::Revoke { id, json },
        } => cli::token_revoke(&client(default_dir())?, &id, json).await,
        Command::Job { id } => cli::job(&client(default_dir())?, &id).await,
        Command::Logs { id, follow } => cli::logs(&client(default_dir())?, &id, follow).await,
        Command::Cancel { id } => cli::cancel(&client(default_dir())?, &id).await,
        Command::Pools { json } => cli::pools(&client(default_dir())?, json).await,
        Command::Token {
            command: TokenCommand::Create { role, team },
        } => cli::token_create(&client(default_dir())?, role.into(), team).await,
        Command::Spend {
            group_by,
            from,
            to,
            bucket,
            team,
            csv,
        } => {
            let query = cli::SpendArgs {
                group_by,
                from,
                to,
                bucket,
                team,
            };
            cli::spend(&client(default_dir())?, &query, csv).await
        }
        Command::Policy {
            command: PolicyCommand::Get { team, project },
        } => cli::policy_get(&client(default_dir())?, &team, project.as_deref()).await,
        Command::Policy {
            command:
                PolicyCommand::Set {
                    team,
                    file,
                    project,
                },
        } => cli::policy_set(&client(default_dir())?, &team, &file, project.as_deref()).await,
        Command::Simulate(sim) => {
            switchyard_broker::simulate::run(&sim)?;
            eprintln!(
                "report written to {}",
                sim.out.join("report.json").display()
            );
            Ok(())
        }
    }
}
