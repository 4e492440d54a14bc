//! What one trace request may ask of an agent: an authenticated collector is trusted to trace,
//! not to make the agent's one thread plan for minutes or allocate without bound.
//!
//! Each list of a [`TraceRequest`] is decoded keeping one element more than its bound
//! ([`super::bounded`]), so that a frame of a million empty patterns costs a thousand strings,
//! and [`check`] refuses whatever reached a bound with one sentence, before anything is planned.

use serde::Deserializer;

use super::{bounded::keep_at_most, protocol::TraceRequest};
use crate::plan::DEFAULT_MAX_PROBES;

/// `-f` and `-u` patterns in one request, together, at most.
pub const MAX_PATTERNS: usize = 1000;
/// `--pid`s and `--binary`s in one request, together, at most.
pub const MAX_TARGETS: usize = 1000;
/// Words of a command to launch, program included, at most.
pub const MAX_COMMAND_WORDS: usize = 4096;
/// Event kinds named in one request, at most (there are fewer kinds than this).
pub const MAX_EVENT_NAMES: usize = 64;
/// Bytes of the working directory a request names, at most (Linux's `PATH_MAX`).
pub const MAX_PATH: usize = 4096;
/// Probes one request may ask for (`max_probes`), at most: `record`'s default.
pub const MAX_PROBES: usize = DEFAULT_MAX_PROBES;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error(
        "the request has more than {MAX_PATTERNS} patterns (functions, USDT probes, triggers, breakpoints, watchpoints): an agent takes at most {MAX_PATTERNS} per request"
    )]
    TooManyPatterns,
    #[error(
        "the request names more than {MAX_TARGETS} pids and binaries: an agent takes at most {MAX_TARGETS} per request"
    )]
    TooManyTargets,
    #[error(
        "the request's command has more than {MAX_COMMAND_WORDS} words: an agent takes at most {MAX_COMMAND_WORDS}"
    )]
    CommandTooLong,
    #[error("the request names more than {MAX_EVENT_NAMES} event kinds")]
    TooManyEventNames,
    #[error("the request asks for up to {0} probes: an agent places at most {MAX_PROBES} per request")]
    TooManyProbes(u32),
    #[error("the request's working directory is longer than {MAX_PATH} bytes")]
    WorkingDirectoryTooLong,
    #[error("the request's working directory {0} is not an absolute path")]
    WorkingDirectoryNotAbsolute(String),
    #[error("the request names a working directory but no command to launch in it")]
    WorkingDirectoryWithoutCommand,
}

/// Refuses a request beyond any bound (one sentence, the first bound broken).
pub fn check(request: &TraceRequest) -> Result<(), RequestError> {
    let patterns =
        [&request.functions, &request.usdt, &request.start_at, &request.stop_at, &request.breaks, &request.watches];
    if patterns.iter().map(|p| p.len()).sum::<usize>() > MAX_PATTERNS {
        return Err(RequestError::TooManyPatterns);
    }
    if request.pids.len() + request.binaries.len() > MAX_TARGETS {
        return Err(RequestError::TooManyTargets);
    }
    if request.command.len() > MAX_COMMAND_WORDS {
        return Err(RequestError::CommandTooLong);
    }
    if request.events.len() > MAX_EVENT_NAMES {
        return Err(RequestError::TooManyEventNames);
    }
    if request.max_probes as usize > MAX_PROBES {
        return Err(RequestError::TooManyProbes(request.max_probes));
    }
    if let Some(cwd) = &request.cwd {
        if cwd.len() > MAX_PATH {
            return Err(RequestError::WorkingDirectoryTooLong);
        }
        if !cwd.starts_with('/') {
            return Err(RequestError::WorkingDirectoryNotAbsolute(cwd.clone()));
        }
        if request.command.is_empty() {
            return Err(RequestError::WorkingDirectoryWithoutCommand);
        }
    }
    Ok(())
}

// Decoders of the request's lists: one element past each bound is kept, so that `check` sees it
// was reached.

pub(super) fn patterns<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    keep_at_most(d, MAX_PATTERNS + 1)
}

pub(super) fn pids<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    keep_at_most(d, MAX_TARGETS + 1)
}

