use super::*;
use crate::replay::Measurement;
use std::time::Duration;

fn row(outcome: Result<Measurement, String>) -> Row {
    Row {
        resource: "pool".into(),
        workload: "a \"quoted\"\\path\n".into(),
        upstream: UpstreamKind::Sim,
        skipped_frees: 7,
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
    };
    let line = json_line(&row(Ok(m)));
    assert_eq!(
        line,
        r#"{"resource":"pool","workload":"a \"quoted\"\\path\n","ops":10,"ns_per_op":25,"peak_live":1000,"peak_upstream":1500,"footprint":1.5,"passes":1,"best_ns_per_op":20,"cpu_ns_per_op":15,"upstream":"sim","skipped_frees":7}"#
    );
    let line = json_line(&row(Err("out of memory".into())));
    assert!(
        line.contains(r#""ops":null,"#) && line.ends_with(r#""skipped_frees":7,"error":"out of memory"}"#),
        "{line}"
    );
    assert_eq!(json_string("\u{1}"), r#""\u0001""#);
}

#[test]
fn table_aligns_columns_and_lists_errors() {
    let m = Measurement {
        ops: 10,
        passes: 1,
        elapsed: Duration::from_nanos(250),
        fastest: Duration::from_nanos(200),
        cpu: Some(Duration::from_nanos(150)),
        peak_live: 1000,
        peak_upstream: 3 << 20,
    };
    let mut rows = [row(Ok(m)), row(Err("boom".into()))];
    for r in &mut rows {
        r.workload = "random:1:2:3".into();
    }
    let text = table(&rows);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(lines[0].starts_with("resource  workload "), "{text}");
    // Right-aligned figures: every line of the table is as long as the header.
    assert!(lines[..3].iter().all(|l| l.len() == lines[0].len()), "{text}");
    let cells: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(
        cells,
        ["pool", "random:1:2:3", "10", "25.0", "15.0", "1000", "B", "3.00", "MiB", "3145.728", "7"]
    );
    assert!(lines[2].contains("FAILED"), "{text}");
    assert_eq!(lines[3], "error: pool on random:1:2:3: boom");
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
    assert_eq!(lines.len(), 5);
    let lengths: Vec<usize> = lines.iter().map(|l| l.len()).collect();
    assert!(lengths[..3].iter().all(|&n| n == lengths[0]), "{lengths:?}");
    assert!(lines[0].starts_with(&format!(
        "resource{}  workload{}  ",
        " ".repeat(70_000 - 8),
        " ".repeat(70_000 - 8)
    )));
    assert!(lines[1].starts_with(&format!("{long}  w ")));
    assert!(lines[2].starts_with(&format!("pool{}  {long}  ", " ".repeat(70_000 - 4))));
    assert_eq!(lines[3], format!("error: {long} on w: boom"));
    assert_eq!(lines[4], format!("error: pool on {long}: boom"));
}

#[test]
fn bytes_in_binary_units() {
    assert_eq!(human_bytes(0), "0 B");
    assert_eq!(human_bytes(1023), "1023 B");
    assert_eq!(human_bytes(1536), "1.50 KiB");
    assert_eq!(human_bytes(5 << 30), "5.00 GiB");
    assert_eq!(human_bytes(u64::MAX), "16777216.00 TiB");
}
