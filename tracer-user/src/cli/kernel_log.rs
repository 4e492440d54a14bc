//! What reaches stderr from the eBPF programs (`--debug-kernel`): the library hands their aya-log
//! records to the `log` crate with a `tracer_ebpf::MODULE` target, and this logger writes each as
//! one line, `tracer: kernel: MESSAGE`. Other crates' `log` records are not shown.

use std::io::Write as _;

use log::{LevelFilter, Log, Metadata, Record};

/// Installs the logger for the whole process (once; later calls do nothing).
pub fn install() {
    if log::set_logger(&KernelLines).is_ok() {
        log::set_max_level(LevelFilter::Trace);
    }
}

struct KernelLines;

impl Log for KernelLines {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.target().starts_with("tracer_ebpf")
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = format!("tracer: kernel: {}\n", record.args());
        // One write per line, so lines from several threads do not interleave.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}
