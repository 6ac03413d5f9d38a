//! Layered configuration sources and a reader that collects every problem.
//!
//! Values come from three layers, highest precedence first: command-line flags
//! (`--set key=value` and the dedicated flags), `EDRA_*` environment variables and the
//! TOML file; a key found in none of them takes its default. The [`Reader`] is asked
//! for each key with its type; a bad value is recorded as a [`Problem`] naming where the
//! value came from, and reading goes on, so one run reports every problem at once.
//! Keys that were given but never asked for are reported as unknown at the end.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where a value came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The configuration file as a whole.
    File(PathBuf),
    /// A key in the configuration file, at this line (1-based).
    FileLine(PathBuf, usize),
    /// An environment variable.
    Env(String),
    /// A command-line flag.
    Flag(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File(p) => write!(f, "{}", p.display()),
            Origin::FileLine(p, line) => write!(f, "{}:{line}", p.display()),
            Origin::Env(v) => write!(f, "environment variable {v}"),
            Origin::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// A raw value before it is interpreted for its key.
#[derive(Debug, Clone)]
pub enum Raw {
    /// Parsed TOML (from the file).
    Toml(toml::Value),
    /// Text from the environment or a flag; parsed according to the key's type.
    Text(String),
}

/// One configuration problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The dotted key, or empty for problems with a whole source.
    pub key: String,
    /// Where the bad value came from, if it came from somewhere.
    pub origin: Option<Origin>,
    /// What is wrong and, where it helps, what to do.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.origin, self.key.is_empty()) {
            (Some(o), false) => write!(f, "{o}: {}: {}", self.key, self.message),
            (Some(o), true) => write!(f, "{o}: {}", self.message),
            (None, false) => write!(f, "{}: {}", self.key, self.message),
            (None, true) => write!(f, "{}", self.message),
        }
    }
}

/// The environment variable that overrides `key`: `EDRA_` + upper case, `.` → `_`.
pub fn env_name(key: &str) -> String {
    format!("EDRA_{}", key.to_ascii_uppercase().replace('.', "_"))
}

/// Collected sources plus the problems found so far.
#[derive(Debug, Default)]
pub struct Reader {
    file: BTreeMap<String, (Raw, Origin)>,
    env: BTreeMap<String, String>,
    flags: BTreeMap<String, (String, String)>,
    asked: BTreeSet<String>,
    problems: Vec<Problem>,
}

impl Reader {
    /// A reader over no sources: every key takes its default.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a parsed TOML document read from `path`, flattening tables into dotted keys.
    /// Arrays of tables stay whole values (they are read as one key).
    pub fn with_toml(mut self, path: &Path, table: toml::Table) -> Self {
        fn flatten(prefix: &str, table: toml::Table, path: &Path, out: &mut BTreeMap<String, (Raw, Origin)>) {
            for (k, v) in table {
                let key = if prefix.is_empty() { k } else { format!("{prefix}.{k}") };
                match v {
                    toml::Value::Table(t) => flatten(&key, t, path, out),
                    other => {
                        out.insert(key, (Raw::Toml(other), Origin::File(path.to_path_buf())));
                    }
                }
            }
        }
        flatten("", table, path, &mut self.file);
        self
    }

    /// Puts the line of each file key (from [`key_lines`]) into its origin, so problems
    /// with file values say where to look, as TOML syntax errors do.
    pub fn with_key_lines(mut self, lines: &BTreeMap<String, usize>) -> Self {
        for (key, (_, origin)) in self.file.iter_mut() {
            if let (Origin::File(path), Some(line)) = (&*origin, lines.get(key)) {
                *origin = Origin::FileLine(path.clone(), *line);
            }
        }
        self
    }

    /// Adds the `EDRA_*` variables from an environment (other variables are ignored).
    pub fn with_env<I: IntoIterator<Item = (String, String)>>(mut self, vars: I) -> Self {
        for (k, v) in vars {
            if k.starts_with("EDRA_") {
                self.env.insert(k, v);
            }
        }
        self
    }

    /// Adds a flag value for `key`; `flag` is how the user wrote it, for messages.
    pub fn with_flag(mut self, key: &str, value: String, flag: &str) -> Self {
        self.flags.insert(key.to_string(), (value, flag.to_string()));
        self
    }

    /// Records a problem that is not about one value.
    pub fn problem(&mut self, key: &str, origin: Option<Origin>, message: impl Into<String>) {
        self.problems.push(Problem { key: key.to_string(), origin, message: message.into() });
    }

    /// The raw value of `key` from the highest-precedence layer that has it.
    fn lookup(&mut self, key: &str) -> Option<(Raw, Origin)> {
        self.asked.insert(key.to_string());
        if let Some((v, flag)) = self.flags.get(key) {
            return Some((Raw::Text(v.clone()), Origin::Flag(flag.clone())));
        }
        let env = env_name(key);
        if let Some(v) = self.env.get(&env) {
            return Some((Raw::Text(v.clone()), Origin::Env(env)));
        }
        self.file.get(key).cloned()
    }

