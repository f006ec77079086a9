//! `MEMRES_LOG_FILE` makes the default resources log in RMM's format (a
//! test binary of its own: it sets the process's environment).
#![cfg(not(feature = "cuda"))]

use memres::device::{flush_logs, get_per_device_resource};
use memres::prelude::*;
use memres::stack::LOG_FILE_VAR;
use memres::DynResource;
use memres_sim::{SimStream, SimWorld};
use std::sync::Arc;

#[test]
fn default_resources_log_where_the_environment_says() {
    let dir = std::env::temp_dir().join(format!("memres-facade-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::env::set_var(LOG_FILE_VAR, dir.join("alloc.csv"));
    let mr = get_per_device_resource(3).unwrap();
    let b = mr.allocate(1000).unwrap();
    // The device's default for another stream type, made by threads racing:
    // the same object, so one log, one header, every row.
    let on_streams: Vec<DynResource<SimStream>> = std::thread::scope(|s| {
        let racing: Vec<_> =
            (0..4).map(|_| s.spawn(|| get_per_device_resource::<SimStream>(3).unwrap())).collect();
        racing.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for r in &on_streams {
        assert_eq!(Arc::as_ptr(r) as *const (), Arc::as_ptr(&mr) as *const (), "one default per device");
    }
    let world = SimWorld::new();
    let c = on_streams[0].allocate(Request::new(2000).unwrap(), &world.stream()).unwrap();
    on_streams[0].deallocate(c, &world.stream()).unwrap();
    mr.deallocate(b).unwrap();
    flush_logs().unwrap();
    let file = std::fs::File::open(dir.join("alloc.dev3.csv")).unwrap();
    let rows = memres::trace::read_all(std::io::BufReader::new(file)).unwrap();
    let sizes: Vec<u64> = rows.iter().map(|r| r.size).collect();
    assert_eq!(sizes, [1000, 2000, 2000, 1000], "both stream types' calls, in order");
    // A file that cannot be made: a typed error, nothing stored, and the
    // next get (the setting fixed) makes the device's resource.
    // Its message names the file and the system's reason.
    let missing = dir.join("no-such-dir").join("alloc.csv");
    std::env::set_var(LOG_FILE_VAR, &missing);
    let reason = std::fs::metadata(dir.join("no-such-dir")).unwrap_err().to_string();
    for _ in 0..2 {
        let e = get_per_device_resource::<()>(4).err();
        let Some(Error::InvalidConfig { what }) = e else { panic!("{e:?}") };
        assert!(what.contains(missing.to_str().unwrap()) && what.contains(&reason), "{what}");
        assert!(what.starts_with(LOG_FILE_VAR), "{what}");
    }
    std::env::remove_var(LOG_FILE_VAR);
    let mr: memres::DynResource = get_per_device_resource(4).unwrap();
    mr.deallocate(mr.allocate(10).unwrap()).unwrap();
    assert!(!dir.join("no-such-dir").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The rows logged are written when the process exits, without a call of
/// `flush_logs`: the logs live in statics, never dropped, and a short
/// program lost every row (its file held the header alone). The test runs
/// itself again as a child that logs and returns.
#[test]
fn the_rows_are_written_at_exit_without_flush_logs() {
    const CHILD: &str = "MEMRES_TEST_EXIT_CHILD";
    if let Some(dir) = std::env::var_os(CHILD) {
        std::env::set_var(LOG_FILE_VAR, std::path::Path::new(&dir).join("exit.csv"));
        let mr = get_per_device_resource(6).unwrap();
        for size in 1..=10 {
            mr.deallocate(mr.allocate(size * 256).unwrap()).unwrap();
        }
        return;
    }
    let dir = std::env::temp_dir().join(format!("memres-facade-exit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let name = "the_rows_are_written_at_exit_without_flush_logs";
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--test-threads", "1"])
        .env(CHILD, &dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let file = std::fs::File::open(dir.join("exit.dev6.csv")).unwrap();
    let rows = memres::trace::read_all(std::io::BufReader::new(file)).unwrap();
    assert_eq!(
        rows.iter().map(|r| r.size).collect::<Vec<_>>(),
        (1..=10).flat_map(|s| [s * 256; 2]).collect::<Vec<_>>()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
