pub const CALL_ENTRY: &str = "call_entry";
pub const CALL_RETURN: &str = "call_return";
/// The same two, sleepable (Linux 6.0+), for probes whose cookie has `cookie::STRINGS`: they
/// fault in a string's page that the non-faulting read could not reach.
pub const CALL_ENTRY_SLEEPABLE: &str = "call_entry_s";
pub const CALL_RETURN_SLEEPABLE: &str = "call_return_s";
/// `tracer top`'s function programs: statistics in the kernel, no records.
pub const TOP_ENTRY: &str = "top_entry";
pub const TOP_RETURN: &str = "top_return";
pub const SCHED_FORK: &str = "sched_fork";
pub const SCHED_EXEC: &str = "sched_exec";
/// `sched_process_exit(task, group_dead)`: the kernels whose tracepoint has `group_dead`.
pub const SCHED_EXIT: &str = "sched_exit";
/// `sched_process_exit(task)`: older kernels (6.1, 6.12), which derive `group_dead`.
pub const SCHED_EXIT_1ARG: &str = "sched_exit_1arg";
pub const IPC_SYS_ENTER: &str = "ipc_sys_enter";
pub const IPC_SYS_EXIT: &str = "ipc_sys_exit";
pub const SIGNAL_GENERATE: &str = "signal_generate";
pub const SIGNAL_DELIVER: &str = "signal_deliver";
/// A program's own events: the `tracer_events:event` USDT probe of the `tracer-events` crate
/// and its C header.
pub const USDT_EVENT: &str = "usdt_event";
/// Any other USDT probe: its arguments, evaluated from the probe's argument spec.
pub const USDT_PROBE: &str = "usdt_probe";
/// The same, sleepable (Linux 6.0+), for breakpoints that read strings.
pub const USDT_PROBE_SLEEPABLE: &str = "usdt_probe_s";
/// A hardware watchpoint fired (a `perf_event` program on `PERF_TYPE_BREAKPOINT` events).
pub const WATCH_HIT: &str = "watch_hit";

/// Kernel raw tracepoints (`TP_PROTO` arguments, no tracefs needed) that the sched programs attach to.
pub const SCHED_FORK_TP: &str = "sched_process_fork";
pub const SCHED_EXEC_TP: &str = "sched_process_exec";
pub const SCHED_EXIT_TP: &str = "sched_process_exit";
pub const SIGNAL_GENERATE_TP: &str = "signal_generate";
pub const SIGNAL_DELIVER_TP: &str = "signal_deliver";
pub const SYS_ENTER_TP: &str = "sys_enter";
pub const SYS_EXIT_TP: &str = "sys_exit";
