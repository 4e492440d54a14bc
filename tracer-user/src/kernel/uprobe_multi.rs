//! Function probes as uprobe-multi links (`BPF_TRACE_UPROBE_MULTI`, Linux 6.6+).
//!
//! Why not aya's `UProbe::attach`: that makes one perf event per probe, and closing one waits for
//! an RCU grace period under a global mutex (about 0.1 s here), so detaching 1,000 probes took two
//! minutes. A uprobe-multi link attaches every offset of one file in one call and detaches them
//! all behind a single grace period.
//!
//! aya 0.14 cannot load a program for uprobe-multi (the kernel wants `expected_attach_type` set at
//! load), so the function and USDT programs are loaded here, for either mechanism (kernels
//! without uprobe-multi attach the same programs through [`super::uprobe_perf`]): aya-obj parses and relocates the same
//! object against the maps aya already created, and the `bpf(2)` calls use aya-obj's generated
//! kernel bindings. The object's BTF goes with them (function and line info), as aya would pass
//! it: the kernel needs it for `bpf_loop` callbacks, and verifier logs then name source lines.

use std::{
    collections::HashSet,
    ffi::CString,
    io,
    os::{
        fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
};

use aya::{Ebpf, maps::Map};

use super::features::AttachMechanism;
use aya_obj::{
    ProgramSection,
    btf::BtfFeatures,
    generated::{
        BPF_F_SLEEPABLE, BPF_F_UPROBE_MULTI_RETURN, bpf_attach_type::BPF_TRACE_UPROBE_MULTI, bpf_attr, bpf_cmd,
        bpf_prog_type::BPF_PROG_TYPE_KPROBE,
    },
};

pub(super) fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a fully initialised `bpf_attr` whose pointers outlive the call.
    let ret =
        unsafe { libc::syscall(libc::SYS_bpf, cmd as libc::c_long, attr as *mut bpf_attr, size_of::<bpf_attr>()) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: on success these commands return a new file descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as i32) })
}

/// The file descriptor of one of aya's maps.
fn map_fd(map: &Map) -> Option<i32> {
    let data = match map {
        Map::Array(d) | Map::HashMap(d) | Map::PerCpuArray(d) | Map::RingBuf(d) | Map::LruHashMap(d) => d,
        Map::PerCpuHashMap(d) | Map::Unsupported(d) => d,
        _ => return None,
    };
    Some(data.fd().as_fd().as_raw_fd())
}

/// Loads BTF into the kernel.
fn load_btf(bytes: &[u8]) -> io::Result<OwnedFd> {
    // SAFETY: an all-zero `bpf_attr` is the documented "unset" value of every field.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing plain integers and a pointer (that outlives the call) into BPF_BTF_LOAD.
    unsafe {
        let u = &mut attr.__bindgen_anon_7;
        u.btf = bytes.as_ptr() as u64;
        u.btf_size = bytes.len() as u32;
    }
    sys_bpf(bpf_cmd::BPF_BTF_LOAD, &mut attr)
}

/// The eBPF object parsed once, its BTF loaded and its code relocated against the maps of the
/// `Ebpf` that loaded the same object, from which each program pair is then loaded
/// ([`ProgramObject::load`]): parsing and relocating it again for every pair (the record, the
/// sleepable and the USDT programs) repeated the same work on a 1.5 MB object.
pub struct ProgramObject {
    obj: aya_obj::Object,
    btf: Option<OwnedFd>,
    mechanism: AttachMechanism,
}

/// Why the uprobe programs could not be made ready ([`ProgramObject::prepare`]) or loaded
/// ([`ProgramObject::load`]). An aya error is passed on whole (its own source, the system's answer,
/// follows it); the kernel's refusal says its error with the verifier's log.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error(transparent)]
    Parse(aya_obj::ParseError),
    #[error(transparent)]
    Btf(aya_obj::btf::BtfError),
    #[error("cannot load the programs' BTF")]
    LoadBtf(#[source] io::Error),
    #[error("map {0} was not created")]
    MissingMap(String),
    #[error(transparent)]
    Relocation(aya_obj::relocation::EbpfRelocationError),
    #[error("program {0} is missing")]
    MissingProgram(String),
    #[error("program {0} has no code")]
    NoCode(String),
    /// The kernel refused it: its error and the end of the verifier's log.
    #[error("program {name}: {error}; verifier log (end):\n{log}")]
    Refused { name: String, error: io::Error, log: String },
}

impl ProgramObject {
    /// Parses `object` for attachment by `mechanism`, relocated against the maps of `ebpf`.
    pub fn prepare(ebpf: &Ebpf, object: &[u8], mechanism: AttachMechanism) -> Result<ProgramObject, ObjectError> {
        let mut obj = aya_obj::Object::parse(object).map_err(ObjectError::Parse)?;
        // The BTF features aya found in this kernel, so the object's BTF is sanitized as aya's own
        // loads are.
        let none = BtfFeatures::default();
        let features = aya::features().btf().unwrap_or(&none);
        let btf = match obj.fixup_and_sanitize_btf(features).map_err(ObjectError::Btf)? {
            Some(btf) => Some(load_btf(&btf.to_bytes()).map_err(ObjectError::LoadBtf)?),
            None => None,
        };
        let text_sections: HashSet<usize> = obj.functions.keys().map(|(section, _)| *section).collect();
        let maps = obj.maps.clone();
        let mut relocations = Vec::new();
        for (name, map) in &maps {
            let fd = ebpf.map(name).and_then(map_fd).ok_or_else(|| ObjectError::MissingMap(name.clone()))?;
            relocations.push((name.as_str(), fd, map));
        }
        obj.relocate_maps(relocations.into_iter(), &text_sections).map_err(ObjectError::Relocation)?;
        obj.relocate_calls(&text_sections).map_err(ObjectError::Relocation)?;
        Ok(ProgramObject { obj, btf, mechanism })
    }

