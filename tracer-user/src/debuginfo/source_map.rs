//! Where code is in the source, and what is in scope there, for breakpoints and watchpoints:
//!
//! - the line table: the file and line of an address (a watchpoint's writing instruction), and
//!   the addresses of a source line (a breakpoint's probes, one per block of code the line has,
//!   inlined copies included);
//! - the functions' address ranges (the function of an address, `FUNC+OFFSET`);
//! - a global or static variable by name: its address and type (`-w VARIABLE`);
//! - the parameters and locals in scope at an address, each with where it lives there
//!   (registers, memory at a register plus an offset, `DW_OP_fbreg` through the frame base and
//!   the call frame's CFA from `.eh_frame`, location lists), or why that is not known.
//!
//! The DWARF is untrusted like everywhere in [`super`]: expressions and location lists are read
//! with the bounds of [`super::dwarf`], and anything malformed leaves a value unknown.

// gimli's DW_* constants keep DWARF's own spelling.
#![allow(non_upper_case_globals)]

use std::{collections::BTreeMap, path::Path, sync::Arc};

use gimli::{AttributeValue, Operation, UnitOffset, UnwindSection as _, constants::*};

use super::{
    dwarf::{FrameBase, LocationAt, Reader, Slice, Unit, frame_base as frame_base_of, operations, walk_scopes},
    types::Type,
};

/// One row of the line table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Row {
    address: u64,
    /// Index into [`SourceMap::files`]; `u32::MAX` ends a sequence (no code from here).
    file: u32,
    line: u32,
    is_stmt: bool,
}

/// A function's code: `[low, high)`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FunctionRange {
    low: u64,
    high: u64,
    name: Arc<str>,
}

/// The line table and function ranges of one ELF file.
#[derive(Clone, Debug, Default)]
pub struct SourceMap {
    rows: Vec<Row>,
    files: Vec<Arc<str>>,
    functions: Vec<FunctionRange>,
}

/// A source line with no code, or a file the line table does not name.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LineError {
    #[error("no source file of the program's line table ends with '{file}'")]
    NoFile { file: String },
    #[error("line {line} of {file} has no code; {}", nearest_text(.before, .after))]
    NoCode { file: String, line: u32, before: Option<u32>, after: Option<u32> },
}

fn nearest_text(before: &Option<u32>, after: &Option<u32>) -> String {
    match (before, after) {
        (Some(b), Some(a)) => format!("the nearest lines with code are {b} and {a}"),
        (Some(l), None) | (None, Some(l)) => format!("the nearest line with code is {l}"),
        (None, None) => "the file has no code".to_string(),
    }
}

/// Whether `path` (as the compiler recorded it) is the file the user named: the same path, or
/// one ending with the user's components (`fixture.c`, `src/fixture.c`).
fn names_file(path: &str, wanted: &str) -> bool {
    let path = Path::new(path);
    let wanted = Path::new(wanted);
    let mut p = path.components().rev();
    wanted.components().rev().all(|w| p.next() == Some(w))
}

impl SourceMap {
    /// The file and line of the code at `address`.
    pub fn line_at(&self, address: u64) -> Option<(Arc<str>, u32)> {
        let i = self.rows.partition_point(|r| r.address <= address).checked_sub(1)?;
        let row = self.rows[i];
        let file = self.files.get(row.file as usize)?;
        (row.line != 0).then(|| (file.clone(), row.line))
    }

    /// The function whose code holds `address` (the innermost out-of-line one).
    pub fn function_at(&self, address: u64) -> Option<Arc<str>> {
        self.functions
            .iter()
            .filter(|f| f.low <= address && address < f.high)
            .min_by_key(|f| f.high - f.low)
            .map(|f| f.name.clone())
    }

    /// Where a function starts, by name.
    pub fn function_start(&self, name: &str) -> Option<u64> {
        self.functions.iter().find(|f| &*f.name == name).map(|f| f.low)
    }

    /// The addresses where `line` of `file` starts: the first statement row of each run of rows
    /// with that line (a line split into blocks, a line inlined in several places, has several).
    pub fn addresses_of(&self, file: &str, line: u32) -> Result<Vec<u64>, LineError> {
        let files: Vec<u32> =
            (0..self.files.len() as u32).filter(|&i| names_file(&self.files[i as usize], file)).collect();
        if files.is_empty() {
            return Err(LineError::NoFile { file: file.to_string() });
        }
        let mut addresses = Vec::new();
        let mut previous: Option<Row> = None;
        for row in &self.rows {
            let here = files.contains(&row.file) && row.line == line;
            let continues = previous.is_some_and(|p| files.contains(&p.file) && p.line == line);
            if here && row.is_stmt && !continues {
                addresses.push(row.address);
            }
            // A non-statement row of the same line continues its run; any other row ends it.
            if !(here && !row.is_stmt && continues) {
                previous = Some(*row);
            }
        }
        addresses.sort_unstable();
        addresses.dedup();
        if addresses.is_empty() {
            let lines = self.rows.iter().filter(|r| files.contains(&r.file) && r.line != 0).map(|r| r.line);
            let before = lines.clone().filter(|&l| l < line).max();
            let after = lines.filter(|&l| l > line).min();
            return Err(LineError::NoCode { file: file.to_string(), line, before, after });
        }
        Ok(addresses)
    }
}

