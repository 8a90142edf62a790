//! The store on its own, on whichever backend the suite runs (SQLite, or PostgreSQL with
//! `SWITCHYARD_TEST_PG_URL`): values round-trip exactly, and concurrent writers are ordered the
//! way SQLite's `BEGIN IMMEDIATE` orders them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::json;
use std::sync::Arc;
use switchyard_broker::store::*;
use switchyard_core::{
    AttemptId, JobId, JobState, Market, Money, NodeId, Pool, PoolId, Region, RegionId, Timestamp,
};
use switchyard_protocol::agent::{AgentEvent, AttemptRef, EventStatus};

const T0: Timestamp = Timestamp(1_800_000_000_123);

async fn seeded(dir: &std::path::Path) -> Arc<Store> {
    let store = test_store(dir).await;
    let region = Region {
        id: RegionId("onprem:dc".into()),
        provider: "onprem".into(),
        code: "dc".into(),
        latitude: Some(52.5),
        longitude: Some(-13.25),
        egress_per_gb: Money::ZERO,
        latency_ms: 2,
        ingress_gbps: 100,
    };
    store.upsert_region(&region).await.unwrap();
    store
        .upsert_pool(&Pool {
            id: PoolId("onprem:dc/h100x8".into()),
            region: region.id.clone(),
            provider: "onprem".into(),
            instance_type: "h100x8".into(),
            gpu_model: "H100".into(),
            gpus_per_node: 8,
            gpu_memory_gb: 80,
            vcpus: 64,
            memory_gb: 512,
            on_demand_per_hour: Money(16_000_000),
            spot_per_hour: None,
            node_limit: 4,
            launchable: false,
            boot_time_s: 0,
            price_updated_at: T0,
            recent_capacity_failures: 0,
            marginal_per_hour: None,
        })
        .await
        .unwrap();
    store
        .insert_enrolment_token(&EnrolmentTokenRecord {
            token_hash: "enrol".into(),
            pool: PoolId("onprem:dc/h100x8".into()),
            instance: None,
            created_at: T0,
            expires_at: T0.plus_secs(3600),
        })
        .await
        .unwrap();
    store
        .register_node(
            "enrol",
            NewNode {
                id: NodeId("n1".into()),
                address: None,
                token_hash: "agent".into(),
                hostname: "h".into(),
                gpus_total: 8,
                inventory_json: "{}".into(),
            },
            T0,
        )
        .await
        .unwrap()
        .unwrap();
    store
}

fn new_job(kind: &str) -> NewJob {
    let wire: switchyard_protocol::api::JobSpec = serde_json::from_value(json!({
        "name": "j", "team": "ml", "command": ["true"], "resources": {"gpus": 1}, "kind": kind,
    }))
    .unwrap();
    NewJob {
        id: JobId(uuid::Uuid::now_v7()),
        spec: switchyard_broker::rules::convert::job_spec(&wire, T0).unwrap(),
        spec_json: serde_json::to_string(&wire).unwrap(),
        submitted_at: T0,
        trace_parent: None,
        replica: None,
    }
}

fn attempt_for(job: &NewJob, expected_end: Timestamp) -> NewAttempt {
    NewAttempt {
        id: AttemptId(uuid::Uuid::now_v7()),
        job: job.id,
        job_version: 0,
        node: NodeId("n1".into()),
        pool: PoolId("onprem:dc/h100x8".into()),
        gpus: vec![3],
        market: Market::OnDemand,
        hourly_cash: Money(400_000),
        estimated_cost: Money(1_000_000),
        hourly_rate: Money(2_000_000),
        expected_end,
        rank: 0,
    }
}

