#![allow(clippy::unwrap_used)]

use super::*;

fn decl(s: &str) -> GpuDeclaration {
    s.parse().unwrap()
}

fn probe(decls: &[&str], faults: &[&str]) -> FakeProbe {
    let decls: Vec<GpuDeclaration> = decls.iter().map(|d| decl(d)).collect();
    let faults = faults.iter().map(|f| f.parse().unwrap()).collect();
    FakeProbe::with_faults(&decls, "node-a", Arc::new(GpuSim::new()), faults).unwrap()
}

fn attempt(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

#[test]
fn fake_uuids_are_stable_per_agent_and_distinct_across_agents() {
    let a1 = FakeProbe::new(&[decl("2xH100")], "a").gpus().unwrap();
    let a2 = FakeProbe::new(&[decl("2xH100")], "a").gpus().unwrap();
    let b = FakeProbe::new(&[decl("2xH100")], "b").gpus().unwrap();
    let ids = |g: &[GpuInfo]| g.iter().map(|g| g.uuid.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&a1), ids(&a2));
    assert_ne!(a1[0].uuid, a1[1].uuid);
    assert_ne!(a1[0].uuid, b[0].uuid);
}

#[test]
fn idle_gpus_idle() {
    let p = probe(&["2xH100"], &[]);
    let t0 = p.started;
    // Long enough for the temperature to settle.
    let gpus = p.read_at(t0 + Duration::from_secs(600));
    for g in &gpus {
        assert_eq!(g.utilization_pct, Some(0));
        assert_eq!(g.power_w, Some(70.0));
        assert_eq!(g.memory_used_mb, Some(IDLE_MEMORY_MB));
        assert_eq!(g.temperature_c, Some(32));
        assert_eq!(g.sm_clock_mhz, Some(345));
        assert_eq!(g.slowdown_temp_c, Some(90));
        assert_eq!(g.vendor.as_deref(), Some("nvidia"));
        let prof = g.profiling.as_ref().unwrap();
        assert_eq!(prof.sm_active_pct, Some(0.0));
        let h = g.health.as_ref().unwrap();
        assert!(h.xid_events.is_empty() && h.throttle_reasons.is_empty());
        assert_eq!(h.ecc_uncorrected_volatile, Some(0));
    }
}

#[test]
fn a_running_attempt_drives_its_gpus_and_they_warm_with_a_lag() {
    let p = probe(&["4xH100"], &[]);
    let t0 = p.started;
    let hold = p.sim().attach(attempt(1), &[1, 2], Some(50), None);
    let early = p.read_at(t0 + Duration::from_secs(10));
    let late = p.read_at(t0 + Duration::from_secs(600));
    for (i, g) in late.iter().enumerate() {
        let busy = i == 1 || i == 2;
        assert_eq!(g.utilization_pct, Some(if busy { 50 } else { 0 }), "{g:?}");
        if busy {
            // 70 W idle + 50 % of (700 - 70).
            assert_eq!(g.power_w, Some(385.0));
            assert_eq!(
                g.memory_used_mb,
                Some((80.0 * 1024.0 * 0.5_f64).round() as u64)
            );
            // Halfway between idle (32) and full load (72).
            assert_eq!(g.temperature_c, Some(52));
            assert_eq!(g.sm_clock_mhz, Some(345 + (1980 - 345) / 2 + 1));
            assert_eq!(g.profiling.as_ref().unwrap().sm_active_pct, Some(50.0));
            // Ten seconds in, the GPU has warmed only part of the way.
            let t = early[i].temperature_c.unwrap();
            assert!(t > 32 && t < 52, "{t}");
        }
    }
    drop(hold);
    let after = p.read_at(t0 + Duration::from_secs(1200));
    assert!(after.iter().all(|g| g.utilization_pct == Some(0)));
    assert_eq!(after[1].temperature_c, Some(32));
}

#[test]
fn an_attempt_without_a_declared_level_runs_at_the_default() {
    let p = probe(&["1xL4"], &[]);
    let _hold = p.sim().attach(attempt(1), &[0], None, None);
    let g = &p.read_at(p.started + Duration::from_secs(1))[0];
    assert_eq!(g.utilization_pct, Some(DEFAULT_BUSY_PCT as u32));
    // An index the agent does not have is ignored.
    let _other = p.sim().attach(attempt(2), &[7], Some(10), None);
    assert_eq!(p.read_at(p.started).len(), 1);
}

