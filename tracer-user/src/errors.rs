//! One rule for every error type of the library: its message says what failed, and its cause is
//! its `source()`, never repeated in the message. `anyhow`'s `{:#}` (the binary) and [`report`]
//! (where an error becomes a string, e.g. sent to a collector) then say each cause once.

use std::error::Error;

/// An error and its causes, outermost first, joined by `: `.
pub fn report(e: &(dyn Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    fn permission_denied() -> std::io::Error {
        std::io::Error::from_raw_os_error(libc::EACCES)
    }

    /// The two errors of the issue, and one of each kind that carries a cause.
    #[test]
    fn causes_are_said_once() {
        let cases: Vec<(Box<dyn Error + Send + Sync>, &str)> = vec![
            (
                Box::new(crate::plan::RecordError::Target(crate::targets::TargetError::Inspect {
                    pid: 1,
                    source: permission_denied(),
                })),
                "cannot inspect process 1: Permission denied (os error 13)",
            ),
            (
                Box::new(crate::plan::RecordError::Output(std::io::Error::from_raw_os_error(libc::EPIPE))),
                "writing the trace failed: Broken pipe (os error 32)",
            ),
            (
                Box::new(crate::functions::symbols::SymbolError::Read {
                    path: PathBuf::from("/x"),
                    source: permission_denied(),
                }),
                "cannot read /x: Permission denied (os error 13)",
            ),
            (
                Box::new(crate::targets::launch::LaunchError::Start {
                    path: PathBuf::from("/x"),
                    source: permission_denied(),
                }),
                "cannot start /x: Permission denied (os error 13)",
            ),
            (
                Box::new(crate::trace::read::ReadError::Io(permission_denied())),
                "cannot read the trace: Permission denied (os error 13)",
            ),
            (
                Box::new(crate::cluster::protocol::FrameError::Io(permission_denied())),
                "connection error: Permission denied (os error 13)",
            ),
        ];
        for (e, expected) in cases {
            assert_eq!(report(&*e), expected);
            assert_eq!(format!("{:#}", anyhow::Error::from_boxed(e)), expected);
        }
    }

    /// Every `#[error]` message in the library: none may print a field that is also its source
    /// (`{source}`, or `{0}` of a `#[from]`/`#[source]` field), or the cause reads twice.
    #[test]
    fn no_error_message_repeats_its_source() {
        fn files(dir: &Path, out: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    files(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let mut all = Vec::new();
        files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut all);
        let mut offenders = Vec::new();
        // (This file holds the pattern in its strings.)
        for path in all.into_iter().filter(|p| !p.ends_with("errors.rs")) {
            let text = std::fs::read_to_string(&path).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                let Some(at) = line.find("#[error(") else { continue };
                if line[..at].contains("//") || line.contains("transparent") {
                    continue;
                }
                // The attribute, and the variant it annotates (up to the next attribute or the
                // end of the enum).
                let attribute: String = lines[i..]
                    .iter()
                    .take_while(|l| !l.trim_end().ends_with(")]"))
                    .chain(lines[i..].iter().find(|l| l.trim_end().ends_with(")]")))
                    .copied()
                    .collect();
                let variant: String = lines[i + 1..]
                    .iter()
                    .skip_while(|l| l.trim_start().starts_with('"') || l.trim_start().starts_with(")]"))
                    .take_while(|l| !l.contains("#[error(") && l.trim() != "}")
                    .copied()
                    .collect();
                let source_field = variant.contains("#[from]") || variant.contains("#[source]");
                if attribute.contains("{source}") || (source_field && attribute.contains("{0}")) {
                    offenders.push(format!("{}:{}", path.display(), i + 1));
                }
            }
        }
        assert!(offenders.is_empty(), "error messages that repeat their source: {offenders:?}");
    }
}
