//! `edra selftest`'s output: a summary table (check, GPU, result, duration, detail, fix)
//! for people, or the [`Report`] as JSON (schema [`super::SCHEMA`]) for tools.

use std::fmt::Write as _;

use super::Report;

/// The report as pretty JSON with a final newline.
pub fn json(report: &Report) -> String {
    let mut s = serde_json::to_string_pretty(report).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    s.push('\n');
    s
}

/// The report as text: the GPUs found, then one row per check, then the counts.
pub fn text(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "edra {} selftest, backend {}, node {}", report.version, report.backend, report.node);
    for g in &report.gpus {
        let pci = if g.pci_bus_id.is_empty() { String::new() } else { format!(" ({})", g.pci_bus_id) };
        let _ = writeln!(out, "  {}: {} {}{pci}", g.name, g.product, g.uuid);
    }
    let _ = writeln!(out);
    let rows: Vec<[String; 5]> = report
        .checks
        .iter()
        .map(|c| {
            [
                c.status.as_str().to_uppercase(),
                c.name.to_string(),
                c.gpu.clone().unwrap_or_else(|| "-".into()),
                format!("{}ms", c.duration_ms),
                if c.fix.is_empty() { c.detail.clone() } else { format!("{}\n  fix: {}", c.detail, c.fix) },
            ]
        })
        .collect();
    let header = ["RESULT", "CHECK", "GPU", "TIME", "DETAIL"].map(String::from);
    let mut widths = [0usize; 4];
    for row in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter_mut().zip(row.iter()) {
            *w = (*w).max(cell.len());
        }
    }
    let indent = widths.iter().sum::<usize>() + 2 * widths.len();
    for row in std::iter::once(&header).chain(&rows) {
        let mut lines = row[4].lines();
        let _ = writeln!(
            out,
            "{:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            lines.next().unwrap_or_default(),
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3]
        );
        for l in lines {
            let _ = writeln!(out, "{:indent$}{l}", "");
        }
    }
    let s = &report.summary;
    let _ = writeln!(
        out,
        "\n{} passed, {} warnings, {} failed, {} skipped in {:.1}s",
        s.passed,
        s.warnings,
        s.failed,
        s.skipped,
        s.duration_ms as f64 / 1000.0
    );
    out
}