#[tokio::test]
async fn times_ids_and_documents_round_trip_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path()).await;
    let regions = store.regions().await.unwrap();
    assert_eq!(regions[0].latitude, Some(52.5));
    assert_eq!(store.pools().await.unwrap()[0].price_updated_at, T0);

    // Odd milliseconds survive; so do the "never" of a service's expected end and the spec
    // text exactly as submitted.
    let job = new_job("service");
    store.insert_job(&job).await.unwrap();
    let a = attempt_for(&job, Timestamp::MAX);
    store
        .commit_plan(std::slice::from_ref(&a), &[], T0.plus_secs(1))
        .await
        .unwrap();
    // The explanation comes after the commit, for the attempt it explains: one for another
    // attempt of the job (placed again since) changes nothing.
    assert_eq!(
        store.job(job.id).await.unwrap().unwrap().explanation_json,
        None
    );
    let stale = AttemptId(uuid::Uuid::now_v7());
    store
        .set_explanations(&[
            (job.id, stale, "{\"stale\": true}".into()),
            (job.id, a.id, "{\"b\": 1, \"a\": [2]}".into()),
        ])
        .await
        .unwrap();
    let rec = store.job(job.id).await.unwrap().unwrap();
    assert_eq!(rec.submitted_at, T0);
    assert_eq!(rec.spec_json, job.spec_json);
    assert_eq!(rec.spec, job.spec);
    assert_eq!(
        rec.explanation_json.as_deref(),
        Some("{\"b\": 1, \"a\": [2]}")
    );
    assert_eq!(rec.state, JobState::Placed);
    assert_eq!(rec.placement.as_ref().unwrap().attempt, a.id);
    assert_eq!(rec.placement.as_ref().unwrap().gpus, vec![3]);
    let live = store.live_attempts().await.unwrap();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].expected_end, Timestamp::MAX);
    assert_eq!(live[0].created_at, T0.plus_secs(1));

    // Events: started, logs in order, finished; the job's times are the events' times.
    let r = AttemptRef {
        job_id: job.id.0,
        attempt_id: a.id.0,
        epoch: 1,
    };
    let events = [
        AgentEvent::Started {
            attempt: r.clone(),
            pid: 7,
        },
        AgentEvent::Log {
            attempt: r.clone(),
            seq: 0,
            stream: switchyard_protocol::agent::Stream::Stdout,
            data: "héllo\n".into(),
        },
        AgentEvent::Log {
            attempt: r.clone(),
            seq: 0,
            stream: switchyard_protocol::agent::Stream::Stdout,
            data: "héllo\n".into(),
        },
        AgentEvent::Finished {
            attempt: r.clone(),
            exit_code: Some(3),
            signal: None,
            error: None,
            stopped: false,
            requeue: false,
            drained: false,
        },
    ];
    let (results, ended) = store
        .apply_events(
            &NodeId("n1".into()),
            &events,
            Timestamp(T0.millis() + 2_007),
        )
        .await
        .unwrap();
    let statuses: Vec<_> = results.iter().map(|r| r.status.clone()).collect();
    assert_eq!(
        statuses,
        [
            EventStatus::Accepted,
            EventStatus::Accepted,
            EventStatus::Duplicate,
            EventStatus::Accepted
        ]
    );
    assert_eq!(ended.len(), 1);
    let rec = store.job(job.id).await.unwrap().unwrap();
    assert_eq!(rec.state, JobState::Failed);
    assert_eq!(rec.exit_code, Some(3));
    assert_eq!(rec.started_at, Some(Timestamp(T0.millis() + 2_007)));
    assert_eq!(rec.reason.as_deref(), Some("exited with code 3"));
    let logs = store.logs(job.id, 0, 10).await.unwrap();
    assert_eq!(logs.len(), 1);
    assert_eq!(logs[0].data, "héllo\n");
    assert_eq!(logs[0].at, Timestamp(T0.millis() + 2_007));

    // Lists: newest first, with the `before` cursor on the time-ordered ids.
    let newer = new_job("batch");
    store.insert_job(&newer).await.unwrap();
    let all = store
        .list_jobs(&JobFilter {
            limit: 10,
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        all.iter().map(|j| j.id).collect::<Vec<_>>(),
        [newer.id, job.id]
    );
    let older = store
        .list_jobs(&JobFilter {
            before: Some(newer.id),
            state: Some(JobState::Failed),
            team: Some("ml".into()),
            limit: 10,
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(older.len(), 1);
    assert_eq!(older[0].id, job.id);
}

/// An agent that stopped a job on its own because it could not renew its lease (`requeue`)
/// puts the job back in the queue: the attempt is `lost` and settled, the job `queued` with a
/// reason, a retry of the report is a duplicate, and a new plan can place it again.
#[tokio::test]
async fn a_fenced_report_requeues_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path()).await;
    let job = new_job("batch");
    store.insert_job(&job).await.unwrap();
    let a = attempt_for(&job, T0.plus_secs(3_600));
    store
        .commit_plan(std::slice::from_ref(&a), &[], T0.plus_secs(1))
        .await
        .unwrap();
    let r = AttemptRef {
        job_id: job.id.0,
        attempt_id: a.id.0,
        epoch: 1,
    };
    let fenced = AgentEvent::Finished {
        attempt: r.clone(),
        exit_code: None,
        signal: Some(9),
        error: Some("stopped by the agent because it could not renew its lease".into()),
        stopped: false,
        requeue: true,
        drained: false,
    };
    let events = [
        AgentEvent::Started {
            attempt: r.clone(),
            pid: 7,
        },
        fenced.clone(),
    ];
    let (results, ended) = store
        .apply_events(&NodeId("n1".into()), &events, T0.plus_secs(60))
        .await
        .unwrap();
    assert!(
        results.iter().all(|r| r.status == EventStatus::Accepted),
        "{results:?}"
    );
    assert_eq!(ended.len(), 1);
    assert_eq!(ended[0].final_state, JobState::Queued);
    let rec = store.job(job.id).await.unwrap().unwrap();
    assert_eq!(rec.state, JobState::Queued);
    assert_eq!(rec.attempts, 1);
    assert!(
        rec.reason
            .as_deref()
            .unwrap_or_default()
            .contains("renew the lease"),
        "{rec:?}"
    );
    assert!(store.live_attempts().await.unwrap().is_empty());
    // The report again (an outbox retry): nothing changes.
    let (results, ended) = store
        .apply_events(&NodeId("n1".into()), &[fenced], T0.plus_secs(61))
        .await
        .unwrap();
    assert_eq!(results[0].status, EventStatus::Rejected, "{results:?}");
    assert!(ended.is_empty());
    assert_eq!(
        store.job(job.id).await.unwrap().unwrap().state,
        JobState::Queued
    );
    // Placed again under a new attempt.
    let mut again = attempt_for(&job, T0.plus_secs(7_200));
    again.job_version = rec.version;
    store
        .commit_plan(std::slice::from_ref(&again), &[], T0.plus_secs(62))
        .await
        .unwrap();
    let rec = store.job(job.id).await.unwrap().unwrap();
    assert_eq!((rec.state, rec.attempts), (JobState::Placed, 2), "{rec:?}");
}

