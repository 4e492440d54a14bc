//! The probe summary on stderr, and its advice shown once. How to give slow functions the fast
//! path is a paragraph that helps the first time and is noise every run after: it is shown the
//! first time on this machine (for this user: a marker file under `$XDG_STATE_HOME/tracer`, else
//! `~/.local/state/tracer`) and whenever `-v` is given; otherwise the summary line ends by
//! saying that `-v` shows it.

use std::path::PathBuf;

use tracer_user::functions::placement::ProbeSummary;

/// The marker's name: a new kind of advice gets a new name, and is shown once again.
const SHOWN: &str = "probe-path-advice-shown";

/// Prints the summary line and, when due, its advice.
pub fn print_probe_summary(summary: &ProbeSummary, verbose: bool) {
    let Some(advice) = &summary.advice else {
        super::stderr::info(format_args!("{}", summary.line));
        return;
    };
    if verbose || first_time() {
        super::stderr::info(format_args!("{}", summary.line));
        super::stderr::info(format_args!("{advice}"));
    } else {
        super::stderr::info(format_args!("{} (-v says how to make them fast)", summary.line));
    }
}

/// Whether the advice has not been shown here before; marks it shown. Where no marker can be
/// written (no home, a read-only file system), the advice is shown every time: better repeated
/// than never seen.
fn first_time() -> bool {
    let Some(dir) = state_dir() else { return true };
    let marker = dir.join(SHOWN);
    if marker.exists() {
        return false;
    }
    let _ = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&marker, b""));
    true
}

fn state_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").filter(|d| !d.is_empty())?).join(".local/state"),
    };
    Some(base.join("tracer"))
}
