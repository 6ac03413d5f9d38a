//! ResourceSlice and pod watches: a streaming body of JSON lines `{"type": ..., "object": ...}`.
//!
//! Without `resourceVersion` (or with `0`) the stream starts with ADDED for every matching
//! slice; with `resourceVersion=N` it replays the history after N, or answers 410 when N is
//! older than the kept window (an ERROR event on a 200 stream like kube-apiserver, or HTTP
//! 410 when the server is so configured). Then it follows changes, sends BOOKMARKs with the
//! current resourceVersion every bookmark interval when `allowWatchBookmarks=true`, and ends
//! after `timeoutSeconds` (default 1800), on `close_watches`, or when the client goes away.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use super::Shared;
use super::authz::Attributes;
use super::convert::ApiVersion;
use super::handler::{Call, Reply};
use super::meta::with_type;
use super::query::FieldSelector;
use super::slices::out;
use super::status::{ApiError, PODS, SLICES};
use super::store::Kind;

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// What a watch streams: slices in a resource.k8s.io version, or pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watched {
    Slices(ApiVersion),
    Pods,
}

impl Watched {
    fn kind(self) -> Kind {
        match self {
            Self::Slices(_) => Kind::Slice,
            Self::Pods => Kind::Pod,
        }
    }

    /// A stored object as served.
    fn render(self, object: &Value) -> Value {
        match self {
            Self::Slices(version) => out(version, object),
            Self::Pods => with_type(object, "v1", "Pod"),
        }
    }

    /// `(kind, apiVersion)` of bookmark objects.
    fn type_meta(self) -> (&'static str, String) {
        match self {
            Self::Slices(version) => ("ResourceSlice", version.group_version()),
            Self::Pods => ("Pod", "v1".to_owned()),
        }
    }
}

struct WatchStream {
    shared: Arc<Shared>,
    what: Watched,
    selector: FieldSelector,
    last_rv: u64,
    changed: watch::Receiver<u64>,
    close: watch::Receiver<u64>,
    deadline: Instant,
    bookmarks: bool,
    next_bookmark: Instant,
    pending: VecDeque<Bytes>,
    done: bool,
}

fn line(kind: &str, object: Value) -> Bytes {
    let mut bytes = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

fn expired(requested: u64, oldest: u64) -> ApiError {
    ApiError::gone(format!("too old resource version: {requested} ({oldest})"))
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.shared.mutate(|s| s.open_watches = s.open_watches.saturating_sub(1));
    }
}

impl WatchStream {
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(bytes) = self.pending.pop_front() {
                self.shared.lock().watch_bytes += bytes.len();
                return Some(bytes);
            }
            if self.done {
                return None;
            }
            self.changed.borrow_and_update();
            self.collect();
            if !self.pending.is_empty() {
                continue;
            }
            tokio::select! {
                changed = self.changed.changed() => if changed.is_err() { self.done = true },
                _ = tokio::time::sleep_until(self.next_bookmark), if self.bookmarks => {
                    // Events that raced in come first; the bookmark then carries the
                    // resourceVersion up to which this watch has seen everything.
                    self.collect();
                    if self.done {
                        continue;
                    }
                    let rv = self.last_rv;
                    let (kind, api_version) = self.what.type_meta();
                    let object = json!({
                        "kind": kind,
                        "apiVersion": api_version,
                        "metadata": {"resourceVersion": rv.to_string(), "creationTimestamp": null},
                    });
                    self.pending.push_back(line("BOOKMARK", object));
                    self.next_bookmark = Instant::now() + self.shared.opts.bookmark_interval;
                }
                _ = tokio::time::sleep_until(self.deadline) => self.done = true,
                _ = self.close.changed() => self.done = true,
            }
        }
    }

    /// Queues every event after `last_rv` that matches, or a 410 ERROR if they are gone.
    fn collect(&mut self) {
        let state = self.shared.lock();
        if self.last_rv < state.compacted_rv() {
            let status = expired(self.last_rv, state.compacted_rv()).body;
            self.pending.push_back(line("ERROR", status));
            self.done = true;
            return;
        }
        for event in state.events_after(self.last_rv, self.what.kind()) {
            if self.selector.matches(&event.object) {
                self.pending.push_back(line(event.event_type.as_str(), self.what.render(&event.object)));
            }
        }
        self.last_rv = state.resource_version();
    }
}

pub(crate) fn start(call: &Call<'_>, version: ApiVersion) -> Result<Reply, ApiError> {
    start_of(call, Watched::Slices(version))
}

