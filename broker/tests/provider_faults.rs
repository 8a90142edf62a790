//! Provider faults against the burst controller, with the scripted fake provider: launches that
//! hang past the provider-call timeout, answers lost after the provider did the work (on launch
//! and on terminate), quota and capacity errors in every region, and terminates that fail.
//! Each test checks the same invariants: the job runs exactly once, no second machine is
//! started for one need, nothing is left running at the provider, and retries are spaced.
//! Each prints one `FIGURE` line with what it measured (run with `--nocapture`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_core::PoolId;
use switchyard_providers::fake::{FakeOutcome, FakeProvider};

/// The provider-call timeout these tests run with (the default is 60 s).
const CALL_TIMEOUT_MS: u64 = 500;
/// Longer than any test: a hang that only the broker's timeout ends.
const FOREVER: Duration = Duration::from_secs(3600);

/// [`spawn_two_clouds`] with a short provider-call timeout.
async fn spawn(
    tweak: impl FnOnce(&mut switchyard_broker::config::Config),
) -> (TestApp, Arc<FakeProvider>) {
    spawn_two_clouds(|c| {
        c.provider_call_timeout_ms = CALL_TIMEOUT_MS;
        tweak(c);
    })
    .await
}

async fn submit(app: &TestApp, dev: &str, name: &str) -> String {
    let r = app.submit(dev, urgent(name)).await;
    assert_eq!(r.status, 201, "{}", r.body);
    r.body["id"].as_str().unwrap().to_string()
}

/// Plays the instance's agent with `enrol` (the token its machine was given): enrols, takes the
/// lease, runs the job to exit 0. Returns once the job has succeeded; asserts it ran once.
async fn run_job_on(app: &TestApp, dev: &str, id: &str, enrol: &str) -> TestAgent {
    let agent = app.agent_with_token(enrol, 8).await;
    app.wait_for_job(dev, id, Duration::from_secs(15), |j| j["state"] == "placed")
        .await;
    let w = work(app, &agent, 5).await;
    let leases = w["leases"].as_array().unwrap();
    assert_eq!(leases.len(), 1, "one lease: {w}");
    let attempt = leases[0]["attempt"].clone();
    let results = events(
        app,
        &agent,
        json!([
            {"type": "started", "attempt": attempt, "pid": 1},
            {"type": "finished", "attempt": attempt, "exit_code": 0, "signal": null, "error": null, "stopped": false}
        ]),
    )
    .await;
    assert_eq!(results, ["accepted", "accepted"]);
    let job = app
        .wait_for_job(dev, id, Duration::from_secs(10), |j| {
            j["state"] == "succeeded"
        })
        .await;
    assert_eq!(job["attempts"], 1, "the job ran exactly once: {job}");
    agent
}

/// Waits until the provider runs nothing and the broker knows no live instance; returns the
/// instances as the broker lists them.
async fn nothing_left_running(app: &TestApp, fake: &FakeProvider, secs: u64) -> Vec<Value> {
    eventually(
        "every instance terminated, here and there",
        secs,
        async || {
            let all = instances(app).await;
            (fake.running().is_empty() && all.iter().all(|i| i["state"] == "terminated"))
                .then_some(all)
        },
    )
    .await
}

