//! Where a watched variable is in each traced process, and whether this machine has hardware
//! breakpoints at all.
//!
//! A variable's address in a process is its link-time address plus the executable's load bias.
//! For a process already running, the bias is read from `/proc/PID/maps`. A launched command's
//! watchpoints are opened before it execs (so that its first write is seen), when its bias is
//! not known yet: so a position-independent executable is launched with address-space
//! randomization off (`personality(ADDR_NO_RANDOMIZE)`, as gdb does), which loads it at
//! [`PIE_BASE_NO_ASLR`]. The perf events survive the exec and are inherited by every thread and
//! child created after them.

use std::path::Path;

use super::{
    select::{ExeLayout, WatchVariable},
    spec::Access,
};

/// Where x86-64 Linux loads a position-independent executable when randomization is off
/// (`ELF_ET_DYN_BASE`: two thirds of the 47-bit address space, page-aligned).
pub const PIE_BASE_NO_ASLR: u64 = 0x5555_5555_4000;

const PAGE: u64 = 0x1000;

/// The perf event device of hardware breakpoints, if the kernel has one.
const BREAKPOINT_PMU: &str = "/sys/bus/event_source/devices/breakpoint";

/// One watchpoint to open: a thread, and what to watch in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watchpoint {
    pub tid: u32,
    pub address: u64,
    pub len: u8,
    pub access: Access,
}

/// Why this machine cannot watch, if it cannot.
pub fn unavailable() -> Option<String> {
    (!Path::new(BREAKPOINT_PMU).exists())
        .then(|| format!("the kernel has no hardware breakpoints ({BREAKPOINT_PMU} is missing)"))
}

impl ExeLayout {
    /// The load bias of a launched command started with randomization off.
    pub fn bias_without_randomization(&self) -> u64 {
        if self.pie { PIE_BASE_NO_ASLR.wrapping_sub(self.first_vaddr & !(PAGE - 1)) } else { 0 }
    }

    /// The load bias of the executable `exe` in the running process `pid`: where its first
    /// page (file offset 0) is mapped, less that page's link-time address.
    pub fn bias_in(&self, pid: u32, exe: &Path) -> Option<u64> {
        if !self.pie {
            return Some(0);
        }
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        let start = maps.lines().find_map(|line| {
            // start-end perms offset dev inode path
            let mut fields = line.split_whitespace();
            let range = fields.next()?;
            let offset = fields.nth(1)?;
            let path = fields.nth(2)?;
            (u64::from_str_radix(offset, 16).ok()? == 0 && Path::new(path) == exe)
                .then(|| u64::from_str_radix(range.split('-').next()?, 16).ok())
                .flatten()
        })?;
        Some(start.wrapping_sub(self.first_vaddr & !(PAGE - 1)))
    }
}

impl WatchVariable {
    /// Its address in a process whose executable is loaded with `bias`.
    pub fn address_with(&self, bias: u64) -> u64 {
        if self.absolute { self.address } else { self.address.wrapping_add(bias) }
    }
}

/// The threads of a running process.
pub fn threads(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return vec![pid] };
    let mut tids: Vec<u32> = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    tids.sort_unstable();
    tids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn biases() {
        let pie = ExeLayout { pie: true, first_vaddr: 0 };
        assert_eq!(pie.bias_without_randomization(), PIE_BASE_NO_ASLR);
        assert_eq!(ExeLayout { pie: false, first_vaddr: 0x400000 }.bias_without_randomization(), 0);
        // This test's own executable is mapped somewhere: its bias makes a link-time address of
        // its code land in a mapping.
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let bias = pie.bias_in(std::process::id(), &exe).expect("mapped");
        assert_eq!(bias % PAGE, 0);
    }
}