/// A global or static variable: where it is (its address in the ELF file) and its type.
#[derive(Clone, Debug, PartialEq)]
pub struct Global {
    pub address: u64,
    pub ty: Arc<Type>,
}

/// Where a local lives at one address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalPlace {
    /// In a register (DWARF's number).
    Register(u16),
    /// In memory at a register (DWARF's number) plus an offset; register 16 is the address of
    /// the probed instruction (a static variable: its address relative to the probe).
    Memory { register: u16, offset: i64 },
    /// A constant the compiler folded in.
    Const(i64),
    /// DWARF has no location for it here.
    OptimizedOut,
    /// A location the tracer cannot evaluate in the kernel: why.
    Unsupported(String),
}

/// A parameter or local variable in scope at an address.
#[derive(Clone, Debug, PartialEq)]
pub struct Local {
    pub name: String,
    pub ty: Arc<Type>,
    pub place: LocalPlace,
}

/// The DWARF register number of the instruction pointer (the return address column).
pub const DWARF_IP: u16 = 16;

/// The call frame's CFA at an address, from `.eh_frame`: a register and an offset.
pub struct CallFrames<'a> {
    eh_frame: gimli::EhFrame<Slice<'a>>,
    bases: gimli::BaseAddresses,
}

impl<'a> CallFrames<'a> {
    /// From the executable's (not the separate debug file's) `.eh_frame`.
    pub fn new(file: &object::File<'a>) -> Option<CallFrames<'a>> {
        use object::{Object as _, ObjectSection as _};
        let section = file.section_by_name(".eh_frame")?;
        let data = section.data().ok()?;
        let mut bases = gimli::BaseAddresses::default().set_eh_frame(section.address());
        if let Some(text) = file.section_by_name(".text") {
            bases = bases.set_text(text.address());
        }
        Some(CallFrames { eh_frame: gimli::EhFrame::new(data, gimli::LittleEndian), bases })
    }

    fn cfa(&self, address: u64) -> Option<(u16, i64)> {
        let mut ctx = gimli::UnwindContext::new();
        let row = self
            .eh_frame
            .unwind_info_for_address(&self.bases, &mut ctx, address, gimli::EhFrame::cie_from_offset)
            .ok()?;
        match row.cfa() {
            gimli::CfaRule::RegisterAndOffset { register, offset } => Some((register.0, *offset)),
            gimli::CfaRule::Expression(_) => None,
        }
    }
}

impl<'d, 'a> Reader<'d, 'a> {
    /// The line table and function ranges of every unit.
    pub(crate) fn source_map(&mut self) -> Result<SourceMap, gimli::Error> {
        let mut map = SourceMap::default();
        let mut file_ids: BTreeMap<Arc<str>, u32> = BTreeMap::new();
        for unit in self.all_units()? {
            if let Some(program) = unit.line_program.clone() {
                let mut unit_files: BTreeMap<u64, u32> = BTreeMap::new();
                let mut rows = program.rows();
                while let Some((_, row)) = rows.next_row()? {
                    if row.end_sequence() {
                        map.rows.push(Row { address: row.address(), file: u32::MAX, line: 0, is_stmt: false });
                        continue;
                    }
                    let index = row.file_index();
                    let file = match unit_files.get(&index) {
                        Some(&f) => f,
                        None => {
                            let path: Arc<str> = self
                                .file_path(&unit, index)
                                .map_or_else(|| Arc::from("?"), |p| p.to_string_lossy().into());
                            let next = file_ids.len() as u32;
                            let id = *file_ids.entry(path.clone()).or_insert(next);
                            if id == next {
                                map.files.push(path);
                            }
                            unit_files.insert(index, id);
                            id
                        }
                    };
                    let line = row.line().map_or(0, |l| l.get().min(u32::MAX as u64) as u32);
                    map.rows.push(Row { address: row.address(), file, line, is_stmt: row.is_stmt() });
                }
            }
            let mut subprograms = Vec::new();
            walk_scopes(&unit, |entry, _, _: Option<()>| {
                if entry.tag() == DW_TAG_subprogram {
                    subprograms.push(entry.offset());
                }
                Ok(None)
            })?;
            for offset in subprograms {
                let ranges = self.ranges(&unit, offset);
                if ranges.is_empty() {
                    continue;
                }
                let name: Arc<str> = self
                    .origin_chain(&unit, offset)
                    .iter()
                    .find_map(|(u, e)| self.name(u, e))
                    .map_or_else(|| Arc::from("?"), Arc::from);
                for (low, high) in ranges {
                    map.functions.push(FunctionRange { low, high, name: name.clone() });
                }
            }
        }
        // Sequences sort by address; an end row sorts before a row that starts the next
        // sequence at the same address.
        map.rows.sort_by_key(|r| (r.address, r.file != u32::MAX));
        Ok(map)
    }

