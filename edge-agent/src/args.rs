//! The agent's configuration: command-line flags, each also readable from a `SWITCHYARD_*`
//! environment variable. `AgentArgs` is a clap `Args` so the broker can embed it as its
//! `switchyard agent ...` subcommand. This module parses and validates; it does no I/O.

use crate::brokers::parse_broker_url;
use crate::fakegpu::GpuFault;
use clap::Args;
use reqwest::Url;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use switchyard_core::gpu_model::parse_declaration;

/// Environment variable of the one-time enrolment token; removed from the jobs' environment.
pub const ENROL_TOKEN_ENV: &str = "SWITCHYARD_ENROL_TOKEN";

/// Enrol with a Switchyard broker, heartbeat, and run the jobs it leases to this machine.
#[derive(Args, Debug, Clone)]
pub struct AgentArgs {
    /// Base URL of the broker, e.g. http://10.0.0.5:8080. Replicas of one broker: repeat the
    /// flag or separate URLs with commas; the agent sticks to one and fails over to the next.
    #[arg(
        long = "broker",
        env = "SWITCHYARD_BROKER",
        value_name = "URL",
        value_delimiter = ',',
        required = true,
        value_parser = parse_broker_url
    )]
    pub brokers: Vec<Url>,

    /// One-time enrolment token (from `switchyard enrolment-token --pool POOL` or
    /// `POST /api/v1/enrolment-tokens`). Not needed when --state-dir holds an earlier enrolment.
    #[arg(long, env = ENROL_TOKEN_ENV, value_name = "TOKEN", hide_env_values = true)]
    pub enrol_token: Option<Secret>,

    /// Simulated GPUs instead of NVML: COUNTxMODEL, repeatable or comma-separated
    /// (`4xH100-80GB`, `2xL4,2xT4`). They idle at 0 % and run at a job's
    /// expected_gpu_utilization (90 % when it declares none); the job may write its current
    /// level, a number from 0 to 100, to the file named in its $SWITCHYARD_GPU_SIM.
    #[arg(
        long,
        env = "SWITCHYARD_FAKE_GPUS",
        value_name = "NxMODEL",
        value_delimiter = ','
    )]
    pub fake_gpus: Vec<GpuDeclaration>,

    /// Inject a fault into a simulated GPU (with --fake-gpus), repeatable: INDEX:KIND@DELAY,
    /// KIND one of xid=N (one XID error), ecc=N (N uncorrectable volatile ECC errors),
    /// overheat or overheat=C (above the slowdown threshold, thermal throttling); DELAY from
    /// the agent's start, e.g. 0s, 30s, 2m. Example: 2:xid=79@30s.
    #[arg(
        long = "fake-gpu-fault",
        env = "SWITCHYARD_FAKE_GPU_FAULTS",
        value_name = "INDEX:KIND@DELAY",
        value_delimiter = ','
    )]
    pub fake_gpu_faults: Vec<GpuFault>,

    /// Name this machine reports to the broker [default: the hostname].
    #[arg(long, env = "SWITCHYARD_AGENT_NAME", value_name = "NAME")]
    pub name: Option<String>,

    /// Seconds between SIGTERM and SIGKILL when stopping a job whose lease names no grace.
    #[arg(
        long,
        env = "SWITCHYARD_GRACE_S",
        value_name = "SECONDS",
        default_value_t = 10
    )]
    pub grace_s: u64,

    /// Directory that keeps the agent id and token, so that a restart re-uses the enrolment.
    #[arg(long, env = "SWITCHYARD_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,

    /// Heartbeat period in seconds [default: what the broker says at enrolment].
    #[arg(long, env = "SWITCHYARD_HEARTBEAT_S", value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub heartbeat_s: Option<u64>,

    /// How long one work long-poll may wait at the broker, in seconds.
    #[arg(
        long,
        env = "SWITCHYARD_POLL_WAIT_S",
        value_name = "SECONDS",
        default_value_t = 25,
        hide = true
    )]
    pub poll_wait_s: u64,

    /// Instance-metadata URL of the cloud's spot interruption notice (404: none; 200: the
    /// machine will be reclaimed), e.g. on EC2
    /// http://169.254.169.254/latest/meta-data/spot/instance-action. Not watched when unset.
    #[arg(long, env = "SWITCHYARD_INTERRUPTION_URL", value_name = "URL")]
    pub interruption_url: Option<Url>,

    /// PEM file of the CA certificate(s) to trust for an https broker, instead of the system's
    /// roots: for a broker whose certificate a private CA signed. The broker's certificate is
    /// always verified (chain and host name); there is no way to turn that off.
    #[arg(long, env = "SWITCHYARD_CA_CERT", value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,

    /// Seconds between two reads of --interruption-url.
    #[arg(
        long,
        env = "SWITCHYARD_INTERRUPTION_POLL_S",
        value_name = "SECONDS",
        default_value_t = 5,
        value_parser = clap::value_parser!(u64).range(1..),
        hide = true
    )]
    pub interruption_poll_s: u64,

    /// Unix uids (each also the job's gid) to run jobs as, START-END: one per running job, never
    /// shared by two jobs at once, never the agent's. Needs the agent to run as root
    /// [default: 20000-20999 when the agent runs as root; otherwise jobs run as the agent's
    /// own user, not isolated].
    #[arg(long, env = "SWITCHYARD_JOB_UIDS", value_name = "START-END")]
    pub job_uids: Option<UidRange>,

    /// Directory under which each job gets its own working directory (also its HOME), removed
    /// when the job ends [default: /var/lib/switchyard-agent/jobs as root, else
    /// $TMPDIR/switchyard-jobs-UID].
    #[arg(long, env = "SWITCHYARD_WORK_DIR", value_name = "DIR")]
    pub work_dir: Option<PathBuf>,

    /// A variable of the agent's environment to copy into every job's environment (which is
    /// otherwise clean: PATH, HOME, LANG, TZ, the job's own env and Switchyard's). Repeatable
    /// or comma-separated.
    #[arg(
        long,
        env = "SWITCHYARD_PASS_ENV",
        value_name = "NAME",
        value_delimiter = ',',
        value_parser = parse_env_name
    )]
    pub pass_env: Vec<String>,

    /// The address at which the gateway reaches this machine's service replicas (an IP address
    /// or a host name, no port): each replica listens on the port the agent gives it in
    /// `$PORT`, and heartbeats report it as HOST:PORT. Set it to an address the gateway can
    /// reach when the gateway runs on another machine (the replica must then listen on
    /// 0.0.0.0, not 127.0.0.1).
    #[arg(
        long,
        env = "SWITCHYARD_ADVERTISE_HOST",
        value_name = "HOST",
        default_value = "127.0.0.1",
        value_parser = parse_host
    )]
    pub advertise_host: String,

    /// Shut down in an orderly way (drain, as on SIGTERM) when stdin reaches end of file: the
    /// process that started the agent holds the other end of a pipe, so the agent ends when
    /// that process dies, however it dies (`switchyard up` uses it).
    #[arg(long, env = "SWITCHYARD_EXIT_ON_STDIN_EOF", hide = true)]
    pub exit_on_stdin_eof: bool,
}

