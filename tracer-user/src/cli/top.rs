//! `tracer top`: the command line of live in-kernel statistics (see [`tracer_user::top`]).

use std::{
    ffi::OsString,
    io::{IsTerminal as _, Write as _},
    path::PathBuf,
    time::{Duration, Instant},
};

use clap::Args;

use super::{stop_signal, values};
use tracer_user::{
    event::EndReason,
    plan::{self, RecordOptions},
    record::pace::{Deadline, liveness_tick},
    targets::launch::{ChildExit, Start},
    top::{Snapshot, Top, plan_top},
};

/// Rows a terminal shows.
const TERMINAL_ROWS: usize = 40;

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Trace this running process (repeatable, or a comma list: -p 1,2).
    #[arg(short, long = "pid", value_name = "PID", value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// Trace every process that runs this executable, now or later (repeatable).
    #[arg(short, long = "binary", value_name = "PATH")]
    pub binaries: Vec<PathBuf>,
    /// Functions to probe (repeatable), as for `record`. Default: every function of the main
    /// executable.
    #[arg(short, long = "functions", visible_alias = "function", value_name = "PATTERN", value_parser = super::pattern_list::parse)]
    pub functions: Vec<super::pattern_list::PatternList>,
    #[command(flatten)]
    pub triggers: super::Triggers,
    /// Count and time only the calls that last at least this long (1.5 = seconds, 10ms, 250us),
    /// each at its return; decided in the kernel (docs/top.md).
    #[arg(long, value_name = "DURATION", value_parser = values::duration)]
    pub min_duration: Option<Duration>,
    /// Time between updates: 1.5 (seconds), 500ms.
    #[arg(short, long, value_name = "DURATION", value_parser = values::duration, default_value = "1")]
    pub interval: Duration,
    /// Stop after this long: 1.5 (seconds), 250ms, 2m.
    #[arg(short, long, value_name = "DURATION", value_parser = values::duration)]
    pub duration: Option<Duration>,
    /// One row per process and function.
    #[arg(long)]
    pub by_process: bool,
    /// One JSON object per interval on standard output (the default when it is not a terminal).
    #[arg(long)]
    pub json: bool,
    /// Do not follow children (following forks and execs is the default).
    #[arg(long)]
    pub no_follow: bool,
    /// Refuse to probe more functions than this without -f.
    #[arg(long, value_name = "N", default_value_t = plan::DEFAULT_MAX_PROBES)]
    pub max_probes: usize,
    /// The command to launch and trace, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

pub fn top(args: TopArgs) -> anyhow::Result<i32> {
    plan::check_root()?;
    plan::check_pid_namespace()?;
    if args.interval.is_zero() {
        anyhow::bail!("--interval must be more than 0 seconds");
    }
    let options = RecordOptions {
        pids: args.pids,
        binaries: args.binaries,
        command: args.command,
        functions: super::pattern_list::flatten(args.functions),
        start_at: super::pattern_list::flatten(args.triggers.start_at),
        stop_at: super::pattern_list::flatten(args.triggers.stop_at),
        depth: args.triggers.depth,
        follow_children: !args.no_follow,
        duration: args.duration,
        max_probes: args.max_probes,
        // With --json, standard output is the statistics: the command's goes to stderr.
        start: if args.json { Start::InheritStdoutToStderr } else { Start::Inherit },
        ..RecordOptions::default()
    };
    let terminal = !args.json && std::io::stdout().is_terminal();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        let stop = stop_signal()?;
        let plan = plan_top(options)?;
        for w in &plan.warnings {
            super::stderr::warning(w);
        }
        if let Some(summary) = &plan.probe_summary {
            super::advice::print_probe_summary(summary, false);
        }
        let min_duration_ns = args.min_duration.map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let mut top = Top::start(plan, args.by_process, min_duration_ns)?;
        for w in &top.warnings {
            super::stderr::warning(w);
        }
        super::stderr::info(format_args!(
            "tracing {} function(s); statistics every {} s to standard output",
            top.probes,
            args.interval.as_secs_f64()
        ));
        let start = Instant::now();
        let deadline = Deadline::after(args.duration);
        let mut every = tokio::time::interval_at(tokio::time::Instant::now() + args.interval, args.interval);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut tick = liveness_tick();
        let mut last_snapshot = start;
        tokio::pin!(stop);
        let reason = loop {
            tokio::select! {
                biased;
                reason = &mut stop => break reason,
                _ = deadline.reached() => break EndReason::Duration,
                _ = every.tick() => {
                    let now = Instant::now();
                    let snapshot = top.snapshot(now - start, now - last_snapshot, false)?;
                    last_snapshot = now;
                    show(&snapshot, terminal)?;
                }
                _ = tick.tick() => {
                    if top.targets_gone() {
                        break if top.command_running().is_some() || top.command_exit().is_some() { EndReason::CommandExited } else { EndReason::TargetsExited };
                    }
                }
            }
        };
        top.stop();
        let now = Instant::now();
        let snapshot = top.snapshot(now - start, now - last_snapshot, true)?;
        show(&snapshot, terminal)?;
        let exit = top.command_exit();
        let running = top.command_running();
        drop(top);
        super::stderr::info(format_args!("top ended ({reason})"));
        if snapshot.lost.total() > 0 {
            let l = &snapshot.lost;
            super::stderr::warning(format_args!("calls not counted or not timed: {} (threads_full: {}, keys_full: {}, too_deep: {}, no_return: {}, untraced_children: {})",
                l.total(),
                l.threads_full,
                l.keys_full,
                l.too_deep,
                l.no_return,
                l.untraced_children
            ));
        }
        if let Some(pid) = running {
            super::stderr::info(format_args!("the command (pid {pid}) is still running, untraced"));
        }
        Ok(match (exit, reason) {
            (Some(exit), _) => ChildExit::shell_code(exit),
            (None, EndReason::Interrupted) if running.is_some() => 130,
            _ => 0,
        })
    })
}

/// Writes a snapshot: a redrawn table on a terminal, otherwise one JSON line.
fn show(snapshot: &Snapshot, terminal: bool) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if terminal {
        // Home and clear, then the table: `top`'s redraw.
        write!(out, "\x1b[H\x1b[2J{}", snapshot.table(TERMINAL_ROWS))?;
    } else {
        serde_json::to_writer(&mut out, snapshot)?;
        writeln!(out)?;
    }
    out.flush()?;
    Ok(())
}