    /// A global or static variable named `name` whose location is a fixed address.
    pub(crate) fn global(&mut self, name: &str) -> Result<Option<Global>, gimli::Error> {
        for unit in self.all_units()? {
            let mut found = None;
            walk_scopes(&unit, |entry, _, _: Option<()>| {
                if found.is_none()
                    && entry.tag() == DW_TAG_variable
                    && self.name(&unit, entry).as_deref() == Some(name)
                    && let Some(AttributeValue::Exprloc(expr)) = entry.attr_value(DW_AT_location)
                    && let Some([Operation::Address { address }]) = operations(expr, unit.encoding()).as_deref()
                {
                    found = Some((*address, entry.offset()));
                }
                Ok(None)
            })?;
            if let Some((address, offset)) = found {
                let chain = self.origin_chain(&unit, offset);
                let ty = self.chain_type(&chain, "no type");
                return Ok(Some(Global { address, ty }));
            }
        }
        Ok(None)
    }

    /// The parameters and locals in scope at `pc`, outermost scope first, with where each lives
    /// there. `None` when no function's DWARF covers `pc`.
    pub(crate) fn locals_at(
        &mut self,
        pc: u64,
        frames: Option<&CallFrames<'_>>,
    ) -> Result<Option<Vec<Local>>, gimli::Error> {
        let wanted = std::collections::BTreeSet::from([pc]);
        for unit in self.all_units()? {
            if !self.unit_holds_any(&unit, &wanted)? {
                continue;
            }
            // Each DIE opens a scope: whether pc is inside it (a scope that holds pc, under
            // scopes that do).
            let mut in_function = false;
            let mut frame_base = FrameBase::Unknown;
            let mut found: Vec<UnitOffset> = Vec::new();
            walk_scopes(&unit, |entry, depth, parent: Option<bool>| {
                let parent_holds = parent.unwrap_or(depth == 0);
                let tag = entry.tag();
                let inside = match tag {
                    DW_TAG_compile_unit | DW_TAG_partial_unit => true,
                    DW_TAG_subprogram | DW_TAG_lexical_block | DW_TAG_inlined_subroutine => {
                        let offset = entry.offset();
                        let here = parent_holds
                            && self.ranges(&unit, offset).iter().any(|&(low, high)| low <= pc && pc < high);
                        if here && tag == DW_TAG_subprogram {
                            in_function = true;
                            frame_base = frame_base_of(&unit, entry);
                        }
                        here
                    }
                    DW_TAG_formal_parameter | DW_TAG_variable => {
                        if parent_holds && in_function && depth >= 2 {
                            found.push(entry.offset());
                        }
                        false
                    }
                    _ => false,
                };
                Ok(Some(inside))
            })?;
            if !in_function {
                continue;
            }
            let locals = found.into_iter().filter_map(|o| self.local(&unit, o, pc, frame_base, frames)).collect();
            return Ok(Some(locals));
        }
        Ok(None)
    }

