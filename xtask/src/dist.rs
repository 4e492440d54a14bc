//! `cargo xtask dist`: what a user installs. `target/dist/tracer-VERSION-x86_64-linux.tar.gz`
//! holds the binary (symbols kept, debug info moved out), the man pages and shell completions
//! (generated from the command line's own definitions by the hidden `tracer docs`), the README,
//! `docs/` (its pages and the trace's JSON Schema) and the licences; the debug info is beside it, `tracer-VERSION.debug`, found by debuggers
//! through the binary's `.gnu_debuglink`.

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result};

use crate::{root, run_checked};

fn mib(path: &Path) -> Result<String> {
    let len = std::fs::metadata(path).with_context(|| format!("stat {}", path.display()))?.len();
    Ok(format!("{:.1} MiB", len as f64 / (1u64 << 20) as f64))
}

pub fn run(tracer: &Path) -> Result<()> {
    let version = env!("CARGO_PKG_VERSION");
    let name = format!("tracer-{version}-x86_64-linux");
    let dist = root().join("target/dist");
    let stage = dist.join(&name);
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(&stage)?;
    let binary = stage.join("tracer");
    std::fs::copy(tracer, &binary)?;
    let debug = dist.join(format!("tracer-{version}.debug"));
    run_checked(Command::new("objcopy").arg("--only-keep-debug").arg(&binary).arg(&debug))?;
    // Symbols stay (a profile of tracer itself still has names); DWARF goes.
    run_checked(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(format!("--add-gnu-debuglink={}", debug.display()))
            .arg(&binary),
    )?;
    run_checked(Command::new(&binary).arg("docs").arg(&stage))?;
    for file in ["README.md", "LICENSE-MIT", "LICENSE-APACHE"] {
        std::fs::copy(root().join(file), stage.join(file))?;
    }
    // The README's links lead into docs/.
    std::fs::create_dir_all(stage.join("docs"))?;
    for entry in std::fs::read_dir(root().join("docs"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "md") {
            std::fs::copy(&path, stage.join("docs").join(path.file_name().expect("a file")))?;
        }
    }
    // The JSON Schema of a trace, which docs/events.md links.
    std::fs::create_dir_all(stage.join("docs/schema"))?;
    for entry in std::fs::read_dir(root().join("docs/schema"))? {
        let path = entry?.path();
        std::fs::copy(&path, stage.join("docs/schema").join(path.file_name().expect("a file")))?;
    }
    let tarball = dist.join(format!("{name}.tar.gz"));
    run_checked(Command::new("tar").arg("-C").arg(&dist).arg("-czf").arg(&tarball).arg(&name))?;
    println!("xtask: {} ({})", tarball.display(), mib(&tarball)?);
    println!("xtask:   tracer {} (debug info moved to {}, {})", mib(&binary)?, debug.display(), mib(&debug)?);
    println!("xtask:   man pages in man/, completions for bash, zsh and fish in completions/");
    Ok(())
}
