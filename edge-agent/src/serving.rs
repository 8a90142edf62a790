//! Service replicas on this agent (issue 26): a lease with `serve` gets a free TCP port, which
//! its process finds in `$PORT`; a readiness probe decides whether the replica takes traffic;
//! every heartbeat reports the live replicas (`Heartbeat::serving`), and any change to that
//! report (a replica appears, becomes ready or not ready, is being stopped, or ends) asks the
//! heartbeat loop for a beat at once.
//!
//! **The port.** [`Serving::reserve`] binds `0.0.0.0:0` (the wildcard, so that the port is free
//! whichever address the replica listens on), reads the port the kernel chose and closes the
//! socket just before the process is spawned. Ports this agent gave to replicas that are still
//! alive are never given again (a pick that lands on one is kept open and the kernel asked
//! again), so two replicas of one agent cannot race each other. The residual race: between the
//! close and the replica's own `bind`, another process on the machine (another agent of a
//! `switchyard up`, or any program's outgoing connection or `bind(0)`) may take the same port
//! from the ephemeral range; the replica then fails to listen, exits, and is reported finished
//! like any failed replica, for the broker to replace. Holding a bound socket with
//! `SO_REUSEADDR` across the replica's start would close that window for servers that set
//! `SO_REUSEADDR` themselves, but would break every server that does not (Python's plain
//! `socketserver.TCPServer`, a bare C `bind`), so the agent does not.
//!
//! **Readiness.** Without a probe a replica is ready once its process has started. With one, the
//! agent sends `GET http://127.0.0.1:PORT{path}` every `period_ms` with a `timeout_ms` limit; a
//! 2xx answer makes the replica ready, `failure_threshold` failed probes in a row (no answer, a
//! timeout, or any status other than 2xx, redirects included) make a ready replica not ready.
//! Each probe is a new connection, never through a proxy. Values from the lease are kept in
//! range (period 100 ms to 1 h, timeout 10 ms to 1 h, threshold at least 1), so that a broker's
//! zero cannot make the agent spin and a huge value cannot overflow a deadline.
//!
//! A replica the agent has started to stop (SIGTERM sent) is reported not ready, whatever its
//! probe says: it is going away and should get no new requests. A replica whose process ended
//! is no longer reported.

use crate::error::AgentError;
use reqwest::Url;
use std::collections::{HashMap, HashSet};
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use switchyard_protocol::agent::{AttemptRef, Readiness, ReplicaReport};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use uuid::Uuid;

/// The shortest probe period the agent keeps to, whatever the lease says.
pub const MIN_PROBE_PERIOD: Duration = Duration::from_millis(100);
/// The shortest probe timeout.
pub const MIN_PROBE_TIMEOUT: Duration = Duration::from_millis(10);
/// The longest probe period and timeout.
pub const MAX_PROBE_INTERVAL: Duration = Duration::from_secs(3600);
/// How many ports one reservation may ask the kernel for before it gives up (each pick that
/// lands on a port of a live replica is one).
const PORT_PICKS: usize = 16;

/// One replica as the table knows it.
#[derive(Debug)]
struct Replica {
    attempt: AttemptRef,
    port: u16,
    /// The process was spawned: the replica is reported from now on.
    started: bool,
    /// The last verdict of its probe (or true once started, without one).
    ready: bool,
    /// The agent is stopping it: reported not ready from now on.
    stopping: bool,
}

impl Replica {
    fn report(&self, host: &str) -> Option<ReplicaReport> {
        self.started.then(|| ReplicaReport {
            attempt: self.attempt.clone(),
            host: host.to_string(),
            port: self.port,
            ready: self.ready && !self.stopping,
        })
    }
}

/// The agent's service replicas, shared by the runners (which add and remove them), their
/// probes and the heartbeat loop. A plain mutex, never held across an await.
#[derive(Debug)]
pub struct Serving {
    /// `--advertise-host`: where the gateway reaches this machine's replicas.
    host: String,
    inner: Mutex<HashMap<Uuid, Replica>>,
    /// Bumped whenever what a heartbeat would report in `serving` changes.
    changed: watch::Sender<u64>,
    /// The probes' client: no proxy, no redirects, no pooled connections.
    http: reqwest::Client,
}

