//! What the running kernel offers, probed once at start-up into a [`KernelFeatures`] value that
//! the loader reads: one program variant per mechanism, chosen here, never by version number.
//!
//! Measured on Debian's 6.1 and 6.12 kernels and on 6.18 (`cargo xtask vm`):
//! - uprobe-multi links (`BPF_TRACE_UPROBE_MULTI`) exist from 6.6; before, each probe site is a
//!   perf-event uprobe with a BPF link carrying the cookie (5.15+). Same programs, same records.
//! - `sched_process_exit` gained its `group_dead` argument after 6.12: where the BTF shows one
//!   argument, `sched_exit_1arg` derives it (see `tracer-ebpf/src/sched.rs`).
//! - the optimized path for uprobes on 5-byte nops is 6.18's ([`KernelProbes`]).
//! - sleepable uprobe programs (`BPF_F_SLEEPABLE` on a kprobe-type program, which may call
//!   `bpf_copy_from_user`) exist from 6.0 (Delyan Kratunov's "sleepable uprobes" series, June
//!   2022): 6.1's verifier says "Only fentry/fexit/fmod_ret, lsm, and kprobe/uprobe programs can
//!   be sleepable", and both perf-event uprobes (`bpf_prog_run_array_sleepable` in
//!   `trace_uprobe.c`) and uprobe-multi links (`uprobe_prog_run` in `bpf_trace.c`, 6.6) run them.

use std::{io, os::fd::OwnedFd, path::Path};

use aya_obj::generated::{
    BPF_F_SLEEPABLE, bpf_attach_type::BPF_TRACE_UPROBE_MULTI, bpf_attr, bpf_cmd, bpf_prog_type::BPF_PROG_TYPE_KPROBE,
};
use serde::{Deserialize, Serialize};

use super::btf::KernelFacts;

/// How function and USDT probes are attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum AttachMechanism {
    /// One uprobe-multi link per file and program (Linux 6.6+): attaches and detaches thousands
    /// of probes in one call each.
    UprobeMulti,
    /// One perf-event uprobe and BPF link per probe site, the cookie on the link (Linux 5.15+).
    /// Detaching costs an RCU grace period per probe (about 0.1 s each, in parallel batches).
    PerfEvent,
}

impl AttachMechanism {
    pub fn name(self) -> &'static str {
        match self {
            AttachMechanism::UprobeMulti => "uprobe_multi",
            AttachMechanism::PerfEvent => "perf_event",
        }
    }
}

/// What the running kernel cannot do at all for a recording; each is one sentence.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    #[error(
        "the kernel is locked down in confidentiality mode ({LOCKDOWN}): it refuses BPF programs that read kernel memory, which following processes and IPC needs (bpftrace cannot run there either); boot with lockdown=integrity or none to trace"
    )]
    LockedDown,
    #[error(
        "this kernel has no uprobes ({UPROBE_PMU} is missing: CONFIG_UPROBE_EVENTS is off), so functions and USDT probes cannot be traced; process and IPC events (-e spawn,exit,ipc) still can"
    )]
    NoUprobes,
    #[error(
        "this kernel has no uprobe-multi links (Linux 6.6 and later have them): --attach uprobe_multi cannot work here"
    )]
    NoUprobeMulti,
}

const LOCKDOWN: &str = "/sys/kernel/security/lockdown";
pub(super) const UPROBE_PMU: &str = "/sys/bus/event_source/devices/uprobe";

/// The running kernel's abilities that change which programs are loaded and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelFeatures {
    /// `uname -r`.
    pub release: String,
    pub attach: AttachMechanism,
    /// `sched_process_exit` passes `group_dead` (its BTF has the argument).
    pub exit_has_group_dead: bool,
    pub probes: KernelProbes,
    /// The kernel has uprobes (the `uprobe` PMU).
    pub uprobes: bool,
    /// `/sys/kernel/security/lockdown` says `[confidentiality]`.
    pub confidentiality_lockdown: bool,
    /// Uprobe programs can be sleepable (Linux 6.0+): string reads can fault pages in.
    pub sleepable_uprobes: bool,
}

