//! Functions, parameters and types read from DWARF with gimli, for a set of function addresses in
//! one pass over the units.
//!
//! The input is untrusted (a traced binary may be anybody's): every reference is followed with a
//! bound (type chains, origin chains, operations per expression, entries per location list), a
//! type that contains itself is marked as such, and malformed parts make a type or a location
//! unknown rather than failing the whole file.

// gimli's DW_* constants keep DWARF's own spelling.
#![allow(non_upper_case_globals)]

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
};

use gimli::{AttributeValue, DebugInfoOffset, EndianSlice, LittleEndian, Operation, UnitOffset, constants::*};

use super::{
    FunctionInfo, Language, Param, Ret, Signature,
    abi::{self, DwarfEntry, Place},
    layout::Reg,
    types::*,
};

pub(crate) type Slice<'a> = EndianSlice<'a, LittleEndian>;
pub(super) type Unit<'a> = gimli::Unit<Slice<'a>>;
pub(super) type Die<'a> = gimli::DebuggingInformationEntry<Slice<'a>>;

/// Typedef, cv-qualifier and member nesting followed at most.
const MAX_TYPE_DEPTH: u32 = 64;
/// `DW_AT_abstract_origin` / `DW_AT_specification` hops followed at most.
const MAX_ORIGIN_HOPS: usize = 8;
const MAX_OPS: usize = 64;
const MAX_LOCATION_ENTRIES: usize = 100_000;
/// Scopes nested deeper than this in one unit are not looked into.
const MAX_SCOPE_DEPTH: usize = 256;

/// A subprogram's frame base, as `DW_OP_fbreg` offsets are taken from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum FrameBase {
    /// `DW_OP_call_frame_cfa` (gcc).
    Cfa,
    /// A register plus an offset (clang's `DW_OP_reg6`, i.e. rbp; `DW_OP_reg7`, rsp).
    Register(u16, i64),
    Unknown,
}

/// The frame base of a subprogram's DIE.
pub(super) fn frame_base(unit: &Unit, die: &Die) -> FrameBase {
    let Some(AttributeValue::Exprloc(expr)) = die.attr_value(DW_AT_frame_base) else {
        return FrameBase::Unknown;
    };
    match operations(expr, unit.encoding()).as_deref() {
        Some([Operation::CallFrameCFA]) => FrameBase::Cfa,
        Some([Operation::Register { register }]) => FrameBase::Register(register.0, 0),
        Some([Operation::RegisterOffset { register, offset, .. }]) => FrameBase::Register(register.0, *offset),
        _ => FrameBase::Unknown,
    }
}

/// The operations of a location expression, at most [`MAX_OPS`]; `None` if it is malformed or
/// longer.
pub(super) fn operations<'a>(
    expr: gimli::Expression<Slice<'a>>,
    encoding: gimli::Encoding,
) -> Option<Vec<Operation<Slice<'a>>>> {
    let mut ops = Vec::new();
    let mut iter = expr.operations(encoding);
    loop {
        match iter.next() {
            Ok(Some(op)) if ops.len() < MAX_OPS => ops.push(op),
            Ok(None) => return Some(ops),
            _ => return None,
        }
    }
}

/// Where a variable or parameter is at one pc, as its `DW_AT_location` says.
pub(super) enum LocationAt<'a> {
    /// This expression; `in_list`: from a location list (registers have their values at the pc).
    Here { expr: gimli::Expression<Slice<'a>>, in_list: bool },
    /// No `DW_AT_location` at all.
    Absent,
    /// A location list with no entry covering the pc.
    NotHere,
    /// A location of a form gimli cannot read as a list.
    UnknownForm,
    /// A malformed location list.
    Malformed,
}

/// Every DIE of a unit in depth-first order, with the value the DIE's parent opened: `visit`
/// returns `Some(value)` to open a scope that its children see as their parent's, `None` to
/// open none (they then see `None`). Scopes are nested at most [`MAX_SCOPE_DEPTH`] deep.
pub(super) fn walk_scopes<'a, T: Copy>(
    unit: &Unit<'a>,
    mut visit: impl FnMut(&Die<'a>, isize, Option<T>) -> Result<Option<T>, gimli::Error>,
) -> Result<(), gimli::Error> {
    let mut open: Vec<(isize, T)> = Vec::new();
    let mut cursor = unit.entries();
    while let Some(entry) = cursor.next_dfs()? {
        let depth = entry.depth();
        while open.last().is_some_and(|(d, _)| *d >= depth) {
            open.pop();
        }
        let parent = open.last().filter(|(d, _)| *d == depth - 1).map(|(_, v)| *v);
        if let Some(value) = visit(entry, depth, parent)?
            && open.len() < MAX_SCOPE_DEPTH
        {
            open.push((depth, value));
        }
    }
    Ok(())
}

/// A function found in the DIE walk, read once the walk of its unit is done.
struct Candidate {
    address: u64,
    die: UnitOffset,
    params: Vec<UnitOffset>,
    variadic: bool,
}

pub(crate) struct Reader<'d, 'a> {
    dwarf: &'d gimli::Dwarf<Slice<'a>>,
    /// Every unit header's offset, sorted: to find the unit a cross-unit reference points into.
    unit_offsets: Vec<usize>,
    units: HashMap<usize, Arc<Unit<'a>>>,
    languages: HashMap<usize, Language>,
    /// Built types by the offset of their DIE in .debug_info.
    types: HashMap<usize, Arc<Type>>,
    in_progress: HashSet<usize>,
}

fn unit_key(unit: &Unit) -> usize {
    unit.header.debug_info_offset().map_or(usize::MAX, |o| o.0)
}

