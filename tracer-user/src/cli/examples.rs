//! The `EXAMPLES` section of each subcommand's `--help` (clap's `after_help`), as man pages
//! have: the commands people start from, each under what it does. Every example is parsed by
//! the command line in a test below, so none goes stale against the options.

pub const RECORD: &str = "\
EXAMPLES:
  # launch and trace a command into trace.jsonl
  sudo tracer record -- ./server --port 8080
  # attach to running processes for 10 s
  sudo tracer record -p 4121,4122 -f 'handle_*' -d 10s
  # every process running that binary, now or later
  sudo tracer record -b /usr/local/bin/worker -f 'worker::*'
  # a library function, calls and returns only
  sudo tracer record -f 'libc.so.6:malloc' -e call,return -p 4121
  # only the matching calls, decided in the kernel
  sudo tracer record -f 'greet if name == \"bob\"' -- ./app
  # each thread's calls from its first handle_request on, two levels deep
  sudo tracer record --start-at handle_request --depth 2 -p 4121
  # the trace on stdout (the command's own output goes to stderr)
  sudo tracer record -o - -f fib -- ./fib 30 | jq -c .
  # the locals at a line; who wrote a variable
  sudo tracer record -B server.c:120 -w requests -- ./server
  # watch it in the browser while it records
  sudo tracer record --serve -f 'handle_*' -p 4121

More: docs/record.md, and `man tracer-record`.";

pub const LIST: &str = "\
EXAMPLES:
  # every function of an executable, with its source and parameters
  tracer list ./server
  # only those a pattern matches
  tracer list -f 'handle_*' ./server
  # USDT probes
  tracer list -u 'python:*' /usr/bin/python3.11
  # what a running process has loaded
  sudo tracer list -p 4121 -f 'libc.so.6:mall*'
  # as JSON
  tracer list --json -f greet ./app | jq .

More: docs/record.md.";

pub const EXPORT: &str = "\
EXAMPLES:
  # for ui.perfetto.dev
  tracer export trace.jsonl -o trace.pftrace
  # Chrome's trace format (Perfetto, chrome://tracing)
  tracer export trace.jsonl -o trace.json
  # for speedscope.app
  tracer export trace.jsonl -o trace.speedscope.json
  # a flame graph
  tracer export trace.jsonl -o trace.svg
  # the messages, for Wireshark (record with --capture-bytes for payloads)
  tracer export trace.jsonl -o web.pcapng
  # spans to an OpenTelemetry collector
  tracer export trace.jsonl --otlp http://collector:4318

More: docs/exports.md.";

pub const REPORT: &str = "\
EXAMPLES:
  # where the time went (reads trace.jsonl)
  tracer report
  # the slowest tails first, from a native trace
  tracer report t.trc --sort p99
  # one row per process and function
  tracer report --by-process
  # as JSON
  tracer report --json | jq .

More: docs/record.md.";

pub const CALLS: &str = "\
EXAMPLES:
  # every thread's calls as a tree (reads trace.jsonl)
  tracer calls
  # only the slow calls of some functions
  tracer calls -f 'handle_*' --min-duration 1ms
  # one process
  tracer calls -p 4121 t.trc | less

More: docs/record.md.";

pub const TOP: &str = "\
EXAMPLES:
  # live per-function statistics, refreshed every second
  sudo tracer top -f 'handle_*' -p 4121
  # a command's allocations
  sudo tracer top -f 'libc.so.6:malloc' -- ./app
  # only what each thread does from its first handle_request on
  sudo tracer top --start-at handle_request -p 4121
  # one JSON object per refresh, for 5 s
  sudo tracer top --json -d 5s -p 4121 | jq .

More: docs/top.md.";

pub const AGENT: &str = "\
EXAMPLES:
  # make the shared secret (give the collector a copy)
  tracer agent --gen-secret /etc/tracer.secret
  # serve local collectors on /run/tracer/agent.sock
  sudo tracer agent
  # serve collectors over the network
  sudo tracer agent --listen 0.0.0.0:7070 --secret-file /etc/tracer.secret

More: docs/cluster.md (and its security model: docs/security.md).";

pub const COLLECT: &str = "\
EXAMPLES:
  # two hosts, one timeline
  tracer collect --agent web=10.0.0.1:7070 --agent db=10.0.0.2:7070 --secret-file /etc/tracer.secret -p web:4121 -p db:977 -e call,return,ipc -o fleet.jsonl
  # through the agent on this host
  sudo tracer collect --agent here=unix:/run/tracer/agent.sock -p here:4121 -e ipc -o t.jsonl

More: docs/cluster.md.";

pub const VIEW: &str = "\
EXAMPLES:
  # trace.jsonl in the browser (prints the URL, opens it when there is a display)
  tracer view
  # on a server: open the printed URL through an SSH tunnel to the port
  tracer view t.trc --no-open --port 8000

More: docs/view.md.";

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::Cli;

    const ALL: [&str; 9] = [RECORD, LIST, EXPORT, REPORT, CALLS, TOP, AGENT, COLLECT, VIEW];

    /// The command of every example line, as words, without `sudo` and what it is piped into.
    fn examples() -> Vec<Vec<String>> {
        let lines = ALL.iter().flat_map(|text| text.lines()).map(str::trim);
        let commands = lines.filter(|l| l.starts_with("tracer ") || l.starts_with("sudo tracer "));
        commands
            .map(|l| {
                let command = l.trim_start_matches("sudo ").split(" | ").next().unwrap();
                shell_words::split(command).unwrap_or_else(|e| panic!("{command}: {e}"))
            })
            .collect()
    }

    #[test]
    fn every_example_is_a_command_the_tracer_takes() {
        let examples = examples();
        assert!(examples.len() >= 30, "{} examples", examples.len());
        for words in examples {
            if let Err(e) = Cli::try_parse_from(&words) {
                panic!("`{}` is refused: {e}", words.join(" "));
            }
        }
    }
}