impl AgentArgs {
    /// Arguments with defaults for everything but the broker (for embedding and tests).
    pub fn new(broker: Url) -> Self {
        Self::with_brokers(vec![broker])
    }

    /// Arguments with defaults for everything but the broker replicas, tried in this order.
    pub fn with_brokers(brokers: Vec<Url>) -> Self {
        AgentArgs {
            brokers,
            enrol_token: None,
            fake_gpus: Vec::new(),
            fake_gpu_faults: Vec::new(),
            name: None,
            grace_s: 10,
            state_dir: None,
            heartbeat_s: None,
            poll_wait_s: 25,
            interruption_url: None,
            interruption_poll_s: 5,
            ca_cert: None,
            job_uids: None,
            work_dir: None,
            pass_env: Vec::new(),
            advertise_host: "127.0.0.1".to_string(),
            exit_on_stdin_eof: false,
        }
    }
}

/// A `--job-uids` range, both ends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UidRange {
    pub start: u32,
    pub end: u32,
}

impl UidRange {
    /// The range used when the agent runs as root and `--job-uids` is not given.
    pub const DEFAULT: UidRange = UidRange {
        start: 20_000,
        end: 20_999,
    };

    pub fn contains(&self, uid: u32) -> bool {
        (self.start..=self.end).contains(&uid)
    }
}