/// Many plan commits race for one job: exactly one places it, the rest are told their plan is
/// stale, and the job has one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_plan_commits_place_a_job_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path()).await;
    let job = new_job("batch");
    store.insert_job(&job).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let store = store.clone();
        let a = attempt_for(&job, T0.plus_secs(600));
        tasks.push(tokio::spawn(async move {
            store.commit_plan(&[a], &[], T0.plus_secs(1)).await
        }));
    }
    let mut placed = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(()) => placed += 1,
            Err(StoreError::Stale(_)) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!(placed, 1);
    let rec = store.job(job.id).await.unwrap().unwrap();
    assert_eq!(
        (rec.state, rec.attempts, rec.version),
        (JobState::Placed, 1, 1)
    );
    assert_eq!(store.live_attempts().await.unwrap().len(), 1);
}

/// Many submissions at once (PostgreSQL writes them in batches): every one is answered after
/// its row committed and reads back whole; a submission that repeats an id already stored fails
/// alone, the rows submitted beside it are written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_submissions_each_commit_and_a_bad_one_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path()).await;
    let first = new_job("batch");
    store.insert_job(&first).await.unwrap();
    let mut tasks = Vec::new();
    for n in 0..300 {
        let store = store.clone();
        let job = if n == 150 {
            // The same id again, in the middle of the crowd.
            NewJob {
                id: first.id,
                ..new_job("service")
            }
        } else {
            new_job(if n % 2 == 0 { "batch" } else { "service" })
        };
        tasks.push(tokio::spawn(async move {
            let r = store.insert_job(&job).await;
            (job, r)
        }));
    }
    let mut written = Vec::new();
    let mut refused = 0;
    for t in tasks {
        let (job, r) = t.await.unwrap();
        match r {
            Ok(()) => written.push(job),
            Err(_) => {
                assert_eq!(job.id, first.id, "only the repeated id fails");
                refused += 1;
            }
        }
    }
    assert_eq!((written.len(), refused), (299, 1));
    for job in &written {
        let rec = store
            .job(job.id)
            .await
            .unwrap()
            .expect("acknowledged, so stored");
        assert_eq!(rec.state, JobState::Queued);
        assert_eq!(rec.spec, job.spec);
    }
    // The first job is untouched by the repeat.
    let rec = store.job(first.id).await.unwrap().unwrap();
    assert_eq!(rec.spec, first.spec);
}