fn language(value: Option<AttributeValue<Slice>>) -> Language {
    match value {
        Some(AttributeValue::Language(l)) => match l {
            DW_LANG_C | DW_LANG_C89 | DW_LANG_C99 | DW_LANG_C11 | DW_LANG_C17 => Language::C,
            DW_LANG_C_plus_plus
            | DW_LANG_C_plus_plus_03
            | DW_LANG_C_plus_plus_11
            | DW_LANG_C_plus_plus_14
            | DW_LANG_C_plus_plus_17
            | DW_LANG_C_plus_plus_20 => Language::Cpp,
            DW_LANG_Rust => Language::Rust,
            other => Language::Other(other.0),
        },
        _ => Language::Other(0),
    }
}

fn is_type_tag(tag: DwTag) -> bool {
    matches!(
        tag,
        DW_TAG_base_type
            | DW_TAG_pointer_type
            | DW_TAG_structure_type
            | DW_TAG_class_type
            | DW_TAG_union_type
            | DW_TAG_enumeration_type
            | DW_TAG_typedef
    )
}

impl<'d, 'a> Reader<'d, 'a> {
    pub(crate) fn new(dwarf: &'d gimli::Dwarf<Slice<'a>>) -> Reader<'d, 'a> {
        Reader {
            dwarf,
            unit_offsets: Vec::new(),
            units: HashMap::new(),
            languages: HashMap::new(),
            types: HashMap::new(),
            in_progress: HashSet::new(),
        }
    }

    /// The functions at these addresses that the DWARF describes (others are left out).
    pub(crate) fn functions(&mut self, wanted: &BTreeSet<u64>) -> Result<BTreeMap<u64, FunctionInfo>, gimli::Error> {
        let mut found = BTreeMap::new();
        for unit in self.all_units()? {
            if found.len() == wanted.len() {
                break;
            }
            if !self.unit_holds_any(&unit, wanted)? {
                continue;
            }
            let (candidates, has_types) = self.walk(&unit, wanted, &found)?;
            for c in candidates {
                let info = self.function(&unit, &c, has_types);
                found.insert(c.address, info);
            }
        }
        Ok(found)
    }

