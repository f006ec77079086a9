use super::*;
use crate::observe::observe;
use crate::workload::Workload;

fn watched() -> (Workload, Observation) {
    let w = Workload::load("random:3000:1048576:7").unwrap();
    let o = observe("pool(sim(1TiB))", &w, None).unwrap();
    (w, o)
}

#[test]
fn the_svg_draws_three_series_and_names_the_peak() {
    let (w, o) = watched();
    let charts = [Chart { resource: "pool", workload: &w.name, observation: &o, times: w.times.as_deref() }];
    let svg = svg(&charts).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
    for color in ["#0000FF", "#FF0000", "#008C00"] {
        let lines = svg.matches(&format!("stroke=\"{color}\" stroke-width=\"2\"")).count();
        assert_eq!(lines, 2, "{color}: the series and its legend mark");
    }
    let p = o.peak.unwrap();
    assert!(svg.contains(&format!("after op {}", p.op)));
    assert!(svg.contains("largest free block"));
}

/// A name with a control character (a trace's file name may hold one) is
/// written as the text table writes it: XML allows no such character, and
/// a browser shows an `.svg` that holds one as an error, not the chart.
#[test]
fn the_svg_escapes_control_characters_in_names() {
    let (_, o) = watched();
    let charts = [Chart { resource: "po\u{1b}ol", workload: "a\u{1}b.csv", observation: &o, times: None }];
    let svg = svg(&charts).unwrap();
    let bad = svg.chars().find(|&c| c.is_control() && !matches!(c, '\n' | '\t' | '\r'));
    assert_eq!(bad, None, "a character XML refuses");
    assert!(svg.contains("po\\u{1b}ol on a\\u{1}b.csv"));
}

#[test]
fn the_html_is_self_contained_and_the_csv_has_every_sample() {
    let (w, o) = watched();
    let charts = [Chart { resource: "a<b", workload: &w.name, observation: &o, times: w.times.as_deref() }];
    let page = html(&charts).unwrap();
    assert!(page.contains("<svg") && page.contains("a&lt;b"));
    for fetch in ["src=", "href=", "@import", "url("] {
        assert!(!page.contains(fetch), "the page fetches something: {fetch}");
    }
    let csv = csv(&charts);
    assert_eq!(csv.lines().count(), 1 + o.samples.len());
    assert!(o.samples.len() <= crate::observe::SAMPLES);
}

#[test]
fn a_trace_with_times_labels_the_ops_with_them() {
    // RMM's clock times: one op a second.
    let trace: String = (0..40)
        .map(|i| {
            let (action, ptr) = if i % 2 == 0 { ("allocate", i) } else { ("free", i - 1) };
            format!("7,10:00:{i:02}.000000,{action},{:#x},4096,0\n", 0x1000 * (ptr + 1))
        })
        .collect();
    let w = crate::workload::parse_trace("t.csv", trace.as_bytes()).unwrap();
    assert_eq!(w.times.as_ref().map(|t| t.len()), Some(40));
    let o = observe("pool(sim)", &w, None).unwrap();
    assert_eq!(o.samples[1].time_us.unwrap() - o.samples[0].time_us.unwrap(), 1_000_000);
    let svg =
        svg(&[Chart { resource: "pool", workload: &w.name, observation: &o, times: w.times.as_deref() }])
            .unwrap();
    assert!(svg.contains("operation (trace time)") && svg.contains("10 (10.00 s)"), "{svg}");
    assert!(csv(&[Chart {
        resource: "pool",
        workload: &w.name,
        observation: &o,
        times: w.times.as_deref()
    }])
    .contains(",pool,1,36001000000,"));
}

#[test]
fn a_tick_reads_the_time_of_its_own_op() {
    // Samples of several ops, and times that jump by a minute after op
    // 1000: a label read from the sample covering op 1000 (its last op,
    // 1001) or measured from the first sample's op says 61 s.
    let mut w = Workload::load("random:3000:4096:7").unwrap();
    let n = w.ops.len() as u64;
    w.times = Some((0..n).map(|i| 5_000_000 + i * 1000 + if i > 1000 { 60_000_000 } else { 0 }).collect());
    let o = observe("pool(sim(1TiB))", &w, None).unwrap();
    assert_eq!(o.samples[0].op, 2, "samples of three ops");
    let c = Chart { resource: "pool", workload: &w.name, observation: &o, times: w.times.as_deref() };
    assert_eq!(tick_label(&c, 0), "0 (0.00 s)");
    assert_eq!(tick_label(&c, 1000), "1000 (1.00 s)");
    assert_eq!(tick_label(&c, 1001), "1001 (61.00 s)");
    assert_eq!(tick_label(&c, n - 1), format!("{} ({:.2} s)", n - 1, (n - 1) as f64 / 1e3 + 60.0));
    // Past the last op there is no op, and no time to say.
    assert_eq!(tick_label(&c, n), n.to_string());
    assert_eq!(tick_label(&Chart { times: None, ..c }, 1000), "1000");
}

/// The timeline is written whole, into a new file renamed over the old
/// one: another name of the old file (a hard link, a reader holding it
/// open) keeps what it held, where it was truncated and written in place.
#[cfg(unix)]
#[test]
fn the_timeline_is_written_whole_never_in_place() {
    let dir = std::env::temp_dir().join(format!("memres-timeline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (file, kept) = (dir.join("t.csv"), dir.join("kept.csv"));
    std::fs::write(&file, "old").unwrap();
    std::fs::hard_link(&file, &kept).unwrap();
    write(&file, &[]).unwrap();
    let (new, old) = (std::fs::read_to_string(&file).unwrap(), std::fs::read_to_string(&kept).unwrap());
    let listed = std::fs::read_dir(&dir).unwrap().count();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(new.starts_with("workload,resource,op,"), "{new}");
    assert_eq!(old, "old");
    assert_eq!(listed, 2, "no temporary file left");
}

#[test]
fn the_form_is_read_from_the_extension_in_either_case() {
    use std::path::Path;
    for (name, form) in [("t.html", Form::Html), ("T.HTML", Form::Html), ("t.Htm", Form::Html)] {
        assert_eq!(Form::of(Path::new(name)), Ok(form), "{name}");
    }
    assert_eq!(
        (Form::of(Path::new("t.SVG")), Form::of(Path::new("a.b.Csv"))),
        (Ok(Form::Svg), Ok(Form::Csv))
    );
    for refused in ["t.txt", "t", "html", "t.html.gz", ".hidden.txt", ".txt"] {
        let e = Form::of(Path::new(refused)).unwrap_err();
        assert!(e.contains(refused) && e.contains("must end in .html"), "{refused}: {e}");
    }
    // `.html` is a hidden file's name, with no extension: said so, not
    // that it must end in what it ends in.
    for hidden in [".html", "out/.SVG"] {
        let e = Form::of(Path::new(hidden)).unwrap_err();
        assert!(e.contains("needs a name before its extension"), "{hidden}: {e}");
    }
}

#[test]
fn the_html_table_writes_control_characters_escaped() {
    let (_, o) = watched();
    let charts = [Chart { resource: "po\u{1b}<ol", workload: "a\nb.csv", observation: &o, times: None }];
    let page = html(&charts).unwrap();
    let table = &page[page.find("<table>").unwrap()..page.find("</table>").unwrap()];
    assert!(table.contains("<td>a\\nb.csv</td><td>po\\u{1b}&lt;ol</td>"), "{table}");
    let bad = page.chars().find(|&c| c.is_control() && !matches!(c, '\n' | '\t' | '\r'));
    assert_eq!(bad, None);
}