/// More submissions at once than PostgreSQL's batch writer lets wait (4,096): the ones past
/// that wait for room rather than fail, and every one is acknowledged only once stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crowd_larger_than_the_submit_queue_waits_and_is_all_stored() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path()).await;
    let jobs: Vec<NewJob> = (0..4_500).map(|_| new_job("batch")).collect();
    let tasks: Vec<_> = jobs
        .iter()
        .cloned()
        .map(|job| {
            let store = store.clone();
            tokio::spawn(async move { store.insert_job(&job).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().expect("every submission is stored");
    }
    for job in jobs.iter().step_by(97) {
        let rec = store
            .job(job.id)
            .await
            .unwrap()
            .expect("acknowledged, so stored");
        assert_eq!(rec.spec, job.spec);
    }
}

/// Cancels racing with a start report: the job ends up in one consistent state either way —
/// cancelled at once (the start is then rejected) or stopping (cancel requested while running).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_racing_a_start_leaves_one_consistent_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path()).await;
    for _ in 0..10 {
        let job = new_job("batch");
        store.insert_job(&job).await.unwrap();
        let a = attempt_for(&job, T0.plus_secs(600));
        store
            .commit_plan(std::slice::from_ref(&a), &[], T0)
            .await
            .unwrap();
        let r = AttemptRef {
            job_id: job.id.0,
            attempt_id: a.id.0,
            epoch: 1,
        };
        let start = {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .apply_events(
                        &NodeId("n1".into()),
                        &[AgentEvent::Started { attempt: r, pid: 1 }],
                        T0.plus_secs(2),
                    )
                    .await
                    .unwrap()
            })
        };
        let cancel = {
            let store = store.clone();
            tokio::spawn(async move { store.cancel_job(job.id, T0.plus_secs(2)).await.unwrap() })
        };
        let (results, _) = start.await.unwrap();
        let outcome = cancel.await.unwrap();
        let rec = store.job(job.id).await.unwrap().unwrap();
        match outcome {
            CancelOutcome::Cancelled { .. } => {
                assert_eq!(results[0].status, EventStatus::Rejected);
                assert_eq!(rec.state, JobState::Cancelled);
            }
            CancelOutcome::Stopping { .. } => {
                assert_eq!(results[0].status, EventStatus::Accepted);
                assert_eq!(rec.state, JobState::Running);
                assert!(rec.cancel_requested);
                assert_eq!(
                    store
                        .stops_for_node(&NodeId("n1".into()))
                        .await
                        .unwrap()
                        .len(),
                    1
                );
                // Let it end, so the next round starts clean.
                store
                    .apply_events(
                        &NodeId("n1".into()),
                        &[AgentEvent::Finished {
                            attempt: AttemptRef {
                                job_id: job.id.0,
                                attempt_id: a.id.0,
                                epoch: 1,
                            },
                            exit_code: None,
                            signal: Some(15),
                            error: None,
                            stopped: true,
                            requeue: false,
                            drained: false,
                        }],
                        T0.plus_secs(3),
                    )
                    .await
                    .unwrap();
                assert_eq!(
                    store.job(job.id).await.unwrap().unwrap().state,
                    JobState::Cancelled
                );
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }
}

/// A heartbeat racing lease expiry: the node is either lost (and the heartbeat then brings it
/// back) or kept (the expiry saw the fresh heartbeat) — never lost with a fresh heartbeat and
/// reported as healthy all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heartbeats_and_lease_expiry_are_ordered() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path()).await;
    let node = NodeId("n1".into());
    let inventory: switchyard_protocol::agent::Inventory = serde_json::from_value(json!({
        "gpus": [], "cpus": 8, "memory_mb": 1024, "simulated": true
    }))
    .unwrap();
    for i in 1..=20 {
        let now = T0.plus_secs(100 * i);
        let hb = {
            let (store, node, inventory) = (store.clone(), node.clone(), inventory.clone());
            tokio::spawn(async move {
                store
                    .heartbeat(&node, &inventory, &[], now)
                    .await
                    .unwrap()
                    .came_back
            })
        };
        let expiry = {
            let store = store.clone();
            tokio::spawn(async move { store.expire_leases(now.plus_secs(-1), now).await.unwrap() })
        };
        let came_back = hb.await.unwrap();
        let expired = expiry.await.unwrap();
        let healthy = store.nodes().await.unwrap()[0].healthy;
        if expired.nodes.is_empty() {
            // The heartbeat came first (or the node was already unhealthy and came back).
            assert!(healthy);
        } else if came_back {
            // Expiry first, then the heartbeat brought it back.
            assert!(healthy);
        } else {
            // Expiry after a heartbeat it did not see: the serial order forbids this.
            panic!("round {i}: node expired after a heartbeat it should have seen");
        }
    }
}

