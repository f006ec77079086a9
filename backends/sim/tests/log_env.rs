//! `MEMRES_LOG_FILE` over the simulated device: a built stack logged in
//! RMM's format to one file per device, a name that cannot be logged to an
//! error that names the variable, with the stack serving on. The values are
//! passed in, never set in the process's environment.

use memres_core::adaptor::Statistics;
use memres_core::stack::{check_log_file, log_from_env, LOG_FILE_VAR};
use memres_core::trace::{read_all, Action};
use memres_core::{DynResource, MemoryResource, Request};
use memres_sim::builder;
use std::ffi::OsStr;
use std::io::BufReader;
use std::path::PathBuf;

fn req(size: u64) -> Request {
    Request::new(size).unwrap()
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("memres-log-env-{}-{name}", std::process::id()))
}

fn exercise(r: &DynResource) {
    let a = r.allocate(req(1000), &()).unwrap();
    let b = r.allocate(req(5000), &()).unwrap();
    r.deallocate(a, &()).unwrap();
    r.deallocate(b, &()).unwrap();
}

#[test]
fn the_setting_logs_each_devices_stack_to_its_own_file_in_rmms_format() {
    let dir = temp("dir");
    std::fs::create_dir_all(&dir).unwrap();
    let value = dir.join("trace.csv");
    check_log_file(Some(value.as_os_str()), 0).unwrap();
    for device in [0, 1] {
        let built = builder::<()>().build_with_handles("stats(pool(sim))", &()).unwrap();
        let log = log_from_env(&built.resource, Some(value.as_os_str()), device).unwrap().unwrap();
        let logged: DynResource = log.clone();
        exercise(&logged);
        assert_eq!(built.get::<Statistics<DynResource>>("stats").unwrap().get_allocations_counter().total, 2);
        log.flush().unwrap();
        let file = dir.join(format!("trace.dev{device}.csv"));
        let rows = read_all(BufReader::new(std::fs::File::open(&file).unwrap())).unwrap();
        let actions: Vec<Action> = rows.iter().map(|r| r.action).collect();
        assert_eq!(actions, [Action::Allocate, Action::Allocate, Action::Free, Action::Free]);
        assert_eq!((rows[0].size, rows[1].size), (1000, 5000));
    }
    assert!(!value.exists(), "only the per-device files");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_name_that_cannot_be_logged_to_is_an_error_and_the_stack_serves_on() {
    let stack = builder::<()>().build("stats(pool(sim))", &()).unwrap();
    let dir = temp("a-directory");
    std::fs::create_dir_all(dir.join("x.dev0.csv")).unwrap();
    let missing = temp("no-such-dir").join("x.csv");
    let not_a_dir = temp("a-file");
    std::fs::write(&not_a_dir, b"").unwrap();
    for value in [dir.clone(), dir.join("x.csv"), missing, not_a_dir.join("x.csv")] {
        let v = Some(value.as_os_str());
        // Found before any device is used, and when one would log.
        let checked = check_log_file(v, 0).unwrap_err();
        let made =
            log_from_env(&stack, v, 0).err().unwrap_or_else(|| panic!("{} was logged to", value.display()));
        for e in [checked, made] {
            assert!(e.to_string().contains(LOG_FILE_VAR), "{e}");
            assert!(e.to_string().contains(&*value.to_string_lossy()), "{e}");
        }
        exercise(&stack);
    }
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_file(&not_a_dir).unwrap();
}

/// Each device's own file is checked: device 1's, a directory, is refused
/// while device 0's is fine, and device 0's, a directory, does not keep
/// device 1 from logging (device 0's was checked for every device).
#[test]
fn each_device_is_checked_for_its_own_file() {
    let stack = builder::<()>().build("pool(sim)", &()).unwrap();
    let dir = temp("per-device");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("x.dev1.csv")).unwrap();
    let value = dir.join("x.csv");
    let v = Some(value.as_os_str());
    check_log_file(v, 0).unwrap();
    let refused = check_log_file(v, 1).unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::IsADirectory, "{refused}");
    assert!(log_from_env(&stack, v, 1).is_err());
    std::fs::remove_dir(dir.join("x.dev1.csv")).unwrap();
    std::fs::create_dir_all(dir.join("x.dev0.csv")).unwrap();
    check_log_file(v, 1).unwrap();
    let log = log_from_env(&stack, v, 1).unwrap().unwrap();
    let logged: DynResource = log.clone();
    exercise(&logged);
    log.flush().unwrap();
    assert!(dir.join("x.dev1.csv").is_file());
    drop((log, logged));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unset_or_blank_logs_nothing() {
    let stack = builder::<()>().build("pool(sim)", &()).unwrap();
    for value in [None, Some(OsStr::new("")), Some(OsStr::new(" \t"))] {
        assert!(check_log_file(value, 0).is_ok());
        assert!(log_from_env(&stack, value, 0).unwrap().is_none());
    }
}

/// A name that ends with a separator names a directory, there or not: it
/// was taken for the file `dir.dev0` beside it. A name with white space
/// around it (a stray space or newline from a script) named a file nobody
/// meant, `x.dev0.csv `. Both are errors, and no file is made.
#[test]
fn a_directory_name_or_white_space_around_the_name_is_an_error() {
    let stack = builder::<()>().build("pool(sim)", &()).unwrap();
    let dir = temp("slash");
    let file = temp("spaced.csv");
    let cases = [
        (format!("{}/", dir.display()), std::io::ErrorKind::IsADirectory),
        (format!("{} ", file.display()), std::io::ErrorKind::InvalidInput),
        (format!("{}\n", file.display()), std::io::ErrorKind::InvalidInput),
    ];
    for (value, kind) in cases {
        let v = Some(OsStr::new(&value));
        let checked = check_log_file(v, 0).unwrap_err();
        let made = log_from_env(&stack, v, 0).err().unwrap_or_else(|| panic!("{value:?} was logged to"));
        for e in [checked, made] {
            assert_eq!(e.kind(), kind, "{value:?}: {e}");
            assert!(e.to_string().contains(LOG_FILE_VAR), "{e}");
        }
        exercise(&stack);
    }
    let made: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.contains(&format!("memres-log-env-{}-s", std::process::id())))
        .collect();
    assert!(made.is_empty(), "made {made:?}");
}
