//! The kernel's set of traced processes, held against the processes that still live: `record` and
//! `top` end when none does.

use super::loader::Kernel;
use crate::targets;

/// Whether any traced process still lives; forgets the ones that are gone (a process that exited
/// before it could be traced never produces the exit that would remove it).
pub(crate) fn any_target_alive(kernel: &mut Kernel) -> bool {
    let mut alive = false;
    for pid in kernel.traced_pids() {
        if targets::process_alive(pid) {
            alive = true;
        } else {
            kernel.untrace_pid(pid);
        }
    }
    alive
}