    /// Where the value of `key` came from, if it was given at all.
    pub fn origin_of(&mut self, key: &str) -> Option<Origin> {
        self.lookup(key).map(|(_, o)| o)
    }

    /// Reads `key` with `parse`; records a problem and returns `default` when it fails.
    pub fn get<T>(&mut self, key: &str, default: T, parse: impl Fn(&Raw) -> Result<T, String>) -> T {
        match self.lookup(key) {
            None => default,
            Some((raw, origin)) => match parse(&raw) {
                Ok(v) => v,
                Err(message) => {
                    self.problems.push(Problem { key: key.to_string(), origin: Some(origin), message });
                    default
                }
            },
        }
    }

    /// Reads an optional key (no default).
    pub fn opt<T>(&mut self, key: &str, parse: impl Fn(&Raw) -> Result<T, String>) -> Option<T> {
        let (raw, origin) = self.lookup(key)?;
        match parse(&raw) {
            Ok(v) => Some(v),
            Err(message) => {
                self.problems.push(Problem { key: key.to_string(), origin: Some(origin), message });
                None
            }
        }
    }

    /// Reports keys that were given but never asked for, then returns all problems.
    pub fn finish(mut self) -> Vec<Problem> {
        let known: Vec<String> = self.asked.iter().cloned().collect();
        let suggest = |given: &str, to_key: &dyn Fn(&str) -> String| -> String {
            known
                .iter()
                .map(|k| (to_key(k), k))
                .filter(|(candidate, _)| similar(given, candidate))
                .map(|(candidate, _)| format!(" (did you mean {candidate}?)"))
                .next()
                .unwrap_or_default()
        };
        for (key, (_, origin)) in &self.file {
            if !self.asked.contains(key) {
                let hint = suggest(key, &|k| k.to_string());
                self.problems.push(Problem {
                    key: key.clone(),
                    origin: Some(origin.clone()),
                    message: format!("unknown key{hint}"),
                });
            }
        }
        let env_known: BTreeSet<String> = known.iter().map(|k| env_name(k)).collect();
        for var in self.env.keys() {
            if !env_known.contains(var) {
                let hint = suggest(var, &|k| env_name(k));
                self.problems.push(Problem {
                    key: String::new(),
                    origin: Some(Origin::Env(var.clone())),
                    message: format!("not a configuration key{hint}"),
                });
            }
        }
        for (key, (_, flag)) in &self.flags {
            if !self.asked.contains(key) {
                let hint = suggest(key, &|k| k.to_string());
                self.problems.push(Problem {
                    key: key.clone(),
                    origin: Some(Origin::Flag(flag.clone())),
                    message: format!("unknown key{hint}"),
                });
            }
        }
        self.problems
    }
}

/// The line (1-based) of each key of a TOML document, as dotted keys the way
/// [`Reader::with_toml`] flattens them; empty when the document does not parse.
pub fn key_lines(text: &str) -> BTreeMap<String, usize> {
    fn walk(prefix: &str, table: &toml::de::DeTable<'_>, text: &str, out: &mut BTreeMap<String, usize>) {
        for (k, v) in table {
            let key = if prefix.is_empty() { k.get_ref().to_string() } else { format!("{prefix}.{}", k.get_ref()) };
            match v.get_ref() {
                toml::de::DeValue::Table(t) => walk(&key, t, text, out),
                _ => {
                    let before = text.get(..k.span().start).unwrap_or_default();
                    out.insert(key, before.matches('\n').count().saturating_add(1));
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    if let Ok(doc) = toml::de::DeTable::parse(text) {
        walk("", doc.get_ref(), text, &mut out);
    }
    out
}

/// True when two names differ by at most two single-character edits.
fn similar(a: &str, b: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    if a.len().abs_diff(b.len()) > 2 {
        return false;
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()] <= 2
}

// ---- value parsers -------------------------------------------------------------------

/// A string value.
pub fn string(raw: &Raw) -> Result<String, String> {
    match raw {
        Raw::Text(s) => Ok(s.clone()),
        Raw::Toml(toml::Value::String(s)) => Ok(s.clone()),
        Raw::Toml(other) => Err(format!("expected a string, found {}", other.type_str())),
    }
}

/// An absolute path.
pub fn abs_path(raw: &Raw) -> Result<PathBuf, String> {
    let s = string(raw)?;
    let p = PathBuf::from(&s);
    if s.is_empty() {
        Err("expected an absolute path, found an empty string".into())
    } else if !p.is_absolute() {
        Err(format!("{s:?} is not an absolute path"))
    } else {
        Ok(p)
    }
}

/// A boolean: TOML `true`/`false`, or text `true|false|1|0|yes|no`.
pub fn boolean(raw: &Raw) -> Result<bool, String> {
    match raw {
        Raw::Toml(toml::Value::Boolean(b)) => Ok(*b),
        Raw::Text(s) => match s.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err(format!("expected true or false, found {s:?}")),
        },
        Raw::Toml(other) => Err(format!("expected true or false, found {}", other.type_str())),
    }
}

/// A non-negative integer.
pub fn uint(raw: &Raw) -> Result<u64, String> {
    match raw {
        Raw::Toml(toml::Value::Integer(i)) if *i >= 0 => Ok(*i as u64),
        Raw::Toml(toml::Value::Integer(i)) => Err(format!("expected a non-negative integer, found {i}")),
        Raw::Text(s) => s.trim().parse::<u64>().map_err(|_| format!("expected a non-negative integer, found {s:?}")),
        Raw::Toml(other) => Err(format!("expected an integer, found {}", other.type_str())),
    }
}

/// A positive number (integer or float).
pub fn positive_f64(raw: &Raw) -> Result<f64, String> {
    let v = match raw {
        Raw::Toml(toml::Value::Integer(i)) => *i as f64,
        Raw::Toml(toml::Value::Float(f)) => *f,
        Raw::Text(s) => s.trim().parse::<f64>().map_err(|_| format!("expected a number, found {s:?}"))?,
        Raw::Toml(other) => return Err(format!("expected a number, found {}", other.type_str())),
    };
    if v.is_finite() && v > 0.0 { Ok(v) } else { Err(format!("expected a number greater than 0, found {v}")) }
}

/// A duration: `"250ms"`, `"30s"`, `"5m"`, `"1h"`, compound `"1m30s"`, or an integer
/// number of seconds.
pub fn duration(raw: &Raw) -> Result<Duration, String> {
    match raw {
        Raw::Toml(toml::Value::Integer(i)) if *i >= 0 => Ok(Duration::from_secs(*i as u64)),
        Raw::Toml(toml::Value::String(s)) | Raw::Text(s) => parse_duration(s),
        Raw::Toml(other) => Err(format!("expected a duration such as \"30s\", found {}", other.type_str())),
    }
}

/// Parses `"1h2m3s"`, `"250ms"` or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let err = || format!("expected a duration such as \"500ms\", \"30s\" or \"5m\", found {s:?}");
    let t = s.trim();
    if t.is_empty() {
        return Err(err());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
        if digits == 0 {
            return Err(err());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| err())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let d = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(err)?),
            "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(err)?),
            _ => return Err(err()),
        };
        total = total.checked_add(d).ok_or_else(err)?;
    }
    Ok(total)
}

