//! Installing and finding the eBPF toolchain (see ../shared/TOOLCHAIN.md).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::run_checked;

/// What a setup installs: what building tracer (and running the demo) needs, or that and what
/// the tests and benchmarks need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    Build,
    Tests,
}

/// Debian packages building needs: Debian's rustc 1.96 with its `core` sources (builds eBPF with
/// `RUSTC_BOOTSTRAP=1`), LLVM 22 (for bpf-linker), and a C compiler (the linker, and the demo's
/// workload). bpf-linker itself is built with cargo.
const BUILD_PACKAGES: &[&str] = &["rustc-web", "cargo-web", "rust-web-src", "llvm-22-dev", "gcc"];
/// What the tests and benchmarks add: C++ and Go compilers (test fixtures; Debian 12's Go is
/// 1.19), python3-venv (rotel's virtual environment), iproute2 (network namespaces for the
/// multi-host tests), libc6-dbg (libc's DWARF under /usr/lib/debug/.build-id, which the debuginfo
/// tests find by build id), systemtap-sdt-dev (`<sys/sdt.h>`, for the USDT fixture;
/// `tracer_events.h` itself needs nothing), tshark (Wireshark's reader checks the pcapng
/// captures; installed noninteractively, its debconf question about non-root capture keeps its
/// default, no); and, besides these, speedscope with npm and rotel with pip.
const TEST_PACKAGES: &[&str] = &[
    "g++",
    "golang-go",
    "iproute2",
    "python3-venv",
    "libc6-dbg",
    "systemtap-sdt-dev",
    // The native format's bench compares its size and `report` speed with uftrace's.
    "uftrace",
    // speedscope's own viewer, loaded headless by the speedscope export test.
    "chromium",
    "nodejs",
    "tshark",
    // `man` renders the generated man pages in their test.
    "man-db",
    // A debugger-traced command (`strace -f`) in the wrappers test: not stopped at exec.
    "strace",
];
/// The speedscope release (its `dist/release` viewer and `file-format-schema.json`) and the JSON
/// Schema validator (ajv, draft-07 like the schema) the speedscope export test uses, installed
/// with npm under `target/tools/speedscope`.
const NPM_PACKAGES: &[&str] = &["speedscope@1.25.0", "ajv@8.20.0"];
/// rotel, the OpenTelemetry collector the OTLP export tests send to: its wheel ships the
/// `rotel-agent` binary. In a virtual environment of its own, so that no system Python changes.
pub const ROTEL_VENV: &str = "/opt/tracer-rotel";
const ROTEL_VERSION: &str = "0.0.1a15";

/// The `rotel-agent` of [`ROTEL_VENV`], if installed.
pub fn rotel_agent() -> Option<PathBuf> {
    let lib = Path::new(ROTEL_VENV).join("lib");
    std::fs::read_dir(&lib)
        .ok()?
        .flatten()
        .map(|python| python.path().join("site-packages/rotel/rotel-agent"))
        .find(|p| p.is_file())
}

/// bpf-linker must be built against the LLVM major version of the compiler emitting the bitcode.
const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Where `cargo install` puts binaries.
fn cargo_bin_dir() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
        .join("bin")
}

/// The bpf-linker to use, if one runs.
pub fn bpf_linker() -> Option<PathBuf> {
    let candidates = [PathBuf::from("bpf-linker"), cargo_bin_dir().join("bpf-linker")];
    candidates.into_iter().find(|c| {
        Command::new(c).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    })
}