    /// Every unit, in order (and the offsets that cross-unit references are resolved with).
    pub(super) fn all_units(&mut self) -> Result<Vec<Arc<Unit<'a>>>, gimli::Error> {
        let mut headers = Vec::new();
        let mut iter = self.dwarf.units();
        while let Some(header) = iter.next()? {
            if let Some(o) = header.debug_info_offset() {
                self.unit_offsets.push(o.0);
            }
            headers.push(header);
        }
        self.unit_offsets.sort_unstable();
        self.unit_offsets.dedup();
        headers.into_iter().map(|h| self.unit(h)).collect()
    }

    pub(super) fn unit(&mut self, header: gimli::UnitHeader<Slice<'a>>) -> Result<Arc<Unit<'a>>, gimli::Error> {
        let key = header.debug_info_offset().map_or(usize::MAX, |o| o.0);
        if let Some(u) = self.units.get(&key) {
            return Ok(u.clone());
        }
        let unit = Arc::new(self.dwarf.unit(header)?);
        let mut cursor = unit.entries();
        let lang = match cursor.next_dfs()? {
            Some(root) => language(root.attr_value(DW_AT_language)),
            None => Language::Other(0),
        };
        self.languages.insert(key, lang);
        self.units.insert(key, unit.clone());
        Ok(unit)
    }

    fn language(&self, unit: &Unit) -> Language {
        self.languages.get(&unit_key(unit)).copied().unwrap_or(Language::Other(0))
    }

    pub(super) fn unit_holds_any(&self, unit: &Unit<'a>, wanted: &BTreeSet<u64>) -> Result<bool, gimli::Error> {
        let mut ranges = self.dwarf.unit_ranges(unit)?;
        while let Some(r) = ranges.next()? {
            if wanted.range(r.begin..r.end).next().is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// One DFS over a unit: the wanted subprograms with their parameter DIEs, and whether the
    /// unit has any types (line-tables-only debug info has none).
    fn walk(
        &self,
        unit: &Unit<'a>,
        wanted: &BTreeSet<u64>,
        found: &BTreeMap<u64, FunctionInfo>,
    ) -> Result<(Vec<Candidate>, bool), gimli::Error> {
        let mut candidates: Vec<Candidate> = Vec::new();
        let mut has_types = false;
        // A wanted subprogram opens a scope: its index in `candidates`.
        walk_scopes(unit, |entry, _, parent: Option<usize>| {
            match entry.tag() {
                DW_TAG_subprogram => {
                    let Some(address) = self.entry_address(unit, entry)? else { return Ok(None) };
                    if wanted.contains(&address)
                        && !found.contains_key(&address)
                        && !candidates.iter().any(|c| c.address == address)
                    {
                        candidates.push(Candidate {
                            address,
                            die: entry.offset(),
                            params: Vec::new(),
                            variadic: false,
                        });
                        return Ok(Some(candidates.len() - 1));
                    }
                }
                DW_TAG_formal_parameter => {
                    if let Some(i) = parent {
                        candidates[i].params.push(entry.offset());
                    }
                }
                DW_TAG_unspecified_parameters => {
                    if let Some(i) = parent {
                        candidates[i].variadic = true;
                    }
                }
                tag => has_types |= is_type_tag(tag),
            }
            Ok(None)
        })?;
        Ok((candidates, has_types))
    }

    /// Where a subprogram is entered: its low pc, or (split into ranges) the first range start.
    fn entry_address(&self, unit: &Unit<'a>, entry: &Die<'a>) -> Result<Option<u64>, gimli::Error> {
        if let Some(v) = entry.attr_value(DW_AT_low_pc) {
            return self.dwarf.attr_address(unit, v);
        }
        if entry.attr_value(DW_AT_ranges).is_none() {
            return Ok(None);
        }
        let mut ranges = self.dwarf.die_ranges(unit, entry)?;
        Ok(ranges.next()?.map(|r| r.begin))
    }

    fn unit_containing(&mut self, offset: DebugInfoOffset) -> Option<Arc<Unit<'a>>> {
        let i = self.unit_offsets.partition_point(|o| *o <= offset.0).checked_sub(1)?;
        let start = self.unit_offsets[i];
        if let Some(u) = self.units.get(&start) {
            return Some(u.clone());
        }
        let header = self.dwarf.debug_info.header_from_offset(DebugInfoOffset(start)).ok()?;
        self.unit(header).ok()
    }

    /// The DIE a reference attribute points to, in whichever unit it is.
    pub(super) fn resolve(
        &mut self,
        unit: &Arc<Unit<'a>>,
        value: AttributeValue<Slice<'a>>,
    ) -> Option<(Arc<Unit<'a>>, UnitOffset)> {
        match value {
            AttributeValue::UnitRef(o) => Some((unit.clone(), o)),
            AttributeValue::DebugInfoRef(o) => {
                let u = self.unit_containing(o)?;
                let local = o.to_unit_offset(&u.header)?;
                Some((u, local))
            }
            _ => None,
        }
    }

    pub(super) fn string(&self, unit: &Unit<'a>, value: AttributeValue<Slice<'a>>) -> Option<String> {
        self.dwarf.attr_string(unit, value).ok().map(|s| s.to_string_lossy().into_owned())
    }

    pub(super) fn name(&self, unit: &Unit<'a>, entry: &Die<'a>) -> Option<String> {
        self.string(unit, entry.attr_value(DW_AT_name)?)
    }

    /// A DIE and the DIEs it continues (`DW_AT_abstract_origin`, `DW_AT_specification`), nearest
    /// first.
    pub(super) fn origin_chain(&mut self, unit: &Arc<Unit<'a>>, offset: UnitOffset) -> Vec<(Arc<Unit<'a>>, Die<'a>)> {
        let mut chain = Vec::new();
        let mut next = Some((unit.clone(), offset));
        while let Some((u, o)) = next.take() {
            if chain.len() > MAX_ORIGIN_HOPS {
                break;
            }
            let Ok(entry) = u.entry(o) else { break };
            let origin = entry.attr_value(DW_AT_abstract_origin).or_else(|| entry.attr_value(DW_AT_specification));
            next = origin.and_then(|v| self.resolve(&u, v));
            chain.push((u, entry));
        }
        chain
    }

    pub(super) fn file_path(&self, unit: &Unit<'a>, index: u64) -> Option<PathBuf> {
        let program = unit.line_program.as_ref()?;
        let header = program.header();
        let file = header.file(index)?;
        let mut path = PathBuf::new();
        // DWARF 5's directory 0 is the compilation directory itself (perhaps relative).
        let dir_is_comp_dir = header.version() >= 5 && file.directory_index() == 0;
        if let Some(dir) = unit.comp_dir.as_ref().filter(|_| !dir_is_comp_dir) {
            path.push(dir.to_string_lossy().as_ref());
        }
        if let Some(dir) = file.directory(header) {
            path.push(self.string(unit, dir)?);
        }
        path.push(self.string(unit, file.path_name())?);
        Some(path.components().collect())
    }

    fn function(&mut self, unit: &Arc<Unit<'a>>, c: &Candidate, has_types: bool) -> FunctionInfo {
        let chain = self.origin_chain(unit, c.die);
        let find = |name: DwAt| chain.iter().find_map(|(u, e)| e.attr_value(name).map(|v| (u.clone(), v)));
        let fn_name = find(DW_AT_name).and_then(|(u, v)| self.string(&u, v)).unwrap_or_default();
        let (file, line) = chain
            .iter()
            .find(|(_, e)| e.attr_value(DW_AT_decl_line).is_some())
            .map(|(u, e)| {
                let line = e.attr_value(DW_AT_decl_line).and_then(|v| v.udata_value()).map(|l| l as u32);
                let file = match e.attr_value(DW_AT_decl_file) {
                    Some(AttributeValue::FileIndex(i)) => self.file_path(u, i),
                    _ => None,
                };
                (file, line)
            })
            .unwrap_or((None, None));
        let language = self.language(unit);
        let signature = has_types.then(|| self.signature(unit, c, &chain, language));
        FunctionInfo { name: fn_name, file, line, language, signature }
    }

    fn signature(
        &mut self,
        unit: &Arc<Unit<'a>>,
        c: &Candidate,
        chain: &[(Arc<Unit<'a>>, Die<'a>)],
        language: Language,
    ) -> Signature {
        let external =
            chain.iter().any(|(_, e)| matches!(e.attr_value(DW_AT_external), Some(AttributeValue::Flag(true))));
        let ret_ty = chain
            .iter()
            .find_map(|(u, e)| e.attr_value(DW_AT_type).map(|v| (u.clone(), v)))
            .map(|(u, v)| self.type_ref(&u, v));
        let frame_base = chain.first().map_or(FrameBase::Unknown, |(u, e)| frame_base(u, e));
        let mut raw = Vec::with_capacity(c.params.len());
        for &offset in &c.params {
            let pchain = self.origin_chain(unit, offset);
            let find = |name: DwAt| pchain.iter().find_map(|(u, e)| e.attr_value(name).map(|v| (u.clone(), v)));
            let name = find(DW_AT_name).and_then(|(u, v)| self.string(&u, v));
            let artificial = matches!(find(DW_AT_artificial), Some((_, AttributeValue::Flag(true))));
            let ty = self.chain_type(&pchain, "a parameter without a type");
            let dwarf = match pchain.first() {
                Some((u, e)) => self.dwarf_entry(u, e, c.address, frame_base, meaningful_bytes(&ty)),
                None => DwarfEntry::Absent,
            };
            raw.push((name, ty, artificial, dwarf));
        }
        let types: Vec<&Type> = raw.iter().map(|(_, t, _, _)| t.as_ref()).collect();
        let classified = abi::classify(language, &types, ret_ty.as_deref());
        let optimized = raw.iter().any(|(_, _, _, d)| d.shows_optimisation());
        let abi_binding = matches!(language, Language::C | Language::Cpp) && external;
        let params = raw
            .into_iter()
            .zip(classified.params)
            .map(|((name, ty, artificial, dwarf), abi)| {
                let entry = abi::entry_place(optimized, abi_binding, &abi, &dwarf);
                Param { name, ty, artificial, entry, abi, dwarf }
            })
            .collect();
        let ret = ret_ty.zip(classified.ret).map(|(ty, place)| Ret { ty, place });
        Signature { params, variadic: c.variadic, ret, optimized }
    }

    /// What DWARF says of a parameter at the entry pc.
    fn dwarf_entry(
        &self,
        unit: &Unit<'a>,
        param: &Die<'a>,
        entry_pc: u64,
        frame_base: FrameBase,
        needed: u64,
    ) -> DwarfEntry {
        match self.location_at(unit, param, entry_pc) {
            LocationAt::Here { expr, in_list } => evaluate(expr, unit.encoding(), frame_base, in_list, needed),
            LocationAt::Absent => DwarfEntry::Absent,
            LocationAt::NotHere => DwarfEntry::NotAtEntry,
            LocationAt::UnknownForm | LocationAt::Malformed => DwarfEntry::Expression,
        }
    }

    /// Where `die`'s `DW_AT_location` puts it at `pc`: its expression, or the entry of its
    /// location list that covers `pc` (at most [`MAX_LOCATION_ENTRIES`] entries looked at).
    pub(super) fn location_at(&self, unit: &Unit<'a>, die: &Die<'a>, pc: u64) -> LocationAt<'a> {
        let Some(value) = die.attr_value(DW_AT_location) else { return LocationAt::Absent };
        if let AttributeValue::Exprloc(expr) = value {
            return LocationAt::Here { expr, in_list: false };
        }
        let Ok(Some(mut list)) = self.dwarf.attr_locations(unit, value) else { return LocationAt::UnknownForm };
        for _ in 0..MAX_LOCATION_ENTRIES {
            match list.next() {
                Ok(Some(e)) if e.range.begin <= pc && pc < e.range.end => {
                    return LocationAt::Here { expr: e.data, in_list: true };
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => return LocationAt::Malformed,
            }
        }
        LocationAt::NotHere
    }

    /// The type of the first DIE of an origin chain that has one; `missing` says why not.
    pub(super) fn chain_type(&mut self, chain: &[(Arc<Unit<'a>>, Die<'a>)], missing: &str) -> Arc<Type> {
        match chain.iter().find_map(|(u, e)| e.attr_value(DW_AT_type).map(|v| (u.clone(), v))) {
            Some((u, v)) => self.type_ref(&u, v),
            None => Arc::new(Type::unknown("?", 0, missing)),
        }
    }

    /// The address ranges of a DIE (none if it has no code).
    pub(super) fn ranges(&self, unit: &Unit<'a>, offset: UnitOffset) -> Vec<(u64, u64)> {
        let Ok(entry) = unit.entry(offset) else { return Vec::new() };
        let mut out = Vec::new();
        if let Ok(mut ranges) = self.dwarf.die_ranges(unit, &entry) {
            while let Ok(Some(r)) = ranges.next() {
                if r.begin < r.end && out.len() < MAX_LOCATION_ENTRIES {
                    out.push((r.begin, r.end));
                }
            }
        }
        out
    }

    /// The type a `DW_AT_type` attribute refers to.
    pub(super) fn type_ref(&mut self, unit: &Arc<Unit<'a>>, value: AttributeValue<Slice<'a>>) -> Arc<Type> {
        match self.resolve(unit, value) {
            Some((u, o)) => self.type_at(&u, o, 0),
            None => Arc::new(Type::unknown("?", 0, "a type in a type unit (not supported)")),
        }
    }

    fn type_at(&mut self, unit: &Arc<Unit<'a>>, offset: UnitOffset, depth: u32) -> Arc<Type> {
        let key = unit_key(unit).wrapping_add(offset.0);
        if let Some(t) = self.types.get(&key) {
            return t.clone();
        }
        if depth > MAX_TYPE_DEPTH || !self.in_progress.insert(key) {
            return Arc::new(Type::unknown("?", 0, "a type that contains itself or is nested too deep"));
        }
        let ty = Arc::new(
            self.build(unit, offset, depth).unwrap_or_else(|e| Type::unknown("?", 0, format!("malformed DWARF: {e}"))),
        );
        self.in_progress.remove(&key);
        self.types.insert(key, ty.clone());
        ty
    }

    fn target(&mut self, unit: &Arc<Unit<'a>>, entry: &Die<'a>) -> Option<(Arc<Unit<'a>>, UnitOffset)> {
        let v = entry.attr_value(DW_AT_type)?;
        self.resolve(unit, v)
    }

    /// A type's name as the source spells it (C: `struct pair`, `const char *`).
    fn name_at(&mut self, unit: &Arc<Unit<'a>>, offset: UnitOffset, depth: u32) -> String {
        if depth > MAX_TYPE_DEPTH {
            return "…".into();
        }
        let Ok(entry) = unit.entry(offset) else { return "?".into() };
        let own = self.name(unit, &entry);
        let c = self.language(unit) == Language::C;
        let inner = |me: &mut Self| match me.target(unit, &entry) {
            Some((u, o)) => me.name_at(&u, o, depth + 1),
            None => "void".into(),
        };
        let qualified = |me: &mut Self, q: &str| {
            let i = inner(me);
            if i.ends_with('*') || i.ends_with('&') { format!("{i} {q}") } else { format!("{q} {i}") }
        };
        let tagged = |kw: &str| match (&own, c) {
            (Some(n), true) => format!("{kw} {n}"),
            (Some(n), false) => n.clone(),
            (None, _) => format!("{kw} <anonymous>"),
        };
        match entry.tag() {
            DW_TAG_structure_type | DW_TAG_class_type => tagged("struct"),
            DW_TAG_union_type => tagged("union"),
            DW_TAG_enumeration_type => tagged("enum"),
            DW_TAG_const_type => qualified(self, "const"),
            DW_TAG_volatile_type => qualified(self, "volatile"),
            DW_TAG_restrict_type | DW_TAG_atomic_type => inner(self),
            DW_TAG_pointer_type | DW_TAG_reference_type | DW_TAG_rvalue_reference_type if own.is_some() => own.unwrap(),
            DW_TAG_pointer_type | DW_TAG_reference_type | DW_TAG_rvalue_reference_type => {
                let sigil = match entry.tag() {
                    DW_TAG_pointer_type => "*",
                    DW_TAG_reference_type => "&",
                    _ => "&&",
                };
                let i = inner(self);
                if i.ends_with('*') { format!("{i}{sigil}") } else { format!("{i} {sigil}") }
            }
            DW_TAG_array_type => {
                let count = self.array_count(unit, offset);
                format!("{}[{}]", inner(self), count.map_or(String::new(), |n| n.to_string()))
            }
            DW_TAG_subroutine_type => "function".into(),
            _ => own.unwrap_or_else(|| "?".into()),
        }
    }

    /// Whether a pointer to this type is a C string: plain `char`, through typedefs and
    /// qualifiers.
    fn is_plain_char(&mut self, unit: &Arc<Unit<'a>>, offset: UnitOffset) -> bool {
        let (mut unit, mut offset) = (unit.clone(), offset);
        for _ in 0..MAX_TYPE_DEPTH {
            let Ok(entry) = unit.entry(offset) else { return false };
            match entry.tag() {
                DW_TAG_typedef | DW_TAG_const_type | DW_TAG_volatile_type | DW_TAG_restrict_type
                | DW_TAG_atomic_type => {
                    let Some(next) = self.target(&unit, &entry) else { return false };
                    (unit, offset) = next;
                }
                DW_TAG_base_type => {
                    let encoding = entry.attr_value(DW_AT_encoding);
                    let char_encoding =
                        matches!(encoding, Some(AttributeValue::Encoding(DW_ATE_signed_char | DW_ATE_unsigned_char)));
                    return char_encoding && self.name(&unit, &entry).as_deref() == Some("char");
                }
                _ => return false,
            }
        }
        false
    }

    fn array_count(&mut self, unit: &Arc<Unit<'a>>, offset: UnitOffset) -> Option<u64> {
        let mut tree = unit.entries_tree(Some(offset)).ok()?;
        let root = tree.root().ok()?;
        let mut children = root.children();
        let mut total: Option<u64> = None;
        while let Ok(Some(child)) = children.next() {
            let e = child.entry();
            if e.tag() != DW_TAG_subrange_type {
                continue;
            }
            let n = match e.attr_value(DW_AT_count).and_then(|v| v.udata_value()) {
                Some(n) => n,
                None => e.attr_value(DW_AT_upper_bound)?.udata_value()?.checked_add(1)?,
            };
            total = Some(total.unwrap_or(1).checked_mul(n)?);
        }
        total
    }

    fn build(&mut self, unit: &Arc<Unit<'a>>, offset: UnitOffset, depth: u32) -> Result<Type, gimli::Error> {
        let entry = unit.entry(offset)?;
        let name = self.name_at(unit, offset, 0);
        let size = entry.attr_value(DW_AT_byte_size).and_then(|v| v.udata_value());
        Ok(match entry.tag() {
            DW_TAG_base_type => {
                let size = size.unwrap_or(0);
                let own = self.name(unit, &entry).unwrap_or_default();
                let kind = match entry.attr_value(DW_AT_encoding) {
                    Some(AttributeValue::Encoding(e)) => match e {
                        DW_ATE_boolean => Kind::Bool,
                        DW_ATE_signed => Kind::Int { signed: true },
                        DW_ATE_unsigned => Kind::Int { signed: false },
                        // Only plain `char` is a character: `signed char`, `unsigned char` (and so
                        // `uint8_t`) are small integers far more often.
                        DW_ATE_signed_char | DW_ATE_unsigned_char if own == "char" => {
                            Kind::Char { signed: e == DW_ATE_signed_char, unicode: false }
                        }
                        DW_ATE_signed_char => Kind::Int { signed: true },
                        DW_ATE_unsigned_char => Kind::Int { signed: false },
                        DW_ATE_UTF => Kind::Char { signed: false, unicode: true },
                        DW_ATE_float => Kind::Float { x87: size > 8 && own.contains("long double") },
                        other => Kind::Unknown { why: format!("base type encoding {other}") },
                    },
                    _ => Kind::Unknown { why: "a base type without an encoding".into() },
                };
                let width_ok = match kind {
                    Kind::Int { .. } => matches!(size, 1 | 2 | 4 | 8 | 16),
                    Kind::Bool | Kind::Char { .. } => matches!(size, 1 | 2 | 4),
                    Kind::Float { .. } => matches!(size, 4 | 8 | 16),
                    _ => true,
                };
                if width_ok {
                    Type { name, size, kind }
                } else {
                    Type::unknown(name, size, format!("a {size}-byte scalar"))
                }
            }
            DW_TAG_typedef | DW_TAG_const_type | DW_TAG_volatile_type | DW_TAG_restrict_type | DW_TAG_atomic_type => {
                match self.target(unit, &entry) {
                    Some((u, o)) => {
                        let inner = self.type_at(&u, o, depth + 1);
                        Type { name, size: inner.size, kind: inner.kind.clone() }
                    }
                    None => Type::unknown(name, 0, "void"),
                }
            }
            DW_TAG_pointer_type | DW_TAG_reference_type | DW_TAG_rvalue_reference_type => {
                let target = self.target(unit, &entry);
                let cstring =
                    entry.tag() == DW_TAG_pointer_type && target.is_some_and(|(u, o)| self.is_plain_char(&u, o));
                Type { name, size: size.unwrap_or(8), kind: if cstring { Kind::CString } else { Kind::Pointer } }
            }
            DW_TAG_enumeration_type => self.enumeration(unit, offset, &entry, name, size, depth)?,
            DW_TAG_structure_type | DW_TAG_class_type | DW_TAG_union_type => {
                self.aggregate(unit, offset, &entry, name, size, depth)?
            }
            DW_TAG_array_type => {
                let chars = self.target(unit, &entry).is_some_and(|(u, o)| self.is_plain_char(&u, o));
                let elem = match self.target(unit, &entry) {
                    Some((u, o)) => self.type_at(&u, o, depth + 1),
                    None => Arc::new(Type::unknown("?", 0, "an array of nothing")),
                };
                let count = self.array_count(unit, offset);
                let size = size.or_else(|| count?.checked_mul(elem.size));
                let Some(size) = size else { return Ok(Type::unknown(name, 0, "an array of unknown size")) };
                let leaves = match count {
                    _ if size > 16 => None,
                    _ if elem.size == 0 => Some(Vec::new()),
                    Some(n) if n.saturating_mul(elem.size) <= 16 => {
                        let mut all = Some(Vec::new());
                        for i in 0..n {
                            let more = elem.leaves_at(i * elem.size);
                            all = all.zip(more).map(|(mut all, more)| {
                                all.extend(more.into_iter().map(|l| Leaf { class: l.class.in_memory_layout(), ..l }));
                                all
                            });
                        }
                        all
                    }
                    _ => None,
                };
                let what = if chars { AggregateKind::CharArray } else { AggregateKind::Array };
                Type {
                    name,
                    size,
                    kind: Kind::Aggregate(Aggregate { what, leaves, align: elem.align(), nontrivial: false }),
                }
            }
            DW_TAG_unspecified_type if name == "decltype(nullptr)" => Type { name, size: 8, kind: Kind::Pointer },
            tag => Type::unknown(name, size.unwrap_or(0), format!("{tag}")),
        })
    }

    fn enumeration(
        &mut self,
        unit: &Arc<Unit<'a>>,
        offset: UnitOffset,
        entry: &Die<'a>,
        name: String,
        size: Option<u64>,
        depth: u32,
    ) -> Result<Type, gimli::Error> {
        let underlying = self.target(unit, entry).map(|(u, o)| self.type_at(&u, o, depth + 1));
        let declared_sign =
            underlying.as_ref().map(|t| matches!(t.kind, Kind::Int { signed: true } | Kind::Char { signed: true, .. }));
        let size = size.or(underlying.as_ref().map(|t| t.size)).unwrap_or(4);
        let mut raw = Vec::new();
        let mut tree = unit.entries_tree(Some(offset))?;
        let mut children = tree.root()?.children();
        while let Some(child) = children.next()? {
            let e = child.entry();
            if e.tag() != DW_TAG_enumerator {
                continue;
            }
            let Some(n) = self.name(unit, e) else { continue };
            if let Some(v) = e.attr_value(DW_AT_const_value) {
                raw.push((n, v));
            }
        }
        let signed =
            declared_sign.unwrap_or_else(|| raw.iter().any(|(_, v)| matches!(v, AttributeValue::Sdata(s) if *s < 0)));
        let width = (size.clamp(1, 8) * 8) as u32;
        let value = |v: &AttributeValue<Slice>| -> Option<i128> {
            Some(match *v {
                AttributeValue::Sdata(s) => s as i128,
                AttributeValue::Udata(u) => u as i128,
                AttributeValue::Data1(_)
                | AttributeValue::Data2(_)
                | AttributeValue::Data4(_)
                | AttributeValue::Data8(_) => {
                    let u = v.udata_value()?;
                    if signed && width < 64 {
                        let shift = 64 - width;
                        (((u << shift) as i64) >> shift) as i128
                    } else if signed {
                        u as i64 as i128
                    } else {
                        u as i128
                    }
                }
                _ => return None,
            })
        };
        let enumerators: Vec<Enumerator> =
            raw.iter().filter_map(|(n, v)| Some(Enumerator { name: n.clone(), value: value(v)? })).collect();
        if !matches!(size, 1 | 2 | 4 | 8) {
            return Ok(Type::unknown(name, size, format!("a {size}-byte enum")));
        }
        Ok(Type { name, size, kind: Kind::Enum { signed, enumerators: enumerators.into() } })
    }

    fn aggregate(
        &mut self,
        unit: &Arc<Unit<'a>>,
        offset: UnitOffset,
        entry: &Die<'a>,
        name: String,
        size: Option<u64>,
        depth: u32,
    ) -> Result<Type, gimli::Error> {
        if matches!(entry.attr_value(DW_AT_declaration), Some(AttributeValue::Flag(true))) {
            return Ok(Type::unknown(name, 0, "declared, not defined here"));
        }
        let Some(size) = size else { return Ok(Type::unknown(name, 0, "no size")) };
        let language = self.language(unit);
        let own = self.name(unit, entry);
        if language == Language::Rust && matches!(own.as_deref(), Some("&str" | "&mut str")) && size == 16 {
            return Ok(Type { name, size, kind: Kind::RustStr });
        }
        let union = entry.tag() == DW_TAG_union_type;
        let mut what = if union { AggregateKind::Union } else { AggregateKind::Struct };
        let mut leaves = (size <= 16).then(Vec::new);
        let mut align = 1;
        let mut nontrivial = false;
        let mut tree = unit.entries_tree(Some(offset))?;
        let mut children = tree.root()?.children();
        while let Some(child) = children.next()? {
            let e = child.entry();
            let flag = |at| matches!(e.attr_value(at), Some(AttributeValue::Flag(true)));
            match e.tag() {
                DW_TAG_member | DW_TAG_inheritance if !flag(DW_AT_declaration) && !flag(DW_AT_external) => {
                    let member_offset = match e.attr_value(DW_AT_data_member_location) {
                        Some(v) => v.udata_value(),
                        None => match e.attr_value(DW_AT_data_bit_offset).and_then(|v| v.udata_value()) {
                            Some(bits) => Some(bits / 8),
                            None => union.then_some(0),
                        },
                    };
                    let member_ty = match self.target(unit, e) {
                        Some((u, o)) => self.type_at(&u, o, depth + 1),
                        None => Arc::new(Type::unknown("?", 0, "a member without a type")),
                    };
                    align = align.max(member_ty.align());
                    if let Kind::Aggregate(a) = &member_ty.kind {
                        nontrivial |= a.nontrivial;
                    }
                    // gcc's vtable pointer: a class with virtual functions is not trivially copyable.
                    if flag(DW_AT_artificial) && self.name(unit, e).is_some_and(|n| n.starts_with("_vptr")) {
                        nontrivial = true;
                    }
                    let bitfield = e.attr_value(DW_AT_bit_size).is_some();
                    let member_leaves = match (member_offset, bitfield) {
                        (Some(o), true) => Some(vec![Leaf { offset: o, size: 1, class: LeafClass::Integer }]),
                        (Some(o), false) => member_ty.leaves_at(o),
                        (None, _) => None,
                    };
                    leaves = match (leaves, member_leaves) {
                        (Some(mut all), Some(more)) => {
                            all.extend(
                                more.into_iter()
                                    .map(|l| if union { Leaf { class: l.class.in_memory_layout(), ..l } } else { l }),
                            );
                            Some(all)
                        }
                        _ => None,
                    };
                }
                DW_TAG_variant_part => {
                    what = AggregateKind::RustEnum;
                    leaves = None;
                }
                DW_TAG_subprogram if language == Language::Cpp => {
                    nontrivial |= self.makes_nontrivial(unit, e, own.as_deref());
                }
                _ => {}
            }
        }
        match entry.attr_value(DW_AT_calling_convention) {
            Some(AttributeValue::CallingConvention(DW_CC_pass_by_reference)) => nontrivial = true,
            Some(AttributeValue::CallingConvention(DW_CC_pass_by_value)) => nontrivial = false,
            _ => {}
        }
        if let Some(l) = leaves.as_mut() {
            l.sort_by_key(|l| l.offset);
        }
        Ok(Type { name, size, kind: Kind::Aggregate(Aggregate { what, leaves, align, nontrivial }) })
    }

    /// Whether a member function makes its C++ class not trivially copyable: a virtual function,
    /// or a destructor or copy/move constructor declared by the user and not defaulted in the
    /// class.
    fn makes_nontrivial(&mut self, unit: &Arc<Unit<'a>>, member: &Die<'a>, class: Option<&str>) -> bool {
        let flag = |at| matches!(member.attr_value(at), Some(AttributeValue::Flag(true)));
        if matches!(member.attr_value(DW_AT_virtuality), Some(AttributeValue::Virtuality(v)) if v != DW_VIRTUALITY_none)
        {
            return true;
        }
        if flag(DW_AT_artificial)
            || matches!(
                member.attr_value(DW_AT_defaulted),
                Some(AttributeValue::Udata(1)) | Some(AttributeValue::Data1(1))
            )
        {
            return false;
        }
        let Some(name) = self.name(unit, member) else { return false };
        if name.starts_with('~') {
            return true;
        }
        if Some(name.as_str()) != class {
            return false;
        }
        // A constructor: a copy or move one takes one reference besides `this`.
        let Ok(mut tree) = unit.entries_tree(Some(member.offset())) else { return false };
        let Ok(root) = tree.root() else { return false };
        let mut children = root.children();
        let mut refs = Vec::new();
        while let Ok(Some(child)) = children.next() {
            let e = child.entry();
            if e.tag() != DW_TAG_formal_parameter
                || matches!(e.attr_value(DW_AT_artificial), Some(AttributeValue::Flag(true)))
            {
                continue;
            }
            let is_ref = e
                .attr_value(DW_AT_type)
                .and_then(|v| if let AttributeValue::UnitRef(o) = v { unit.entry(o).ok() } else { None })
                .is_some_and(|t| matches!(t.tag(), DW_TAG_reference_type | DW_TAG_rvalue_reference_type));
            refs.push(is_ref);
        }
        refs == [true]
    }
}

/// One piece of a DWARF location at the entry pc.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Part {
    Gpr(Reg),
    Xmm,
    Stack(u64),
    Reference(Reg),
    FrameSlot,
    Missing,
    Other,
}

