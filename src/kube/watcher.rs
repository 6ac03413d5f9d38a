//! Watching a kind of object ([`Watched`]: ResourceSlices, or pods as [`PodClaims`]), kube-rs
//! style: an explicit state (`Empty` → list →
//! `Listed` → watch → `Watching`) and a `step` function that advances it by one event,
//! turned into a `Stream`. The initial LIST emits `Restarted`; ADDED/MODIFIED emit
//! `Applied`, DELETED emits `Deleted`; BOOKMARKs move the resume version silently; a watch
//! that ends is resumed from the last version; 410 Gone (status or ERROR event) relists; any
//! other error is emitted as `Error` and retried after a jittered exponential backoff
//! (reset after success). The body is read frame by frame and split into JSON lines.

use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde_json::Value;

use super::api::convert_err;
use super::backoff::Backoff;
use super::client::operation;
use super::pods::{self, PodClaims};
use super::{Client, Error, ResourceApi, convert, request};

/// What the watch reports.
#[derive(Debug)]
pub enum Event<T = ResourceSlice> {
    /// The full current set (after the first list and after each relist).
    Restarted(Vec<T>),
    /// An object was added or modified.
    Applied(T),
    /// An object was deleted (its last state).
    Deleted(T),
    /// Something failed; the watcher retries by itself after a backoff.
    Error(Error),
}

/// A kind of object the [`Watcher`] can list and watch: its requests and how its objects
/// are read from the wire.
pub trait Watched: Sized + Send + 'static {
    /// The resource's plural, for error messages (`WATCH pods`).
    const RESOURCE: &'static str;
    /// The list request.
    fn list_request(api: ResourceApi, field_selector: &str) -> http::Request<Bytes>;
    /// The watch request from `resource_version`.
    fn watch_request(
        api: ResourceApi,
        field_selector: &str,
        resource_version: &str,
        timeout: u32,
    ) -> http::Request<Bytes>;
    /// A list body: the objects and the list's resourceVersion.
    fn decode_list(api: ResourceApi, op: &str, body: &[u8]) -> Result<(Vec<Self>, String), Error>;
    /// One watch event's object.
    fn from_wire(api: ResourceApi, op: &str, object: Value) -> Result<Self, Error>;
}

impl Watched for ResourceSlice {
    const RESOURCE: &'static str = "resourceslices";
    fn list_request(api: ResourceApi, field_selector: &str) -> http::Request<Bytes> {
        request::list_slices(api, field_selector)
    }
    fn watch_request(api: ResourceApi, selector: &str, rv: &str, timeout: u32) -> http::Request<Bytes> {
        request::watch_slices(api, selector, rv, timeout)
    }
    fn decode_list(api: ResourceApi, op: &str, body: &[u8]) -> Result<(Vec<Self>, String), Error> {
        let list = super::api::decode_slice_list(api, op, body)?;
        Ok((list.items, list.resource_version))
    }
    fn from_wire(api: ResourceApi, op: &str, object: Value) -> Result<Self, Error> {
        convert::slice_from_wire(api, object).map_err(|e| convert_err(op, e))
    }
}

/// Pods, read as the claims they use (the resource.k8s.io version plays no part).
impl Watched for PodClaims {
    const RESOURCE: &'static str = "pods";
    fn list_request(_: ResourceApi, field_selector: &str) -> http::Request<Bytes> {
        request::list_pods(field_selector)
    }
    fn watch_request(_: ResourceApi, selector: &str, rv: &str, timeout: u32) -> http::Request<Bytes> {
        request::watch_pods(selector, rv, timeout)
    }
    fn decode_list(_: ResourceApi, op: &str, body: &[u8]) -> Result<(Vec<Self>, String), Error> {
        pods::decode_list(op, body)
    }
    fn from_wire(_: ResourceApi, op: &str, object: Value) -> Result<Self, Error> {
        pods::from_wire(op, object)
    }
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
pub struct Watcher<T = ResourceSlice> {
    client: Client,
    api: ResourceApi,
    selector: String,
    state: State,
    backoff: Backoff,
    delay: Option<Duration>,
    _kind: std::marker::PhantomData<fn() -> T>,
}

impl<T: Watched> Watcher<T> {
    pub fn new(client: Client, api: ResourceApi, field_selector: &str) -> Self {
        let s = &client.inner.settings;
        let backoff = Backoff::new(s.watch_backoff_base, s.watch_backoff_max);
        Watcher {
            client,
            api,
            selector: field_selector.to_string(),
            state: State::Empty,
            backoff,
            delay: None,
            _kind: std::marker::PhantomData,
        }
    }