impl Serving {
    /// The table of an agent whose replicas the gateway reaches at `host`.
    pub fn new(host: impl Into<String>) -> Result<Serving, AgentError> {
        let http = reqwest::Client::builder()
            // A replica is on this machine: never through a proxy, never elsewhere.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            // Each probe tests that the replica still accepts connections.
            .pool_max_idle_per_host(0)
            .user_agent(concat!(
                "switchyard-agent/",
                env!("CARGO_PKG_VERSION"),
                " (readiness probe)"
            ))
            .build()
            .map_err(|e| AgentError::HttpClient(e.to_string()))?;
        Ok(Serving {
            host: host.into(),
            inner: Mutex::new(HashMap::new()),
            changed: watch::channel(0).0,
            http,
        })
    }

    /// The address replicas are advertised at.
    pub fn host(&self) -> &str {
        &self.host
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Uuid, Replica>> {
        // A panic elsewhere must not wedge the agent: the table stays consistent per call.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes whenever the heartbeat's `serving` would: the heartbeat loop beats at once.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn notify(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The live replicas (process started, not yet ended), in attempt order, for a heartbeat.
    pub fn reports(&self) -> Vec<ReplicaReport> {
        let mut reports: Vec<ReplicaReport> = self
            .lock()
            .values()
            .filter_map(|r| r.report(&self.host))
            .collect();
        reports.sort_by(|a, b| a.attempt.cmp(&b.attempt));
        reports
    }

    /// Picks a free port for `attempt`'s replica (see the module's note on the residual race)
    /// and holds it for the attempt until the returned reservation is dropped. Not reported
    /// until [`Reservation::started`].
    pub fn reserve(self: &Arc<Self>, attempt: &AttemptRef) -> std::io::Result<Reservation> {
        let mut inner = self.lock();
        let taken: HashSet<u16> = inner.values().map(|r| r.port).collect();
        // Picks that landed on a live replica's port stay open, so that the kernel moves on.
        let mut held = Vec::new();
        let port = loop {
            if held.len() >= PORT_PICKS {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "the kernel kept choosing ports of this agent's other replicas",
                ));
            }
            let socket = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0))?;
            let port = socket.local_addr()?.port();
            if port != 0 && !taken.contains(&port) {
                break port;
            }
            held.push(socket);
        };
        drop(held);
        inner.insert(
            attempt.attempt_id,
            Replica {
                attempt: attempt.clone(),
                port,
                started: false,
                ready: false,
                stopping: false,
            },
        );
        Ok(Reservation {
            serving: self.clone(),
            id: attempt.attempt_id,
            port,
            probe: None,
        })
    }

    /// Records that the replica's process started: reported from now on, ready at once
    /// without a probe.
    fn started(&self, id: Uuid, ready: bool) {
        if let Some(r) = self.lock().get_mut(&id) {
            r.started = true;
            r.ready = ready;
        }
        self.notify();
    }

    /// Records the probe's verdict; true when it changed what is reported.
    fn set_ready(&self, id: Uuid, ready: bool) -> bool {
        let changed = match self.lock().get_mut(&id) {
            Some(r) if r.ready != ready => {
                r.ready = ready;
                !r.stopping
            }
            _ => false,
        };
        if changed {
            self.notify();
        }
        changed
    }

    fn stopping(&self, id: Uuid) {
        let changed = match self.lock().get_mut(&id) {
            Some(r) if !r.stopping => {
                r.stopping = true;
                r.started && r.ready
            }
            _ => false,
        };
        if changed {
            self.notify();
        }
    }

    fn remove(&self, id: Uuid) {
        let was_reported = self.lock().remove(&id).is_some_and(|r| r.started);
        if was_reported {
            self.notify();
        }
    }
}

/// One replica's port and probe, held by its runner for as long as its process lives: dropping
/// it stops the probe and takes the replica out of the heartbeat.
#[derive(Debug)]
pub struct Reservation {
    serving: Arc<Serving>,
    id: Uuid,
    port: u16,
    probe: Option<JoinHandle<()>>,
}

