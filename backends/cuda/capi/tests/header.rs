//! `include/memres.h` declares exactly the functions the library exports,
//! each with the C types of its Rust parameters and result, and its
//! `memres_stats_t` and `memres_steps_t` have the fields of `MemresStats`
//! and `MemresSteps` in order.

const HEADER: &str = include_str!("../include/memres.h");
const SOURCE: &str = include_str!("../src/lib.rs");
/// Every file that exports functions.
const SOURCES: [&str; 2] = [SOURCE, include_str!("../src/snapshot.rs")];

/// The functions the library exports: each `#[no_mangle]` item's name.
fn exported_names(source: &str) -> Vec<String> {
    source
        .match_indices("#[no_mangle]")
        .map(|(i, _)| {
            let rest = &source[i..];
            let rest = &rest[rest.find(" fn ").unwrap() + 4..];
            assert!(source[i..].find(" fn ") < source[i..].find('{'), "#[no_mangle] on a function");
            rest[..rest.find('(').unwrap()].trim().to_string()
        })
        .collect()
}

#[test]
fn the_header_declares_every_exported_function() {
    let mut exported: Vec<String> = SOURCES.iter().flat_map(|s| exported_names(s)).collect();
    exported.sort();
    assert!(exported.len() >= 6, "{exported:?}");
    // Declarations in the header: `memres_xxx(` at the start of a line or
    // after a return type, outside comments.
    let code: String = strip_comments(HEADER);
    let mut declared: Vec<String> = code
        .split(';')
        .filter_map(|decl| {
            let open = decl.find('(')?;
            let head = &decl[..open];
            let name = head.rsplit(|c: char| !(c.is_alphanumeric() || c == '_')).next()?;
            name.starts_with("memres_").then(|| name.to_string())
        })
        .collect();
    declared.sort();
    assert_eq!(declared, exported);
    // And each is `extern "C"`.
    for name in &exported {
        assert!(SOURCES.iter().any(|s| s.contains(&format!("extern \"C\" fn {name}("))), "{name}");
    }
}

/// Each declaration's result and parameters are the C types of the Rust
/// function's: a width or a `const` changed on one side only (an `int`
/// for an `int64_t`) was not found, as names alone were compared.
#[test]
fn each_declaration_has_the_types_of_its_function() {
    let code = strip_comments(HEADER);
    let mut checked = 0;
    for decl in code.split(';') {
        let Some(open) = decl.find('(') else { continue };
        let (ret, name) = split_declared(&decl[..open]);
        if !name.starts_with("memres_") {
            continue;
        }
        let params = decl[open + 1..decl.rfind(')').unwrap()].trim();
        let c_params: Vec<String> = match params {
            "void" => Vec::new(),
            _ => params.split(',').map(|p| split_declared(p).0).collect(),
        };
        let source = SOURCES.iter().find(|s| s.contains(&format!("extern \"C\" fn {name}("))).unwrap();
        let sig = &source[source.find(&format!("extern \"C\" fn {name}(")).unwrap()..];
        let sig = &sig[sig.find('(').unwrap() + 1..sig.find('{').unwrap()];
        let (args, result) = sig.split_once(')').unwrap();
        let rust_params: Vec<String> = args
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(|a| c_type_of(a.split_once(':').unwrap().1.trim()))
            .collect();
        let rust_ret = match result.trim().strip_prefix("->") {
            Some(ty) => c_type_of(ty.trim()),
            None => "void".to_string(),
        };
        assert_eq!((ret, c_params), (rust_ret, rust_params), "{name}");
        checked += 1;
    }
    assert_eq!(checked, SOURCES.iter().map(|s| exported_names(s).len()).sum::<usize>());
}

/// The type and the name of a C declarator (`void *stream`, `const char
/// *memres_x`): the type with its white space taken out (`void*`).
fn split_declared(text: &str) -> (String, String) {
    let text = text.trim();
    let at = text.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
    let ty: String = text[..at].chars().filter(|c| !c.is_whitespace()).collect();
    (ty, text[at..].to_string())
}

/// The C type of a Rust parameter or result type of the library, written
/// as `split_declared` writes it.
fn c_type_of(rust: &str) -> String {
    let (prefix, base) = match rust.split_once(' ') {
        Some(("*mut", base)) => ("", format!("{}*", c_type_of(base))),
        Some(("*const", base)) => ("const", format!("{}*", c_type_of(base))),
        _ => {
            let c = match rust {
                "c_int" => "int",
                "c_char" => "char",
                "c_void" => "void",
                "isize" => "ssize_t",
                "usize" => "size_t",
                "i64" => "int64_t",
                "MemresStats" => "memres_stats_t",
                "MemresSteps" => "memres_steps_t",
                other => panic!("no C type for {other}"),
            };
            ("", c.to_string())
        }
    };
    format!("{prefix}{base}")
}

#[test]
fn the_structs_match() {
    struct_matches("memres_stats_t", "MemresStats", std::mem::size_of::<memres::MemresStats>());
    struct_matches("memres_steps_t", "MemresSteps", std::mem::size_of::<memres::MemresSteps>());
}

/// The C struct `c_name` of the header has the fields of the Rust struct
/// `rust_name` in order, with the C types of theirs, and `size` bytes.
fn struct_matches(c_name: &str, rust_name: &str, size: usize) {
    let code = strip_comments(HEADER);
    let body = &code[code.find(&format!("typedef struct {c_name} {{")).unwrap()..];
    let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
    let c_fields: Vec<(String, String)> = body
        .split(';')
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(|f| {
            let (ty, name) = f.rsplit_once(' ').unwrap();
            (ty.trim().to_string(), name.to_string())
        })
        .collect();
    let src = &SOURCE[SOURCE.find(&format!("pub struct {rust_name} {{")).unwrap()..];
    let src = &src[..src.find("\n}").unwrap()];
    let rust_fields: Vec<(String, String)> = src
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub "))
        .filter_map(|l| l.strip_suffix(','))
        .map(|l| {
            let (name, ty) = l.split_once(':').unwrap();
            (ty.trim().to_string(), name.trim().to_string())
        })
        .collect();
    let as_c: Vec<(String, String)> = rust_fields
        .into_iter()
        .map(|(ty, name)| {
            let c = match ty.as_str() {
                "i64" => "int64_t",
                other => panic!("no C type for {other}"),
            };
            (c.to_string(), name)
        })
        .collect();
    assert!(!as_c.is_empty(), "{rust_name}");
    assert_eq!(c_fields, as_c, "{c_name}");
    assert_eq!(size, as_c.len() * 8, "{rust_name}");
}

fn strip_comments(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        rest = &rest[i + rest[i..].find("*/").unwrap() + 2..];
    }
    out.push_str(rest);
    out.lines().filter(|l| !l.trim_start().starts_with('#')).collect::<Vec<_>>().join("\n")
}
