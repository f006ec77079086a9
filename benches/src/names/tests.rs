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
        e.contains("(valid: initial, max, growth, granule, release, per_stream); did you mean `growth`?"),
        "{e}"
    );
    let e = build_error("fixed(sim, blox=4)");
    assert!(e.contains("(valid: size, blocks)"), "{e}");
    // Nothing near: the list alone.
    assert!(!build_error("zzzzzz(sim)").contains("did you mean"));
}

#[test]
fn every_key_a_constructor_takes_is_listed() {
    // Each listed key is accepted: an unknown one would be refused.
    for n in NAMES.iter().filter(|n| !n.cuda) {
        // `log` would open a file named by the value.
        for (k, _) in n.keys.iter().filter(|(k, _)| *k != "file") {
            let text = format!("{}(sim, {k}=1)", n.name);
            let world = SimWorld::new();
            if let Err(e) = parse(&text)
                .and_then(|c| crate::stack::builder().build_call(&c, &world.default_stream()).map(|_| ()))
            {
                assert!(!matches!(e.kind, StackErrorKind::UnknownKey(_)), "{text}: {e}");
            }
        }
    }
}
