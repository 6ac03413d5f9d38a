//! Rendering a [`Report`]: JSON (`{"checks": [...], "summary": {...}}`) and a table whose
//! DETAIL and FIX columns wrap at word boundaries, so it fits a terminal; and the
//! normalisation of multi-line texts to one line.

use serde_json::json;

use super::{Report, Status};

/// Width of the DETAIL column before it wraps.
const DETAIL_WIDTH: usize = 60;
/// Width of the FIX column before it wraps.
const FIX_WIDTH: usize = 48;

/// One line: lines are trimmed and joined; list items (`- x`) become `; x`.
pub(super) fn one_line(text: &str) -> String {
    let mut out = String::new();
    let mut after_item = false;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match line.strip_prefix("- ") {
            Some(item) if !out.is_empty() => {
                out.push_str(if out.ends_with(':') { " " } else { "; " });
                out.push_str(item);
                after_item = true;
            }
            _ => {
                if !out.is_empty() {
                    out.push_str(if after_item { "; " } else { " " });
                }
                out.push_str(line);
                after_item = false;
            }
        }
    }
    out
}

/// Splits `text` into lines of at most `width` characters at spaces (longer words are cut).
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    for word in text.split_whitespace() {
        let mut word: Vec<char> = word.chars().collect();
        while word.len() > width {
            if !cur.is_empty() {
                lines.push(std::mem::take(&mut cur));
            }
            lines.push(word.drain(..width).collect());
        }
        let word: String = word.into_iter().collect();
        if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(&word);
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    lines
}

impl Report {
    /// `{"checks": [{"name", "status", "detail", "fix"}], "summary": {"pass", "warn", "fail",
    /// "skip", "worst", "exit_code"}}`.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "checks": self.checks,
            "summary": {
                "pass": self.count(Status::Pass),
                "warn": self.count(Status::Warn),
                "fail": self.count(Status::Fail),
                "skip": self.count(Status::Skip),
                "worst": self.worst(),
                "exit_code": self.exit_code(),
            },
        })
    }

    /// A table with the columns STATUS, CHECK, DETAIL and FIX, and a summary line.
    pub fn to_table(&self) -> String {
        let check_width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0).max("CHECK".len());
        let detail_width =
            self.checks.iter().map(|c| c.detail.chars().count()).max().unwrap_or(0).clamp(6, DETAIL_WIDTH);
        let mut out = String::new();
        let mut row = |status: &str, check: &str, detail: &[String], fix: &[String]| {
            for i in 0..detail.len().max(fix.len()).max(1) {
                let (s, c) = if i == 0 { (status, check) } else { ("", "") };
                let d = detail.get(i).map(String::as_str).unwrap_or("");
                let f = fix.get(i).map(String::as_str).unwrap_or("");
                let line = format!("{s:<6}  {c:<check_width$}  {d:<detail_width$}  {f}");
                out.push_str(line.trim_end());
                out.push('\n');
            }
        };
        row("STATUS", "CHECK", &["DETAIL".to_string()], &["FIX".to_string()]);
        for c in &self.checks {
            let fix = if c.fix.is_empty() { Vec::new() } else { wrap(&c.fix, FIX_WIDTH) };
            row(&c.status.as_str().to_uppercase(), c.name, &wrap(&c.detail, detail_width), &fix);
        }
        out.push_str(&format!(
            "\n{} passed, {} warnings, {} failed, {} skipped\n",
            self.count(Status::Pass),
            self.count(Status::Warn),
            self.count(Status::Fail),
            self.count(Status::Skip)
        ));
        out.push_str("`edra selftest` prepares claims on this node's GPUs without a cluster (docs/selftest.md)\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::CheckResult;
    use super::super::tests::report;
    use super::*;

    #[test]
    fn json_has_checks_and_summary() {
        let v = report().to_json();
        assert_eq!(v["checks"][1]["name"], "state");
        assert_eq!(v["checks"][1]["status"], "warn");
        assert_eq!(v["checks"][1]["fix"], "chmod 700 /var/lib/edra");
        assert_eq!(v["summary"]["pass"], 1);
        assert_eq!(v["summary"]["warn"], 1);
        assert_eq!(v["summary"]["worst"], "warn");
        assert_eq!(v["summary"]["exit_code"], 0);
    }

    #[test]
    fn table_aligns_columns_and_wraps_long_text() {
        let t = report().to_table();
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("STATUS  CHECK    DETAIL"), "{t}");
        assert!(lines[1].starts_with("PASS    backend  NVML 550.54.15, 2 GPUs"), "{t}");
        assert!(
            lines[2].starts_with("WARN    state    mode 0755") && lines[2].ends_with("chmod 700 /var/lib/edra"),
            "{t}"
        );
        assert!(t.contains("1 passed, 1 warnings, 0 failed, 0 skipped"), "{t}");
        let long = Report { checks: vec![CheckResult::pass("x", "word ".repeat(40))] };
        let t = long.to_table();
        assert!(
            t.lines().filter(|l| l.contains("word")).all(|l| l.chars().count() <= 6 + 2 + 5 + 2 + DETAIL_WIDTH),
            "{t}"
        );
        assert_eq!(t.lines().filter(|l| l.contains("word")).count(), 4, "{t}");
    }

    #[test]
    fn texts_become_one_line() {
        let e = "no Kubernetes credentials found; tried:\n  - KUBECONFIG: not set\n  - in-cluster: no\nset one";
        assert_eq!(one_line(e), "no Kubernetes credentials found; tried: KUBECONFIG: not set; in-cluster: no; set one");
        assert_eq!(CheckResult::pass("a", "x\ny").detail, "x y");
        assert_eq!(one_line("a\n- b"), "a; b");
    }

    #[test]
    fn wrapping() {
        assert_eq!(wrap("aa bb cc", 5), ["aa bb", "cc"]);
        assert_eq!(wrap("abcdefgh", 3), ["abc", "def", "gh"]);
        assert_eq!(wrap("", 3), [""]);
    }
}
