//! Writes seed inputs for the fuzz targets: `cargo run -p memres-tests
//! --example seed_corpus -- fuzz/corpus`. Each seed is pseudo-random bytes
//! (any bytes decode to an operation sequence), of lengths from a few bytes
//! to a few KiB; each is checked to pass the harness before it is written.

use memres_core::testing::SplitMix64;
use memres_tests::fuzz;

fn main() {
    let root = std::env::args().nth(1).unwrap_or_else(|| "fuzz/corpus".into());
    for (t, &(name, run)) in fuzz::TARGETS.iter().enumerate() {
        let dir = std::path::Path::new(&root).join(name);
        std::fs::create_dir_all(&dir).expect("create corpus folder");
        let mut rng = SplitMix64::new(0xc0ffee + t as u64);
        for i in 0..8 {
            let len = [8, 32, 128, 512, 1024, 2048, 4096, 4096][i];
            let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            run(&data);
            std::fs::write(dir.join(format!("seed-{i}")), &data).expect("write seed");
        }
    }
}