/// Batched heartbeats move a healthy node's lease forward only, never bring a lost node back
/// (that is [`Store::heartbeat`]'s job, which tells the scheduler), and skip unknown nodes.
#[tokio::test]
async fn batched_heartbeats_only_renew_healthy_nodes_and_only_forward() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path()).await;
    let node = NodeId("n1".into());
    let beat = |at: Timestamp, inventory: &str| HeartbeatWrite {
        node: node.clone(),
        inventory_json: inventory.into(),
        at,
    };
    let ghost = HeartbeatWrite {
        node: NodeId("ghost".into()),
        inventory_json: "{}".into(),
        at: T0.plus_secs(10),
    };
    let read = |store: Arc<Store>| async move {
        let n = store.nodes().await.unwrap().remove(0);
        (n.last_heartbeat, n.inventory_json, n.healthy)
    };

    let written = store
        .record_heartbeats(&[beat(T0.plus_secs(10), "{\"v\":1}"), ghost.clone()])
        .await
        .unwrap();
    assert_eq!(written, 1, "the unknown node is skipped");
    assert_eq!(
        read(store.clone()).await,
        (T0.plus_secs(10), "{\"v\":1}".to_string(), true)
    );

    // An older heartbeat (a late flush) changes nothing.
    let written = store
        .record_heartbeats(&[beat(T0.plus_secs(5), "{\"v\":0}")])
        .await
        .unwrap();
    assert_eq!(written, 0);
    assert_eq!(
        read(store.clone()).await,
        (T0.plus_secs(10), "{\"v\":1}".to_string(), true)
    );

    // Lost, then a buffered heartbeat arrives: the node stays lost.
    let expired = store
        .expire_leases(T0.plus_secs(20), T0.plus_secs(20))
        .await
        .unwrap();
    assert_eq!(expired.nodes, vec![node.clone()]);
    let written = store
        .record_heartbeats(&[beat(T0.plus_secs(30), "{\"v\":2}")])
        .await
        .unwrap();
    assert_eq!(written, 0);
    assert!(
        !read(store.clone()).await.2,
        "a batch must not revive a lost node"
    );

    // The direct heartbeat brings it back and says so.
    let inventory: switchyard_protocol::agent::Inventory = serde_json::from_value(json!({
        "gpus": [], "cpus": 8, "memory_mb": 1024, "simulated": true
    }))
    .unwrap();
    let outcome = store
        .heartbeat(&node, &inventory, &[], T0.plus_secs(31))
        .await
        .unwrap();
    assert!(outcome.came_back);
    assert!(read(store.clone()).await.2);

    // Many nodes' worth in one call (more than one statement's chunk) is fine.
    let many: Vec<HeartbeatWrite> = (0..1_200)
        .map(|i| HeartbeatWrite {
            node: NodeId(format!("absent-{i}")),
            inventory_json: "{}".into(),
            at: T0.plus_secs(40),
        })
        .chain([beat(T0.plus_secs(40), "{\"v\":3}")])
        .collect();
    assert_eq!(store.record_heartbeats(&many).await.unwrap(), 1);
    assert_eq!(read(store.clone()).await.0, T0.plus_secs(40));
}

