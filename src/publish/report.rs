//! `edra inventory`: discover devices and show them, with the ResourceSlices edra would
//! publish, without contacting a cluster.
//!
//! JSON and YAML print a `v1` `List` of `resource.k8s.io/v1` ResourceSlices that
//! `kubectl apply -f -` accepts: each slice has a fixed `metadata.name` (its generateName
//! plus a stable suffix, see [`with_stable_name`]) instead of `generateName`, and no owner
//! reference (the Node's UID is not known offline). Their pool generation is 1: the
//! generation the agent would use depends on what the cluster already has. The table
//! lists one device per line.

use std::fmt::Write as _;
use std::io::Write;

use serde_json::json;

use super::desired::{NodeIdentity, desired_slices, quantity, with_stable_name};
use crate::config::Config;
use crate::inventory::{Inventory, InventoryError, backend_from_config};

/// How to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A `List` of ResourceSlices as JSON.
    Json,
    /// The same as YAML.
    Yaml,
    /// One line per device.
    Table,
}

/// Why the inventory could not be shown.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Discovery failed.
    #[error(transparent)]
    Discover(#[from] InventoryError),
    /// The slices could not be encoded.
    #[error("encoding the ResourceSlices as {format} failed")]
    Encode {
        /// `JSON` or `YAML`.
        format: &'static str,
        /// The encoder's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Standard output could not be written.
    #[error("writing to standard output failed")]
    Write(#[source] std::io::Error),
}

/// Discovers with the configured backend and writes the result to `out`.
pub fn run(cfg: &Config, format: Format, out: &mut dyn Write) -> Result<(), ReportError> {
    let backend = backend_from_config(cfg)?;
    let inv = backend.discover()?;
    tracing::debug!(backend = backend.name(), devices = inv.devices.len(), "discovered");
    let text = render(cfg, &inv, format)?;
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).map_err(ReportError::Write)
}

/// The text `edra inventory` prints for `inv`.
pub fn render(cfg: &Config, inv: &Inventory, format: Format) -> Result<String, ReportError> {
    let node = NodeIdentity { name: cfg.node_name.clone(), uid: None };
    let published = cfg.sharing.published(inv, true);
    let slices: Vec<_> =
        desired_slices(&published, &node, &cfg.driver_name, 1).into_iter().map(with_stable_name).collect();
    let list = json!({ "apiVersion": "v1", "kind": "List", "items": slices });
    match format {
        Format::Json => serde_json::to_string_pretty(&list)
            .map(|mut s| {
                s.push('\n');
                s
            })
            .map_err(|e| ReportError::Encode { format: "JSON", source: Box::new(e) }),
        Format::Yaml => {
            yaml_serde::to_string(&list).map_err(|e| ReportError::Encode { format: "YAML", source: Box::new(e) })
        }
        Format::Table => Ok(table(cfg, inv, slices.len())),
    }
}

fn table(cfg: &Config, inv: &Inventory, slice_count: usize) -> String {
    let rows: Vec<[String; 5]> = inv
        .devices
        .iter()
        .map(|d| {
            let memory = d.capacity.get("memory").map(|m| quantity(*m)).unwrap_or_default();
            [d.name.clone(), d.text("type"), d.uuid.clone(), d.text("productName"), memory]
        })
        .collect();
    let header = ["NAME", "TYPE", "UUID", "PRODUCT", "MEMORY"].map(String::from);
    let mut widths = header.each_ref().map(String::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    let _ = writeln!(
        out,
        "\n{} device{} in {slice_count} ResourceSlice{} (driver {}, pool {})",
        rows.len(),
        if rows.len() == 1 { "" } else { "s" },
        if slice_count == 1 { "" } else { "s" },
        cfg.driver_name,
        cfg.node_name
    );
    out
}