impl FromStr for UidRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("invalid uid range `{s}`: expected START-END such as 20000-20999");
        let (a, b) = s.trim().split_once('-').ok_or_else(bad)?;
        let start: u32 = a.trim().parse().map_err(|_| bad())?;
        let end: u32 = b.trim().parse().map_err(|_| bad())?;
        if start > end {
            return Err(format!("invalid uid range `{s}`: START is above END"));
        }
        // Uids below 1000 are the system's own accounts; u32::MAX is "no uid" to the kernel,
        // and (u32::MAX - 1) is the overflow uid.
        if start < 1000 || end >= u32::MAX - 1 {
            return Err(format!(
                "invalid uid range `{s}`: job uids must be between 1000 and 4294967293"
            ));
        }
        Ok(UidRange { start, end })
    }
}

/// An `--advertise-host`: an IP address (v4, or v6 without brackets) or a DNS name; no scheme,
/// port or path, since the gateway adds the replica's port.
fn parse_host(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.parse::<std::net::IpAddr>().is_ok() {
        return Ok(s.to_string());
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    let name = s.strip_suffix('.').unwrap_or(s);
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!(
            "invalid host `{s}`: expected an IP address or a host name such as 10.0.0.5 or \
             gpu-7.internal, without a port"
        ));
    }
    Ok(s.to_string())
}

/// An environment variable's name for `--pass-env`: not empty, no `=` or NUL.
fn parse_env_name(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.is_empty() || s.contains(['=', '\0']) {
        return Err(format!("invalid environment variable name `{s}`"));
    }
    if s == ENROL_TOKEN_ENV {
        return Err(format!(
            "{ENROL_TOKEN_ENV} is the agent's secret: it is never passed to jobs"
        ));
    }
    Ok(s.to_string())
}

/// One `--fake-gpus` entry: `count` GPUs of a normalised `model` with `memory_gb` each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuDeclaration {
    pub count: u32,
    pub model: String,
    pub memory_gb: u32,
}

impl FromStr for GpuDeclaration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_declaration(s)
            .map(|(count, model, memory_gb)| GpuDeclaration {
                count,
                model,
                memory_gb,
            })
            .ok_or_else(|| {
                format!(
                    "invalid GPU declaration `{s}`: expected COUNTxMODEL such as 4xH100-80GB or \
                     2xL4 (1 to 64 GPUs; a model of unknown memory needs it: 2xMYSTERY-24GB)"
                )
            })
    }
}

