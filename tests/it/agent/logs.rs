//! What `edra run` writes to stderr when it is not a terminal: plain lines without ANSI
//! escape codes (a file, a pipe, a log collector), and under systemd's journal lines with
//! an sd-daemon priority prefix and no timestamp of their own.

use std::os::unix::fs::MetadataExt;

use crate::support::agent::{ChildAgent, Cluster};

/// Starts an agent logging at info with `env`, stops it; returns what it wrote.
async fn run_and_stop(cluster: &Cluster, env: &[(&str, &str)]) -> String {
    let mut all = vec![("EDRA_LOG_LEVEL", "info")];
    all.extend_from_slice(env);
    let agent = ChildAgent::start_with_env(cluster, "", &all).await;
    let log = agent.log.clone();
    agent.terminate().await;
    std::fs::read_to_string(log).expect("read the agent's log")
}

#[tokio::test]
async fn a_redirected_log_has_no_escape_codes_and_says_each_thing_once() {
    let cluster = Cluster::start().await;
    let text = run_and_stop(&cluster, &[]).await;
    assert!(text.contains(" INFO ") && text.contains("serving the kubelet"), "{text}");
    assert!(!text.contains('\x1b'), "escape codes in a log written to a file:\n{text:?}");
    assert_eq!(text.matches("state recovered").count(), 1, "{text}");
    assert_eq!(text.matches("stopped").count(), 1, "{text}");
    // A timestamp leads each line when the journal is not the destination.
    for line in text.lines() {
        assert!(line.starts_with("20") && line.as_bytes().get(10) == Some(&b'T'), "no timestamp: {line:?}");
    }
}

#[tokio::test]
async fn under_the_journal_lines_carry_a_priority_and_no_timestamp() {
    let cluster = Cluster::start().await;
    // The agent's stderr is this file; JOURNAL_STREAM names it as systemd does.
    let path = cluster.dir.path().join("edra-run.log");
    std::fs::write(&path, "").expect("create the log");
    let meta = std::fs::metadata(&path).expect("stat the log");
    let stream = format!("{}:{}", meta.dev(), meta.ino());
    let text = run_and_stop(&cluster, &[("JOURNAL_STREAM", &stream)]).await;
    assert!(!text.contains('\x1b'), "{text:?}");
    let started = text.lines().find(|l| l.contains("serving the kubelet")).expect("an info line");
    assert!(started.starts_with("<6>INFO edra::app: serving the kubelet"), "{started:?}");
    for line in text.lines() {
        let priority = line.get(..3).unwrap_or_default();
        assert!(["<3>", "<4>", "<6>", "<7>"].contains(&priority), "no priority prefix: {line:?}");
        let level = ["ERROR ", "WARN ", "INFO ", "DEBUG ", "TRACE "];
        assert!(level.iter().any(|l| line[3..].starts_with(l)), "not the level after the priority: {line:?}");
    }
    // A stream that is not stderr's (inherited, then redirected) is ignored.
    // Renamed, not removed: the file keeps its inode, so the new log cannot reuse it.
    std::fs::rename(&path, cluster.dir.path().join("journal-stream")).expect("move the log aside");
    let text = run_and_stop(&cluster, &[("JOURNAL_STREAM", &stream)]).await;
    assert!(text.lines().all(|l| !l.starts_with('<')), "{text}");
}

#[tokio::test]
async fn a_log_filter_per_module_keeps_that_modules_lines_and_drops_the_others() {
    let cluster = Cluster::start().await;
    let target = |line: &str| line.split(" INFO ").nth(1).and_then(|rest| rest.split(": ").next()).map(str::to_string);
    let everything = run_and_stop(&cluster, &[]).await;
    let others = everything.lines().filter_map(target).filter(|t| t != "edra::app").count();
    assert!(others > 0, "at info, lines of modules besides edra::app:\n{everything}");
    let both = run_and_stop(&cluster, &[("EDRA_LOG_LEVEL", "warn,edra::app=info")]).await;
    // The agent appends to the cluster's log file: the second run's lines follow the first's.
    let filtered = both.strip_prefix(everything.as_str()).unwrap_or(&both);
    let targets: Vec<String> = filtered.lines().filter_map(target).collect();
    assert!(targets.iter().any(|t| t == "edra::app"), "{filtered}");
    assert!(targets.iter().all(|t| t == "edra::app"), "{filtered}");
    // A module can be raised above the default: debug lines of edra::app only.
    assert!(!everything.contains(" DEBUG "), "{everything}");
    let all = run_and_stop(&cluster, &[("EDRA_LOG_LEVEL", "info,edra::app=debug")]).await;
    let raised = all.strip_prefix(both.as_str()).unwrap_or(&all);
    assert!(raised.contains(" DEBUG edra::app: malloc arenas limited"), "{raised}");
    assert!(raised.lines().filter(|l| l.contains(" DEBUG ")).all(|l| l.contains(" DEBUG edra::app: ")), "{raised}");
    assert!(raised.contains(" INFO edra::prepare::recover: state recovered"), "{raised}");
}
