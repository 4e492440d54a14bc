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

use std::{io, path::Path};

use aya_obj::generated::{HW_BREAKPOINT_W, PERF_FLAG_FD_CLOEXEC, perf_event_attr, perf_type_id::PERF_TYPE_BREAKPOINT};

use super::select::{ExeLayout, WatchVariable};

/// Where x86-64 Linux loads a position-independent executable when randomization is off
/// (`ELF_ET_DYN_BASE`: two thirds of the 47-bit address space, page-aligned).
pub const PIE_BASE_NO_ASLR: u64 = 0x5555_5555_4000;

const PAGE: u64 = 0x1000;

/// Why this machine cannot watch, if it cannot: a hardware breakpoint on a variable of the
/// tracer's own thread (opened disabled, closed at once) is refused with the errno of a kernel or
/// machine without them: no breakpoint PMU (`ENOENT`, `ENODEV`), or none this CPU or hypervisor
/// gives (`EOPNOTSUPP`). The sysfs device alone is not enough: a VM can list it and still give
/// no debug registers. Any other error is left to the real attach, which reports it per process.
pub fn unavailable() -> Option<String> {
    match open_probe_breakpoint() {
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENODEV | libc::EOPNOTSUPP)) => {
            Some(format!("it gives no hardware breakpoints (perf_event_open of one answers: {e})"))
        }
        _ => None,
    }
}

fn open_probe_breakpoint() -> io::Result<()> {
    static WATCHED: u64 = 0;
    // SAFETY: an all-zero `perf_event_attr` is the documented "unset" value of every field.
    let mut attr: perf_event_attr = unsafe { std::mem::zeroed() };
    attr.type_ = PERF_TYPE_BREAKPOINT as u32;
    attr.size = size_of::<perf_event_attr>() as u32;
    attr.set_disabled(1);
    attr.bp_type = HW_BREAKPOINT_W;
    attr.__bindgen_anon_3.bp_addr = &raw const WATCHED as u64;
    attr.__bindgen_anon_4.bp_len = 8;
    attr.__bindgen_anon_1.sample_period = 1;
    // SAFETY: `attr` is initialised; the event is on this thread (pid 0), any CPU.
    let fd = unsafe {
        libc::syscall(libc::SYS_perf_event_open, &attr as *const perf_event_attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC)
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the descriptor just opened, closed once.
    unsafe { libc::close(fd as i32) };
    Ok(())
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
