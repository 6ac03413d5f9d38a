//! The shape of the house, checked on its source. One layout for unit tests: a module's
//! tests live in `tests.rs` in the module's own folder (`foo.rs` → `foo/tests.rs`,
//! `foo/mod.rs` → `foo/tests.rs`; a long suite as `foo/tests/mod.rs` plus
//! `foo/tests/<topic>.rs`), declared `#[cfg(test)] mod tests;`; support shared with these
//! integration tests lives in `src/test_support/`; no source file reaches into tests/. And
//! small rooms: no production file over 650 lines, no function over 90 (both print the
//! longest, so the numbers are in every test log).

use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 650;
const MAX_FN_LINES: usize = 90;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read a source directory").flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every source file under src/, as (path relative to src/, text).
fn all_sources() -> Vec<(String, String)> {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read a source file");
            (p.strip_prefix(src()).expect("under src").display().to_string(), text)
        })
        .collect()
}

/// Whether `rel` (relative to src/) is test code: a `tests.rs`, anything in a `tests/`
/// folder, or the shared test support.
fn is_test_file(rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    parts.last() == Some(&"tests.rs") || parts[..parts.len() - 1].contains(&"tests") || parts[0] == "test_support"
}

#[test]
fn unit_tests_have_one_layout_and_no_source_reaches_into_tests() {
    let mut wrong = Vec::new();
    for (rel, text) in all_sources() {
        let name = rel.rsplit('/').next().unwrap_or_default();
        if name.ends_with("_tests.rs") || name.starts_with("tests_") {
            wrong.push(format!("{rel}: a test file outside the layout; move it to <module>/tests.rs"));
        }
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            let at = format!("{rel}:{}", n + 1);
            if t.starts_with("#[path") {
                wrong.push(format!("{at}: #[path] (modules are found where the compiler looks)"));
            }
            if ["include!(", "include_str!(", "include_bytes!("].iter().any(|m| t.contains(m)) && t.contains("tests/") {
                wrong.push(format!("{at}: includes a file from tests/"));
            }
            if t.contains("mod tests {") {
                wrong.push(format!("{at}: an inline test module; move its body to the module's tests.rs"));
            }
            if t == "#[cfg(test)]"
                && let Some(next) = lines.get(n + 1)
            {
                let next = next.trim_start().trim_start_matches("pub(crate) ").trim_start_matches("pub ");
                if next.starts_with("mod ") && next != "mod tests;" && next != "mod test_support;" {
                    wrong.push(format!("{at}: a test-only module other than `tests`: {next}"));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "outside the one test layout:\n{}", wrong.join("\n"));
}

/// `text` with comments, string and character literals blanked out (newlines kept), so
/// braces and `fn` in them are not counted.
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1).copied() == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1).copied() == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1).copied() == Some('*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1).copied() == Some('/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && (c.get(i + 1).copied() == Some('"') || c.get(i + 1).copied() == Some('#'))
            && !ident_before(&c, i)
        {
            let mut hashes = 0;
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let close: Vec<char> = close.chars().collect();
            out.extend(std::iter::repeat_n(' ', j + 1 - i));
            i = j + 1;
            while i < c.len() && !c[i..].starts_with(&close) {
                out.push(blank(c[i]));
                i += 1;
            }
            out.extend(std::iter::repeat_n(' ', close.len()));
            i += close.len();
        } else if c[i] == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' && c.get(i + 1).copied() == Some('\\') {
            out.push(' ');
            i += 1;
            while i < c.len() && !(c[i] == '\'' && c[i - 1] != '\\') {
                out.push(' ');
                i += 1;
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' && c.get(i + 2).copied() == Some('\'') {
            out.push_str("   ");
            i += 3;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn ident_before(c: &[char], i: usize) -> bool {
    i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_')
}

/// The functions of `text` with a body: (name, first line, number of lines from the `fn`
/// line to its closing brace).
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let code = code_only(text);
    let bytes = code.as_bytes();
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(off) = code[at..].find("fn ") {
        let start = at + off;
        at = start + 3;
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
            continue;
        }
        let name: String = code[at..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        if name.is_empty() {
            continue;
        }
        // The body opens at the first `{` before any `;` (a declaration without a body).
        let Some(open) = code[at..].find(['{', ';']).map(|o| at + o) else { break };
        if bytes[open] == b';' {
            continue;
        }
        let mut depth = 0usize;
        let mut end = open;
        for (k, b) in bytes[open..].iter().enumerate() {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + k;
                        break;
                    }
                }
                _ => {}
            }
        }
        let (first, last) = (line_of(start), line_of(end));
        found.push((name, first, last - first + 1));
    }
    found
}

#[test]
fn no_production_file_or_function_is_too_long() {
    let mut files = Vec::new();
    let mut fns = Vec::new();
    for (rel, text) in all_sources() {
        if is_test_file(&rel) {
            continue;
        }
        files.push((text.lines().count(), rel.clone()));
        for (name, line, len) in functions(&text) {
            fns.push((len, format!("{rel}:{line} {name}")));
        }
    }
    files.sort_by(|a, b| b.cmp(a));
    fns.sort_by(|a, b| b.cmp(a));
    println!("longest production files (limit {MAX_FILE_LINES} lines):");
    files.iter().take(10).for_each(|(n, f)| println!("  {n:5} {f}"));
    println!("longest functions (limit {MAX_FN_LINES} lines):");
    fns.iter().take(10).for_each(|(n, f)| println!("  {n:5} {f}"));
    let long_files: Vec<_> = files.iter().filter(|(n, _)| *n > MAX_FILE_LINES).collect();
    let long_fns: Vec<_> = fns.iter().filter(|(n, _)| *n > MAX_FN_LINES).collect();
    assert!(
        long_files.is_empty() && long_fns.is_empty(),
        "too long: files {long_files:?}, functions {long_fns:?}; split them by what they do"
    );
}

#[test]
fn the_measure_counts_a_function_from_fn_to_its_brace_and_skips_braces_in_text() {
    let text = "fn a() {\n    let s = \"}}}{\";\n    let c = '}';\n    // }\n    let r = r#\"{\"#;\n}\n\
                trait T {\n    fn b(&self);\n    fn c<'x>(&'x self) -> &'x str {\n        \"\"\n    }\n}\n";
    let found = functions(text);
    assert_eq!(found, vec![("a".to_string(), 1, 6), ("c".to_string(), 9, 3)]);
}
