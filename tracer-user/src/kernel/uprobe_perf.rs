//! Function and USDT probes as perf-event uprobes: one perf event per probe site, each with a
//! `BPF_PERF_EVENT` link that carries the site's cookie (Linux 5.15+). The way kernels before
//! uprobe-multi links (6.6) attach; the programs and records are the same, only the cost of
//! attaching and detaching differs (see [`super::features::AttachMechanism`]).
//!
//! The perf event is opened for every process (`pid = -1`, `cpu = 0`, as libbpf and bpftrace do
//! for uprobes: a uprobe fires on whichever CPU the probed code runs), and the programs filter by
//! pid themselves. The link holds the event, so its file descriptor is closed at once and the
//! link's is the only one kept.

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
    sync::OnceLock,
};

use aya_obj::generated::{PERF_FLAG_FD_CLOEXEC, bpf_attach_type::BPF_PERF_EVENT, bpf_attr, bpf_cmd, perf_event_attr};

use super::{
    features::UPROBE_PMU,
    uprobe_multi::{Site, sys_bpf},
};

/// The `uprobe` PMU as sysfs describes it: its type number and where the return-probe flag and
/// the semaphore (reference counter) offset go in `config`.
#[derive(Clone, Copy, Debug)]
struct UprobePmu {
    type_: u32,
    retprobe_bit: u32,
    ref_ctr_shift: u32,
}

fn pmu() -> io::Result<UprobePmu> {
    static PMU: OnceLock<Result<UprobePmu, String>> = OnceLock::new();
    PMU.get_or_init(|| read_pmu().map_err(|e| format!("cannot read {UPROBE_PMU}: {e}")))
        .clone()
        .map_err(io::Error::other)
}

fn read_pmu() -> io::Result<UprobePmu> {
    let read = |name: &str| std::fs::read_to_string(Path::new(UPROBE_PMU).join(name));
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let type_ = read("type")?.trim().parse().map_err(|_| invalid("type is not a number"))?;
    // "config:0" and "config:32-63": the first bit of the field.
    let first_bit = |text: String| -> io::Result<u32> {
        let bits = text.trim().strip_prefix("config:").ok_or_else(|| invalid("a format outside config"))?;
        bits.split('-').next().and_then(|b| b.parse().ok()).ok_or_else(|| invalid("a format without a bit"))
    };
    let retprobe_bit = first_bit(read("format/retprobe")?)?;
    // Kernels before 4.20 have no semaphore support; their USDT probes with semaphores fail.
    let ref_ctr_shift = read("format/ref_ctr_offset").map(first_bit).unwrap_or(Ok(32))?;
    Ok(UprobePmu { type_, retprobe_bit, ref_ctr_shift })
}

/// Attaches `program` at `site` of the file at `path`, as a return probe when `ret`; returns the
/// link (closing it detaches the probe and lowers the site's semaphore).
pub fn attach(program: &OwnedFd, path: &Path, site: &Site, ret: bool) -> io::Result<OwnedFd> {
    let pmu = pmu()?;
    let path = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: an all-zero `perf_event_attr` is the documented "unset" value of every field.
    let mut attr: perf_event_attr = unsafe { std::mem::zeroed() };
    attr.type_ = pmu.type_;
    attr.size = size_of::<perf_event_attr>() as u32;
    attr.config = (site.ref_ctr_offset << pmu.ref_ctr_shift) | if ret { 1 << pmu.retprobe_bit } else { 0 };
    attr.__bindgen_anon_3.uprobe_path = path.as_ptr() as u64;
    attr.__bindgen_anon_4.probe_offset = site.file_offset;
    attr.__bindgen_anon_1.sample_period = 1;
    // SAFETY: `attr` is initialised and `path` outlives the call.
    let fd = unsafe {
        libc::syscall(libc::SYS_perf_event_open, &attr as *const perf_event_attr, -1, 0, -1, PERF_FLAG_FD_CLOEXEC)
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new file descriptor that we now own.
    let event = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: an all-zero `bpf_attr` is the documented "unset" value of every field.
    let mut link: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing plain integers into the BPF_LINK_CREATE member of the union.
    unsafe {
        let l = &mut link.link_create;
        l.__bindgen_anon_1.prog_fd = program.as_raw_fd() as u32;
        l.__bindgen_anon_2.target_fd = event.as_raw_fd() as u32;
        l.attach_type = BPF_PERF_EVENT as u32;
        l.__bindgen_anon_3.perf_event.bpf_cookie = site.cookie;
    }
    sys_bpf(bpf_cmd::BPF_LINK_CREATE, &mut link)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_uprobe_pmu_from_sysfs() {
        let pmu = read_pmu().expect("every kernel with uprobes describes the PMU");
        assert_eq!((pmu.retprobe_bit, pmu.ref_ctr_shift), (0, 32), "{pmu:?}");
        assert!(pmu.type_ > 5, "a dynamic PMU type follows the fixed ones: {pmu:?}");
    }
}