fn register_part(number: u16) -> Part {
    match Reg::from_dwarf(number) {
        Some(r) => Part::Gpr(r),
        None if (17..=32).contains(&number) => Part::Xmm,
        None => Part::Other,
    }
}

fn part(ops: &[Operation<Slice>], encoding: gimli::Encoding, frame_base: FrameBase, in_list: bool) -> Part {
    let masks_then_value = |rest: &[Operation<Slice>]| {
        let Some((last, masks)) = rest.split_last() else { return false };
        *last == Operation::StackValue
            && masks.chunks(2).all(|c| matches!(c, [Operation::UnsignedConstant { .. }, Operation::And]))
    };
    match ops {
        [] => Part::Missing,
        [Operation::Register { register }] => register_part(register.0),
        // At the entry pc, a parameter's entry value is the register itself.
        [Operation::EntryValue { expression }, Operation::StackValue] => {
            let mut inner = gimli::Expression(*expression).operations(encoding);
            match (inner.next(), inner.next()) {
                (Ok(Some(Operation::Register { register })), Ok(None)) => register_part(register.0),
                (Ok(Some(Operation::RegisterOffset { register, offset: 0, base_type })), Ok(None))
                    if base_type.0 != 0 =>
                {
                    register_part(register.0)
                }
                _ => Part::Other,
            }
        }
        // The register's value, masked to the type's width.
        [Operation::RegisterOffset { register, offset: 0, .. }, rest @ ..] if masks_then_value(rest) => {
            register_part(register.0)
        }
        [Operation::RegisterOffset { register, offset: 0, .. }] if Reg::from_dwarf(register.0).is_some() => {
            Part::Reference(Reg::from_dwarf(register.0).unwrap())
        }
        [Operation::RegisterOffset { register, offset, .. }] if register.0 == 7 && in_list && *offset >= 8 => {
            Part::Stack(*offset as u64 - 8)
        }
        [Operation::RegisterOffset { register, .. }, Operation::Deref { .. }] if matches!(register.0, 6 | 7) => {
            Part::FrameSlot
        }
        [Operation::FrameOffset { offset }] => match frame_base {
            FrameBase::Cfa if *offset >= 0 => Part::Stack(*offset as u64),
            FrameBase::Register(7, 0) if in_list && *offset >= 8 => Part::Stack(*offset as u64 - 8),
            _ => Part::FrameSlot,
        },
        [Operation::FrameOffset { .. }, Operation::Deref { .. }] => Part::FrameSlot,
        [Operation::RegisterOffset { register, .. }] if matches!(register.0, 6 | 7) => Part::FrameSlot,
        _ => Part::Other,
    }
}