    /// Loads the named programs. Returns one file descriptor per name.
    pub fn load(&self, names: &[&str]) -> Result<Vec<OwnedFd>, ObjectError> {
        let (obj, btf, mechanism, license) = (&self.obj, &self.btf, self.mechanism, &self.obj.license);
        names
            .iter()
            .map(|name| {
                let program = obj.programs.get(*name).ok_or_else(|| ObjectError::MissingProgram(name.to_string()))?;
                let function =
                    obj.functions.get(&program.function_key()).ok_or_else(|| ObjectError::NoCode(name.to_string()))?;
                let insns = &function.instructions;
                let func_info = function.func_info.func_info_bytes();
                let line_info = function.line_info.line_info_bytes();
                let load = |log: &mut [u8]| {
                    // SAFETY: an all-zero `bpf_attr` is the documented "unset" value of every field.
                    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
                    // SAFETY: writing plain integers into the BPF_PROG_LOAD member of the union.
                    let u = unsafe { &mut attr.__bindgen_anon_3 };
                    u.prog_type = BPF_PROG_TYPE_KPROBE as u32;
                    // A perf-event uprobe's program has none: the kernel then resolves
                    // `bpf_get_attach_cookie` to the perf link's cookie.
                    if mechanism == AttachMechanism::UprobeMulti {
                        u.expected_attach_type = BPF_TRACE_UPROBE_MULTI as u32;
                    }
                    // `uprobe.s` and `uretprobe.s` sections (`#[uprobe(sleepable)]`).
                    if matches!(
                        program.section,
                        ProgramSection::UProbe { sleepable: true } | ProgramSection::URetProbe { sleepable: true }
                    ) {
                        u.prog_flags = BPF_F_SLEEPABLE;
                    }
                    u.insns = insns.as_ptr() as u64;
                    u.insn_cnt = insns.len() as u32;
                    u.license = license.as_ptr() as u64;
                    for (dst, src) in u.prog_name.iter_mut().zip(name.bytes().take(15)) {
                        *dst = src as libc::c_char;
                    }
                    if let Some(btf) = &btf {
                        u.prog_btf_fd = btf.as_raw_fd() as u32;
                        if function.func_info_rec_size > 0 {
                            u.func_info_rec_size = function.func_info_rec_size as u32;
                            u.func_info = func_info.as_ptr() as u64;
                            u.func_info_cnt = function.func_info.func_info.len() as u32;
                        }
                        if function.line_info_rec_size > 0 {
                            u.line_info_rec_size = function.line_info_rec_size as u32;
                            u.line_info = line_info.as_ptr() as u64;
                            u.line_info_cnt = function.line_info.line_info.len() as u32;
                        }
                    }
                    if !log.is_empty() {
                        u.log_level = 1;
                        u.log_buf = log.as_mut_ptr() as u64;
                        u.log_size = log.len() as u32;
                    }
                    sys_bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr)
                };
                load(&mut []).or_else(|_| {
                    // Load again with the verifier's log, to say why.
                    let mut log = vec![0u8; 1 << 20];
                    load(&mut log).map_err(|error| {
                        let text = String::from_utf8_lossy(tracer_common::decode::c_bytes(&log)).into_owned();
                        let tail: Vec<&str> = text.lines().rev().take(20).collect();
                        let log = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
                        ObjectError::Refused { name: name.to_string(), error, log }
                    })
                })
            })
            .collect()
    }
}

/// One probe site of a uprobe-multi link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Site {
    /// Where the probe is in the file.
    pub file_offset: u64,
    /// Delivered to the program (`bpf_get_attach_cookie`).
    pub cookie: u64,
    /// File offset of a USDT semaphore the kernel raises while the link exists; 0 for none.
    pub ref_ctr_offset: u64,
}

/// Attaches `program` at every site of the file at `path`; as return probes when `ret`. Fires for
/// every process (the programs filter by pid themselves).
pub fn attach(program: &OwnedFd, path: &Path, sites: &[Site], ret: bool) -> io::Result<OwnedFd> {
    let path = CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let offsets: Vec<u64> = sites.iter().map(|s| s.file_offset).collect();
    let cookies: Vec<u64> = sites.iter().map(|s| s.cookie).collect();
    let ref_ctr_offsets: Vec<u64> = sites.iter().map(|s| s.ref_ctr_offset).collect();
    let has_ref_ctrs = ref_ctr_offsets.iter().any(|&o| o != 0);
    // SAFETY: as in `ProgramObject::load`.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing plain integers and pointers (that outlive the call) into BPF_LINK_CREATE.
    unsafe {
        let link = &mut attr.link_create;
        link.__bindgen_anon_1.prog_fd = program.as_raw_fd() as u32;
        link.attach_type = BPF_TRACE_UPROBE_MULTI as u32;
        let multi = &mut link.__bindgen_anon_3.uprobe_multi;
        multi.path = path.as_ptr() as u64;
        multi.offsets = offsets.as_ptr() as u64;
        multi.cookies = cookies.as_ptr() as u64;
        if has_ref_ctrs {
            multi.ref_ctr_offsets = ref_ctr_offsets.as_ptr() as u64;
        }
        multi.cnt = sites.len() as u32;
        multi.flags = if ret { BPF_F_UPROBE_MULTI_RETURN } else { 0 };
    }
    sys_bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr)
}