/// A credential: never printed by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl FromStr for Secret {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Err("the token is empty".into());
        }
        Ok(Secret(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        agent: AgentArgs,
    }

    fn parse(args: &[&str]) -> Result<AgentArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("switchyard-agent").chain(args.iter().copied()))
            .map(|c| c.agent)
    }

    #[test]
    fn fake_gpus_are_repeatable_and_comma_separated() {
        let a = parse(&[
            "--broker",
            "http://b:8080",
            "--fake-gpus",
            "2xL4,2xT4",
            "--fake-gpus",
            "1xH100-80GB",
        ])
        .unwrap();
        let got: Vec<(u32, &str, u32)> = a
            .fake_gpus
            .iter()
            .map(|d| (d.count, d.model.as_str(), d.memory_gb))
            .collect();
        assert_eq!(got, vec![(2, "L4", 24), (2, "T4", 16), (1, "H100", 80)]);
        assert_eq!(a.grace_s, 10);
        assert_eq!(a.poll_wait_s, 25);
        assert_eq!(a.heartbeat_s, None);
        assert_eq!(a.interruption_url, None);
        assert_eq!(a.interruption_poll_s, 5);
    }

    #[test]
    fn interruption_url_and_poll_period() {
        let a = parse(&[
            "--broker",
            "http://b",
            "--interruption-url",
            "http://169.254.169.254/latest/meta-data/spot/instance-action",
            "--interruption-poll-s",
            "2",
        ])
        .unwrap();
        assert_eq!(
            a.interruption_url.unwrap().path(),
            "/latest/meta-data/spot/instance-action"
        );
        assert_eq!(a.interruption_poll_s, 2);
        assert!(parse(&["--broker", "http://b", "--interruption-url", "nope"]).is_err());
        assert!(parse(&["--broker", "http://b", "--interruption-poll-s", "0"]).is_err());
    }

    #[test]
    fn rejects_bad_declarations_and_missing_broker() {
        let err = parse(&["--broker", "http://b", "--fake-gpus", "4xMYSTERY"]).unwrap_err();
        assert!(
            err.to_string()
                .contains("invalid GPU declaration `4xMYSTERY`"),
            "{err}"
        );
        assert!(parse(&["--fake-gpus", "1xL4"]).is_err());
        assert!(parse(&["--broker", "not a url"]).is_err());
        assert!(parse(&["--broker", "http://b", "--heartbeat-s", "0"]).is_err());
    }

    #[test]
    fn gpu_faults_are_repeatable_and_a_bad_one_is_refused_naming_the_flag() {
        let args = parse(&[
            "--broker",
            "http://b",
            "--fake-gpus",
            "4xH100",
            "--fake-gpu-fault",
            "2:xid=79@30s",
            "--fake-gpu-fault",
            "0:ecc=1@0s,1:overheat@2m",
        ])
        .unwrap();
        let faults: Vec<String> = args.fake_gpu_faults.iter().map(|f| f.to_string()).collect();
        assert_eq!(faults, ["2:xid=79@30s", "0:ecc=1@0s", "1:overheat@120s"]);
        let err = parse(&["--broker", "http://b", "--fake-gpu-fault", "2:xid=79@soon"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--fake-gpu-fault"), "{err}");
        assert!(err.contains("`soon`"), "{err}");
    }

    #[test]
    fn the_flags_are_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    /// As the broker embeds it: `switchyard agent --broker URL ...`.
    #[derive(Parser, Debug)]
    struct Embedding {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(clap::Subcommand, Debug)]
    enum Command {
        Agent(AgentArgs),
    }

    #[test]
    fn embeds_as_a_subcommand_with_one_or_several_brokers() {
        for (given, want) in [
            (
                vec!["http://127.0.0.1:8080"],
                vec!["http://127.0.0.1:8080/"],
            ),
            (
                vec!["http://a:1,http://b:2", "--broker", "http://c:3"],
                vec!["http://a:1/", "http://b:2/", "http://c:3/"],
            ),
        ] {
            let argv = ["switchyard", "agent", "--broker"]
                .into_iter()
                .chain(given)
                .chain(["--enrol-token", "t", "--fake-gpus", "1xL4"]);
            let Command::Agent(a) = Embedding::try_parse_from(argv).unwrap().command;
            assert_eq!(brokers(&a), want);
        }
    }

    fn brokers(a: &AgentArgs) -> Vec<&str> {
        a.brokers.iter().map(Url::as_str).collect()
    }

    #[test]
    fn one_broker_url_parses_as_before() {
        let a = parse(&["--broker", "http://10.0.0.5:8080"]).unwrap();
        assert_eq!(brokers(&a), ["http://10.0.0.5:8080/"]);
        let a = parse(&["--broker=https://b.example.com/sy"]).unwrap();
        assert_eq!(brokers(&a), ["https://b.example.com/sy"]);
        assert_eq!(
            brokers(&AgentArgs::new("http://b:1".parse().unwrap())),
            ["http://b:1/"]
        );
    }

    #[test]
    fn broker_urls_are_comma_separated_and_repeatable() {
        let a = parse(&[
            "--broker",
            "http://a:8080,http://b:8080/, http://c:8080",
            "--broker",
            "https://d",
        ])
        .unwrap();
        assert_eq!(
            brokers(&a),
            [
                "http://a:8080/",
                "http://b:8080/",
                "http://c:8080/",
                "https://d/"
            ]
        );
        let err = parse(&["--broker", "http://a,,http://b"]).unwrap_err();
        assert!(err.to_string().contains("empty broker URL"), "{err}");
        let err = parse(&["--broker", "http://a,"]).unwrap_err();
        assert!(err.to_string().contains("empty broker URL"), "{err}");
        let err = parse(&["--broker", "http://a,b:8080"]).unwrap_err();
        assert!(err.to_string().contains("http or https"), "{err}");
    }

    #[test]
    fn isolation_flags_parse_and_default_to_none() {
        let a = parse(&["--broker", "http://b"]).unwrap();
        assert_eq!((a.job_uids, a.work_dir.clone()), (None, None));
        assert!(a.pass_env.is_empty() && !a.exit_on_stdin_eof);
        let a = parse(&[
            "--broker",
            "http://b",
            "--job-uids",
            "30000-30009",
            "--work-dir",
            "/srv/jobs",
            "--pass-env",
            "HTTP_PROXY,NO_PROXY",
            "--pass-env",
            "HF_HOME",
            "--exit-on-stdin-eof",
        ])
        .unwrap();
        assert_eq!(
            a.job_uids,
            Some(UidRange {
                start: 30000,
                end: 30009
            })
        );
        assert!(a.job_uids.unwrap().contains(30009) && !a.job_uids.unwrap().contains(30010));
        assert_eq!(a.work_dir, Some(PathBuf::from("/srv/jobs")));
        assert_eq!(a.pass_env, ["HTTP_PROXY", "NO_PROXY", "HF_HOME"]);
        assert!(a.exit_on_stdin_eof);
    }

    #[test]
    fn bad_uid_ranges_and_env_names_are_refused() {
        for bad in ["20000", "x-y", "5-1", "0-10", "999-2000", "1000-4294967295"] {
            assert!(
                parse(&["--broker", "http://b", "--job-uids", bad]).is_err(),
                "{bad}"
            );
        }
        assert!(parse(&["--broker", "http://b", "--job-uids", "1000-1000"]).is_ok());
        for bad in ["A=B", "", "SWITCHYARD_ENROL_TOKEN"] {
            assert!(
                parse(&["--broker", "http://b", "--pass-env", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_advertised_host_defaults_to_loopback_and_takes_no_port() {
        let a = parse(&["--broker", "http://b"]).unwrap();
        assert_eq!(a.advertise_host, "127.0.0.1");
        assert_eq!(
            AgentArgs::new("http://b".parse().unwrap()).advertise_host,
            "127.0.0.1"
        );
        for good in [
            "10.0.0.5",
            "fd00::7",
            "gpu-7.internal",
            "node1",
            "gpu-7.internal.",
        ] {
            let a = parse(&["--broker", "http://b", "--advertise-host", good]).unwrap();
            assert_eq!(a.advertise_host, good);
        }
        for bad in [
            "",
            "10.0.0.5:8080",
            "http://gpu-7",
            "gpu_7",
            "-gpu",
            "a..b",
            "[fd00::7]",
            "gpu 7",
        ] {
            assert!(
                parse(&["--broker", "http://b", "--advertise-host", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn secrets_do_not_debug_print() {
        let a = parse(&["--broker", "http://b", "--enrol-token", "s3cret"]).unwrap();
        assert_eq!(a.enrol_token.as_ref().map(Secret::expose), Some("s3cret"));
        assert!(!format!("{a:?}").contains("s3cret"));
    }
}
