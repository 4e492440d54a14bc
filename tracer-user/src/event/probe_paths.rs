//! Which path the kernel takes for each probe of a trace (see `functions::placement`, which
//! decides it): what `trace_start.probe_paths` records, so it lives with the events, below the
//! stage that makes it.

use serde::{Deserialize, Serialize};

use super::json::omit_when_empty;

/// The path a probe's hit takes in the kernel, fastest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbePath {
    /// The instruction becomes a call into the kernel's uprobe trampoline: no trap.
    Optimized,
    /// One trap; the kernel emulates the instruction.
    Emulated,
    /// A trap and a single-step of the instruction out of line.
    Trap,
}

impl ProbePath {
    pub const ALL: [ProbePath; 3] = [ProbePath::Optimized, ProbePath::Emulated, ProbePath::Trap];

    pub fn name(self) -> &'static str {
        match self {
            ProbePath::Optimized => "optimized",
            ProbePath::Emulated => "emulated",
            ProbePath::Trap => "trap",
        }
    }
}

/// The probed functions of a trace by the path their probes take, as `trace_start.probe_paths`
/// records it: names only, so that thousands of functions stay a few lines' worth.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbePaths {
    #[serde(default)]
    pub optimized: Vec<String>,
    #[serde(default)]
    pub emulated: Vec<String>,
    #[serde(default)]
    pub trap: Vec<String>,
    /// Functions whose probes are not at their symbol, and how many bytes after it they are.
    #[serde(default, serialize_with = "omit_when_empty")]
    pub moved: std::collections::BTreeMap<String, u64>,
}

impl ProbePaths {
    pub fn is_empty(&self) -> bool {
        self.optimized.is_empty() && self.emulated.is_empty() && self.trap.is_empty()
    }

    pub fn add(&mut self, name: &str, path: ProbePath) {
        self.list_mut(path).push(name.to_string());
    }

    pub fn list(&self, path: ProbePath) -> &[String] {
        match path {
            ProbePath::Optimized => &self.optimized,
            ProbePath::Emulated => &self.emulated,
            ProbePath::Trap => &self.trap,
        }
    }

    fn list_mut(&mut self, path: ProbePath) -> &mut Vec<String> {
        match path {
            ProbePath::Optimized => &mut self.optimized,
            ProbePath::Emulated => &mut self.emulated,
            ProbePath::Trap => &mut self.trap,
        }
    }
}
