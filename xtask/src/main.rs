//! `cargo xtask`: the one place that knows how to set up, build, test, benchmark and demo the tracer.
//!
//! The eBPF crate needs a compiler that can build `core` for `bpfel-unknown-none` and `bpf-linker`;
//! see `../shared/TOOLCHAIN.md` for why this machine uses Debian's `rustc-web` with
//! `RUSTC_BOOTSTRAP=1`. Everything else builds with the ordinary stable toolchain.

mod bench;
mod bench_cluster;
mod bench_events;
mod bench_export;
mod bench_filters;
mod bench_kernels;
mod bench_native;
mod bench_otlp;
mod bench_params;
mod bench_startup;
mod demo;
mod dist;
mod screenshots;
mod toolchain;
mod vm;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand, ValueEnum as _};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Build, test, benchmark and demo the tracer")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what a fresh machine lacks to build tracer and run the demo (Debian packages,
    /// bpf-linker), and with --test what the tests and benchmarks use too; skips what is there.
    Setup {
        /// Also what the tests and benchmarks use (compilers for the fixtures, uftrace, chromium,
        /// tshark, speedscope, an OpenTelemetry collector).
        #[arg(long)]
        test: bool,
    },
    /// Build the eBPF object and the `tracer` binary that embeds it.
    Build,
    /// Build, then make `target/dist/tracer-VERSION-x86_64-linux.tar.gz`: the binary without its
    /// debug info (beside it in a `.debug` file), man pages, completions, README and licences.
    Dist,
    /// Build, then run `tracer` as root with these arguments.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Setup, build, format check, clippy, unit tests, and the root integration tests: the whole
    /// suite on this machine's kernel and the core set (`CORE_TESTS`) under Debian's 6.1 and 6.12
    /// kernels in VMs.
    Test {
        /// Only run integration tests whose name contains this.
        #[arg(long)]
        filter: Option<String>,
        /// Run the whole integration suite under this kernel only (repeatable): `host`, or `6.1`
        /// or `6.12` in a VM (`cargo xtask vm`).
        #[arg(long, value_enum)]
        kernel: Vec<vm::Kernel>,
    },
    /// Measure the tracer's overhead and throughput, and the exporters' speed and memory; prints
    /// tables for the README.
    Bench {
        /// Run only this part.
        #[arg(long, value_enum)]
        only: Option<bench::Part>,
        /// Run the benchmarks under this kernel in a VM (`cargo xtask vm`), built here first;
        /// repeatable, one kernel after the other (never side by side: they would slow each
        /// other). Ratios to bpftrace are measured in the same VM.
        #[arg(long, value_enum)]
        kernel: Vec<vm::Kernel>,
        /// Use the tracer already built (inside a VM, where building would take an hour).
        #[arg(long, hide = true)]
        built: bool,
    },
    /// Trace the bundled demo workload into a Chrome trace for the Perfetto UI.
    Demo,
    /// Take the pictures of `tracer view` in docs/ again, from the demo's trace (headless
    /// Chromium, one per tab).
    Screenshots,
    /// Fuzz the decoders of untrusted input (network frames, trace files, kernel records) with
    /// libFuzzer; needs a nightly toolchain (installs cargo-fuzz if missing).
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Only this target (frame, trace_line, record, event_payload).
        target: Option<String>,
    },
    /// Write the seed corpus of every fuzz target into `fuzz/corpus/<target>/` in the current
    /// encodings (frames, trace lines, ring-buffer records, program-event payloads).
    FuzzSeeds,
    /// Run a command as root in a qemu VM booting another Debian kernel (6.1, 6.12) over this
    /// machine's own root filesystem, or directly on the host (`--kernel host`); exits with its code.
    Vm(vm::Args),
    /// Run a command (its standard output discarded) and print its peak resident memory in KiB
    /// (used by `bench`: a fresh process, so no memory of the caller's is counted).
    #[command(hide = true)]
    PeakRss {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        command: Vec<String>,
    },
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Task::Setup { test } => toolchain::setup(if test { toolchain::Needs::Tests } else { toolchain::Needs::Build }),
        Task::Build => build().map(|_| ()),
        Task::Dist => {
            toolchain::setup(toolchain::Needs::Build)?;
            dist::run(&build()?)
        }
        Task::Run { args } => {
            let tracer = build()?;
            run_as_root(&tracer, &args)
        }
        Task::Test { filter, kernel } => test(filter.as_deref(), &kernel),
        Task::Bench { only, kernel, built } => {
            if built {
                return bench::run(&root().join("target/release/tracer"), only, bench::Machine::Emulated);
            }
            toolchain::setup(toolchain::Needs::Tests)?;
            let tracer = build()?;
            if kernel.is_empty() {
                return bench::run(&tracer, only, bench::Machine::Host);
            }
            for k in kernel {
                println!("xtask: ---- benchmarks under Linux {} ----", k.name());
                let mut command =
                    vec![std::env::current_exe()?.display().to_string(), "bench".into(), "--built".into()];
                if let Some(only) = only {
                    command.extend([
                        "--only".into(),
                        only.to_possible_value().expect("no skipped parts").get_name().into(),
                    ]);
                }
                let code = vm::run_command(&vm::Args { kernel: k, mem: "4G".into(), cpus: 2, timeout: 3600, command })?;
                if code != 0 {
                    bail!("the benchmarks under Linux {} failed (exit {code})", k.name());
                }
            }
            Ok(())
        }
        Task::Demo => {
            toolchain::setup(toolchain::Needs::Build)?;
            let tracer = build()?;
            demo::run(&tracer)
        }
        Task::Screenshots => {
            toolchain::setup(toolchain::Needs::Tests)?;
            let tracer = build()?;
            screenshots::run(&tracer)
        }
        Task::Fuzz { seconds, target } => fuzz(seconds, target.as_deref()),
        Task::FuzzSeeds => {
            toolchain::build_ebpf(&root())?;
            let corpus = root().join("fuzz/corpus");
            run_checked(cargo(&["run", "-q", "-p", "tracer-user", "--example", "fuzz_seeds", "--"]).arg(corpus))
        }
        Task::PeakRss { command } => bench_export::peak_rss(&command),
        Task::Vm(args) => vm::run(args),
    }
}

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// Where the eBPF object lands.
fn ebpf_object() -> PathBuf {
    root().join("target/bpfel-unknown-none/release/tracer-ebpf")
}

