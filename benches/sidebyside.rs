//! edra next to another DRA kubelet plugin on a real control plane: the same kubelet-side
//! gRPC client calls both over their Unix sockets, alternating, with claims the real
//! scheduler allocated to pods bound to each plugin's node.
//!
//! A development tool, not part of `cargo bench`'s default runs: it needs a running
//! Kubernetes control plane with two nodes and the two plugins serving (see
//! docs/benchmarks.md, "edra and the Go reference side by side", for the recipe), and
//! prints "skipped" without it. Settings come from the environment:
//!
//! - `SBS_KUBECTL`: the kubectl command with an admin kubeconfig, e.g.
//!   `/h/bin/kubectl --kubeconfig /h/admin.kubeconfig`;
//! - `SBS_A` and `SBS_B`: `<label>,<dra socket>,<node>,<device class>` of each plugin;
//! - `SBS_PREFETCH=off`: the plugins were started without reading claims before the
//!   kubelet asks (edra with `EDRA_CLAIMS_PREFETCH=false`); the first-time row says so;
//! - `SBS_ROUNDS` (200): claims per plugin; `SBS_DELAY_MS` (20): how long after its pod is
//!   bound a claim's prepare is sent (the kubelet calls after it has seen and admitted the
//!   pod); `SBS_REPEATS` (1): repeated prepares timed per claim (more samples for their
//!   tail; the kubelet repeats a prepare at every restart of a pod's containers; with
//!   more than one, the table also splits them into the first of each claim, sent right
//!   after the first-time call, and the others);
//!   `SBS_INTERLEAVE=after` (or `before`): a call with no claims right after (before)
//!   each repeated prepare, timed as its own row: the floor under the repeated prepares in
//!   their own conditions (the control plane at work between rounds), not only at the
//!   end with it idle; with `before`, the first of them comes right after the first-time
//!   call, in the place of the first repeated prepare;
//!   `SBS_RAW`: a file to write every sample to, one per line (plugin, operation, index,
//!   microseconds), for looking at a tail sample by sample.
//!
//! Each round creates, per plugin, one claim and one pod using it pinned to the plugin's
//! node, waits until the scheduler allocated and reserved the claim and bound the pod, then
//! times NodePrepareResources (first time), NodePrepareResources again (repeated),
//! NodeUnprepareResources, and NodePrepareResources once more after that unprepare (the same
//! claim for the same pod: nothing read early is left for it, so the claim is read in the
//! call), unprepares it again, and deletes the pod and the claim. Plugins alternate A B, B A.
//! Then it times as many calls with no claims as there were repeated prepares, back to
//! back and alternating: the floor under every answer (the gRPC round trip, each plugin's
//! server, the scheduling of both processes), which shows how much of a tail is the
//! plugin's own work.

#[allow(unused_imports, dead_code)]
#[path = "../tests/it/support/kubelet.rs"]
mod kubelet;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use edra::plugin::proto::dra_v1 as v1;

