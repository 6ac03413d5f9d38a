//! Watching ResourceSlices, kube-rs style: an explicit state (`Empty` → list →
//! `Listed` → watch → `Watching`) and a `step` function that advances it by one event,
//! turned into a `Stream`. The initial LIST emits `Restarted`; ADDED/MODIFIED emit
//! `Applied`, DELETED emits `Deleted`; BOOKMARKs move the resume version silently; a watch
//! that ends is resumed from the last version; 410 Gone (status or ERROR event) relists; any
//! other error is emitted as `Error` and retried after a jittered exponential backoff
//! (reset after success). The body is read frame by frame and split into JSON lines.

use std::time::Duration;

use futures_util::Stream;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::Value;

use super::api::convert_err;
use super::backoff::Backoff;
use super::{Client, Error, ResourceApi, convert, request};

/// What the watch reports.
#[derive(Debug)]
pub enum Event {
    /// The full current set (after the first list and after each relist).
    Restarted(Vec<ResourceSlice>),
    /// A slice was added or modified.
    Applied(ResourceSlice),
    /// A slice was deleted (its last state).
    Deleted(ResourceSlice),
    /// Something failed; the watcher retries by itself after a backoff.
    Error(Error),
}

/// Longest accepted watch event line; a longer one is an error, not unbounded memory.
const MAX_LINE: usize = 16 << 20;

/// Splits a byte stream into lines (JSON objects), keeping partial lines across frames.
/// Each byte is searched for a newline once, however many frames a long line spans.
#[derive(Debug, Default)]
pub struct LineBuffer {
    buf: Vec<u8>,
    start: usize,
    /// Bytes after `start` already known to hold no newline.
    scanned: usize,
}

impl LineBuffer {
    pub fn push(&mut self, data: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            self.scanned = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// The next complete non-empty line, without its newline.
    pub fn next_line(&mut self) -> Option<Vec<u8>> {
        loop {
            let from = self.start + self.scanned;
            let Some(pos) = self.buf[from..].iter().position(|&b| b == b'\n') else {
                self.scanned = self.buf.len() - self.start;
                return None;
            };
            let line = self.buf[self.start..from + pos].to_vec();
            self.start = from + pos + 1;
            self.scanned = 0;
            if self.start > 64 << 10 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            if !line.iter().all(u8::is_ascii_whitespace) {
                return Some(line);
            }
        }
    }

    /// Bytes of the incomplete line waiting for more data.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }
}

enum State {
    Empty,
    Listed { rv: String },
    Watching { rv: String, body: Incoming, lines: LineBuffer, got_any: bool },
}

/// The watch state machine.
pub struct Watcher {
    client: Client,
    api: ResourceApi,
    selector: String,
    state: State,
    backoff: Backoff,
    delay: Option<Duration>,
}

impl Watcher {
    pub fn new(client: Client, api: ResourceApi, field_selector: &str) -> Self {
        let s = &client.inner.settings;
        let backoff = Backoff::new(s.watch_backoff_base, s.watch_backoff_max);
        Watcher { client, api, selector: field_selector.to_string(), state: State::Empty, backoff, delay: None }
    }

    /// The resourceVersion the watch would resume from (empty before the first list).
    pub fn resource_version(&self) -> &str {
        match &self.state {
            State::Empty => "",
            State::Listed { rv } | State::Watching { rv, .. } => rv,
        }
    }

    fn fail(&mut self, next: State, err: Error) -> Event {
        self.state = next;
        self.delay = Some(self.backoff.next_delay());
        Event::Error(err)
    }

    /// Advance until the next event.
    pub async fn step(&mut self) -> Event {
        loop {
            if let Some(d) = self.delay.take() {
                tokio::time::sleep(d).await;
            }
            let event = match std::mem::replace(&mut self.state, State::Empty) {
                State::Empty => Some(self.list().await),
                State::Listed { rv } => self.start_watch(rv).await,
                State::Watching { rv, body, lines, got_any } => self.read_watch(rv, body, lines, got_any).await,
            };
            if let Some(event) = event {
                return event;
            }
        }
    }

    /// `Empty`: list, emitting the full set.
    async fn list(&mut self) -> Event {
        match self.client.list_slices(self.api, &self.selector).await {
            Ok(list) => {
                self.backoff.reset();
                self.state = State::Listed { rv: list.resource_version };
                Event::Restarted(list.items)
            }
            Err(e) => self.fail(State::Empty, e),
        }
    }

    /// `Listed`: open a watch from `rv`; an expired version relists.
    async fn start_watch(&mut self, rv: String) -> Option<Event> {
        let timeout = self.client.inner.settings.watch_timeout_seconds;
        let req = request::watch_slices(self.api, &self.selector, &rv, timeout);
        match self.client.stream(req).await {
            Ok(body) => self.state = State::Watching { rv, body, lines: LineBuffer::default(), got_any: false },
            Err(e) if e.is_gone() => tracing::debug!(%rv, "watch version gone; relisting"),
            Err(e) => return Some(self.fail(State::Listed { rv }, e)),
        }
        None
    }

