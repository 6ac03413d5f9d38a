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
mod tests;
