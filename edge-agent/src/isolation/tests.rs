#![allow(clippy::unwrap_used)]

use super::*;
use std::os::unix::process::ExitStatusExt;
use uuid::Uuid;

fn lease() -> Lease {
    Lease {
        expected_gpu_utilization_pct: None,
        attempt: AttemptRef {
            job_id: Uuid::from_u128(1),
            attempt_id: Uuid::from_u128(2),
            epoch: 1,
        },
        command: vec!["true".into()],
        env: Default::default(),
        gpus: vec![1, 3],
        grace_s: 0,
        traceparent: None,
        serve: None,
    }
}

fn as_strings(env: &BTreeMap<OsString, OsString>) -> Vec<(String, String)> {
    env.iter()
        .map(|(k, v)| (k.to_string_lossy().into(), v.to_string_lossy().into()))
        .collect()
}

fn root() -> bool {
    if geteuid().is_root() {
        return true;
    }
    eprintln!("skipped: needs root (CI runs as root)");
    false
}

#[test]
fn a_job_env_is_the_fixed_base_and_the_jobs_own() {
    let env = job_env(&lease(), Path::new("/w/2"), &[], None);
    assert_eq!(
        as_strings(&env),
        [
            ("CUDA_VISIBLE_DEVICES", "1,3"),
            ("HOME", "/w/2"),
            ("LANG", "C.UTF-8"),
            ("PATH", JOB_PATH),
            (
                "SWITCHYARD_ATTEMPT_ID",
                "00000000-0000-0000-0000-000000000002"
            ),
            ("SWITCHYARD_JOB_ID", "00000000-0000-0000-0000-000000000001"),
            ("TZ", "UTC"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
    );
}

#[test]
fn the_job_overrides_the_base_and_pass_env_but_never_the_agents_variables() {
    let mut l = lease();
    for (k, v) in [
        ("PATH", "/opt/bin"),
        ("FOO", "bar"),
        ("HF_HOME", "/job/hf"),
        ("CUDA_VISIBLE_DEVICES", "0,1,2,3"),
        ("SWITCHYARD_JOB_ID", "forged"),
        ("TRACEPARENT", "00-forged"),
    ] {
        l.env.insert(k.into(), v.into());
    }
    let pass = [
        (OsString::from("HF_HOME"), OsString::from("/agent/hf")),
        (
            OsString::from("HTTP_PROXY"),
            OsString::from("http://proxy:3128"),
        ),
    ];
    let env = as_strings(&job_env(&l, Path::new("/w/2"), &pass, None));
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    assert_eq!(get("PATH"), Some("/opt/bin"));
    assert_eq!(get("FOO"), Some("bar"));
    assert_eq!(get("HF_HOME"), Some("/job/hf"), "the job's own env wins");
    assert_eq!(get("HTTP_PROXY"), Some("http://proxy:3128"));
    assert_eq!(get("CUDA_VISIBLE_DEVICES"), Some("1,3"));
    assert_eq!(
        get("SWITCHYARD_JOB_ID"),
        Some("00000000-0000-0000-0000-000000000001")
    );
    assert_eq!(get("TRACEPARENT"), None, "no trace context: none forged");
    l.traceparent = Some("00-abc-def-01".into());
    let env = as_strings(&job_env(&l, Path::new("/w/2"), &pass, None));
    assert!(env.contains(&("TRACEPARENT".into(), "00-abc-def-01".into())));
}

#[test]
fn a_replica_gets_the_agents_port_and_a_batch_job_keeps_its_own() {
    let mut l = lease();
    l.env.insert("PORT".into(), "1234".into());
    let env = as_strings(&job_env(&l, Path::new("/w/2"), &[], Some(41000)));
    assert!(env.contains(&("PORT".into(), "41000".into())), "{env:?}");
    assert!(!env.contains(&("PORT".into(), "1234".into())));
    let env = as_strings(&job_env(&l, Path::new("/w/2"), &[], None));
    assert!(env.contains(&("PORT".into(), "1234".into())), "{env:?}");
    let env = as_strings(&job_env(&lease(), Path::new("/w/2"), &[], None));
    assert!(env.iter().all(|(k, _)| k != "PORT"), "{env:?}");
}

#[test]
fn status_lines_give_the_four_uids_of_live_processes() {
    let status = "Name:\tsleep\nState:\tS (sleeping)\nTgid:\t7\nUid:\t20001\t20001\t20001\t20002\nGid:\t5\t5\t5\t5\n";
    assert_eq!(parse_status(status), Some([20001, 20001, 20001, 20002]));
    let zombie = "Name:\tsh\nState:\tZ (zombie)\nUid:\t20001\t20001\t20001\t20001\n";
    assert_eq!(parse_status(zombie), None);
    assert_eq!(parse_status("Name:\tx\nUid:\t1\t2\n"), None);
    let me = std::fs::read_to_string("/proc/self/status").unwrap();
    assert_eq!(parse_status(&me).unwrap()[1], geteuid().as_raw());
}

#[test]
fn a_job_directory_is_private_and_removed_with_everything_in_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("jobs");
    let sandbox = Sandbox::new(&root, None, Vec::new()).unwrap();
    assert!(!sandbox.is_isolated());
    let meta = std::fs::metadata(&root).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o711, "traversable, not listable");
    let space = sandbox.enter(&lease().attempt).unwrap();
    assert_eq!(
        space.dir(),
        sandbox.work_root().join(Uuid::from_u128(2).to_string())
    );
    assert_eq!(space.uid(), None);
    assert_eq!(
        std::fs::metadata(space.dir()).unwrap().mode() & 0o777,
        0o700
    );
    std::fs::create_dir_all(space.dir().join("a/b")).unwrap();
    std::fs::write(space.dir().join("a/b/c"), "x").unwrap();
    // A link out of the directory: removing the directory must not follow it.
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), "x").unwrap();
    std::os::unix::fs::symlink(&outside, space.dir().join("link")).unwrap();
    let dir = space.dir().to_path_buf();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert_eq!(rt.block_on(space.release()), 0);
    assert!(!dir.exists());
    assert!(outside.join("keep").exists());
}

