//! The exporter: one thread that posts the queued requests to the collector over OTLP/HTTP,
//! retrying what OTLP says may be retried, and the counters of what it sent and lost.

use std::{
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use super::DRAIN_DEADLINE;

/// How the exporter retries.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Attempts per batch, the first included.
    pub attempts: u32,
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// How long one request may take.
    pub timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 6,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
        }
    }
}

/// What the exporter sent and lost, counted in spans and in log records.
#[derive(Debug, Default)]
pub struct Counters {
    pub spans_sent: AtomicU64,
    /// Batches that found the queue full.
    pub spans_dropped_queue_full: AtomicU64,
    /// Batches the collector refused, or that failed every attempt.
    pub spans_dropped_export_failed: AtomicU64,
    pub log_records_sent: AtomicU64,
    pub log_records_dropped_queue_full: AtomicU64,
    pub log_records_dropped_export_failed: AtomicU64,
    pub retries: AtomicU64,
    /// Links from receives to sends whose spans were not known when the receive came: the send
    /// came after it (a collected trace whose clocks could not be reconciled) or was forgotten
    /// (older than the last [`MAX_REMEMBERED_SENDS`](crate::export::MAX_REMEMBERED_SENDS)).
    pub links_unknown: AtomicU64,
}

/// Which OTLP signal a request carries: it picks the endpoint and the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Signal {
    Traces,
    Logs,
}

impl Counters {
    /// Spans and log records lost, whatever the reason.
    pub fn lost(&self) -> u64 {
        [
            &self.spans_dropped_queue_full,
            &self.spans_dropped_export_failed,
            &self.log_records_dropped_queue_full,
            &self.log_records_dropped_export_failed,
        ]
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .sum()
    }

    pub(super) fn sent(&self, signal: Signal) -> &AtomicU64 {
        match signal {
            Signal::Traces => &self.spans_sent,
            Signal::Logs => &self.log_records_sent,
        }
    }

    pub(super) fn dropped_queue_full(&self, signal: Signal) -> &AtomicU64 {
        match signal {
            Signal::Traces => &self.spans_dropped_queue_full,
            Signal::Logs => &self.log_records_dropped_queue_full,
        }
    }

    pub(super) fn dropped_export_failed(&self, signal: Signal) -> &AtomicU64 {
        match signal {
            Signal::Traces => &self.spans_dropped_export_failed,
            Signal::Logs => &self.log_records_dropped_export_failed,
        }
    }
}

/// One encoded export request in the queue: its signal, its body, and how many spans or log
/// records it holds (for the counters).
pub(super) struct Request {
    pub(super) signal: Signal,
    pub(super) body: Vec<u8>,
    pub(super) items: u64,
}

/// Why `--otlp URL` was refused.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("'{0}' is not an http:// URL (OTLP/HTTP without TLS is what tracer speaks)")]
    NotHttp(String),
    #[error("'{0}' names no host")]
    NoHost(String),
    #[error(
        "'{0}' names a path that does not end in /v1/traces, so tracer cannot tell where its log records go: give the collector's base URL (http://host:4318) or its traces endpoint (.../v1/traces)"
    )]
    NotSignalPath(String),
}

/// The traces endpoint of a collector URL: `http://h:4318` → `http://h:4318/v1/traces`.
pub fn traces_endpoint(url: &str) -> Result<String, UrlError> {
    endpoint(url, Signal::Traces)
}

/// The logs endpoint of a collector URL, derived as [`traces_endpoint`] is (OTLP/HTTP: a base
/// URL gets `/v1/logs` appended): `http://h:4318` → `http://h:4318/v1/logs`, and a traces
/// endpoint `http://h/otlp/v1/traces` → its sibling `http://h/otlp/v1/logs`.
pub fn logs_endpoint(url: &str) -> Result<String, UrlError> {
    endpoint(url, Signal::Logs)
}

