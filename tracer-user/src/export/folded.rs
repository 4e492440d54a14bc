//! Folded stacks (`.folded`): one `proc;frame;frame value` line per call stack, the value being the
//! stack's self time in nanoseconds. inferno, flamegraph.pl and speedscope read it.

use std::io::{self, Write};

use crate::analysis::stacks::{FlameNode, folded_lines};

/// Writes the stacks under these roots, one line each.
pub fn write(roots: &[FlameNode], out: &mut dyn Write) -> io::Result<()> {
    for line in folded_lines(roots) {
        writeln!(out, "{line}")?;
    }
    Ok(())
}