impl KernelFeatures {
    /// Probes the running kernel (a few `bpf(2)` calls and a BTF look-up; no version numbers).
    pub fn probe(btf: &KernelFacts) -> KernelFeatures {
        let release = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_else(|_| "unknown".into());
        let attach = if has_uprobe_multi() { AttachMechanism::UprobeMulti } else { AttachMechanism::PerfEvent };
        KernelFeatures {
            release,
            attach,
            exit_has_group_dead: btf.sched_exit_args().is_some_and(|n| n >= 2),
            probes: KernelProbes::current(),
            uprobes: std::path::Path::new(UPROBE_PMU).exists(),
            confidentiality_lockdown: std::fs::read_to_string(LOCKDOWN)
                .is_ok_and(|mode| lockdown_is_confidentiality(&mode)),
            sleepable_uprobes: has_sleepable_uprobes(),
        }
    }

    /// These features with probes attached by `mechanism` (`--attach`, for tests and benches that
    /// compare the two on one kernel), if the kernel has it.
    pub fn with_attach(self, mechanism: AttachMechanism) -> Result<KernelFeatures, KernelError> {
        if mechanism == AttachMechanism::UprobeMulti && self.attach != AttachMechanism::UprobeMulti {
            return Err(KernelError::NoUprobeMulti);
        }
        Ok(KernelFeatures { attach: mechanism, ..self })
    }

    /// Whether a recording that needs uprobes (`wants_uprobes`) or not can run on this kernel.
    pub fn check(&self, wants_uprobes: bool) -> Result<(), KernelError> {
        if self.confidentiality_lockdown {
            return Err(KernelError::LockedDown);
        }
        if wants_uprobes && !self.uprobes {
            return Err(KernelError::NoUprobes);
        }
        Ok(())
    }

    /// What a trace says of this kernel (`trace_start.kernel`).
    /// What the trace records of the kernel and of how it was used (a ring of `ring_bytes`).
    pub fn info(&self, ring_bytes: u32) -> crate::event::KernelInfo {
        crate::event::KernelInfo {
            ring_bytes,
            release: self.release.clone(),
            attach: self.attach.name().to_string(),
            process_exit: if self.exit_has_group_dead { "group_dead" } else { "live_threads" }.to_string(),
            optimized_probes: self.probes.optimizes_nop5,
        }
    }

    /// The program to attach to `sched_process_exit`.
    pub fn sched_exit_program(&self) -> &'static str {
        if self.exit_has_group_dead {
            tracer_common::programs::SCHED_EXIT
        } else {
            tracer_common::programs::SCHED_EXIT_1ARG
        }
    }
}

/// Whether the kernel loads a sleepable kprobe-type program (the type of uprobe programs): 6.0
/// and later do; before, the verifier allowed only fentry/fexit/fmod_ret and LSM programs to sleep.
fn has_sleepable_uprobes() -> bool {
    load_probe_program(0, BPF_F_SLEEPABLE).is_ok()
}

/// Loads `r0 = 0; exit` as a kprobe-type program with `expected_attach_type` and `prog_flags`:
/// whether the kernel takes it says whether it has what they ask for.
fn load_probe_program(expected_attach_type: u32, prog_flags: u32) -> io::Result<OwnedFd> {
    let insns: [u64; 2] = [0x0000_0000_0000_00b7, 0x0000_0000_0000_0095];
    let license = c"GPL";
    // SAFETY: an all-zero `bpf_attr` is the documented "unset" value of every field.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing plain integers and pointers (that outlive the call) into BPF_PROG_LOAD.
    unsafe {
        let u = &mut attr.__bindgen_anon_3;
        u.prog_type = BPF_PROG_TYPE_KPROBE as u32;
        u.expected_attach_type = expected_attach_type;
        u.prog_flags = prog_flags;
        u.insns = insns.as_ptr() as u64;
        u.insn_cnt = insns.len() as u32;
        u.license = license.as_ptr() as u64;
    }
    super::uprobe_multi::sys_bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr)
}

/// The selected mode of `/sys/kernel/security/lockdown` is in brackets: `none [integrity]
/// confidentiality`.
fn lockdown_is_confidentiality(modes: &str) -> bool {
    modes.contains("[confidentiality]")
}

/// Whether the kernel has uprobe-multi links, as libbpf probes it: a program loaded for them,
/// linked to an offset of `/` (a directory), fails with EBADF where the link type exists and
/// with EINVAL (or the load itself fails) where it does not.
fn has_uprobe_multi() -> bool {
    let Ok(prog) = load_probe_program(BPF_TRACE_UPROBE_MULTI as u32, 0) else { return false };
    let site = super::uprobe_multi::Site { file_offset: 0, cookie: 0, ref_ctr_offset: 0 };
    let link = super::uprobe_multi::attach(&prog, Path::new("/"), &[site], false);
    matches!(link, Err(e) if e.raw_os_error() == Some(libc::EBADF))
}

