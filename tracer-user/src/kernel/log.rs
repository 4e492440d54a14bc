//! `--debug-kernel`: the eBPF programs' aya-log records, read while a trace runs and handed to
//! the `log` crate (target `tracer_ebpf::MODULE`); the binary decides where they are printed.
//!
//! aya-log 0.3 does not read by itself: its ring's fd becomes readable when records wait, and
//! the reader flushes them. The recording's loop waits on that fd beside the events' drain.

use std::io;

use aya::Ebpf;
use aya_log::EbpfLogger;
use tokio::io::unix::AsyncFd;

type Logger = EbpfLogger<&'static dyn log::Log>;

/// The programs' log ring, taken from the loaded object. Dropping it closes the map's fd, which
/// programs loaded later refer to: keep it until the recording ends.
pub struct KernelLog(Logger);

impl KernelLog {
    pub(crate) fn start(ebpf: &mut Ebpf) -> Result<KernelLog, aya_log::Error> {
        EbpfLogger::init(ebpf).map(KernelLog)
    }

    /// Registers the ring with the runtime (needs one running, unlike [`KernelLog::start`]).
    pub(crate) fn polled(self) -> io::Result<PolledKernelLog> {
        // SAFETY: the logger owns its ring's fd: it stays open, and `as_raw_fd` returns it, until
        // the logger (held by the `AsyncFd`) is dropped.
        Ok(PolledKernelLog(unsafe { AsyncFd::register(self.0) }?))
    }
}

pub(crate) struct PolledKernelLog(AsyncFd<Logger>);

impl PolledKernelLog {
    /// Hands every record waiting to the `log` crate.
    pub(crate) fn flush(&mut self) {
        self.0.get_mut().flush();
    }
}

/// Waits until records are waiting, then hands them on; never resolves without a log.
pub(crate) async fn forward(log: &mut Option<PolledKernelLog>) -> io::Result<()> {
    let Some(log) = log else { return std::future::pending().await };
    let mut ready = log.0.readable_mut().await?;
    ready.get_inner_mut().flush();
    ready.clear_ready();
    Ok(())
}