#[test]
fn a_work_root_that_is_someone_elses_or_a_link_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = Sandbox::new(&link, None, Vec::new()).unwrap_err();
    assert!(err.to_string().contains("not a directory"), "{err}");
    let file = tmp.path().join("file");
    std::fs::write(&file, "").unwrap();
    assert!(Sandbox::new(&file, None, Vec::new()).is_err());
    if root() {
        std::os::unix::fs::chown(&target, Some(20_999), None).unwrap();
        let err = Sandbox::new(&target, None, Vec::new()).unwrap_err();
        assert!(err.to_string().contains("owned by uid 20999"), "{err}");
    }
}

#[test]
fn account_uids_are_read_from_passwd() {
    let uids = account_uids();
    assert!(uids.contains(&0), "root is an account: {uids:?}");
}

/// Root only: two attempts hold two different uids, never the agent's; each directory belongs
/// to its uid; a process left running as the uid is killed on release, and the uid is free
/// again afterwards.
#[tokio::test]
async fn isolated_attempts_get_uids_of_their_own_and_leave_nothing_behind() {
    if !root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), Permissions::from_mode(0o711)).unwrap();
    let range = UidRange {
        start: 20_900,
        end: 20_999,
    };
    let sandbox = Sandbox::new(&tmp.path().join("jobs"), Some(range), Vec::new()).unwrap();
    assert!(sandbox.is_isolated());
    let mut a_ref = lease().attempt;
    a_ref.attempt_id = Uuid::now_v7();
    let mut b_ref = a_ref.clone();
    b_ref.attempt_id = Uuid::now_v7();
    let a = sandbox.enter(&a_ref).unwrap();
    let b = sandbox.enter(&b_ref).unwrap();
    let (ua, ub) = (a.uid().unwrap(), b.uid().unwrap());
    assert_ne!(ua, ub);
    assert!(range.contains(ua) && range.contains(ub));
    let meta = std::fs::metadata(a.dir()).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o777),
        (ua, ua, 0o700)
    );

    // Something the job left behind, in a session of its own.
    let mut escaped = tokio::process::Command::new("setsid")
        .args(["sleep", "300"])
        .uid(ua)
        .gid(ua)
        .current_dir(a.dir())
        .spawn()
        .unwrap();
    let pid = escaped.id().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_of(ua).contains(&pid) {
        assert!(Instant::now() < deadline, "the process never ran as {ua}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Its uid is busy: a third claim gets yet another one.
    let mut c_ref = a_ref.clone();
    c_ref.attempt_id = Uuid::now_v7();
    let c = sandbox.enter(&c_ref).unwrap();
    assert!(![ua, ub].contains(&c.uid().unwrap()));

    let dir = a.dir().to_path_buf();
    assert!(a.release().await >= 1);
    let status = escaped.wait().await.unwrap();
    assert_eq!(status.signal(), Some(9));
    assert!(processes_of(ua).is_empty());
    assert!(!dir.exists());
    b.release().await;
    c.release().await;
}

/// Root only: a range of one uid runs one job at a time; the second is refused with a clear
/// message until the first gives the uid back.
#[tokio::test]
async fn a_full_uid_range_refuses_the_next_job() {
    if !root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), Permissions::from_mode(0o711)).unwrap();
    let range = UidRange {
        start: 20_898,
        end: 20_898,
    };
    let sandbox = Sandbox::new(&tmp.path().join("jobs"), Some(range), Vec::new()).unwrap();
    let first = sandbox.enter(&lease().attempt).unwrap();
    let mut other = lease().attempt;
    other.attempt_id = Uuid::now_v7();
    let err = sandbox.enter(&other).unwrap_err();
    assert!(err.contains("no free job uid in 20898-20898"), "{err}");
    first.release().await;
    let again = sandbox.enter(&other).unwrap();
    assert_eq!(again.uid(), Some(20_898));
    again.release().await;
}

#[test]
fn a_range_holding_the_agents_uid_is_refused() {
    if !root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let range = UidRange { start: 0, end: 10 };
    assert!(Sandbox::new(&tmp.path().join("jobs"), Some(range), Vec::new()).is_err());
}