/// PostgreSQL only: the schema uses native types (the SQLite schema has no such types).
#[tokio::test]
async fn postgres_schema_uses_native_types() {
    let dir = tempfile::tempdir().unwrap();
    let Some(url) = test_database_url(dir.path()) else {
        return;
    };
    let _store = test_store(dir.path()).await;
    {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let types: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT table_name::TEXT, column_name::TEXT, data_type::TEXT \
             FROM information_schema.columns WHERE table_schema = 'public' \
             AND (table_name, column_name) IN (('jobs', 'id'), ('jobs', 'submitted_at'), \
             ('jobs', 'cancel_requested'), ('ledger', 'amount_micros'), ('attempts', 'job_id')) \
             ORDER BY 1, 2",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        let types: Vec<_> = types
            .iter()
            .map(|(t, c, d)| format!("{t}.{c}: {d}"))
            .collect();
        assert_eq!(
            types,
            [
                "attempts.job_id: uuid",
                "jobs.cancel_requested: boolean",
                "jobs.id: uuid",
                "jobs.submitted_at: timestamp with time zone",
                "ledger.amount_micros: bigint",
            ]
        );
        pool.close().await;
    }
}

/// Every SQLite migration has its PostgreSQL twin (same version and name), so that both
/// backends reach the same schema version.
#[test]
fn both_backends_have_the_same_migrations() {
    let names = |backend: &str| {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../migrations")
            .join(backend);
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".sql"))
            .collect();
        names.sort();
        names
    };
    assert_eq!(names("sqlite"), names("postgres"));
}

/// The leader lease on its own: one holder at a time, renewals keep the epoch, an expired or
/// restarted holder's lease is taken under the next epoch, and a deposed leader's writes are
/// rejected in their own transaction and change nothing (the fencing epoch).
#[tokio::test]
async fn the_leader_lease_is_exclusive_and_its_epoch_fences_a_deposed_leader() {
    let now = || switchyard_broker::clock::Clock::system().now();
    let dir = tempfile::tempdir().unwrap();
    let a = seeded(dir.path()).await;
    let b = test_store(dir.path()).await;
    let (run_a, run_b) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    let ttl = 400;
    assert_eq!(a.leader().await.unwrap(), None);
    assert_eq!(
        a.acquire_leadership("a", run_a, ttl, now()).await.unwrap(),
        Some(1)
    );
    assert_eq!(
        b.acquire_leadership("b", run_b, ttl, now()).await.unwrap(),
        None
    );
    assert_eq!(
        a.acquire_leadership("a", run_a, ttl, now()).await.unwrap(),
        Some(1)
    );

    // Leading under epoch 1, `a` makes the leader's writes.
    a.fence().hold(1);
    let job = new_job("batch");
    a.insert_job(&job).await.unwrap();
    a.set_holds(&[(job.id, Some("budget_exhausted".into()))])
        .await
        .unwrap();

    // `a` stalls past its TTL; `b` takes over under epoch 2.
    tokio::time::sleep(std::time::Duration::from_millis(ttl as u64 + 300)).await;
    assert_eq!(
        b.acquire_leadership("b", run_b, ttl, now()).await.unwrap(),
        Some(2)
    );
    let lease = b.leader().await.unwrap().unwrap();
    assert_eq!((lease.holder.as_str(), lease.epoch), ("b", 2));

    // `a` has not noticed: its writes are fenced off and change nothing.
    let before = a.job(job.id).await.unwrap().unwrap();
    let fenced = |r: StoreResult<()>| match r {
        Err(StoreError::Fenced {
            held: 1,
            current: 2,
        }) => {}
        other => panic!("expected a fenced write, got {other:?}"),
    };
    fenced(a.set_holds(&[(job.id, None)]).await);
    fenced(
        a.commit_plan(&[attempt_for(&job, T0.plus_secs(600))], &[], T0)
            .await,
    );
    fenced(a.accrue_ledger(T0, 60).await.map(|_| ()));
    fenced(a.expire_leases(T0, T0).await.map(|_| ()));
    let after = a.job(job.id).await.unwrap().unwrap();
    assert_eq!(
        (after.state, after.reason.as_deref(), after.version),
        (before.state, before.reason.as_deref(), before.version)
    );
    assert_eq!(after.state, JobState::Held);
    assert!(a.live_attempts().await.unwrap().is_empty());
    // And it cannot take the lease back while `b` renews it.
    assert_eq!(
        a.acquire_leadership("a", run_a, ttl, now()).await.unwrap(),
        None
    );

    // `b` restarts (same replica, new run): it takes over at once, under a new epoch, so its
    // previous run is fenced off too.
    let run_b2 = uuid::Uuid::now_v7();
    assert_eq!(
        b.acquire_leadership("b", run_b2, ttl, now()).await.unwrap(),
        Some(3)
    );
    // A clean shutdown resigns: `a` leads next without waiting for the TTL.
    b.resign_leadership(run_b).await.unwrap(); // an old run's resignation is a no-op
    assert_eq!(
        a.acquire_leadership("a", run_a, ttl, now()).await.unwrap(),
        None
    );
    b.resign_leadership(run_b2).await.unwrap();
    assert_eq!(
        a.acquire_leadership("a", run_a, ttl, now()).await.unwrap(),
        Some(4)
    );
    a.fence().hold(4);
    a.set_holds(&[(job.id, None)]).await.unwrap();
    assert_eq!(
        a.job(job.id).await.unwrap().unwrap().state,
        JobState::Queued
    );
}