pub fn setup(needs: Needs) -> Result<()> {
    let wanted = BUILD_PACKAGES.iter().chain(if needs == Needs::Tests { TEST_PACKAGES } else { &[] });
    let missing: Vec<&str> = wanted.copied().filter(|p| !installed(p)).collect();
    if !missing.is_empty() {
        println!("xtask: installing {}", missing.join(" "));
        run_checked(Command::new("apt-get").arg("update").arg("-q"))?;
        run_checked(
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends"])
                .args(&missing)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    if bpf_linker().is_none() {
        println!("xtask: installing bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (takes a few minutes)");
        let path = format!("{LLVM_PREFIX}/bin:{}", std::env::var("PATH").unwrap_or_default());
        run_checked(
            Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .args(["install", "bpf-linker", "--locked", "--version", BPF_LINKER_VERSION])
                .args(["--no-default-features", "--features", "llvm-22"])
                .env("LLVM_PREFIX", LLVM_PREFIX)
                .env("PATH", path)
                .env_remove("RUSTUP_TOOLCHAIN"),
        )?;
    }
    if needs == Needs::Build {
        return Ok(());
    }
    setup_speedscope()?;
    if rotel_agent().is_none() {
        println!("xtask: installing rotel {ROTEL_VERSION} (an OpenTelemetry collector) into {ROTEL_VENV}");
        run_checked(Command::new("python3").args(["-m", "venv", ROTEL_VENV]))?;
        run_checked(Command::new(Path::new(ROTEL_VENV).join("bin/pip")).args([
            "install",
            "-q",
            &format!("rotel=={ROTEL_VERSION}"),
        ]))?;
    }
    Ok(())
}

/// Where `setup` installs the npm packages of [`NPM_PACKAGES`].
pub fn speedscope_dir() -> PathBuf {
    crate::root().join("target/tools/speedscope")
}

fn setup_speedscope() -> Result<()> {
    let dir = speedscope_dir();
    let present = ["speedscope/dist/release/index.html", "ajv/package.json"]
        .iter()
        .all(|f| dir.join("node_modules").join(f).exists());
    if present {
        return Ok(());
    }
    if Command::new("npm").arg("--version").stdout(Stdio::null()).status().is_err() {
        // Debian's nodejs comes without npm; NodeSource's includes it.
        run_checked(
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends", "npm"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    println!("xtask: installing {} into {}", NPM_PACKAGES.join(" "), dir.display());
    std::fs::create_dir_all(&dir)?;
    run_checked(
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--save-exact", "--prefix"])
            .arg(&dir)
            .args(NPM_PACKAGES),
    )
}

/// A compiler that can build `core` for the BPF target.
enum EbpfToolchain {
    /// rustup's nightly with the rust-src component: the standard aya set-up.
    Nightly,
    /// Debian's rustc-web with rust-web-src, unlocked with RUSTC_BOOTSTRAP=1.
    Debian,
}

fn detect() -> Result<EbpfToolchain> {
    let nightly_src = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("lib/rustlib/src/rust/library/core"));
    if nightly_src.is_some_and(|p| p.is_dir()) {
        return Ok(EbpfToolchain::Nightly);
    }
    if Path::new("/usr/bin/rustc").exists() && Path::new("/usr/lib/rustlib/src/rust/library/core").is_dir() {
        return Ok(EbpfToolchain::Debian);
    }
    bail!(
        "no compiler can build eBPF here: install rust-src for a nightly toolchain \
         (rustup component add rust-src --toolchain nightly) or Debian's rustc-web and rust-web-src \
         (cargo xtask setup)"
    )
}

/// Builds `tracer-ebpf` for bpfel-unknown-none.
pub fn build_ebpf(root: &Path) -> Result<()> {
    let linker = bpf_linker().context("bpf-linker is not installed: run `cargo xtask setup`")?;
    let mut cmd = match detect()? {
        EbpfToolchain::Nightly => {
            let mut c = Command::new("rustup");
            c.args(["run", "nightly", "cargo"]);
            c
        }
        EbpfToolchain::Debian => {
            let mut c = Command::new("/usr/bin/cargo");
            c.env("RUSTC_BOOTSTRAP", "1").env("RUSTC", "/usr/bin/rustc");
            c
        }
    };
    cmd.current_dir(root)
        .args(["build", "--release", "-p", "tracer-ebpf", "--target", "bpfel-unknown-none", "-Z", "build-std=core"])
        .env("CARGO_TARGET_BPFEL_UNKNOWN_NONE_LINKER", linker)
        // bpf-linker emits BTF from the debug info (aya needs it for the programs' globals); BPF v3
        // has the atomic fetch-and-add the stream counters use (Linux 5.12+).
        .env("CARGO_ENCODED_RUSTFLAGS", "-Cdebuginfo=2\x1f-Clink-arg=--btf\x1f-Ctarget-cpu=v3")
        // Outer cargo/rustup settings would point the inner cargo at the wrong compiler.
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTFLAGS");
    run_checked(&mut cmd).context("building the eBPF programs failed")
}