/// What the running kernel can do with a probe (read once at start-up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelProbes {
    /// The kernel turns uprobes on 5-byte nops into calls (the `uprobe` syscall, Linux 6.18+).
    pub optimizes_nop5: bool,
}

impl KernelProbes {
    /// This kernel's abilities, [`KernelProbes::detect`]ed once per process.
    pub fn current() -> KernelProbes {
        static CURRENT: std::sync::OnceLock<KernelProbes> = std::sync::OnceLock::new();
        *CURRENT.get_or_init(KernelProbes::detect)
    }

    /// The `uprobe` system call is in the kernel's BTF (read once for everything a trace needs;
    /// reading `/proc/kallsyms` for it took tens of milliseconds, and a second with many BPF
    /// programs loaded), or, without BTF, the release is 6.18 or later.
    pub fn detect() -> KernelProbes {
        let optimizes_nop5 = match KernelFacts::running() {
            Ok(facts) => facts.uprobe_syscall(),
            Err(_) => {
                let release = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned());
                release.is_ok_and(|r| release_at_least(&r, 6, 18))
            }
        };
        KernelProbes { optimizes_nop5 }
    }
}

fn release_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse::<u32>().ok());
    let (Some(a), Some(b)) = (parts.next(), parts.next()) else { return false };
    (a, b) >= (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases() {
        assert!(release_at_least("6.18.44-fc-v1045", 6, 18));
        assert!(release_at_least("7.0.1", 6, 18));
        assert!(!release_at_least("6.12.9", 6, 18));
        assert!(!release_at_least("junk", 6, 18));
    }
    use crate::kernel::btf::KernelBtf;

    /// The running kernel's answer must agree with what its BTF says the attach type is: the
    /// probe cannot be asked to fail here, so it is checked against an independent source.
    #[test]
    fn uprobe_multi_probe_agrees_with_the_kernels_btf() {
        let _alone = KernelBtf::parsing_alone();
        let btf = KernelBtf::load().expect("kernel BTF");
        let in_btf = btf.enum_has_value("bpf_attach_type", "BPF_TRACE_UPROBE_MULTI");
        assert_eq!(has_uprobe_multi(), in_btf);
    }

    #[test]
    fn what_the_kernel_cannot_do_is_one_sentence_each() {
        assert!(lockdown_is_confidentiality("none integrity [confidentiality]\n"));
        assert!(!lockdown_is_confidentiality("none [integrity] confidentiality\n"));
        let here = KernelFeatures::probe(KernelFacts::running().expect("kernel BTF"));
        // This machine: uprobes, and lockdown at most integrity.
        assert_eq!(here.check(true), Ok(()));
        let locked = KernelFeatures { confidentiality_lockdown: true, ..here.clone() };
        assert_eq!(locked.check(false), Err(KernelError::LockedDown));
        let without = KernelFeatures { uprobes: false, ..here };
        assert_eq!(without.check(false), Ok(()));
        assert_eq!(
            without.check(true).unwrap_err().to_string(),
            "this kernel has no uprobes (/sys/bus/event_source/devices/uprobe is missing: CONFIG_UPROBE_EVENTS is off), so functions and USDT probes cannot be traced; process and IPC events (-e spawn,exit,ipc) still can"
        );
    }

    #[test]
    fn sched_process_exit_arguments_are_read_from_btf() {
        let _alone = KernelBtf::parsing_alone();
        let btf = KernelBtf::load().expect("kernel BTF");
        let n = btf.tracepoint_args("sched_process_exit").expect("sched_process_exit is in every kernel's BTF");
        assert!(n == 1 || n == 2, "{n}");
        assert_eq!(btf.tracepoint_args("sched_process_fork"), Some(2));
        assert_eq!(btf.tracepoint_args("no_such_tracepoint_xyz"), None);
    }

    /// Every kernel these tests run on (6.1, 6.12, 6.18) has sleepable uprobes (6.0+).
    #[test]
    fn this_kernel_has_sleepable_uprobes() {
        assert!(has_sleepable_uprobes());
    }
}
