//! `tracer list`: what `record` could probe, as text or JSON.

use std::{ffi::OsString, io::Write, path::PathBuf};

use anyhow::bail;
use clap::Args;

use tracer_user::{
    functions::placement::ProbePath,
    plan::list::{ListOptions, ListedFunction, Listing, list as resolve},
};

#[derive(Debug, Args)]
pub struct ListArgs {
    /// List the functions matching this pattern (repeatable), as `record -f` takes it. Default:
    /// the functions `record` probes by default (unless only -u is given).
    #[arg(short, long = "functions", visible_alias = "function", value_name = "PATTERN", value_parser = super::pattern_list::parse)]
    pub functions: Vec<super::pattern_list::PatternList>,
    /// List the USDT probes matching this pattern (repeatable), as `record -u` takes it:
    /// [MODULE:]PROVIDER:NAME. Default: every USDT probe of the targets and their libraries
    /// (unless only -f is given).
    #[arg(short, long = "usdt", value_name = "PATTERN", value_parser = super::pattern_list::parse)]
    pub usdt: Vec<super::pattern_list::PatternList>,
    /// The executable of this running process, and what it has loaded (repeatable).
    #[arg(short, long = "pid", value_name = "PID", value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// This executable (repeatable; the same as giving it as PATH).
    #[arg(short, long = "binary", value_name = "PATH")]
    pub binaries: Vec<PathBuf>,
    /// Write the listing as JSON.
    #[arg(long)]
    pub json: bool,
    /// Executables to list.
    #[arg(value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// A command, after `--`: its program is listed (it is not run).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

pub fn list(args: ListArgs) -> anyhow::Result<i32> {
    if args.pids.is_empty() && args.binaries.is_empty() && args.paths.is_empty() && args.command.is_empty() {
        bail!("nothing to list: give an executable, --pid, --binary, or a command after --");
    }
    let listing = resolve(ListOptions {
        pids: args.pids,
        binaries: args.binaries.into_iter().chain(args.paths).collect(),
        command: args.command,
        functions: super::pattern_list::flatten(args.functions),
        usdt: super::pattern_list::flatten(args.usdt),
    })?;
    super::print_warnings(&listing.warnings);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.json {
        serde_json::to_writer_pretty(&mut out, &listing)?;
        writeln!(out)?;
    } else {
        write_text(&listing, &mut tracer_user::printable::Printable::new(&mut out))?;
    }
    out.flush()?;
    Ok(0)
}

/// A function as its source declares it: `greet(who: name_t) -> const char *`; without DWARF,
/// its name alone.
fn signature(f: &ListedFunction) -> String {
    let Some(params) = &f.params else { return f.name.clone() };
    let params: Vec<String> = params.iter().map(|p| format!("{}: {}", p.name, p.ty)).collect();
    let ret = f.returns.as_ref().map_or(String::new(), |r| format!(" -> {r}"));
    format!("{}({}){ret}", f.name, params.join(", "))
}

fn write_text(listing: &Listing, out: &mut impl Write) -> std::io::Result<()> {
    let mut module = None;
    let width = listing.functions.iter().map(|f| signature(f).chars().count()).max().unwrap_or(0);
    let source_width = listing.functions.iter().map(|f| source(f).chars().count()).max().unwrap_or(0);
    for f in &listing.functions {
        if module != Some(&f.module) {
            module = Some(&f.module);
            writeln!(out, "{}:", f.module)?;
        }
        writeln!(out, "  {:width$}  {:source_width$}  {}", signature(f), source(f), f.probe.name())?;
    }
    if !listing.functions.is_empty() {
        let fast = listing.functions.iter().filter(|f| f.probe == ProbePath::Optimized).count();
        writeln!(
            out,
            "{} function(s), {fast} on the fast path (optimized: no trap; emulated: one trap; trap: a trap and a single-step)",
            listing.functions.len()
        )?;
    }
    let mut module = None;
    for p in &listing.usdt {
        if module != Some(&p.module) {
            if module.is_none() && !listing.functions.is_empty() {
                writeln!(out)?;
            }
            module = Some(&p.module);
            writeln!(out, "{} (USDT):", p.module)?;
        }
        let sites = if p.sites > 1 { format!(", {} sites", p.sites) } else { String::new() };
        let semaphore = if p.semaphore { ", semaphore" } else { "" };
        writeln!(out, "  {}:{} ({} args{sites}{semaphore})", p.provider, p.name, p.args)?;
    }
    Ok(())
}

/// `file:line` where DWARF says the function is defined, or nothing.
fn source(f: &ListedFunction) -> String {
    match (&f.file, f.line) {
        (Some(file), Some(line)) => format!("{file}:{line}"),
        (Some(file), None) => file.clone(),
        _ => String::new(),
    }
}
