//! Fault injection controlled by the test: answer the next N matching requests with a 500,
//! a 429 or 503 with `Retry-After` (header, Status details or both), or delay them. Connection-level faults (refusing connections,
//! stop/restart, closing watches) live on the handle in `mod.rs`.

use std::time::Duration;

use http::Method;

/// What an injected fault does to a matching request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultAction {
    /// `500 InternalError` Status.
    InternalError,
    /// `500 InternalError` Status whose message ends with this text.
    InternalErrorSaying(String),
    /// `429 TooManyRequests` Status with `Retry-After: secs`.
    TooManyRequests { retry_after_secs: u64 },
    /// An error status `code` (429 or 503) with a `Retry-After` header of `header_secs`
    /// and/or `details.retryAfterSeconds` of `details_secs` (either may be absent).
    Throttled { code: u16, header_secs: Option<u64>, details_secs: Option<u64> },
    /// Wait this long, then serve the request normally.
    Delay(Duration),
}

/// A fault applied to the next `times` requests matching `method` and `path_contains`
/// (both optional; `None` matches everything).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub action: FaultAction,
    pub times: usize,
    pub method: Option<Method>,
    pub path_contains: Option<String>,
}

impl Fault {
    /// The next `times` requests of any kind get `action`.
    pub fn next(times: usize, action: FaultAction) -> Self {
        Self { action, times, method: None, path_contains: None }
    }

    /// Only requests with this method.
    pub fn method(mut self, method: Method) -> Self {
        self.method = Some(method);
        self
    }

    /// Only requests whose path contains `fragment` (e.g. `/resourceslices`).
    pub fn path_contains(mut self, fragment: &str) -> Self {
        self.path_contains = Some(fragment.to_owned());
        self
    }

    fn matches(&self, method: &Method, path: &str) -> bool {
        self.times > 0
            && self.method.as_ref().is_none_or(|m| m == method)
            && self.path_contains.as_deref().is_none_or(|p| path.contains(p))
    }
}

/// Takes one use of the first matching fault, dropping exhausted ones.
pub(crate) fn take(faults: &mut Vec<Fault>, method: &Method, path: &str) -> Option<FaultAction> {
    let found = faults.iter_mut().find(|f| f.matches(method, path)).map(|f| {
        f.times -= 1;
        f.action.clone()
    });
    faults.retain(|f| f.times > 0);
    found
}
