#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| memres_tests::fuzz::run_trace(data));
