//! What `record` could probe in some targets, without probing anything (`tracer list`): the
//! functions a `-f` pattern (or the default) selects, with what their DWARF says and the path their
//! entry probe would take, and the USDT probes of the targets and their libraries. It runs the
//! same resolution `record` does ([`super::plan`], [`crate::usdt::select`]), so that what is listed
//! is what would be traced.

use std::{
    collections::{BTreeSet, HashMap},
    ffi::OsString,
    path::PathBuf,
};

use serde::Serialize;

use super::{RecordError, RecordOptions, plan};
use crate::{
    event::EventKind,
    functions::placement::ProbePath,
    targets::modules::ModuleCandidates,
    usdt::{
        notes::UsdtNote,
        select::{self, ProbeFiles, UsdtPattern},
    },
};

/// The targets and patterns of a listing, as `record` takes them.
#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    pub pids: Vec<u32>,
    pub binaries: Vec<PathBuf>,
    /// A command (program first) whose program is listed; it is not run.
    pub command: Vec<OsString>,
    /// `-f` patterns; none lists every function `record` probes by default, unless `usdt` is
    /// given alone.
    pub functions: Vec<String>,
    /// `-u` patterns; none lists every USDT probe, unless `functions` is given alone.
    pub usdt: Vec<String>,
}

/// What [`list`] found.
#[derive(Debug, Default, Serialize)]
pub struct Listing {
    pub functions: Vec<ListedFunction>,
    pub usdt: Vec<ListedProbe>,
    /// What the user should know (as `record` would warn).
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// One function `record` would probe.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct ListedFunction {
    /// Demangled, as its events name it.
    pub name: String,
    /// Path of the ELF file.
    pub module: String,
    /// Where DWARF says it is defined.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// Its parameters in order, from DWARF; `None` without DWARF (calls then carry registers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<Vec<ListedParam>>,
    /// The return type (`None`: `void`, or no DWARF).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub returns: Option<String>,
    /// The path the entry probe takes in the kernel: `optimized` (no trap: the fast path),
    /// `emulated` (one trap) or `trap` (a trap and a single-step).
    pub probe: ProbePath,
}

#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct ListedParam {
    pub name: String,
    /// As the source spells it.
    #[serde(rename = "type")]
    pub ty: String,
}

/// One USDT probe site.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct ListedProbe {
    pub provider: String,
    pub name: String,
    /// Path of the ELF file.
    pub module: String,
    pub args: usize,
    /// In how many places of the code it is (a probe in an inlined function is in several).
    pub sites: usize,
    /// Whether it has a semaphore (which the tracer raises while attached, so that the program
    /// computes the probe's arguments).
    pub semaphore: bool,
}

impl ListedProbe {
    fn of(module: &std::path::Path, note: &UsdtNote) -> ListedProbe {
        ListedProbe {
            provider: note.provider.clone(),
            name: note.name.clone(),
            module: module.display().to_string(),
            args: note.args.len(),
            sites: 1,
            semaphore: note.semaphore.is_some(),
        }
    }
}

/// Resolves the targets and patterns as `record` would, and says what it would probe.
pub fn list(options: ListOptions) -> Result<Listing, RecordError> {
    let want_functions = !options.functions.is_empty() || options.usdt.is_empty();
    let want_usdt = !options.usdt.is_empty() || options.functions.is_empty();
    let events: BTreeSet<EventKind> =
        if want_functions { BTreeSet::from([EventKind::Call, EventKind::Return]) } else { BTreeSet::new() };
    let plan = plan(RecordOptions {
        pids: options.pids,
        binaries: options.binaries,
        command: options.command,
        functions: options.functions,
        // USDT probes are listed below, all of them without patterns.
        usdt: Vec::new(),
        events,
        // Listing costs no probe.
        max_probes: usize::MAX,
        // The rest as `record` has them by default (no breakpoints or watchpoints among them).
        ..RecordOptions::default()
    })?;
    // `list` runs nothing, so no exec follows: a pattern must match in what it is given.
    if let Some(u) = plan.unmatched.first() {
        let (pattern, modules, suggestions) = (u.pattern.clone(), u.modules.clone(), u.suggestions.clone());
        return Err(RecordError::NoMatch { pattern, modules, suggestions });
    }
    let mut listing = Listing { warnings: plan.warnings.clone(), ..Listing::default() };

    // A function's probe path is recorded by the name its events carry.
    let mut paths: HashMap<&str, ProbePath> = HashMap::new();
    for path in ProbePath::ALL {
        for name in plan.probe_paths.list(path) {
            paths.entry(name.as_str()).or_insert(path);
        }
    }
    for f in &plan.functions {
        let source = f.source.as_deref();
        let layout = source.and_then(|s| s.layout.as_ref());
        listing.functions.push(ListedFunction {
            name: f.name.to_string(),
            module: f.module.to_string(),
            file: source.and_then(|s| s.file.as_deref()).map(str::to_string),
            line: source.and_then(|s| s.line),
            params: layout.map(|l| {
                l.params.iter().map(|p| ListedParam { name: p.name.clone(), ty: p.ty.name.clone() }).collect()
            }),
            returns: layout.and_then(|l| l.ret.as_ref()).map(|r| r.ty.name.clone()),
            probe: paths.get(&*f.name).copied().unwrap_or(ProbePath::Trap),
        });
    }

    if want_usdt {
        let patterns = options.usdt.iter().map(|p| UsdtPattern::parse(p)).collect::<Result<Vec<_>, _>>()?;
        let pids: Vec<u32> = plan.processes.iter().map(|p| p.pid).collect();
        let candidates = ModuleCandidates::new(&plan.executables, &pids);
        let mut files = ProbeFiles::load(candidates.files())?;
        if patterns.is_empty() {
            for file in files.iter() {
                listing.usdt.extend(file.notes.iter().map(|n| ListedProbe::of(&file.path, n)));
            }
        } else {
            let chosen = select::matching(&mut files, &candidates, &patterns)?;
            listing.usdt.extend(chosen.iter().map(|((path, _), note)| ListedProbe::of(path, note)));
        }
        // One line per probe, not per site: a probe inlined in several places is one probe.
        listing.usdt.sort_by(|a, b| (&a.module, &a.provider, &a.name).cmp(&(&b.module, &b.provider, &b.name)));
        listing.usdt.dedup_by(|later, first| {
            let same = (&later.module, &later.provider, &later.name) == (&first.module, &first.provider, &first.name);
            if same {
                first.sites += later.sites;
            }
            same
        });
        for file in files.iter() {
            listing.warnings.extend(file.skipped.iter().map(|s| format!("{}: {s}", file.path.display())));
        }
    }
    Ok(listing)
}
