//! `MEMRES_LOG_FILE` makes the default resources log in RMM's format (a
//! test binary of its own: it sets the process's environment).
#![cfg(not(feature = "cuda"))]

use memres::device::{flush_logs, get_per_device_resource};
use memres::prelude::*;
use memres::stack::LOG_FILE_VAR;

#[test]
fn default_resources_log_where_the_environment_says() {
    let dir = std::env::temp_dir().join(format!("memres-facade-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::env::set_var(LOG_FILE_VAR, dir.join("alloc.csv"));
    let mr = get_per_device_resource(3).unwrap();
    let b = mr.allocate(1000).unwrap();
    mr.deallocate(b).unwrap();
    flush_logs().unwrap();
    let file = std::fs::File::open(dir.join("alloc.dev3.csv")).unwrap();
    let rows = memres::trace::read_all(std::io::BufReader::new(file)).unwrap();
    assert_eq!(rows.len(), 2, "one allocation, one free");
    assert_eq!(rows[0].size, 1000);
    // A file that cannot be made: a typed error, nothing stored, and the
    // next get (the setting fixed) makes the device's resource.
    std::env::set_var(LOG_FILE_VAR, dir.join("no-such-dir").join("alloc.csv"));
    assert!(matches!(get_per_device_resource::<()>(4), Err(Error::InvalidConfig { .. })));
    std::env::remove_var(LOG_FILE_VAR);
    let mr: memres::DynResource = get_per_device_resource(4).unwrap();
    mr.deallocate(mr.allocate(10).unwrap()).unwrap();
    assert!(!dir.join("no-such-dir").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
