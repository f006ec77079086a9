use super::*;
use crate::replay::Measurement;
use std::time::Duration;

fn row(outcome: Result<Measurement, String>) -> Row {
    Row {
        resource: "pool".into(),
        workload: "a \"quoted\"\\path\n".into(),
        workload_ops: 10,
        upstream: Some(UpstreamKind::Sim),
        skipped_frees: 7,
        failed_allocations: 0,
        reused_pointers: 0,
        size_mismatches: 0,
        held_out: false,
        outcome,
    }
}

#[test]
fn json_lines_escape_and_carry_every_key() {
    let m = Measurement {
        ops: 10,
        passes: 1,
        elapsed: Duration::from_nanos(250),
        fastest: Duration::from_nanos(200),
        cpu: Some(Duration::from_nanos(150)),
        peak_live: 1000,
        peak_upstream: 1500,
        upstream_allocations_per_pass: Some(2.5),
    };
    let line = json_line(&row(Ok(m)));
    assert_eq!(
        line,
        r#"{"resource":"pool","workload":"a \"quoted\"\\path\n","ops":10,"ns_per_op":25,"peak_live":1000,"peak_upstream":1500,"footprint":1.5,"passes":1,"best_ns_per_op":20,"cpu_ns_per_op":15,"upstream_allocs_per_pass":2.5,"upstream":"sim","skipped_frees":7,"failed_allocations":0,"reused_pointers":0,"size_mismatches":0,"held_out":false,"error":null}"#
    );
    let m = Measurement { upstream_allocations_per_pass: None, ..m };
    assert!(json_line(&row(Ok(m))).contains(r#","upstream_allocs_per_pass":null,"#));
    let line = json_line(&row(Err("out of memory".into())));
    assert!(
        line.contains(r#""ops":null,"#)
            && line.ends_with(r#""size_mismatches":0,"held_out":false,"error":"out of memory"}"#),
        "{line}"
    );
    assert_eq!(json_string("\u{1}"), r#""\u0001""#);
}

fn measured(peak_upstream: u64, upstream_allocations_per_pass: Option<f64>) -> Measurement {
    Measurement {
        ops: 10,
        passes: 1,
        elapsed: Duration::from_nanos(250),
        fastest: Duration::from_nanos(200),
        cpu: Some(Duration::from_nanos(150)),
        peak_live: 1000,
        peak_upstream,
        upstream_allocations_per_pass,
    }
}

#[test]
fn table_names_each_workload_once_aligns_columns_and_lists_errors() {
    let mut rows =
        [row(Ok(measured(3 << 20, Some(0.0)))), row(Err("boom".into())), row(Ok(measured(1000, None)))];
    for r in &mut rows[..2] {
        r.workload = "random:1:2:3".into();
    }
    (rows[2].workload, rows[2].held_out) = ("other".into(), true);
    let text = table(&rows);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("  resource   ns/op  cpu ns/op"), "{text}");
    assert_eq!(lines[1], "random:1:2:3: 10 ops, 7 stray frees");
    // Right-aligned figures: every line of the table is as long as the header.
    for i in [2, 3, 5] {
        assert_eq!(lines[i].len(), lines[0].len(), "{text}");
    }
    let cells: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(cells, ["pool", "25.0", "15.0", "1000", "B", "3.00", "MiB", "3145.728", "0.0"]);
    assert!(lines[0].ends_with("  footprint  grows/pass"), "{text}");
    assert!(lines[3].contains("FAILED"), "{text}");
    assert_eq!(lines[4], "other (held out): 10 ops, 7 stray frees");
    assert!(lines[5].ends_with(" 1.000           -"), "{text}");
    assert_eq!(lines[6], "error: pool on random:1:2:3: boom");
    assert!(text.ends_with(LEGEND) && LEGEND.contains("footprint: ") && LEGEND.contains("stray frees: "));
    assert!(LEGEND.contains("grows/pass: "));
    assert!(LEGEND.lines().all(|l| l.len() <= 100), "the legend fits 100 columns");
}

/// A name longer than a format width may be (65,535) used to panic the
/// printer after the replay had run: the columns still align.
#[test]
fn table_takes_names_of_any_length() {
    let long = "x".repeat(70_000);
    let mut rows = [row(Err("boom".into())), row(Err("boom".into()))];
    (rows[0].resource, rows[0].workload) = (long.clone(), "w".into());
    rows[1].workload = long.clone();
    let text = table(&rows);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0].len(), lines[2].len());
    assert!(lines[0].starts_with(&format!("  resource{}   ns/op", " ".repeat(70_000 - 8))));
    assert!(lines[2].starts_with(&format!("  {long}  FAILED")));
    assert_eq!(lines[3], format!("{long}: 10 ops, 7 stray frees"));
    assert!(lines[4].starts_with(&format!("  pool{}  FAILED", " ".repeat(70_000 - 4))));
    assert_eq!(lines[5], format!("error: {long} on w: boom"));
}

#[test]
fn csv_lines_carry_the_json_fields() {
    let line = csv_line(&row(Ok(measured(1500, Some(1693.0)))));
    assert_eq!(line.matches(',').count(), CSV_HEADER.matches(',').count());
    assert_eq!(line, "pool,\"a \"\"quoted\"\"\\path\n\",10,25,1000,1500,1.5,1,20,15,sim,7,0,,1693,false,0,0");
    // New columns come last, so the ones before them keep their places.
    assert!(CSV_HEADER.ends_with(
        ",failed_allocations,error,upstream_allocs_per_pass,held_out,reused_pointers,size_mismatches"
    ));
    let uncounted = csv_line(&row(Ok(measured(1500, None))));
    assert!(uncounted.ends_with(",sim,7,0,,,false,0,0"), "{uncounted}");
    let failed = csv_line(&row(Err("out of memory, sorry".into())));
    assert!(failed.ends_with(",,,,,,,,sim,7,0,\"out of memory, sorry\",,false,0,0"), "{failed}");
    let held = csv_line(&Row { held_out: true, ..row(Ok(measured(1500, None))) });
    assert!(held.ends_with(",,true,0,0"), "{held}");
}

/// JSON and CSV rows have the same fields, whether or not the replay ran:
/// a failed JSON row has every key, `null` where it has no figure, as its
/// CSV row has every column, empty (it lacked `passes`, `best_ns_per_op`,
/// `cpu_ns_per_op` and `upstream_allocs_per_pass`); a row that ran has
/// `error`, `null` (it left it out).
#[test]
fn json_and_csv_rows_have_the_same_fields_whether_or_not_they_ran() {
    let object =
        |line: String| -> serde_json::Map<String, serde_json::Value> { serde_json::from_str(&line).unwrap() };
    let sorted = |mut keys: Vec<String>| {
        keys.sort();
        keys
    };
    let columns = sorted(CSV_HEADER.split(',').map(String::from).collect());
    let failed = object(json_line(&row(Err("boom".into()))));
    assert_eq!(sorted(failed.keys().cloned().collect()), columns);
    let figures = ["ops", "ns_per_op", "peak_live", "peak_upstream", "footprint", "passes", "best_ns_per_op"];
    for key in figures.iter().chain(&["cpu_ns_per_op", "upstream_allocs_per_pass"]) {
        assert!(failed[*key].is_null(), "{key}");
    }
    let ran = object(json_line(&row(Ok(measured(1500, None)))));
    assert_eq!(sorted(ran.keys().cloned().collect()), columns);
    assert!(ran["error"].is_null());
}

#[test]
fn bytes_in_binary_units() {
    assert_eq!(human_bytes(0), "0 B");
    assert_eq!(human_bytes(1023), "1023 B");
    assert_eq!(human_bytes(1536), "1.50 KiB");
    assert_eq!(human_bytes(5 << 30), "5.00 GiB");
    assert_eq!(human_bytes(u64::MAX), "16.00 EiB");
}

/// A trace's pointers allocated again while live and frees of another size
/// are said beside its stray frees (nothing is said where there are none),
/// and carried in JSON and CSV.
#[test]
fn reused_pointers_and_size_mismatches_are_reported_with_the_workload() {
    let odd = Row {
        workload: "t.csv".into(),
        reused_pointers: 3,
        size_mismatches: 2,
        ..row(Ok(measured(1000, None)))
    };
    let text = table(std::slice::from_ref(&odd));
    assert_eq!(
        text.lines().nth(1),
        Some("t.csv: 10 ops, 7 stray frees, 3 pointers allocated again while live, 2 frees of another size"),
        "{text}"
    );
    let plain = table(&[Row { workload: "t.csv".into(), ..row(Ok(measured(1000, None))) }]);
    assert_eq!(plain.lines().nth(1), Some("t.csv: 10 ops, 7 stray frees"), "{plain}");
    assert!(json_line(&odd).contains(r#""reused_pointers":3,"size_mismatches":2,"#));
    assert!(csv_line(&odd).ends_with(",false,3,2"));
}

/// A workload's line gives the workload's ops, not its first row's: a row
/// on K threads counts K times as many, and a failed row none.
#[test]
fn the_workload_line_gives_the_workloads_ops_whatever_its_first_row() {
    let threads = Row { workload: "w".into(), ..row(Ok(Measurement { ops: 40, ..measured(1000, None) })) };
    assert_eq!(table(std::slice::from_ref(&threads)).lines().nth(1), Some("w: 10 ops, 7 stray frees"));
    let failed = Row { workload: "w".into(), ..row(Err("boom".into())) };
    assert_eq!(table(&[failed, threads]).lines().nth(1), Some("w: 10 ops, 7 stray frees"));
}

/// A name with a line break or another control character (a trace's file
/// name may hold one) is escaped in the table, as `escape_debug` writes
/// it, so that each row stays one line; CSV and JSON quote it. Before: the
/// workload's line and the error line broke in two.
#[test]
fn table_escapes_control_characters_in_names() {
    let mut rows = [row(Err("boom".into()))];
    rows[0].resource = "po\tol".into();
    let text = table(&rows);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[1], "a \"quoted\"\\path\\n: 10 ops, 7 stray frees", "{text}");
    assert!(lines[2].starts_with("  po\\tol    FAILED"), "{text}");
    assert_eq!(lines[3], "error: po\\tol on a \"quoted\"\\path\\n: boom", "{text}");
    assert_eq!(text_name("é\u{1b}[0m\r"), "é\\u{1b}[0m\\r");
    // Characters XML allows nowhere, which made the timeline's SVG unreadable.
    assert_eq!(text_name("y\u{fffe}\u{ffff}.csv"), "y\\u{fffe}\\u{ffff}.csv");
}
