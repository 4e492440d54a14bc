//! The kernel's break and watch records back into events.

use std::{collections::HashMap, sync::Arc};

use serde_json::Value;
use tracer_common::{UsdtRecord, WatchRecord, watch_flags};

use super::select::{BreakSite, LocalRead};
use crate::{
    debuginfo::{format, layout::parse_strings, source_map::SourceMap, types::Type},
    event::data::{self, Params, SourceValue},
};

/// Breakpoint sites by attach cookie (from `first_cookie` on: they share `USDT_SPECS` with the
/// USDT probes, after them).
#[derive(Debug, Default)]
pub struct BreakTable {
    pub first_cookie: u64,
    pub sites: Vec<BreakSite>,
}

impl BreakTable {
    /// The event of a break record and the strings after it, `None` if its cookie names no site.
    pub fn event(&self, r: &UsdtRecord, tail: &[u8]) -> Option<data::Break> {
        let site = self.sites.get(usize::try_from(r.cookie.checked_sub(self.first_cookie)?).ok()?)?;
        let evaluated = |i: usize| i < r.arg_count as usize && r.failed_args & (1 << i) == 0;
        // Checked whole before any is used: a record whose strings do not parse shows none.
        let strings = parse_strings(site.string_size, site.strings, tail);
        let locals = site
            .locals
            .iter()
            .map(|l| {
                let value = match &l.read {
                    LocalRead::Arg(i) if evaluated(*i) => format::scalar(&l.ty, r.args[*i]),
                    LocalRead::String { arg, index } if evaluated(*arg) => {
                        match strings.as_ref().ok().and_then(|s| s.get(*index)) {
                            Some(s) => format::string(s, r.args[*arg], None),
                            None => format::unreadable("string not captured"),
                        }
                    }
                    LocalRead::Arg(_) | LocalRead::String { .. } => format::unreadable("its memory could not be read"),
                    LocalRead::Bits(bits) => format::scalar(&l.ty, *bits),
                    LocalRead::OptimizedOut => Value::String("optimized_out".to_string()),
                    LocalRead::Unreadable(why) => format::unreadable(why),
                };
                (l.name.clone(), SourceValue(value))
            })
            .collect();
        Some(data::Break {
            function: site.function.clone(),
            file: site.file.clone(),
            line: site.line,
            module: site.module.clone(),
            locals: Params(locals),
        })
    }
}

/// A watchpoint as its records are decoded: its variable, and the load bias of the executable
/// in the processes where it sits at this address.
#[derive(Clone, Debug)]
pub struct WatchEntry {
    pub variable: Arc<str>,
    pub ty: Arc<Type>,
    pub bias: u64,
}

/// Watchpoints by their address in the processes, and the executable's line table.
#[derive(Debug, Default)]
pub struct WatchTable {
    pub by_address: HashMap<u64, WatchEntry>,
    pub source_map: Arc<SourceMap>,
}

impl WatchTable {
    /// The event of a watch record, `None` if its address is not watched.
    pub fn event(&self, r: &WatchRecord) -> Option<data::Watch> {
        let entry = self.by_address.get(&r.address)?;
        let value = if r.flags & watch_flags::READ_FAILED != 0 {
            format::unreadable("the variable could not be read after the access")
        } else {
            format::scalar(&entry.ty, r.value)
        };
        // x86 reports a data breakpoint after the access: `ip` is the next instruction, and the
        // byte before it is the last of the instruction that made the access.
        let pc = r.ip.wrapping_sub(1).wrapping_sub(entry.bias);
        let line = self.source_map.line_at(pc);
        Some(data::Watch {
            variable: entry.variable.clone(),
            address: r.address,
            value: SourceValue(value),
            function: self.source_map.function_at(pc),
            file: line.as_ref().map(|(f, _)| f.clone()),
            line: line.map(|(_, l)| l),
        })
    }
}