#[test]
fn the_job_sets_its_level_through_the_file_and_bad_content_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let p = probe(&["2xA100-80GB"], &[]);
    let file = create_level_file(dir.path(), Some(40), None).unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), "40");
    let _hold = p
        .sim()
        .attach(attempt(1), &[0], Some(40), Some(file.clone()));
    let level = |p: &FakeProbe| p.read_at(Instant::now())[0].utilization_pct;
    assert_eq!(level(&p), Some(40));
    for (content, want) in [
        ("75\n", 75),
        ("garbage", 75),
        ("101", 75),
        ("-3", 75),
        ("NaN", 75),
        ("12.5", 13),
        ("", 13),
        ("0", 0),
    ] {
        std::fs::write(&file, content).unwrap();
        assert_eq!(level(&p), Some(want), "after writing {content:?}");
    }
    // A link is not followed, a missing file keeps the level.
    std::fs::remove_file(&file).unwrap();
    let target = dir.path().join("elsewhere");
    std::fs::write(&target, "99").unwrap();
    std::os::unix::fs::symlink(&target, &file).unwrap();
    assert_eq!(level(&p), Some(0));
    std::fs::remove_file(&file).unwrap();
    assert_eq!(level(&p), Some(0));
}

#[test]
fn faults_parse_or_are_refused_naming_the_bad_part() {
    let ok: &[(&str, GpuFault)] = &[
        (
            "2:xid=79@30s",
            GpuFault {
                gpu: 2,
                kind: FaultKind::Xid(79),
                after: Duration::from_secs(30),
            },
        ),
        (
            "0:ecc=3@2m",
            GpuFault {
                gpu: 0,
                kind: FaultKind::Ecc(3),
                after: Duration::from_secs(120),
            },
        ),
        (
            "1:overheat@0s",
            GpuFault {
                gpu: 1,
                kind: FaultKind::Overheat(None),
                after: Duration::ZERO,
            },
        ),
        (
            "3:overheat=97@1h",
            GpuFault {
                gpu: 3,
                kind: FaultKind::Overheat(Some(97)),
                after: Duration::from_secs(3600),
            },
        ),
    ];
    for (text, want) in ok {
        assert_eq!(text.parse::<GpuFault>().unwrap(), *want, "{text}");
        assert_eq!(want.to_string().parse::<GpuFault>().unwrap(), *want);
    }
    let bad = [
        ("xid=79@30s", "xid=79@30s"),
        ("x:xid=79@30s", "`x`"),
        ("2:xid=79", "`xid=79`"),
        ("2:xid=79@30", "`30`"),
        ("2:xid=79@soon", "`soon`"),
        ("2:xid=0@1s", "`0`"),
        ("2:xid=abc@1s", "`abc`"),
        ("2:ecc=-1@1s", "`-1`"),
        ("2:overheat=500@1s", "`500`"),
        ("2:melt@1s", "`melt`"),
        ("2:xid@1s", "`xid`"),
    ];
    for (text, part) in bad {
        let err = text.parse::<GpuFault>().unwrap_err();
        assert!(err.contains(part), "{text}: {err}");
        assert!(err.contains(text), "{text}: {err}");
    }
}

#[test]
fn faults_take_effect_after_their_delay() {
    let p = probe(
        &["4xH100"],
        &[
            "0:xid=79@30s",
            "1:ecc=2@0s",
            "2:overheat@1m",
            "3:overheat=80@0s",
        ],
    );
    let t0 = p.started;
    let before = p.read_at(t0 + Duration::from_secs(10));
    let health = |g: &GpuInfo| g.health.clone().unwrap();
    assert!(health(&before[0]).xid_events.is_empty());
    assert_eq!(health(&before[1]).ecc_uncorrected_volatile, Some(2));
    assert!(health(&before[2]).throttle_reasons.is_empty());
    assert!(before[2].temperature_c.unwrap() < 90);
    // overheat=80 is below the H100's 90 °C threshold: hot, not throttled.
    assert_eq!(before[3].temperature_c, Some(80));
    assert!(health(&before[3]).throttle_reasons.is_empty());

    let after = p.read_at(t0 + Duration::from_secs(61));
    assert_eq!(health(&after[0]).xid_events, vec![79]);
    assert_eq!(health(&after[1]).ecc_uncorrected_volatile, Some(2));
    assert_eq!(after[2].temperature_c, Some(95));
    assert_eq!(
        health(&after[2]).throttle_reasons,
        vec!["hw_thermal_slowdown"]
    );
    // An XID is reported once: the heartbeat keeps it until the broker has it.
    let later = p.read_at(t0 + Duration::from_secs(62));
    assert!(health(&later[0]).xid_events.is_empty());
    assert_eq!(later[2].temperature_c, Some(95));
}

#[test]
fn figures_have_a_generic_fallback_and_vendors_are_known() {
    assert_eq!(figures("MYSTERY"), GENERIC);
    assert!(figures("H100").tdp_w > figures("L4").tdp_w);
    assert_eq!(vendor_of("MI300X"), "amd");
    assert_eq!(vendor_of("H100"), "nvidia");
    assert_eq!(vendor_of("TPU-V5E"), "google");
    let g = &FakeProbe::new(&[decl("1xMI300X-192GB")], "a")
        .gpus()
        .unwrap()[0];
    assert_eq!(g.vendor.as_deref(), Some("amd"));
    assert_eq!(g.slowdown_temp_c, Some(95));
}