/// `Idempotency-Key`: racing inserts under one key create one job; the key names it to later
/// requests (telling the same request from another), in its scope only, until it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_idempotency_key_makes_one_job_however_many_race_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded(dir.path()).await;
    let key = |scope: &str, hash: &str| IdempotencyKey {
        scope: scope.into(),
        key: "k-1".into(),
        request_hash: hash.into(),
    };
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let (store, k) = (store.clone(), key("team:ml", "h1"));
        tasks.push(tokio::spawn(async move {
            let job = new_job("batch");
            let r = store
                .insert_job_idempotent(&job, &k, T0.plus_secs(-60))
                .await
                .unwrap();
            (job.id, r)
        }));
    }
    let mut inserted = Vec::new();
    let mut existing = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (id, IdempotentInsert::Inserted) => inserted.push(id),
            (_, IdempotentInsert::Existing { job, same_request }) => {
                assert!(same_request);
                existing.push(job);
            }
        }
    }
    assert_eq!(inserted.len(), 1, "{inserted:?}");
    assert_eq!(existing.len(), 19);
    assert!(existing.iter().all(|j| *j == inserted[0]));
    assert!(store.job(inserted[0]).await.unwrap().is_some());
    let since = T0.plus_secs(-60);
    assert_eq!(
        store
            .idempotent_job(&key("team:ml", "h1"), since)
            .await
            .unwrap(),
        Some((inserted[0], true))
    );
    assert_eq!(
        store
            .idempotent_job(&key("team:ml", "other"), since)
            .await
            .unwrap(),
        Some((inserted[0], false))
    );
    // Another team's key of the same name is another key.
    assert_eq!(
        store
            .idempotent_job(&key("team:cv", "h1"), since)
            .await
            .unwrap(),
        None
    );
    // Past its lifetime the key names nothing, and a new request takes it over.
    let later = T0.plus_secs(86_400);
    assert_eq!(
        store
            .idempotent_job(&key("team:ml", "h1"), later)
            .await
            .unwrap(),
        None
    );
    let job = NewJob {
        submitted_at: later,
        ..new_job("batch")
    };
    assert_eq!(
        store
            .insert_job_idempotent(&job, &key("team:ml", "h2"), later)
            .await
            .unwrap(),
        IdempotentInsert::Inserted
    );
    assert_eq!(
        store
            .idempotent_job(&key("team:ml", "h2"), later)
            .await
            .unwrap(),
        Some((job.id, true))
    );
}

/// The database holds token hashes, specs with their environments and the ledger: its file is
/// its owner's only, whether new or found with a looser mode.
#[tokio::test]
async fn the_sqlite_file_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fresh.db");
    let url = format!("sqlite://{}", path.display());
    let store = Store::open_url(&url).await.unwrap();
    drop(store);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    Store::open_url(&url).await.unwrap();
    assert_eq!(mode(&path), 0o600);
}