fn endpoint(url: &str, signal: Signal) -> Result<String, UrlError> {
    let rest = url.strip_prefix("http://").ok_or_else(|| UrlError::NotHttp(url.to_string()))?;
    let (authority, path) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    if authority.is_empty() || authority.contains(['@', ' ', '?', '#']) {
        return Err(UrlError::NoHost(url.to_string()));
    }
    let suffix = match signal {
        Signal::Traces => "v1/traces",
        Signal::Logs => "v1/logs",
    };
    if path.is_empty() {
        return Ok(format!("http://{authority}/{suffix}"));
    }
    let base = path.strip_suffix("v1/traces").filter(|b| b.is_empty() || b.ends_with('/'));
    match base {
        Some(base) => Ok(format!("http://{authority}/{base}{suffix}")),
        None => Err(UrlError::NotSignalPath(url.to_string())),
    }
}

/// What one attempt to send a batch came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Sent,
    /// Worth another try: 429, 502, 503, 504, or no answer.
    Retry(String),
    /// The collector refused the batch for good.
    Refused(String),
}

/// Sends requests from the queue until it closes; `endpoints`: traces', logs'.
pub(super) fn export_loop(
    endpoints: &[String; 2],
    retry: RetryPolicy,
    rx: mpsc::Receiver<Request>,
    counters: &Counters,
    deadline: &OnceLock<Instant>,
) {
    let agent: ureq::Agent =
        ureq::Agent::config_builder().timeout_global(Some(retry.timeout)).http_status_as_error(false).build().into();
    let mut warned = false;
    for Request { signal, body, items } in rx {
        let endpoint = match signal {
            Signal::Traces => &endpoints[0],
            Signal::Logs => &endpoints[1],
        };
        let attempt = || match deadline.get() {
            Some(at) if Instant::now() >= *at => Outcome::Refused(format!(
                "the trace ended {} s ago and the batch was not sent yet",
                DRAIN_DEADLINE.as_secs()
            )),
            _ => post(&agent, endpoint, &body),
        };
        match send_with_retries(&retry, counters, attempt) {
            Ok(()) => {
                counters.sent(signal).fetch_add(items, Ordering::Relaxed);
            }
            Err(why) => {
                counters.dropped_export_failed(signal).fetch_add(items, Ordering::Relaxed);
                if !warned {
                    tracing::warn!("OTLP export to {endpoint} failed: {why}");
                    warned = true;
                }
            }
        }
    }
}

/// Why a batch was not sent.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The collector refused it for good (or the trace's drain deadline passed).
    #[error("{0}")]
    Refused(String),
    /// Every attempt the policy allows failed; the last one's reason.
    #[error("{last} (after {attempts} attempts)")]
    GaveUp { last: String, attempts: u32 },
}

/// Tries `attempt` until it sends, is refused, or the policy's attempts run out, sleeping an
/// exponentially growing back-off between tries.
pub fn send_with_retries(
    policy: &RetryPolicy,
    counters: &Counters,
    mut attempt: impl FnMut() -> Outcome,
) -> Result<(), SendError> {
    let mut backoff = policy.first_backoff;
    let mut last = String::new();
    for n in 0..policy.attempts.max(1) {
        if n > 0 {
            counters.retries.fetch_add(1, Ordering::Relaxed);
            thread::sleep(backoff);
            backoff = (backoff * 2).min(policy.max_backoff);
        }
        match attempt() {
            Outcome::Sent => return Ok(()),
            Outcome::Refused(why) => return Err(SendError::Refused(why)),
            Outcome::Retry(why) => last = why,
        }
    }
    Err(SendError::GaveUp { last, attempts: policy.attempts.max(1) })
}

fn post(agent: &ureq::Agent, endpoint: &str, body: &[u8]) -> Outcome {
    match agent.post(endpoint).header("Content-Type", "application/x-protobuf").send(body) {
        Ok(response) => classify(response.status().as_u16()),
        Err(e) => Outcome::Retry(format!("cannot reach the collector: {e}")),
    }
}

/// OTLP/HTTP's rule: 429, 502, 503 and 504 are retryable, other failures are not.
pub fn classify(status: u16) -> Outcome {
    match status {
        200..=299 => Outcome::Sent,
        429 | 502 | 503 | 504 => Outcome::Retry(format!("the collector answered {status}")),
        _ => Outcome::Refused(format!("the collector answered {status}")),
    }
}