    /// One parameter or variable at `pc` (`None` for one without a name: nothing to show it by).
    fn local(
        &mut self,
        unit: &Arc<Unit<'a>>,
        offset: UnitOffset,
        pc: u64,
        frame_base: FrameBase,
        frames: Option<&CallFrames<'_>>,
    ) -> Option<Local> {
        let chain = self.origin_chain(unit, offset);
        let name = chain.iter().find_map(|(u, e)| self.name(u, e))?;
        let ty = self.chain_type(&chain, "no type");
        let (_, die) = chain.first()?;
        let place = match self.location_at(unit, die, pc) {
            LocationAt::Absent => match die.attr_value(DW_AT_const_value) {
                Some(v) => match v.sdata_value().or_else(|| v.udata_value().map(|u| u as i64)) {
                    Some(c) => LocalPlace::Const(c),
                    None => LocalPlace::Unsupported("a constant that is not an integer".into()),
                },
                None => LocalPlace::OptimizedOut,
            },
            LocationAt::Here { expr, .. } => place(expr, unit.encoding(), pc, frame_base, frames),
            LocationAt::NotHere => LocalPlace::OptimizedOut,
            LocationAt::Malformed => LocalPlace::Unsupported("a malformed location list".into()),
            LocationAt::UnknownForm => LocalPlace::Unsupported("a location of an unknown form".into()),
        };
        Some(Local { name, ty, place })
    }
}

/// Where one location expression puts a value at `pc`.
fn place(
    expr: gimli::Expression<Slice>,
    encoding: gimli::Encoding,
    pc: u64,
    frame_base: FrameBase,
    frames: Option<&CallFrames<'_>>,
) -> LocalPlace {
    let Some(ops) = operations(expr, encoding) else {
        return LocalPlace::Unsupported("a malformed or too long location expression".into());
    };
    match ops.as_slice() {
        [] => LocalPlace::OptimizedOut,
        [Operation::Register { register }] => LocalPlace::Register(register.0),
        [Operation::RegisterOffset { register, offset, .. }] => {
            LocalPlace::Memory { register: register.0, offset: *offset }
        }
        [Operation::RegisterOffset { register, offset: 0, .. }, Operation::StackValue] => {
            LocalPlace::Register(register.0)
        }
        [Operation::UnsignedConstant { value }, Operation::StackValue] => LocalPlace::Const(*value as i64),
        [Operation::SignedConstant { value }, Operation::StackValue] => LocalPlace::Const(*value),
        [Operation::Address { address }] => {
            LocalPlace::Memory { register: DWARF_IP, offset: address.wrapping_sub(pc) as i64 }
        }
        [Operation::FrameOffset { offset }] => match frame_base {
            FrameBase::Register(register, base) => LocalPlace::Memory { register, offset: base + offset },
            FrameBase::Cfa => match frames.and_then(|f| f.cfa(pc)) {
                Some((register, cfa)) => LocalPlace::Memory { register, offset: cfa + offset },
                None => LocalPlace::Unsupported("no call frame information for this address".into()),
            },
            FrameBase::Unknown => LocalPlace::Unsupported("a frame base the tracer does not evaluate".into()),
        },
        ops if ops.iter().any(|op| matches!(op, Operation::EntryValue { .. })) => {
            LocalPlace::Unsupported("its value at the function's entry (DW_OP_entry_value)".into())
        }
        ops if ops.iter().any(|op| matches!(op, Operation::Piece { .. })) => {
            LocalPlace::Unsupported("a value in pieces".into())
        }
        _ => LocalPlace::Unsupported("a computed location".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_named_by_its_trailing_components() {
        assert!(names_file("/src/tests/fixtures/breakpoints.c", "breakpoints.c"));
        assert!(names_file("/src/tests/fixtures/breakpoints.c", "fixtures/breakpoints.c"));
        assert!(!names_file("/src/tests/fixtures/breakpoints.c", "points.c"));
        assert!(!names_file("/src/a.c", "b/a.c"));
    }

    fn map(rows: &[(u64, u32, u32, bool)]) -> SourceMap {
        SourceMap {
            rows: rows.iter().map(|&(address, file, line, is_stmt)| Row { address, file, line, is_stmt }).collect(),
            files: vec![Arc::from("/src/f.c"), Arc::from("/src/g.c")],
            functions: vec![FunctionRange { low: 0x10, high: 0x40, name: Arc::from("f") }],
        }
    }

    #[test]
    fn a_line_starts_once_per_run_of_its_rows() {
        let m = map(&[
            (0x10, 0, 3, true),
            (0x14, 0, 4, true),
            (0x18, 0, 4, false),
            (0x1c, 0, 4, true),
            (0x20, 0, 6, true),
            (0x28, 0, 4, true),
            (0x30, u32::MAX, 0, false),
        ]);
        assert_eq!(m.addresses_of("f.c", 4), Ok(vec![0x14, 0x28]));
        assert_eq!(m.line_at(0x1a), Some((Arc::from("/src/f.c"), 4)));
        assert_eq!(m.line_at(0x30), None);
        assert_eq!(m.function_at(0x1a).as_deref(), Some("f"));
        assert_eq!(
            m.addresses_of("f.c", 5).unwrap_err().to_string(),
            "line 5 of f.c has no code; the nearest lines with code are 4 and 6"
        );
        assert_eq!(m.addresses_of("h.c", 5), Err(LineError::NoFile { file: "h.c".into() }));
    }
}