pub(super) fn binaries<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    keep_at_most(d, MAX_TARGETS + 1)
}

pub(super) fn command<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    keep_at_most(d, MAX_COMMAND_WORDS + 1)
}

pub(super) fn event_names<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    keep_at_most(d, MAX_EVENT_NAMES + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::protocol::{Message, decode, encode_body};

    fn decoded(request: TraceRequest) -> TraceRequest {
        let body = encode_body(&Message::Start { trace_id: 1, request: Box::new(request) }).unwrap();
        match decode(&body).unwrap() {
            Message::Start { request, .. } => *request,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_request_within_the_bounds_passes_whole() {
        let request = TraceRequest {
            functions: vec!["P*".into(); 600],
            usdt: vec!["p:n".into(); 400],
            pids: vec![1; 1000],
            max_probes: MAX_PROBES as u32,
            ..Default::default()
        };
        let got = decoded(request.clone());
        assert_eq!(got, request);
        assert_eq!(check(&got), Ok(()));
    }

    #[test]
    fn a_hundred_thousand_patterns_cost_a_thousand_and_are_refused() {
        let request = TraceRequest { functions: vec!["P*".into(); 100_000], ..Default::default() };
        let got = decoded(request);
        assert_eq!(got.functions.len(), MAX_PATTERNS + 1);
        assert_eq!(
            check(&got).unwrap_err().to_string(),
            "the request has more than 1000 patterns (functions, USDT probes, triggers, breakpoints, watchpoints): an agent takes at most 1000 per request"
        );
        for request in [
            TraceRequest { breaks: vec!["a.c:1".into(); 100_000], ..Default::default() },
            TraceRequest { watches: vec!["x".into(); 100_000], ..Default::default() },
        ] {
            let got = decoded(request);
            assert_eq!(got.breaks.len() + got.watches.len(), MAX_PATTERNS + 1);
            assert_eq!(check(&got), Err(RequestError::TooManyPatterns));
        }
        let split = TraceRequest {
            functions: vec!["a".into(); 500],
            breaks: vec!["a.c:1".into(); 300],
            watches: vec!["x".into(); 201],
            ..Default::default()
        };
        assert_eq!(check(&decoded(split)), Err(RequestError::TooManyPatterns));
        let split =
            TraceRequest { functions: vec!["a".into(); 600], usdt: vec!["p:n".into(); 401], ..Default::default() };
        assert_eq!(check(&decoded(split)), Err(RequestError::TooManyPatterns));
    }

    #[test]
    fn every_list_and_the_probe_count_are_bounded() {
        let pids = TraceRequest { pids: vec![1; 2000], ..Default::default() };
        assert_eq!(check(&decoded(pids)), Err(RequestError::TooManyTargets));
        let words = TraceRequest { command: vec![String::new(); 10_000], ..Default::default() };
        assert_eq!(check(&decoded(words)), Err(RequestError::CommandTooLong));
        let kinds = TraceRequest { events: vec!["call".into(); 100], ..Default::default() };
        assert_eq!(check(&decoded(kinds)), Err(RequestError::TooManyEventNames));
        let probes = TraceRequest { max_probes: 100_000, ..Default::default() };
        assert_eq!(
            check(&probes).unwrap_err().to_string(),
            "the request asks for up to 100000 probes: an agent places at most 4096 per request"
        );
    }

    #[test]
    fn the_working_directory_is_bounded_absolute_and_for_a_command() {
        let command = vec!["pwd".to_string()];
        let cwd = |dir: String| TraceRequest { command: command.clone(), cwd: Some(dir), ..Default::default() };
        assert_eq!(check(&decoded(cwd("/srv/app".into()))), Ok(()));
        assert_eq!(
            check(&decoded(cwd(format!("/{}", "d".repeat(MAX_PATH))))),
            Err(RequestError::WorkingDirectoryTooLong)
        );
        assert_eq!(
            check(&cwd("srv".into())).unwrap_err().to_string(),
            "the request's working directory srv is not an absolute path"
        );
        let alone = TraceRequest { pids: vec![1], cwd: Some("/".into()), ..Default::default() };
        assert_eq!(check(&alone), Err(RequestError::WorkingDirectoryWithoutCommand));
    }
}