impl Reservation {
    /// The port given to the replica in `$PORT`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process started: without `readiness` the replica is ready now; with it, the probe
    /// starts (on the current tokio runtime) and decides.
    pub fn started(&mut self, readiness: Option<&Readiness>) {
        let Some(readiness) = readiness else {
            self.serving.started(self.id, true);
            return;
        };
        self.serving.started(self.id, false);
        let Some(url) = probe_url(self.port, &readiness.path) else {
            tracing::warn!(
                path = %readiness.path,
                "the readiness path is not a path on this replica: it is never probed, never ready"
            );
            return;
        };
        let probe = Probe::from(readiness);
        let serving = self.serving.clone();
        let id = self.id;
        // Not in the runner's span: a task that lives as long as the replica would hold the
        // job's launch span open (its log lines name the attempt instead).
        self.probe = Some(tokio::spawn(probe_loop(serving, id, url, probe)));
    }

    /// The agent is stopping the replica (SIGTERM sent): reported not ready from now on.
    pub fn stopping(&self) {
        self.serving.stopping(self.id);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(probe) = self.probe.take() {
            probe.abort();
        }
        self.serving.remove(self.id);
    }
}

/// The probe URL on this machine, or `None` when `path` would lead anywhere else (it must start
/// with `/`; `@host` tricks and the like are refused by checking what the URL parses to).
pub fn probe_url(port: u16, path: &str) -> Option<Url> {
    if !path.starts_with('/') {
        return None;
    }
    let url = Url::parse(&format!("http://127.0.0.1:{port}{path}")).ok()?;
    (url.host_str() == Some("127.0.0.1") && url.port_or_known_default() == Some(port))
        .then_some(url)
}

/// A lease's readiness settings, kept in range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub period: Duration,
    pub timeout: Duration,
    pub failure_threshold: u32,
}

impl From<&Readiness> for Probe {
    fn from(r: &Readiness) -> Probe {
        Probe {
            period: Duration::from_millis(r.period_ms).clamp(MIN_PROBE_PERIOD, MAX_PROBE_INTERVAL),
            timeout: Duration::from_millis(r.timeout_ms)
                .clamp(MIN_PROBE_TIMEOUT, MAX_PROBE_INTERVAL),
            failure_threshold: r.failure_threshold.max(1),
        }
    }
}

/// The readiness verdict from a run of probe results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub ready: bool,
    /// Failed probes in a row.
    pub failures: u32,
}

impl Verdict {
    /// Takes one probe's result; `Some(ready)` when the verdict changed.
    pub fn observe(&mut self, passed: bool, failure_threshold: u32) -> Option<bool> {
        if passed {
            self.failures = 0;
            if !self.ready {
                self.ready = true;
                return Some(true);
            }
        } else {
            self.failures = self.failures.saturating_add(1);
            if self.ready && self.failures >= failure_threshold.max(1) {
                self.ready = false;
                return Some(false);
            }
        }
        None
    }
}