/// The bytes of a value that hold data: up to the end of its last leaf (trailing padding is
/// never described by pieces), or all of it.
fn meaningful_bytes(ty: &Type) -> u64 {
    match ty.leaves_at(0) {
        Some(leaves) if !leaves.is_empty() => leaves.iter().map(|l| l.offset + l.size).max().unwrap_or(ty.size),
        _ => ty.size,
    }
}

/// A location expression at the entry pc, as a [`DwarfEntry`]. `in_list`: it is a location-list
/// entry, so registers (rsp among them) have their values at that pc. `needed`: the bytes that
/// pieces must cover for the value to be whole.
fn evaluate(
    expr: gimli::Expression<Slice>,
    encoding: gimli::Encoding,
    frame_base: FrameBase,
    in_list: bool,
    needed: u64,
) -> DwarfEntry {
    let Some(ops) = operations(expr, encoding) else { return DwarfEntry::Expression };
    let mut pieces = Vec::new();
    let mut covered = 0u64;
    let mut start = 0;
    for (i, op) in ops.iter().enumerate() {
        if let Operation::Piece { size_in_bits, bit_offset } = op {
            if bit_offset.is_some() || size_in_bits % 8 != 0 {
                return DwarfEntry::Expression;
            }
            covered = covered.saturating_add(size_in_bits / 8);
            pieces.push(part(&ops[start..i], encoding, frame_base, in_list));
            start = i + 1;
        }
    }
    if pieces.is_empty() {
        return match part(&ops, encoding, frame_base, in_list) {
            Part::Gpr(r) => DwarfEntry::At(Place::Reg(r)),
            Part::Xmm => DwarfEntry::At(Place::Float),
            Part::Stack(offset) => DwarfEntry::At(Place::Stack { offset, spilled: false }),
            Part::Reference(r) => DwarfEntry::At(Place::Reference(r)),
            Part::FrameSlot => DwarfEntry::FrameSlot,
            Part::Missing => DwarfEntry::Absent,
            Part::Other => DwarfEntry::Expression,
        };
    }
    if start != ops.len() {
        return DwarfEntry::Expression;
    }
    if pieces.iter().all(|p| *p == Part::Missing) {
        return DwarfEntry::Absent;
    }
    if pieces.contains(&Part::Missing) || covered < needed {
        return DwarfEntry::PartlyOptimizedOut;
    }
    let gprs: Vec<Reg> = pieces.iter().filter_map(|p| if let Part::Gpr(r) = p { Some(*r) } else { None }).collect();
    let xmms = pieces.iter().filter(|p| **p == Part::Xmm).count();
    match (gprs.as_slice(), xmms) {
        ([r], 0) => DwarfEntry::At(Place::Reg(*r)),
        ([a, b], 0) => DwarfEntry::At(Place::RegPair(*a, *b)),
        ([], n) if n == pieces.len() => DwarfEntry::At(Place::Float),
        (g, n) if !g.is_empty() && g.len() + n == pieces.len() => DwarfEntry::At(Place::PartlyFloat),
        _ => DwarfEntry::Expression,
    }
}