    /// `Watching`: the next complete line, else the next frame of the body.
    async fn read_watch(
        &mut self,
        rv: String,
        mut body: Incoming,
        mut lines: LineBuffer,
        got_any: bool,
    ) -> Option<Event> {
        if let Some(line) = lines.next_line() {
            return match handle_line(self.api, rv, &line) {
                (next, Some(Event::Error(e))) => Some(self.fail(next, e)),
                (next, ev) => {
                    self.state = match next {
                        State::Listed { rv } => State::Watching { rv, body, lines, got_any: true },
                        other => other,
                    };
                    if ev.is_some() {
                        self.backoff.reset();
                    }
                    ev
                }
            };
        }
        // Bookmarks arrive about once a minute and the server ends the watch after
        // timeoutSeconds, so silence beyond that means a dead connection.
        let settings = &self.client.inner.settings;
        let idle =
            Duration::from_secs(u64::from(settings.watch_timeout_seconds)).saturating_add(settings.request_timeout);
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Ok(frame) => frame,
            Err(_) => {
                let err = Error::Timeout { operation: "WATCH resourceslices".into(), after: idle };
                return Some(self.fail(State::Listed { rv }, err));
            }
        };
        match frame {
            None => {
                if !got_any {
                    // Closed without a single line: do not spin on a server that hangs up.
                    self.delay = Some(self.backoff.next_delay());
                }
                self.state = State::Listed { rv };
            }
            Some(Err(e)) => {
                let err = Error::Transport { operation: "WATCH resourceslices".into(), source: Box::new(e) };
                return Some(self.fail(State::Listed { rv }, err));
            }
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    self.client.record_received(data.len());
                    lines.push(data);
                }
                if lines.pending() > MAX_LINE {
                    let err = Error::Convert {
                        operation: "WATCH resourceslices".into(),
                        problem: format!("a watch event is longer than {MAX_LINE} bytes"),
                    };
                    return Some(self.fail(State::Listed { rv }, err));
                }
                self.state = State::Watching { rv, body, lines, got_any };
            }
        }
        None
    }
}

/// Applies one watch line to a watch resuming from `rv`: the version to resume from
/// (`None` = relist) and the event to emit, if any.
pub(crate) fn apply_line(api: ResourceApi, rv: String, line: &[u8]) -> (Option<String>, Option<Event>) {
    match handle_line(api, rv, line) {
        (State::Listed { rv } | State::Watching { rv, .. }, ev) => (Some(rv), ev),
        (State::Empty, ev) => (None, ev),
    }
}

/// Apply one watch line. Returns the next state (`Listed{rv}` = keep watching from
/// `rv`, `Empty` = relist) and the event to emit, if any.
fn handle_line(api: ResourceApi, rv: String, line: &[u8]) -> (State, Option<Event>) {
    let op = "WATCH resourceslices";
    let mut v: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(source) => {
            return (State::Listed { rv }, Some(Event::Error(Error::Decode { operation: op.into(), source })));
        }
    };
    let kind = v.get("type").and_then(Value::as_str).unwrap_or_default().to_string();
    let object = v.get_mut("object").map(Value::take).unwrap_or(Value::Null);
    let new_rv =
        object.pointer("/metadata/resourceVersion").and_then(Value::as_str).filter(|s| !s.is_empty()).map(String::from);
    match kind.as_str() {
        "ADDED" | "MODIFIED" | "DELETED" => {
            let rv = new_rv.unwrap_or(rv);
            match convert::slice_from_wire(api, object) {
                Ok(s) if kind == "DELETED" => (State::Listed { rv }, Some(Event::Deleted(s))),
                Ok(s) => (State::Listed { rv }, Some(Event::Applied(s))),
                Err(e) => (State::Listed { rv }, Some(Event::Error(convert_err(op, e)))),
            }
        }
        "BOOKMARK" => (State::Listed { rv: new_rv.unwrap_or(rv) }, None),
        "ERROR" => {
            let code = object.get("code").and_then(Value::as_u64).and_then(|c| u16::try_from(c).ok()).unwrap_or(500);
            if code == 410 {
                tracing::debug!(%rv, "watch version expired; relisting");
                return (State::Empty, None);
            }
            let body = serde_json::to_vec(&object).unwrap_or_default();
            (State::Listed { rv }, Some(Event::Error(Error::from_status(op.into(), code, &body, None))))
        }
        other => {
            let problem = format!("unknown watch event type {other:?}");
            (State::Listed { rv }, Some(Event::Error(Error::Convert { operation: op.into(), problem })))
        }
    }
}

impl Client {
    /// Watch slices matching `field_selector` (list, then watch; relists on 410; retries).
    /// The stream never ends; drop it to stop.
    pub fn watch_slices(&self, api: ResourceApi, field_selector: &str) -> impl Stream<Item = Event> + Send + 'static {
        let watcher = Watcher::new(self.clone(), api, field_selector);
        futures_util::stream::unfold(watcher, |mut w| async move {
            let ev = w.step().await;
            Some((ev, w))
        })
    }
}

#[cfg(test)]
#[path = "watcher_tests.rs"]
mod tests;
