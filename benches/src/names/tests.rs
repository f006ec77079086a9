use super::*;
use memres_sim::SimWorld;

#[test]
fn the_table_names_exactly_what_the_builder_registers() {
    let registered: Vec<String> = crate::stack::builder().names().map(String::from).collect();
    let mut listed: Vec<String> = NAMES.iter().filter(|n| !n.cuda).map(|n| n.name.to_string()).collect();
    listed.sort();
    assert_eq!(listed, registered);
}

fn build_error(text: &str) -> String {
    let world = SimWorld::new();
    let e = parse(text)
        .and_then(|c| crate::stack::builder().build_call(&c, &world.default_stream()).map(|_| ()))
        .unwrap_err();
    explain(text, &e)
}

#[test]
fn unknown_names_and_keys_list_the_valid_ones_and_the_nearest() {
    let e = build_error("stats(poool(sim))");
    assert!(e.contains("unknown resource `poool`") && e.contains("(valid: sim, host, vpool"), "{e}");
    assert!(e.ends_with("did you mean `pool`?"), "{e}");
    let e = build_error("pool(sim, initial=1GiB, growht=double)");
    assert!(
        e.contains(
            "(valid: initial, max, growth, granule, release, large, per_stream); did you mean `growth`?"
        ),
        "{e}"
    );
    let e = build_error("fixed(sim, blox=4)");
    assert!(e.contains("(valid: size, blocks)"), "{e}");
    // A name that takes no keys says so rather than list none.
    let e = build_error("stats(sim, x=1)");
    assert!(e.ends_with("unknown key `x` (`stats` takes no keys)"), "{e}");
    // Nothing near: the list alone.
    assert!(!build_error("zzzzzz(sim)").contains("did you mean"));
}

/// Whether the builder's constructor of `name` refuses `key` as unknown.
fn accepts(name: &str, key: &str) -> bool {
    // The key first: it is checked before any argument after it.
    let text = format!("{name}({key}=1, sim)");
    let world = SimWorld::new();
    let built = parse(&text).and_then(|c| crate::stack::builder().build_call(&c, &world.default_stream()));
    !matches!(built, Err(ref e) if matches!(e.kind, StackErrorKind::UnknownKey(_)))
}

/// The keys a name takes are exactly the ones listed for it, among every
/// key of the table and the ones renamed away (#16: `min`/`max` of
/// `binning`, `keep` of `vpool`).
#[test]
fn each_name_takes_exactly_its_listed_keys() {
    let mut candidates: Vec<&str> = NAMES.iter().flat_map(|n| n.keys.iter().map(|&(k, _)| k)).collect();
    candidates.extend(["min", "keep", "granules", "handle_granules", "release_threshold"]);
    candidates.sort();
    candidates.dedup();
    // `log` would open a file named by the value.
    for n in NAMES.iter().filter(|n| !n.cuda && n.name != "log") {
        let taken: Vec<&str> = candidates.iter().copied().filter(|k| accepts(n.name, k)).collect();
        let mut listed: Vec<&str> = n.keys.iter().map(|&(k, _)| k).collect();
        listed.sort();
        assert_eq!(taken, listed, "{}", n.name);
    }
}

/// The capacity the listing says a `sim` has when none is given is the one
/// the tool's builder gives it (it said 1 TiB, the builder gives 80 GiB).
#[test]
fn the_sim_leafs_default_capacity_is_the_builders() {
    let world = SimWorld::new();
    let built = crate::stack::builder().build_with_handles("sim", &world.default_stream()).unwrap();
    let capacity = built.get::<memres_sim::SimDevice>("sim").unwrap().capacity();
    assert_eq!(capacity, memres_sim::DEFAULT_SIM_CAPACITY);
    let sim = NAMES.iter().find(|n| n.name == "sim").unwrap();
    let (_, help) = sim.keys.iter().find(|(k, _)| *k == "capacity").unwrap();
    assert_eq!(capacity % (1 << 30), 0, "said in GiB");
    let said = format!("(default {} GiB", capacity >> 30);
    assert!(help.contains(&said), "{help} against {said}");
}

/// Binning's bins are arguments, not keys: the listing shows both forms
/// (it showed `binning(upstream)`, and no way to give a bin).
#[test]
fn the_listing_shows_how_binning_takes_its_bins() {
    let text = listing();
    let line = text.lines().find(|l| l.trim_start().starts_with("binning(")).unwrap();
    assert!(line.contains("bin(SIZE)") && line.contains("bin(SIZE, RESOURCE)"), "{line}");
}