/// A list of strings: a TOML array, or text that is either a TOML inline array
/// (`["/a", "/b"]`) or comma-separated (`/a,/b`).
pub fn string_list(raw: &Raw) -> Result<Vec<String>, String> {
    match raw {
        Raw::Text(s) if s.trim_start().starts_with('[') => match toml_value(raw) {
            Ok(array @ toml::Value::Array(_)) => string_list(&Raw::Toml(array)),
            _ => Err(format!(
                "expected a TOML array of strings such as [\"/a\", \"/b\"] or comma-separated values such as /a,/b, found {s:?}"
            )),
        },
        Raw::Text(s) => Ok(s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(String::from).collect()),
        Raw::Toml(toml::Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                toml::Value::String(s) => Ok(s.clone()),
                other => Err(format!("expected a list of strings, found an element of type {}", other.type_str())),
            })
            .collect(),
        Raw::Toml(other) => Err(format!("expected a list of strings, found {}", other.type_str())),
    }
}

/// A list of absolute paths.
pub fn abs_path_list(raw: &Raw) -> Result<Vec<PathBuf>, String> {
    string_list(raw)?.into_iter().map(|s| abs_path(&Raw::Text(s))).collect()
}

/// A byte size: an integer, or a string with a binary (`Ki`, `Mi`, `Gi`, `Ti`) or decimal
/// (`k`, `M`, `G`, `T`) suffix as in Kubernetes quantities.
pub fn bytes(raw: &Raw) -> Result<u64, String> {
    match raw {
        Raw::Toml(toml::Value::Integer(i)) if *i >= 0 => Ok(*i as u64),
        Raw::Toml(toml::Value::String(s)) | Raw::Text(s) => parse_bytes(s),
        Raw::Toml(other) => Err(format!("expected a size such as \"80Gi\", found {}", other.type_str())),
    }
}

/// Parses `"80Gi"`, `"512Mi"`, `"40G"` or a plain number of bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("expected a size such as \"80Gi\" or \"512Mi\", found {s:?}"))?;
    let mult: u64 = match suffix {
        "" => 1,
        "k" => 1000,
        "M" => 1000u64.pow(2),
        "G" => 1000u64.pow(3),
        "T" => 1000u64.pow(4),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return Err(format!("unknown size suffix {suffix:?} in {s:?}; use Ki, Mi, Gi, Ti, k, M, G or T")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} is too large"))
}

/// Any TOML value: file values as they are, text parsed as a TOML inline value.
pub fn toml_value(raw: &Raw) -> Result<toml::Value, String> {
    match raw {
        Raw::Toml(v) => Ok(v.clone()),
        Raw::Text(s) => {
            let doc = format!("v = {s}");
            let mut table: toml::Table =
                toml::from_str(&doc).map_err(|e| format!("not a TOML value: {}", e.message()))?;
            table.remove("v").ok_or_else(|| "not a TOML value".to_string())
        }
    }
}

#[cfg(test)]
mod tests;