/// A watch of pods (all namespaces), with the node authorizer's selector rule.
pub(crate) fn start_pods(call: &Call<'_>) -> Result<Reply, ApiError> {
    start_of(call, Watched::Pods)
}

fn start_of(call: &Call<'_>, what: Watched) -> Result<Reply, ApiError> {
    let raw_selector = call.params.get("fieldSelector").map(String::as_str);
    let selector = match what {
        Watched::Slices(_) => FieldSelector::parse_for_slices(raw_selector)?,
        Watched::Pods => FieldSelector::parse_for_pods(raw_selector)?,
    };
    let resource = if what == Watched::Pods { PODS } else { SLICES };
    let attrs =
        Attributes { selector_node: selector.required_value("spec.nodeName"), ..Attributes::new("watch", resource) };
    call.authorize(&attrs)?;
    let timeout = match call.params.get("timeoutSeconds") {
        None => DEFAULT_TIMEOUT,
        Some(raw) => Duration::from_secs(
            raw.parse().map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {raw:?}")))?,
        ),
    };
    let requested = match call.params.get("resourceVersion").map(String::as_str) {
        None | Some("" | "0") => None,
        Some(raw) => Some(
            raw.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version {raw:?}: must be an integer")))?,
        ),
    };
    let initial_events = match call.params.get("sendInitialEvents").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => {
            let bookmarks = call.params.get("allowWatchBookmarks").is_some_and(|v| v == "true");
            let not_older = call.params.get("resourceVersionMatch").is_some_and(|v| v == "NotOlderThan");
            if !bookmarks || !not_older {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents requires \
                     setting resourceVersionMatch to NotOlderThan and allowWatchBookmarks to true"
                        .to_owned(),
                    None,
                ));
            }
            true
        }
        Some(other) => return Err(ApiError::bad_request(format!("invalid sendInitialEvents: {other:?}"))),
    };
    let shared = call.shared.clone();
    let mut changed = shared.changed.subscribe();
    changed.borrow_and_update();
    let mut pending = VecDeque::new();
    let mut done = false;
    let last_rv = {
        let state = shared.lock();
        match requested {
            // Streaming list: current objects, then a bookmark marking the end of them.
            _ if initial_events => {
                if let Some(rv) = requested
                    && rv > state.resource_version()
                {
                    return Err(ApiError::new(
                        504,
                        "Timeout",
                        format!("Too large resource version: {rv}, current: {}", state.resource_version()),
                        None,
                    ));
                }
                for object in current(&state, what).filter(|s| selector.matches(s)) {
                    pending.push_back(line("ADDED", what.render(object)));
                }
                let (kind, api_version) = what.type_meta();
                let end = json!({
                    "kind": kind,
                    "apiVersion": api_version,
                    "metadata": {
                        "resourceVersion": state.resource_version().to_string(),
                        "creationTimestamp": null,
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                });
                pending.push_back(line("BOOKMARK", end));
                state.resource_version()
            }
            None => {
                for object in current(&state, what).filter(|s| selector.matches(s)) {
                    pending.push_back(line("ADDED", what.render(object)));
                }
                state.resource_version()
            }
            Some(rv) if rv < state.compacted_rv() => {
                let err = expired(rv, state.compacted_rv());
                if state.gone_as_http_status {
                    return Err(err);
                }
                pending.push_back(line("ERROR", err.body));
                done = true;
                rv
            }
            Some(rv) => rv,
        }
    };
    shared.mutate(|s| s.open_watches += 1);
    let now = Instant::now();
    let watch = WatchStream {
        close: shared.close_watches.subscribe(),
        bookmarks: call.params.get("allowWatchBookmarks").is_some_and(|v| v == "true" || v == "1"),
        next_bookmark: now + shared.opts.bookmark_interval,
        deadline: now + timeout,
        shared,
        what,
        selector,
        last_rv,
        changed,
        pending,
        done,
    };
    let frames = stream::unfold(watch, |mut watch| async move {
        let bytes = watch.next().await?;
        Some((Ok::<_, Infallible>(Frame::data(bytes)), watch))
    });
    Ok(Reply::Stream(BodyExt::boxed_unsync(StreamBody::new(frames))))
}

/// The stored objects a watch of `what` starts with.
fn current(state: &super::State, what: Watched) -> Box<dyn Iterator<Item = &Value> + '_> {
    match what {
        Watched::Slices(_) => Box::new(state.slices.values()),
        Watched::Pods => Box::new(state.pods.values()),
    }
}