    /// The resourceVersion the watch would resume from (empty before the first list).
    pub fn resource_version(&self) -> &str {
        match &self.state {
            State::Empty => "",
            State::Listed { rv } | State::Watching { rv, .. } => rv,
        }
    }

    fn fail(&mut self, next: State, err: Error) -> Event<T> {
        self.state = next;
        self.delay = Some(self.backoff.next_delay());
        Event::Error(err)
    }

    /// Advance until the next event.
    pub async fn step(&mut self) -> Event<T> {
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
    async fn list(&mut self) -> Event<T> {
        let req = T::list_request(self.api, &self.selector);
        let op = operation(&req);
        let listed = match self.client.request(req).await {
            Ok(body) => T::decode_list(self.api, &op, &body),
            Err(e) => Err(e),
        };
        match listed {
            Ok((items, rv)) => {
                self.backoff.reset();
                self.state = State::Listed { rv };
                Event::Restarted(items)
            }
            Err(e) => self.fail(State::Empty, e),
        }
    }

    /// `Listed`: open a watch from `rv`; an expired version relists.
    async fn start_watch(&mut self, rv: String) -> Option<Event<T>> {
        let timeout = self.client.inner.settings.watch_timeout_seconds;
        let req = T::watch_request(self.api, &self.selector, &rv, timeout);
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
    ) -> Option<Event<T>> {
        if let Some(line) = lines.next_line() {
            return match handle_line::<T>(self.api, rv, &line) {
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
                let err = Error::Timeout { operation: watch_op::<T>(), after: idle };
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
                let err = Error::Transport { operation: watch_op::<T>(), source: Box::new(e) };
                return Some(self.fail(State::Listed { rv }, err));
            }
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    self.client.record_received(data.len());
                    lines.push(data);
                }
                if lines.pending() > MAX_LINE {
                    let err = Error::Convert {
                        operation: watch_op::<T>(),
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

/// `WATCH <resource>`, naming the operation in errors.
fn watch_op<T: Watched>() -> String {
    format!("WATCH {}", T::RESOURCE)
}

/// Applies one watch line to a watch resuming from `rv`: the version to resume from
/// (`None` = relist) and the event to emit, if any.
pub(crate) fn apply_line(api: ResourceApi, rv: String, line: &[u8]) -> (Option<String>, Option<Event>) {
    match handle_line::<ResourceSlice>(api, rv, line) {
        (State::Listed { rv } | State::Watching { rv, .. }, ev) => (Some(rv), ev),
        (State::Empty, ev) => (None, ev),
    }
}

/// Apply one watch line. Returns the next state (`Listed{rv}` = keep watching from
/// `rv`, `Empty` = relist) and the event to emit, if any.
fn handle_line<T: Watched>(api: ResourceApi, rv: String, line: &[u8]) -> (State, Option<Event<T>>) {
    let op = watch_op::<T>();
    let op = op.as_str();
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
            match T::from_wire(api, op, object) {
                Ok(s) if kind == "DELETED" => (State::Listed { rv }, Some(Event::Deleted(s))),
                Ok(s) => (State::Listed { rv }, Some(Event::Applied(s))),
                Err(e) => (State::Listed { rv }, Some(Event::Error(e))),
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
        self.watch::<ResourceSlice>(api, field_selector)
    }

    /// Watch pods matching `field_selector` (for a node: `spec.nodeName=<node>`, the only
    /// selector the node authorizer allows), read as the claims they use; like
    /// [`Client::watch_slices`] otherwise.
    pub fn watch_pods(&self, field_selector: &str) -> impl Stream<Item = Event<PodClaims>> + Send + 'static {
        self.watch::<PodClaims>(ResourceApi::V1, field_selector)
    }

    fn watch<T: Watched>(
        &self,
        api: ResourceApi,
        field_selector: &str,
    ) -> impl Stream<Item = Event<T>> + Send + 'static {
        let watcher = Watcher::<T>::new(self.clone(), api, field_selector);
        futures_util::stream::unfold(watcher, |mut w| async move {
            let ev = w.step().await;
            Some((ev, w))
        })
    }
}

#[cfg(test)]
mod tests;
