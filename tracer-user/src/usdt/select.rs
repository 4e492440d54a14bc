//! Which probe sites to attach, and how the kernel evaluates their arguments.
//!
//! Every `tracer_events:event` probe of the modules is taken without asking (a program's own
//! events); other probes are taken when a `-u [MODULE:]PROVIDER:NAME` pattern matches them
//! (globs; without a module, in the executables and every library they use). Each site becomes
//! a [`UsdtProbe`] for the loader, with the cookie that names it in the kernel's records and in
//! the [`ProbeTable`] that decodes them.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::Arc,
};

use globset::{Glob, GlobMatcher};
use tracer_common::{USDT_MAX_ARGS, USDT_NO_REGISTER, UsdtArgKind, UsdtArgSpec, UsdtSpec};

use super::{
    args::{ArgSpec, Location, Register},
    notes::{NoteError, UsdtFile, UsdtNote},
};
use crate::{
    kernel::btf::{KernelBtfError, KernelFacts},
    kernel::sites::{UsdtProbe, UsdtProgram},
    targets::modules::{ModuleCandidates, ModuleError},
};

/// Provider and name of the probe every program event goes through.
pub const EVENT_PROVIDER: &str = "tracer_events";
pub const EVENT_NAME: &str = "event";

#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    #[error("invalid USDT pattern '{pattern}': {reason}")]
    BadPattern { pattern: String, reason: String },
    #[error("USDT pattern '{pattern}' matches no probe in {modules}; {}", available_probes(.available))]
    NoMatch { pattern: String, modules: String, available: Vec<String> },
    #[error(transparent)]
    Module(#[from] ModuleError),
    #[error(transparent)]
    Notes(#[from] NoteError),
    #[error(transparent)]
    KernelBtf(#[from] KernelBtfError),
}

fn available_probes(available: &[String]) -> String {
    if available.is_empty() {
        "they have no USDT probes".to_string()
    } else {
        format!("the probes there are: {}", available.join(", "))
    }
}

/// `-u [MODULE:]PROVIDER:NAME`, provider and name globs (`libc.so.6:libc:setjmp`, `myapp:*`).
#[derive(Clone, Debug)]
pub struct UsdtPattern {
    pub text: String,
    pub module: Option<String>,
    provider: GlobMatcher,
    name: GlobMatcher,
}

impl UsdtPattern {
    pub fn parse(text: &str) -> Result<UsdtPattern, SelectError> {
        let bad = |reason: String| SelectError::BadPattern { pattern: text.to_string(), reason };
        // The module may be a path, so the provider and name are the last two parts.
        let mut parts = text.rsplitn(3, ':');
        let (Some(name), Some(provider)) = (parts.next(), parts.next()) else {
            return Err(bad("expected PROVIDER:NAME, optionally after MODULE:".to_string()));
        };
        let module = parts.next().map(str::to_string);
        if provider.is_empty() || name.is_empty() || module.as_deref() == Some("") {
            return Err(bad("the module, provider and name cannot be empty".to_string()));
        }
        let glob = |g: &str| Glob::new(g).map(|g| g.compile_matcher()).map_err(|e| bad(e.to_string()));
        Ok(UsdtPattern { text: text.to_string(), module, provider: glob(provider)?, name: glob(name)? })
    }

    fn matches(&self, note: &UsdtNote) -> bool {
        self.provider.is_match(&note.provider) && self.name.is_match(&note.name)
    }
}

/// What a probe's records are decoded with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeInfo {
    pub provider: Arc<str>,
    pub name: Arc<str>,
    /// Path of the ELF file.
    pub module: Arc<str>,
    /// Per argument: whether it is signed (`None`: the tracer cannot evaluate it).
    pub signed: Vec<Option<bool>>,
}

/// Probes by cookie.
pub type ProbeTable = Vec<ProbeInfo>;

/// The sites to attach, the table to decode their records, and what the user should know.
#[derive(Debug, Default)]
pub struct Selection {
    pub probes: Vec<UsdtProbe>,
    pub table: ProbeTable,
    pub warnings: Vec<String>,
}

/// `struct pt_regs` offsets of the registers, from the running kernel's BTF.
pub struct RegisterOffsets(BTreeMap<&'static str, u32>);

impl RegisterOffsets {
    pub fn from_facts(facts: &KernelFacts) -> Result<RegisterOffsets, KernelBtfError> {
        Ok(RegisterOffsets(facts.pt_regs()?.iter().copied().collect()))
    }

    pub(crate) fn of(&self, register: Register) -> u32 {
        self.0[register.pt_regs_field()]
    }
}

/// The kernel's spec of one argument.
pub(crate) fn arg_spec(arg: &ArgSpec, regs: &RegisterOffsets) -> UsdtArgSpec {
    let mut spec = UsdtArgSpec {
        kind: UsdtArgKind::Const as u32,
        size: arg.size as u32,
        signed: arg.signed as u32,
        reg: 0,
        index_reg: USDT_NO_REGISTER,
        scale: 1,
        value: 0,
    };
    match &arg.location {
        Location::Const(value) => spec.value = *value,
        Location::Register(r) => {
            spec.kind = UsdtArgKind::Register as u32;
            spec.reg = regs.of(*r);
        }
        Location::Memory { base, index, offset } => {
            spec.kind = UsdtArgKind::Memory as u32;
            spec.reg = regs.of(*base);
            spec.value = *offset;
            if let Some((index, scale)) = index {
                spec.index_reg = regs.of(*index);
                spec.scale = *scale as u32;
            }
        }
        // `notes` resolves every symbol or turns it into an error.
        Location::Symbol { .. } => spec.kind = UsdtArgKind::Unsupported as u32,
    }
    spec
}

/// The kernel's spec of a probe: every argument it can evaluate (the others are `Unsupported`,
/// reported as not read).
pub fn probe_spec(note: &UsdtNote, regs: &RegisterOffsets) -> UsdtSpec {
    let mut spec = UsdtSpec { arg_count: note.args.len().min(USDT_MAX_ARGS) as u32, ..UsdtSpec::default() };
    for (slot, arg) in spec.args.iter_mut().zip(&note.args) {
        *slot = match arg {
            Ok(arg) => arg_spec(arg, regs),
            Err(_) => UsdtArgSpec { kind: UsdtArgKind::Unsupported as u32, ..UsdtArgSpec::default() },
        };
    }
    spec
}

/// Whether a note is a program-event probe, and has the arguments one must have.
fn is_event_probe(note: &UsdtNote) -> bool {
    note.provider == EVENT_PROVIDER && note.name == EVENT_NAME
}

fn event_probe_is_valid(note: &UsdtNote) -> bool {
    matches!(note.args.as_slice(), [Ok(a), Ok(b)] if a.size == 8 && b.size == 8)
}

/// The probe files of the modules, read once each. A mapped file that is not ELF (a locale
/// archive, a font) has no probes; any other failure is an error.
pub struct ProbeFiles {
    files: BTreeMap<PathBuf, UsdtFile>,
}

impl ProbeFiles {
    pub fn load(modules: &[PathBuf]) -> Result<ProbeFiles, SelectError> {
        let mut files = BTreeMap::new();
        for path in modules {
            match UsdtFile::load(path) {
                Ok(file) => {
                    files.insert(path.clone(), file);
                }
                Err(NoteError::NotElf { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(ProbeFiles { files })
    }

    pub fn iter(&self) -> impl Iterator<Item = &UsdtFile> {
        self.files.values()
    }

    fn get(&mut self, path: &Path) -> Result<&UsdtFile, SelectError> {
        if !self.files.contains_key(path) {
            self.files.insert(path.to_owned(), UsdtFile::load(path)?);
        }
        Ok(&self.files[path])
    }
}

/// The probes the patterns match (in a pattern's module, or in all of `files`), each site once,
/// by (file, file offset). A pattern that matches nothing is an error that lists the probes
/// there are. `record` attaches these; `list` shows them.
pub fn matching(
    files: &mut ProbeFiles,
    candidates: &ModuleCandidates,
    patterns: &[UsdtPattern],
) -> Result<BTreeMap<(PathBuf, u64), UsdtNote>, SelectError> {
    let mut chosen = BTreeMap::new();
    for pattern in patterns {
        let modules: Vec<PathBuf> = match &pattern.module {
            Some(module) => vec![candidates.resolve(module)?],
            None => files.iter().map(|f| f.path.clone()).collect(),
        };
        let mut matched = 0;
        for module in &modules {
            for note in files.get(module)?.notes.iter().filter(|n| pattern.matches(n)) {
                if is_event_probe(note) && !event_probe_is_valid(note) {
                    continue;
                }
                chosen.insert((module.clone(), note.file_offset), note.clone());
                matched += 1;
            }
        }
        if matched == 0 {
            let mut available = BTreeSet::new();
            for module in &modules {
                for note in &files.get(module)?.notes {
                    available.insert(format!("{}:{}", note.provider, note.name));
                }
            }
            let modules = modules.iter().map(|m| m.display().to_string()).collect::<Vec<_>>().join(", ");
            return Err(SelectError::NoMatch {
                pattern: pattern.text.clone(),
                modules,
                available: available.into_iter().collect(),
            });
        }
    }
    Ok(chosen)
}

/// Picks the sites: every valid program-event probe of `files` (with `program_events`), and every probe a pattern
/// matches (in its module, or in all of `files`). A pattern that matches nothing is an error
/// that lists the probes there are.
pub fn select(
    files: &mut ProbeFiles,
    candidates: &ModuleCandidates,
    patterns: &[UsdtPattern],
    regs: &RegisterOffsets,
    program_events: bool,
) -> Result<Selection, SelectError> {
    // (path, file offset) -> the note, each site once, in a stable order.
    let mut chosen: BTreeMap<(PathBuf, u64), UsdtNote> = BTreeMap::new();
    let mut warnings = Vec::new();
    for file in files.iter() {
        for skipped in &file.skipped {
            warnings.push(format!("{}: {skipped}", file.path.display()));
        }
        for note in file.notes.iter().filter(|n| program_events && is_event_probe(n)) {
            if event_probe_is_valid(note) {
                chosen.insert((file.path.clone(), note.file_offset), note.clone());
            } else {
                warnings.push(format!(
                    "{}: ignoring a {EVENT_PROVIDER}:{EVENT_NAME} probe with arguments '{}' (expected an 8-byte address and length)",
                    file.path.display(),
                    note.args_text
                ));
            }
        }
    }
    chosen.extend(matching(files, candidates, patterns)?);

    let mut selection = Selection { warnings, ..Selection::default() };
    let mut unreadable: BTreeSet<String> = BTreeSet::new();
    for ((path, _), note) in chosen {
        let cookie = selection.table.len() as u64;
        let program = if is_event_probe(&note) { UsdtProgram::Event } else { UsdtProgram::Probe };
        for (i, arg) in note.args.iter().enumerate() {
            if let Err(e) = arg {
                unreadable.insert(format!("{}:{} argument {} ({e})", note.provider, note.name, i + 1));
            }
        }
        if note.args.len() > USDT_MAX_ARGS {
            unreadable.insert(format!("{}:{} arguments past the {USDT_MAX_ARGS}th", note.provider, note.name));
        }
        selection.probes.push(UsdtProbe {
            path: path.clone(),
            file_offset: note.file_offset,
            semaphore_offset: note.semaphore.map_or(0, |s| s.file_offset),
            cookie,
            program,
            spec: probe_spec(&note, regs),
        });
        selection.table.push(ProbeInfo {
            provider: Arc::from(note.provider.as_str()),
            name: Arc::from(note.name.as_str()),
            module: Arc::from(path.to_string_lossy()),
            signed: note.args.iter().take(USDT_MAX_ARGS).map(|a| a.as_ref().ok().map(|a| a.signed)).collect(),
        });
    }
    if !unreadable.is_empty() {
        let list: Vec<String> = unreadable.into_iter().collect();
        selection.warnings.push(format!("cannot read these USDT arguments (recorded as null): {}", list.join("; ")));
    }
    Ok(selection)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn regs() -> RegisterOffsets {
        RegisterOffsets::from_facts(KernelFacts::running().expect("kernel BTF")).expect("pt_regs")
    }

    #[test]
    fn patterns() {
        let p = UsdtPattern::parse("libc.so.6:libc:setjmp").unwrap();
        assert_eq!(p.module.as_deref(), Some("libc.so.6"));
        let p = UsdtPattern::parse("/opt/my:dir/lib.so:app:req*").unwrap();
        assert_eq!(p.module.as_deref(), Some("/opt/my:dir/lib.so"));
        let note = |provider: &str, name: &str| UsdtNote {
            provider: provider.into(),
            name: name.into(),
            address: 0,
            file_offset: 0,
            semaphore: None,
            args_text: String::new(),
            args: Vec::new(),
        };
        assert!(p.matches(&note("app", "request_start")));
        assert!(!p.matches(&note("app", "reply")));
        assert!(UsdtPattern::parse("*:*").unwrap().matches(&note("x", "y")));
        for bad in ["setjmp", ":x", "a:", "m::x", ":a:b", "a:[b"] {
            assert!(matches!(UsdtPattern::parse(bad), Err(SelectError::BadPattern { .. })), "{bad}");
        }
    }

    #[test]
    fn register_offsets_come_from_the_kernel() {
        let regs = regs();
        // x86-64 `struct pt_regs`: r15 first, then r14 .. r12, bp, bx, r11 .. r8, ax, cx, dx, si,
        // di, orig_ax, ip.
        assert_eq!(regs.of(Register::R15), 0);
        assert_eq!(regs.of(Register::Di), 112);
        assert_eq!(regs.of(Register::Ip), 128);
        assert_eq!(regs.of(Register::Sp), 152);
    }

    #[test]
    fn kernel_specs_say_where_each_argument_is() {
        let regs = regs();
        let note = UsdtNote {
            provider: "p".into(),
            name: "n".into(),
            address: 0x1000,
            file_offset: 0x1000,
            semaphore: None,
            args_text: "-4@-12(%rbp) 1@$-56 2@8(%rax,%rbx,2) 8@%xmm0".into(),
            args: super::super::args::parse_args("-4@-12(%rbp) 1@$-56 2@8(%rax,%rbx,2) 8@%xmm0"),
        };
        let spec = probe_spec(&note, &regs);
        assert_eq!(spec.arg_count, 4);
        let a = spec.args;
        assert_eq!((a[0].kind, a[0].size, a[0].signed, a[0].reg, a[0].value), (3, 4, 1, regs.of(Register::Bp), -12));
        assert_eq!(a[0].index_reg, USDT_NO_REGISTER);
        assert_eq!((a[1].kind, a[1].size, a[1].signed, a[1].value), (1, 1, 0, -56));
        assert_eq!(
            (a[2].kind, a[2].reg, a[2].index_reg, a[2].scale, a[2].value),
            (3, regs.of(Register::Ax), regs.of(Register::Bx), 2, 8)
        );
        assert_eq!(a[3].kind, UsdtArgKind::Unsupported as u32);
    }

    #[test]
    fn selects_event_probes_and_patterns_and_lists_probes_when_nothing_matches() {
        let exe = std::env::current_exe().unwrap();
        let candidates = ModuleCandidates::new(std::slice::from_ref(&exe), &[]);
        let mut files = ProbeFiles::load(candidates.files()).unwrap();
        let regs = regs();
        // libstdc++'s probes, by module.
        let pattern = UsdtPattern::parse("libstdc++.so.6:libstdcxx:*throw").unwrap();
        let stdcxx_candidates = ModuleCandidates::new(&[PathBuf::from("/lib/x86_64-linux-gnu/libstdc++.so.6")], &[]);
        let mut stdcxx = ProbeFiles::load(stdcxx_candidates.files()).unwrap();
        let selection = select(&mut stdcxx, &stdcxx_candidates, &[pattern], &regs, true).unwrap();
        let names: Vec<&str> = selection.table.iter().map(|p| &*p.name).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.contains(&"throw") && names.contains(&"rethrow"), "{names:?}");
        assert!(selection.probes.iter().all(|p| p.program == UsdtProgram::Probe && p.semaphore_offset == 0));
        assert_eq!(selection.probes.iter().map(|p| p.cookie).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(selection.table[0].signed, [Some(false), Some(false)]);

        // This test binary has no probes: the error says so, and lists what there is elsewhere.
        let err = select(&mut files, &candidates, &[UsdtPattern::parse("nope:*").unwrap()], &regs, true).unwrap_err();
        assert!(matches!(err, SelectError::NoMatch { .. }), "{err}");
        let err =
            select(&mut stdcxx, &stdcxx_candidates, &[UsdtPattern::parse("libstdcxx:nope").unwrap()], &regs, true)
                .unwrap_err()
                .to_string();
        assert!(err.starts_with("USDT pattern 'libstdcxx:nope' matches no probe in "), "{err}");
        assert!(err.ends_with("the probes there are: libstdcxx:catch, libstdcxx:rethrow, libstdcxx:throw"), "{err}");
    }
}