/// A `cargo` command for the user-space crates, with the eBPF object to embed. Every user-space
/// cargo call goes through here, so that all of them agree on `TRACER_EBPF_OBJECT` and none
/// rebuilds `tracer` without its programs.
pub fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root()).args(args).env("TRACER_EBPF_OBJECT", ebpf_object());
    cmd
}

pub fn run_checked(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("cannot run {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

/// Builds the eBPF object and the release `tracer`; returns the binary's path.
pub fn build() -> Result<PathBuf> {
    toolchain::build_ebpf(&root())?;
    run_checked(&mut cargo(&["build", "--release", "-p", "tracer-user", "--bin", "tracer"]))?;
    Ok(root().join("target/release/tracer"))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn run_as_root(tracer: &Path, args: &[String]) -> Result<()> {
    let mut cmd = if is_root() {
        Command::new(tracer)
    } else {
        let mut sudo = Command::new("sudo");
        sudo.arg(tracer);
        sudo
    };
    let status = cmd.args(args).status().context("cannot run tracer")?;
    std::process::exit(status.code().unwrap_or(1));
}

fn fuzz(seconds: u64, only: Option<&str>) -> Result<()> {
    let nightly = |args: &[&str]| {
        let mut c = Command::new("rustup");
        c.args(["run", "nightly", "cargo"]).args(args).current_dir(root()).env_remove("RUSTUP_TOOLCHAIN");
        c
    };
    if !nightly(&["fuzz", "--version"]).output().is_ok_and(|o| o.status.success()) {
        println!("xtask: installing cargo-fuzz");
        run_checked(Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())).args([
            "install",
            "cargo-fuzz",
            "--locked",
        ]))?;
    }
    // Built first, so a target that does not compile is not reported as a failure found.
    println!("xtask: building the fuzz targets");
    run_checked(&mut nightly(&["fuzz", "build", "--fuzz-dir", "fuzz"])).context("the fuzz targets did not build")?;
    for target in ["frame", "trace_line", "record", "event_payload", "native"]
        .into_iter()
        .filter(|t| only.is_none_or(|o| o == *t))
    {
        println!("xtask: fuzzing {target} for {seconds} s");
        run_checked(&mut nightly(&[
            "fuzz",
            "run",
            "--fuzz-dir",
            "fuzz",
            target,
            "--",
            &format!("-max_total_time={seconds}"),
        ]))
        .with_context(|| format!("fuzz target {target} found a failure (see fuzz/artifacts/{target})"))?;
    }
    Ok(())
}

/// The integration-test files that run under every kernel the README promises on each
/// `cargo xtask test`: the recording foundation, IPC, USDT, DWARF parameters, Go, `top`, the
/// cluster and its security, crashes and signals, probe placement, returns through unwinding,
/// predicates, triggers and depth evaluated in the kernel,
/// strings in pages not yet faulted in (sleepable programs), commands behind wrappers (a process
/// stopped at exec while its new image is resolved), breakpoints and hardware watchpoints (which
/// QEMU's emulated CPU has).
/// The others (exporters, readers, benches of formats) do not depend on the kernel;
/// `--kernel 6.1` runs them there too.
const CORE_TESTS: &[&str] = &[
    "record",
    "filters",
    "triggers",
    "ipc",
    "usdt",
    "debuginfo_live",
    "go",
    "top",
    "cluster",
    "security",
    "crash_and_signals",
    "placement",
    "unwinding",
    "cold_strings",
    "wrappers",
    "breakpoints",
];

fn test(filter: Option<&str>, kernels: &[vm::Kernel]) -> Result<()> {
    if !is_root() {
        bail!("the integration tests load eBPF programs: run `cargo xtask test` as root");
    }
    toolchain::setup(toolchain::Needs::Tests)?;
    let tracer = build()?;
    println!("xtask: cargo fmt --check");
    run_checked(&mut cargo(&["fmt", "--all", "--check"]))?;
    println!("xtask: clippy");
    run_checked(&mut cargo(&[
        "clippy",
        "--release",
        "--workspace",
        "--exclude",
        "tracer-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    println!("xtask: unit tests");
    run_checked(&mut cargo(&[
        "test",
        "--release",
        "--workspace",
        "--exclude",
        "tracer-ebpf",
        "--exclude",
        "tracer-tests",
    ]))?;
    let rotel = toolchain::rotel_agent().context("rotel-agent is not installed: run `cargo xtask setup`")?;
    // What the tests read, here and in the VMs (`vm` passes TRACER_* and ROTEL_AGENT through).
    // SAFETY: xtask has no other threads.
    unsafe {
        std::env::set_var("TRACER_BIN", &tracer);
        std::env::set_var("TRACER_SPEEDSCOPE", toolchain::speedscope_dir());
        std::env::set_var("ROTEL_AGENT", &rotel);
    }
    let runs: Vec<(vm::Kernel, bool)> = if kernels.is_empty() {
        vec![(vm::Kernel::Host, true), (vm::Kernel::V6_1, false), (vm::Kernel::V6_12, false)]
    } else {
        kernels.iter().map(|&k| (k, true)).collect()
    };
    let mut failed = Vec::new();
    if runs.iter().any(|(k, _)| *k == vm::Kernel::Host) {
        println!("xtask: integration tests (root, this machine's kernel)");
        let mut args = vec!["test", "--release", "-p", "tracer-tests", "--", "--test-threads=1"];
        args.extend(filter);
        if let Err(e) = run_checked(&mut cargo(&args)) {
            eprintln!("xtask: {e:#}");
            failed.push(vm::Kernel::Host.name());
        }
    }
    // The VMs run side by side, each on one host thread (see vm.rs), their output in a log each,
    // printed whole as each ends.
    let vms: Vec<(vm::Kernel, bool)> = runs.into_iter().filter(|(k, _)| *k != vm::Kernel::Host).collect();
    if !vms.is_empty() {
        let binaries = test_binaries()?;
        let mut children = Vec::new();
        for (kernel, whole) in vms {
            let selected: Vec<&(String, PathBuf)> =
                binaries.iter().filter(|(name, _)| whole || CORE_TESTS.contains(&name.as_str())).collect();
            println!(
                "xtask: integration tests under Linux {} in a VM: {}",
                kernel.name(),
                selected.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
            );
            // One boot for all of them; each binary prints its own summary line.
            let mut script = String::from("status=0\n");
            for (_, path) in &selected {
                script.push_str(&format!("{} --test-threads=1 {} || status=1\n", path.display(), filter.unwrap_or("")));
            }
            script.push_str("exit $status\n");
            let dir = root().join("target/vm");
            std::fs::create_dir_all(&dir)?;
            let script_path = dir.join(format!("tests-{}.sh", kernel.name()));
            std::fs::write(&script_path, script)?;
            let log_path = dir.join(format!("tests-{}.log", kernel.name()));
            let log = std::fs::File::create(&log_path)?;
            let child = Command::new(std::env::current_exe()?)
                .args(["vm", "--kernel", kernel.name(), "--", "sh"])
                .arg(&script_path)
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("cannot start cargo xtask vm")?;
            children.push((kernel, child, log_path));
        }
        for (kernel, mut child, log_path) in children {
            let status = child.wait()?;
            println!("xtask: ---- Linux {} (VM), from {} ----", kernel.name(), log_path.display());
            print!("{}", std::fs::read_to_string(&log_path).unwrap_or_default());
            if !status.success() {
                failed.push(kernel.name());
            }
        }
    }
    if !failed.is_empty() {
        bail!("integration tests failed under: {}", failed.join(", "));
    }
    println!("xtask: all tests passed");
    Ok(())
}

/// The integration-test executables by file name (`record`, `ipc`, ...), built now.
fn test_binaries() -> Result<Vec<(String, PathBuf)>> {
    let out = cargo(&["test", "--release", "-p", "tracer-tests", "--no-run", "--message-format=json"])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot build the integration tests")?;
    if !out.status.success() {
        bail!("the integration tests did not build");
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let (Some(exe), Some(kinds)) = (msg["executable"].as_str(), msg["target"]["kind"].as_array()) else {
            continue;
        };
        if kinds.iter().any(|k| k == "test") {
            let name = msg["target"]["name"].as_str().unwrap_or_default().to_string();
            found.push((name, PathBuf::from(exe)));
        }
    }
    found.sort();
    Ok(found)
}