fn keys(fake: &FakeProvider) -> Vec<String> {
    fake.launches()
        .into_iter()
        .map(|l| l.instance_key)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_that_hangs_past_the_call_timeout_is_retried_under_its_key_and_runs_once() {
    let (app, fake) = spawn(|_| {}).await;
    fake.script(&PoolId(CHEAP.into()), [FakeOutcome::Hang(FOREVER)]);
    let dev = app.token("developer", Some("ml")).await;
    let t0 = Instant::now();
    let id = submit(&app, &dev, "hang").await;
    let inst = eventually("a booting instance", 20, async || {
        instances(&app)
            .await
            .into_iter()
            .find(|i| i["state"] == "booting")
    })
    .await;
    let recovered = t0.elapsed();
    let launches = fake.launches();
    assert_eq!(
        launches.len(),
        2,
        "the hung call, then one retry: {launches:?}"
    );
    assert!(keys(&fake).iter().all(|k| *k == launches[0].instance_key));
    assert_eq!(fake.started().len(), 1, "one machine");
    assert_eq!(instances(&app).await.len(), 1, "one instance for one need");
    assert_eq!(inst["pool"], CHEAP, "a hang is not a capacity failure");
    run_job_on(&app, &dev, &id, &launches[1].enrolment_token).await;
    nothing_left_running(&app, &fake, 20).await;
    println!(
        "FIGURE hang: launch calls {}, machines {}, runs 1, leaked 0, booting {:.2} s after submit (call timeout {CALL_TIMEOUT_MS} ms)",
        fake.launches().len(),
        fake.started().len(),
        recovered.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_answered_after_the_timeout_starts_one_machine_and_the_job_runs_once() {
    let (app, fake) = spawn(|_| {}).await;
    // The machine starts at once; its answer comes long after the broker stopped waiting.
    fake.script(&PoolId(CHEAP.into()), [FakeOutcome::SlowAnswer(FOREVER)]);
    let dev = app.token("developer", Some("ml")).await;
    let t0 = Instant::now();
    let id = submit(&app, &dev, "slow-answer").await;
    let inst = eventually("a booting instance", 20, async || {
        instances(&app)
            .await
            .into_iter()
            .find(|i| i["state"] == "booting")
    })
    .await;
    let recovered = t0.elapsed();
    let launches = fake.launches();
    assert_eq!(launches.len(), 2, "{launches:?}");
    assert!(keys(&fake).iter().all(|k| *k == launches[0].instance_key));
    let started = fake.started();
    assert_eq!(
        started.len(),
        1,
        "the retry found the first machine: {started:?}"
    );
    assert_eq!(inst["provider_id"], started[0].provider_id.as_str());
    // The machine boots with the token of the call that started it, which still enrols it.
    run_job_on(&app, &dev, &id, &launches[0].enrolment_token).await;
    nothing_left_running(&app, &fake, 20).await;
    println!(
        "FIGURE slow-answer: launch calls {}, machines {}, runs 1, leaked 0, booting {:.2} s after submit",
        fake.launches().len(),
        fake.started().len(),
        recovered.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_launch_answer_is_retried_under_its_key_and_starts_one_machine() {
    let (app, fake) = spawn(|_| {}).await;
    fake.script(&PoolId(CHEAP.into()), [FakeOutcome::LostAnswer]);
    let dev = app.token("developer", Some("ml")).await;
    let t0 = Instant::now();
    let id = submit(&app, &dev, "lost-answer").await;
    eventually("a booting instance", 20, async || {
        instances(&app)
            .await
            .into_iter()
            .find(|i| i["state"] == "booting")
    })
    .await;
    let recovered = t0.elapsed();
    let launches = fake.launches();
    assert_eq!(launches.len(), 2, "{launches:?}");
    assert!(keys(&fake).iter().all(|k| *k == launches[0].instance_key));
    assert_eq!(fake.started().len(), 1);
    assert_eq!(instances(&app).await.len(), 1);
    run_job_on(&app, &dev, &id, &launches[0].enrolment_token).await;
    nothing_left_running(&app, &fake, 20).await;
    println!(
        "FIGURE lost-answer: launch calls {}, machines {}, runs 1, leaked 0, booting {:.2} s after submit",
        fake.launches().len(),
        fake.started().len(),
        recovered.as_secs_f64()
    );
}

/// The machine of a lost answer boots and its agent enrols before the broker retried the
/// launch: the broker never learned the provider's id or the launch time. It must still run the
/// job once, end the machine when idle (past the minimum billed time), and terminate it at the
/// provider — found by its tag — before marking it ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_that_enrols_before_its_lost_launch_answer_is_retried_is_not_leaked() {
    let (app, fake) = spawn(|c| c.min_billed_s = 1).await;
    fake.script(&PoolId(CHEAP.into()), [FakeOutcome::LostAnswer]);
    let dev = app.token("developer", Some("ml")).await;
    let id = submit(&app, &dev, "early-enrol").await;
    let first = eventually("a launch", 20, async || fake.launches().first().cloned()).await;
    let t0 = Instant::now();
    run_job_on(&app, &dev, &id, &first.enrolment_token).await;
    let all = nothing_left_running(&app, &fake, 20).await;
    let idle_ended = t0.elapsed();
    assert_eq!(all.len(), 1, "{all:?}");
    let started = fake.started();
    assert_eq!(started.len(), 1, "{started:?}");
    assert!(
        fake.terminations().contains(&started[0].provider_id),
        "terminated at the provider: {:?}",
        fake.terminations()
    );
    assert!(
        all[0]["end_reason"]
            .as_str()
            .unwrap_or("")
            .starts_with("idle: no job for"),
        "ended as idle, not reaped: {}",
        all[0]
    );
    // Billed, from its enrolment at the latest (the store had no launch time for it).
    let ledger = app.app.store.ledger_total().await.unwrap();
    assert!(
        ledger > Default::default(),
        "the instance was never billed: {ledger}"
    );
    println!(
        "FIGURE early-enrol: launch calls {}, machines {}, runs 1, leaked 0, idle machine terminated {:.2} s after the job started (idle_ttl 1 s, min_billed 1 s), ledger {ledger} µ$",
        fake.launches().len(),
        started.len(),
        idle_ended.as_secs_f64()
    );
}

/// The launch's answer is lost, then the retries are throttled until the broker gives the
/// instance up. Giving up would send the job to a second machine; the broker finds the first
/// by its tag instead and adopts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_given_up_after_a_lost_answer_adopts_the_machine_instead_of_starting_another() {
    let (app, fake) = spawn(|c| c.launch_attempts = 2).await;
    fake.script(
        &PoolId(CHEAP.into()),
        [FakeOutcome::LostAnswer, FakeOutcome::Throttled],
    );
    let dev = app.token("developer", Some("ml")).await;
    let t0 = Instant::now();
    let id = submit(&app, &dev, "adopt").await;
    let inst = eventually("a booting instance", 20, async || {
        instances(&app)
            .await
            .into_iter()
            .find(|i| i["state"] == "booting")
    })
    .await;
    let recovered = t0.elapsed();
    // Settle: no second instance is requested afterwards.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let all = instances(&app).await;
    assert_eq!(all.len(), 1, "no second instance for the job: {all:?}");
    let started = fake.started();
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(inst["provider_id"], started[0].provider_id.as_str());
    let launches = fake.launches();
    assert_eq!(launches.len(), 2, "{launches:?}");
    run_job_on(&app, &dev, &id, &launches[0].enrolment_token).await;
    nothing_left_running(&app, &fake, 20).await;
    println!(
        "FIGURE adopt: launch calls {}, machines {}, runs 1, leaked 0, adopted (booting) {:.2} s after submit",
        launches.len(),
        started.len(),
        recovered.as_secs_f64()
    );
}

/// Quota in one region, capacity errors in the other, three rounds each: the job waits (with
/// its reason saying why), each pool gets one launch per back-off period — no storm — and the
/// job runs once capacity returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_and_capacity_errors_everywhere_back_off_every_pool_and_the_job_waits_then_runs() {
    const BACKOFF_S: u64 = 2;
    const ROUNDS: usize = 3;
    let (app, fake) = spawn(|c| c.pool_backoff_s = BACKOFF_S).await;
    fake.script(&PoolId(CHEAP.into()), vec![FakeOutcome::Quota; ROUNDS]);
    fake.script(&PoolId(DEAR.into()), vec![FakeOutcome::Capacity; ROUNDS]);
    let dev = app.token("developer", Some("ml")).await;
    let t0 = Instant::now();
    let id = submit(&app, &dev, "no-capacity").await;

    // Watch every launch call as it happens, and what the job says while it waits.
    let mut seen: Vec<(String, Duration)> = Vec::new();
    let mut reasons: Vec<String> = Vec::new();
    let booting = loop {
        for l in fake.launches().into_iter().skip(seen.len()) {
            seen.push((l.pool.to_string(), t0.elapsed()));
        }
        let job = app.job(&dev, &id).await.body;
        if let Some(r) = job["reason"].as_str()
            && reasons.last().map(String::as_str) != Some(r)
        {
            reasons.push(r.to_string());
        }
        assert_ne!(job["state"], "failed", "{job}");
        if let Some(i) = instances(&app)
            .await
            .into_iter()
            .find(|i| i["state"] == "booting")
        {
            break i;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(40),
            "no launch succeeded: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let recovered = t0.elapsed();
    for l in fake.launches().into_iter().skip(seen.len()) {
        seen.push((l.pool.to_string(), t0.elapsed()));
    }
    let per_pool = |pool: &str| -> Vec<Duration> {
        seen.iter()
            .filter(|(p, _)| p == pool)
            .map(|(_, t)| *t)
            .collect()
    };
    let (cheap, dear) = (per_pool(CHEAP), per_pool(DEAR));
    // Each failure costs its pool exactly one call per back-off period.
    for (pool, calls) in [(CHEAP, &cheap), (DEAR, &dear)] {
        for pair in calls.windows(2) {
            let gap = pair[1] - pair[0];
            assert!(
                gap >= Duration::from_millis(BACKOFF_S * 1000 - 100),
                "{pool} called again {gap:?} after a capacity/quota error: {seen:?}"
            );
        }
    }
    assert_eq!(
        cheap.len() + dear.len(),
        2 * ROUNDS + 1,
        "every scripted failure, then one success: {seen:?}"
    );
    assert_eq!(fake.started().len(), 1);
    assert_eq!(booting["pool"], CHEAP, "the cheaper pool, once it has room");
    let said: Vec<&String> = reasons
        .iter()
        .filter(|r| r.contains("VcpuLimitExceeded") || r.contains("InsufficientInstanceCapacity"))
        .collect();
    assert!(
        !said.is_empty(),
        "while waiting, the job's reason names the provider's refusal: {reasons:?}"
    );
    let launches = fake.launches();
    let last = launches.last().unwrap();
    run_job_on(&app, &dev, &id, &last.enrolment_token).await;
    nothing_left_running(&app, &fake, 20).await;
    let gaps = |calls: &[Duration]| -> String {
        calls
            .windows(2)
            .map(|p| format!("{:.2}", (p[1] - p[0]).as_secs_f64()))
            .collect::<Vec<_>>()
            .join("/")
    };
    println!(
        "FIGURE no-capacity: launch calls {} ({} in {CHEAP}, gaps {} s; {} in {DEAR}, gaps {} s; back-off {BACKOFF_S} s), machines {}, runs 1, leaked 0, booting {:.2} s after submit; reasons seen: {reasons:?}",
        launches.len(),
        cheap.len(),
        gaps(&cheap),
        dear.len(),
        gaps(&dear),
        fake.started().len(),
        recovered.as_secs_f64()
    );
}

/// The idle instance's terminate fails every way there is — a 5xx, throttling, a hang past the
/// call timeout, and an answer lost after the machine was ended — and is retried until the
/// provider confirms (or lists the machine as gone). The instance is never marked ended while
/// it still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_failures_are_retried_until_the_instance_is_gone() {
    let (app, fake) = spawn(|_| {}).await;
    fake.script_terminate([
        FakeOutcome::Transient,
        FakeOutcome::Throttled,
        FakeOutcome::Hang(FOREVER),
        FakeOutcome::LostAnswer,
    ]);
    let dev = app.token("developer", Some("ml")).await;
    let id = submit(&app, &dev, "sticky").await;
    let launch = eventually("a launch", 20, async || fake.launches().first().cloned()).await;
    run_job_on(&app, &dev, &id, &launch.enrolment_token).await;
    let t0 = Instant::now();
    let first_terminate = eventually("a terminate call", 20, async || {
        (!fake.terminations().is_empty()).then(Instant::now)
    })
    .await;
    // Until the provider has ended the machine, the broker must not call it ended.
    let all = loop {
        let all = instances(&app).await;
        let running = fake.running();
        if !running.is_empty() {
            assert!(
                all.iter().all(|i| i["state"] != "terminated"),
                "marked ended while still running: {all:?} {running:?}"
            );
        } else if all.iter().all(|i| i["state"] == "terminated") {
            break all;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "never ended: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let gone = first_terminate.elapsed();
    let calls = fake.terminations();
    // Four failures; the fourth ended the machine but lost the answer, so either the next
    // terminate call succeeds or the reaper sees the machine gone first.
    assert!(calls.len() >= 4, "four failures, then success: {calls:?}");
    assert!(calls.iter().all(|c| *c == calls[0]), "{calls:?}");
    let ended_as = all[0]["end_reason"].as_str().unwrap_or("").to_string();
    assert!(
        ended_as.contains("idle") || ended_as.contains("gone"),
        "{ended_as}"
    );
    assert_eq!(fake.started().len(), 1);
    println!(
        "FIGURE terminate-failures: terminate calls {}, launches {}, machines {}, leaked 0, ended {:.2} s after the first terminate call (as {ended_as:?})",
        calls.len(),
        fake.launches().len(),
        fake.started().len(),
        gone.as_secs_f64()
    );
}

/// A stray tagged machine whose terminate first hangs, then fails: the reaper (every 5 s)
/// retries until it is gone, and a hung terminate holds up no launch meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stray_whose_terminate_hangs_or_fails_is_reaped_on_a_later_pass() {
    let (app, fake) = spawn(|_| {}).await;
    let t0 = Instant::now();
    let stray = fake.add_stray(&PoolId(CHEAP.into()), "not-from-this-broker");
    fake.script_terminate_of(&stray, [FakeOutcome::Hang(FOREVER), FakeOutcome::Transient]);
    let dev = app.token("developer", Some("ml")).await;
    let id = submit(&app, &dev, "beside-a-stray").await;
    // The job's launch is not held up by the hung terminate.
    let launch = eventually("a launch", 10, async || fake.launches().first().cloned()).await;
    run_job_on(&app, &dev, &id, &launch.enrolment_token).await;
    eventually("the stray to be gone", 30, async || {
        (!fake.running().iter().any(|i| i.provider_id == stray)).then_some(())
    })
    .await;
    let reaped = t0.elapsed();
    let stray_calls = fake.terminations().iter().filter(|c| **c == stray).count();
    assert!(stray_calls >= 3, "{:?}", fake.terminations());
    nothing_left_running(&app, &fake, 20).await;
    println!(
        "FIGURE stray-terminate-failures: terminate calls on the stray {stray_calls}, launches {}, machines {}, runs 1, leaked 0, stray gone {:.2} s after it appeared (reaper every 5 s)",
        fake.launches().len(),
        fake.started().len(),
        reaped.as_secs_f64()
    );
}

/// A launch retried against an API that ignores idempotency tokens (moto does; a real EC2
/// client token prevents it) leaves two machines under one instance key. The reaper keeps the
/// one the broker recorded and terminates the other; the job runs once on the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_machine_under_a_known_key_is_reaped_and_the_first_kept() {
    let (app, fake) = spawn(|c| c.idle_ttl_s = 600).await;
    let dev = app.token("developer", Some("ml")).await;
    let id = submit(&app, &dev, "duplicate").await;
    let inst = eventually("a booting instance", 20, async || {
        instances(&app)
            .await
            .into_iter()
            .find(|i| i["state"] == "booting")
    })
    .await;
    let launch = fake.launches()[0].clone();
    let t0 = Instant::now();
    let duplicate = fake.add_stray(&PoolId(CHEAP.into()), &launch.instance_key);
    run_job_on(&app, &dev, &id, &launch.enrolment_token).await;
    eventually("the duplicate to be reaped", 20, async || {
        (!fake.running().iter().any(|i| i.provider_id == duplicate)).then_some(())
    })
    .await;
    let reaped = t0.elapsed();
    let running = fake.running();
    assert_eq!(running.len(), 1, "{running:?}");
    assert_eq!(inst["provider_id"], running[0].provider_id.as_str());
    let now = instances(&app).await;
    assert_eq!(now.len(), 1);
    assert_eq!(
        now[0]["state"], "ready",
        "the recorded machine is kept: {}",
        now[0]
    );
    assert!(
        !fake.terminations().contains(&running[0].provider_id),
        "{:?}",
        fake.terminations()
    );
    println!(
        "FIGURE duplicate: launches {}, machines {} (1 duplicate added), runs 1, leaked 0, duplicate gone {:.2} s after it appeared (reaper every 5 s)",
        fake.launches().len(),
        fake.started().len() + 1,
        reaped.as_secs_f64()
    );
}
