//! Folded stacks (`.folded`): one `proc;frame;frame value` line per call stack, the value being the
//! stack's self time in nanoseconds. inferno, flamegraph.pl and speedscope read it.

use std::io::{self, Write};

use crate::analysis::flame_stacks::{FlameNode, for_each_folded_line};

/// Writes the stacks under these roots, one line each, as it walks them.
pub fn write(roots: &[FlameNode], out: &mut dyn Write) -> io::Result<()> {
    for_each_folded_line(roots, &mut |line| writeln!(out, "{line}"))
}