/// Probes every `period` until aborted (its reservation dropped).
async fn probe_loop(serving: Arc<Serving>, id: Uuid, url: Url, probe: Probe) {
    let mut ticker = tokio::time::interval(probe.period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut verdict = Verdict::default();
    loop {
        ticker.tick().await;
        let failure = match serving
            .http
            .get(url.clone())
            .timeout(probe.timeout)
            .send()
            .await
        {
            Ok(res) if res.status().is_success() => None,
            Ok(res) => Some(format!("HTTP {}", res.status())),
            Err(e) if e.is_timeout() => {
                Some(format!("no answer within {} ms", probe.timeout.as_millis()))
            }
            Err(e) => Some(e.to_string()),
        };
        match verdict.observe(failure.is_none(), probe.failure_threshold) {
            Some(true) => {
                tracing::info!(attempt.id = %id, url = %url, "replica ready");
                serving.set_ready(id, true);
            }
            Some(false) => {
                tracing::warn!(attempt.id = %id, url = %url, failures = verdict.failures,
                    last = failure.as_deref().unwrap_or_default(), "replica not ready");
                serving.set_ready(id, false);
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn attempt(n: u128) -> AttemptRef {
        AttemptRef {
            job_id: Uuid::from_u128(n),
            attempt_id: Uuid::from_u128(n),
            epoch: 1,
        }
    }

    #[test]
    fn a_probe_url_stays_on_this_replica() {
        assert_eq!(
            probe_url(8080, "/health").unwrap().as_str(),
            "http://127.0.0.1:8080/health"
        );
        assert_eq!(
            probe_url(8080, "/health?deep=1").unwrap().as_str(),
            "http://127.0.0.1:8080/health?deep=1"
        );
        assert_eq!(
            probe_url(8080, "//evil.example/x").unwrap().host_str(),
            Some("127.0.0.1")
        );
        for bad in ["health", "", "@evil.example/", ".evil.example/"] {
            assert_eq!(probe_url(8080, bad), None, "{bad}");
        }
    }

    #[test]
    fn probe_settings_from_the_network_are_kept_in_range() {
        let r = |period_ms, timeout_ms, failure_threshold| {
            Probe::from(&Readiness {
                path: "/".into(),
                period_ms,
                timeout_ms,
                failure_threshold,
            })
        };
        assert_eq!(
            r(2000, 1000, 3),
            Probe {
                period: Duration::from_secs(2),
                timeout: Duration::from_secs(1),
                failure_threshold: 3
            }
        );
        assert_eq!(
            r(0, 0, 0),
            Probe {
                period: MIN_PROBE_PERIOD,
                timeout: MIN_PROBE_TIMEOUT,
                failure_threshold: 1
            }
        );
        let huge = r(u64::MAX, u64::MAX, u32::MAX);
        assert_eq!(
            (huge.period, huge.timeout),
            (MAX_PROBE_INTERVAL, MAX_PROBE_INTERVAL)
        );
    }

    #[test]
    fn a_pass_makes_ready_and_threshold_failures_in_a_row_make_not_ready() {
        let mut v = Verdict::default();
        let (f, t) = (false, true);
        let seen: Vec<Option<bool>> = [f, f, t, t, f, f, t, f, f, f, t]
            .into_iter()
            .map(|passed| v.observe(passed, 3))
            .collect();
        let want = [
            None,        // failing before the first pass: not ready, nothing changes
            None,        //
            Some(true),  // the first pass
            None,        //
            None,        // one failure…
            None,        // …two: under the threshold
            None,        // a pass resets the count
            None,        // one…
            None,        // …two…
            Some(false), // …three in a row
            Some(true),  // ready again at the next pass
        ];
        assert_eq!(seen, want);
        assert_eq!(v.failures, 0);
        // A threshold of 0 from the network counts as 1.
        let mut v = Verdict::default();
        assert_eq!(
            (v.observe(t, 0), v.observe(f, 0)),
            (Some(true), Some(false))
        );
    }

    #[tokio::test]
    async fn reservations_get_distinct_bindable_ports_and_report_once_started() {
        let serving = Arc::new(Serving::new("10.0.0.7").unwrap());
        let mut changes = serving.subscribe();
        let mut a = serving.reserve(&attempt(1)).unwrap();
        let b = serving.reserve(&attempt(2)).unwrap();
        assert_ne!(a.port(), b.port());
        assert_ne!(a.port(), 0);
        // Free for the replica to take, on any address.
        drop(TcpListener::bind((Ipv4Addr::UNSPECIFIED, a.port())).unwrap());
        assert!(serving.reports().is_empty(), "no process yet");
        assert!(!changes.has_changed().unwrap());

        a.started(None);
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        assert_eq!(
            serving.reports(),
            [ReplicaReport {
                attempt: attempt(1),
                host: "10.0.0.7".into(),
                port: a.port(),
                ready: true
            }]
        );
        a.stopping();
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        assert!(!serving.reports()[0].ready, "a replica being stopped");
        drop(a);
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        assert!(serving.reports().is_empty());
        drop(b);
        assert!(
            !changes.has_changed().unwrap(),
            "b was never reported: its end changes nothing"
        );
    }
}