/// A table row: its label and the samples it shows.
type Row = (&'static str, fn(&Plugin) -> &Vec<Duration>);

struct Plugin {
    label: String,
    socket: PathBuf,
    node: String,
    class: String,
    first: Vec<Duration>,
    repeat: Vec<Duration>,
    release: Vec<Duration>,
    /// NodePrepareResources of the claim just unprepared, for the same pod: nothing was
    /// read before the call (the claim is read inside it).
    again: Vec<Duration>,
    /// NodePrepareResources with no claims: the plugin's gRPC stack and nothing else.
    empty: Vec<Duration>,
    /// The same, each right after a repeated prepare (`SBS_INTERLEAVE=1`).
    between: Vec<Duration>,
}

fn kubectl(base: &[String], args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    let mut cmd = Command::new(&base[0]);
    cmd.args(&base[1..]).args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().map_err(|e| format!("cannot run kubectl: {e}"))?;
    if let Some(text) = stdin {
        use std::io::Write;
        child.stdin.take().ok_or("no stdin")?.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn objects(ns: &str, name: &str, node: &str, class: &str) -> String {
    format!(
        "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {{name: {name}, namespace: {ns}}}\n\
         spec:\n  devices:\n    requests:\n    - name: dev\n      exactly: {{deviceClassName: {class}}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  \
         nodeSelector: {{kubernetes.io/hostname: {node}}}\n  terminationGracePeriodSeconds: 0\n  \
         automountServiceAccountToken: false\n  containers:\n  - name: c\n    image: busybox\n    \
         resources: {{claims: [{{name: dev}}]}}\n  resourceClaims:\n  - {{name: dev, resourceClaimName: {name}}}\n"
    )
}

/// Waits until claim `name` is reserved and its pod bound; returns the claim's UID.
fn wait_ready(base: &[String], ns: &str, name: &str) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let claim = kubectl(
            base,
            &["-n", ns, "get", "resourceclaim", name, "-o", "jsonpath={.metadata.uid} {.status.reservedFor[0].name}"],
            None,
        )?;
        let pod = kubectl(base, &["-n", ns, "get", "pod", name, "-o", "jsonpath={.spec.nodeName}"], None)?;
        let mut parts = claim.split_whitespace();
        if let (Some(uid), Some(_), false) = (parts.next(), parts.next(), pod.trim().is_empty()) {
            return Ok(uid.to_string());
        }
        if Instant::now() > deadline {
            return Err(format!("claim {ns}/{name} not allocated and bound within 60 s"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn percentile(v: &[Duration], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort();
    if v.is_empty() {
        return 0.0;
    }
    let idx = ((p / 100.0) * (v.len() as f64)).ceil() as usize;
    v[idx.clamp(1, v.len()) - 1].as_secs_f64() * 1000.0
}

fn parse_plugin(var: &str) -> Option<Plugin> {
    let v = std::env::var(var).ok()?;
    let mut parts = v.split(',');
    Some(Plugin {
        label: parts.next()?.to_string(),
        socket: PathBuf::from(parts.next()?),
        node: parts.next()?.to_string(),
        class: parts.next()?.to_string(),
        first: Vec::new(),
        repeat: Vec::new(),
        release: Vec::new(),
        again: Vec::new(),
        empty: Vec::new(),
        between: Vec::new(),
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let (Some(base), Some(a), Some(b)) =
        (std::env::var("SBS_KUBECTL").ok(), parse_plugin("SBS_A"), parse_plugin("SBS_B"))
    else {
        println!("sidebyside: skipped (set SBS_KUBECTL, SBS_A and SBS_B; see the module docs)");
        return;
    };
    let base: Vec<String> = base.split_whitespace().map(str::to_string).collect();
    let rounds: usize = std::env::var("SBS_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let delay = Duration::from_millis(std::env::var("SBS_DELAY_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(20));
    let repeats: usize = std::env::var("SBS_REPEATS").ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1);
    let interleave = std::env::var("SBS_INTERLEAVE").ok();
    let (empty_before, empty_after) = (interleave.as_deref() == Some("before"), interleave.as_deref() == Some("after"));
    let ns = "sidebyside";
    let _ = kubectl(&base, &["create", "namespace", ns], None);
    let mut plugins = [a, b];
    let mut clients = Vec::new();
    for p in &plugins {
        clients.push(kubelet::dra_v1(&p.socket).await);
    }
    let warmup = 10;
    for round in 0..(warmup + rounds) {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let p = &mut plugins[i];
            let name = format!("{}-{round}", p.label);
            kubectl(&base, &["apply", "-f", "-"], Some(&objects(ns, &name, &p.node, &p.class))).expect("create");
            let uid = wait_ready(&base, ns, &name).expect("allocated");
            std::thread::sleep(delay);
            let claim = v1::Claim { namespace: ns.into(), name: name.clone(), uid: uid.clone() };
            let client = &mut clients[i];
            let (first, err) = timed_prepare(client, &claim).await;
            assert!(err.is_empty(), "{}: prepare of {name} failed: {err}", p.label);
            let mut repeat = Vec::with_capacity(repeats);
            let mut between = Vec::new();
            for _ in 0..repeats {
                if empty_before {
                    between.push(empty_call(client).await);
                }
                let t = Instant::now();
                client
                    .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![claim.clone()] })
                    .await
                    .expect("NodePrepareResources again");
                repeat.push(t.elapsed());
                if empty_after {
                    between.push(empty_call(client).await);
                }
            }
            let t = Instant::now();
            client
                .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: vec![claim.clone()] })
                .await
                .expect("NodeUnprepareResources");
            let release = t.elapsed();
            // The same claim prepared again for the same pod, after its unprepare: what the
            // plugin read before the kubelet asked is used up, so the call reads the claim.
            std::thread::sleep(delay);
            let (again, err) = timed_prepare(client, &claim).await;
            assert!(err.is_empty(), "{}: prepare of {name} after its unprepare failed: {err}", p.label);
            client
                .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: vec![claim] })
                .await
                .expect("NodeUnprepareResources again");
            if round >= warmup {
                p.first.push(first);
                p.repeat.extend(repeat);
                p.between.extend(between);
                p.release.push(release);
                p.again.push(again);
            }
            let _ = kubectl(
                &base,
                &["-n", ns, "delete", "pod", &name, "--force", "--grace-period=0", "--wait=false"],
                None,
            );
            let _ = kubectl(&base, &["-n", ns, "delete", "resourceclaim", &name, "--wait=false"], None);
        }
    }
    // The floor under every answer: a call with no claims, timed back to back like the
    // repeated prepares, as many of them, alternating between the plugins.
    let empties = rounds.saturating_mul(repeats);
    for n in 0..(warmup + empties) {
        for i in if n % 2 == 0 { [0, 1] } else { [1, 0] } {
            let took = empty_call(&mut clients[i]).await;
            if n >= warmup {
                plugins[i].empty.push(took);
            }
        }
    }
    println!(
        "## Side by side: {rounds} claims per plugin, alternating; prepare sent {} ms after the pod was bound\n",
        delay.as_millis()
    );
    let (a, b) = (&plugins[0].label, &plugins[1].label);
    println!("| operation (ms) | {a} p50 | {a} p90 | {a} p99 | {b} p50 | {b} p90 | {b} p99 |");
    println!("|---|---|---|---|---|---|---|");
    // With the plugins started without reading claims early (edra's `claims.prefetch =
    // false`), every first-time prepare reads its claim inside the call.
    let no_prefetch = std::env::var("SBS_PREFETCH").is_ok_and(|v| v == "off");
    let rows: [Row; 6] = [
        (if no_prefetch { "prepare, first time, no prefetch" } else { "prepare, first time" }, |p| &p.first),
        ("prepare after unprepare, same pod", |p| &p.again),
        ("prepare, repeated", |p| &p.repeat),
        ("unprepare", |p| &p.release),
        ("call with no claims", |p| &p.empty),
        ("call with no claims, next to each repeated prepare", |p| &p.between),
    ];
    for (what, f) in rows {
        if f(&plugins[0]).is_empty() {
            continue;
        }
        print_row(what, f(&plugins[0]), f(&plugins[1]));
        if what == "prepare, repeated" && repeats > 1 {
            // Where a repeated prepare's tail comes from: the call right after the
            // first-time one (the first after the pause before it) or one after another
            // repeated call. Each claim's repeats are `repeats` samples in a row.
            let part = |p: &Plugin, first: bool| -> Vec<Duration> {
                p.repeat.chunks(repeats).flat_map(|c| if first { &c[..1] } else { &c[1..] }).copied().collect()
            };
            print_row("  repeated, first of each claim", &part(&plugins[0], true), &part(&plugins[1], true));
            print_row("  repeated, the others", &part(&plugins[0], false), &part(&plugins[1], false));
        }
    }
    if let Ok(path) = std::env::var("SBS_RAW") {
        let mut out = String::new();
        for p in &plugins {
            for (what, f) in rows {
                for (i, d) in f(p).iter().enumerate() {
                    out.push_str(&format!("{}\t{what}\t{i}\t{}\n", p.label, d.as_micros()));
                }
            }
        }
        std::fs::write(&path, out).expect("write SBS_RAW");
    }
}

/// Times one NodePrepareResources call for `claim`; returns how long it took and the
/// error the plugin gave for the claim (empty when it was prepared).
async fn timed_prepare(
    client: &mut v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>,
    claim: &v1::Claim,
) -> (Duration, String) {
    let t = Instant::now();
    let r = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: vec![claim.clone()] })
        .await
        .expect("NodePrepareResources");
    let took = t.elapsed();
    (took, r.get_ref().claims.get(&claim.uid).map(|c| c.error.clone()).unwrap_or_default())
}

/// Times one NodePrepareResources call with no claims.
async fn empty_call(client: &mut v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>) -> Duration {
    let t = Instant::now();
    client
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: Vec::new() })
        .await
        .expect("NodePrepareResources with no claims");
    t.elapsed()
}

/// One line of the table: p50, p90 and p99 of each plugin's samples.
fn print_row(what: &str, x: &[Duration], y: &[Duration]) {
    let cells: Vec<String> =
        [x, y].iter().flat_map(|v| [50.0, 90.0, 99.0].map(|q| format!("{:.3}", percentile(v, q)))).collect();
    println!("| {what} ({} samples each) | {} |", x.len().min(y.len()), cells.join(" | "));
}
