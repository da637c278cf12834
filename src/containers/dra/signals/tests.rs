use super::*;

fn addr() -> PciAddress {
    "0000:01:00.0".parse().unwrap()
}

fn d0() -> Readings {
    Readings {
        power_state: Some("D0".into()),
        vendor: Some(0x10de),
        ..Default::default()
    }
}

#[test]
fn the_aer_totals_are_read_from_the_kernels_files() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sys/bus/pci/devices/0000:01:00.0");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("power_state"), "D0\n").unwrap();
    std::fs::write(dir.join("config"), [0xde, 0x10, 0xb8, 0x1e]).unwrap();
    std::fs::write(
            dir.join("aer_dev_fatal"),
            "Undefined 0\nDLP 1\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\nUnxCmplt 0\nRxOF 0\nMalfTLP 0\nECRC 0\nUnsupReq 0\nACSViol 0\nTOTAL_ERR_FATAL 1\n",
        )
        .unwrap();
    std::fs::write(
        dir.join("aer_dev_nonfatal"),
        "Undefined 0\nCmpltTO 2\nTOTAL_ERR_NONFATAL 2\n",
    )
    .unwrap();
    let r = read(&HostRoot::new(t.path()), &addr());
    assert_eq!(
        r,
        Readings {
            power_state: Some("D0".into()),
            vendor: Some(0x10de),
            aer_fatal: Some(1),
            aer_nonfatal: Some(2),
        }
    );
    // Not in D0: config space is not read (a read would wake a suspended function).
    std::fs::write(dir.join("power_state"), "D3hot\n").unwrap();
    assert_eq!(read(&HostRoot::new(t.path()), &addr()).vendor, None);
    // A kernel without AER, or a function without the capability: no counts.
    std::fs::remove_file(dir.join("aer_dev_fatal")).unwrap();
    assert_eq!(read(&HostRoot::new(t.path()), &addr()).aer_fatal, None);
}

#[test]
fn d3cold_a_dead_config_space_and_a_power_error_are_problems_until_they_clear() {
    let mut t = Tracker::default();
    let now = Instant::now();
    let a = addr();
    assert_eq!(t.judge(&a, Some("nvidia"), false, &d0(), now), None);
    let cold = Readings {
        power_state: Some("D3cold".into()),
        ..Default::default()
    };
    assert_eq!(t.judge(&a, None, false, &cold, now).unwrap().code, "d3cold");
    assert_eq!(
        t.judge(&a, Some("vfio-pci"), true, &cold, now).unwrap().code,
        "d3cold"
    );
    // A host driver's runtime power management may power its function off: not a problem.
    assert_eq!(t.judge(&a, Some("nvidia"), false, &cold, now), None);
    let dead = Readings {
        vendor: Some(0xffff),
        ..d0()
    };
    let p = t.judge(&a, Some("nvidia"), false, &dead, now).unwrap();
    assert_eq!(p.code, "no-config");
    assert!(
        p.message.contains("0000:01:00.0 does not answer"),
        "{}",
        p.message
    );
    let err = Readings {
        power_state: Some("error".into()),
        ..Default::default()
    };
    assert_eq!(
        t.judge(&a, Some("nvidia"), false, &err, now).unwrap().code,
        "power-error"
    );
    assert_eq!(t.judge(&a, Some("nvidia"), false, &d0(), now), None);
}

#[test]
fn an_aer_rise_is_a_problem_for_the_hold_time_after_the_last_one() {
    let mut t = Tracker::default();
    let t0 = Instant::now();
    let a = addr();
    let aer = |f, n| Readings {
        aer_fatal: Some(f),
        aer_nonfatal: Some(n),
        ..d0()
    };
    assert_eq!(t.judge(&a, Some("nvidia"), false, &aer(0, 0), t0), None);
    let p = t
        .judge(
            &a,
            Some("nvidia"),
            false,
            &aer(0, 1),
            t0 + Duration::from_secs(10),
        )
        .unwrap();
    assert_eq!(p.code, "aer");
    assert!(p.message.contains("0 fatal, 1 non-fatal"), "{}", p.message);
    // No new error: still unhealthy inside the hold, healthy after it.
    let quiet = t0 + Duration::from_secs(10) + AER_HOLD - Duration::from_secs(1);
    assert_eq!(
        t.judge(&a, Some("nvidia"), false, &aer(0, 1), quiet)
            .unwrap()
            .code,
        "aer"
    );
    // A new error restarts the hold.
    let again = t0 + Duration::from_secs(10) + AER_HOLD - Duration::from_secs(1);
    assert!(t.judge(&a, Some("nvidia"), false, &aer(1, 1), again).is_some());
    assert!(t
        .judge(
            &a,
            Some("nvidia"),
            false,
            &aer(1, 1),
            again + AER_HOLD - Duration::from_secs(1)
        )
        .is_some());
    assert_eq!(
        t.judge(&a, Some("nvidia"), false, &aer(1, 1), again + AER_HOLD),
        None
    );
    // Counts already there when first read count as a rise then.
    let b: PciAddress = "0000:02:00.0".parse().unwrap();
    assert!(t.judge(&b, None, false, &aer(2, 0), t0).is_some());
    assert_eq!(t.judge(&b, None, false, &aer(2, 0), t0 + AER_HOLD), None);
}

#[test]
fn a_lost_driver_is_a_problem_until_one_holds_the_function_again() {
    let mut t = Tracker::default();
    let now = Instant::now();
    let a = addr();
    assert_eq!(t.judge(&a, Some("snd_hda_intel"), false, &d0(), now), None);
    let p = t.judge(&a, None, false, &d0(), now).unwrap();
    assert_eq!(p.code, "driver-lost");
    assert!(
        p.message.contains("lost its driver snd_hda_intel"),
        "{}",
        p.message
    );
    // Prepared: gpupass moved it; the prepared check judges it instead.
    assert_eq!(t.judge(&a, None, true, &d0(), now), None);
    assert_eq!(t.judge(&a, Some("vfio-pci"), false, &d0(), now), None);
    assert_eq!(t.judge(&a, Some("snd_hda_intel"), false, &d0(), now), None);
    // A function driverless when first seen (the edu device, by design) is fine so.
    let b: PciAddress = "0000:00:06.0".parse().unwrap();
    assert_eq!(t.judge(&b, None, false, &d0(), now), None);
    assert_eq!(t.judge(&b, None, false, &d0(), now), None);
}
