//! Field offsets of kernel structures, read from the running kernel's BTF.
//!
//! The eBPF programs read a few fields of `task_struct`, `linux_binprm` and friends with
//! `bpf_probe_read_kernel`. Rust eBPF has no CO-RE relocations, so instead of hard-coding offsets
//! for one kernel build, user space looks them up in `/sys/kernel/btf/vmlinux` at start-up and
//! hands them to the programs in their read-only configuration.
//!
//! A trace needs a few dozen numbers from some 150,000 types: [`KernelFacts::running`] reads them
//! all, the first time they are asked for, and keeps only them. The BTF is mapped, not parsed
//! (`btf-rs`'s mmap backend: one pass that records where each type starts), and the names asked
//! for ([`FACT_NAMES`]) are found in one more pass over the type names; nothing else is decoded.
//! Decoding and indexing every type and string instead (`btf-rs` 1.1, and its cache backend
//! still) took 0.17-0.22 s for 6.18's 5.5 MB on this machine; this takes some 6 ms (see the
//! start-up section of docs/performance.md).

use std::{cell::Cell, collections::HashMap, io::Write as _, os::fd::AsRawFd as _};

use btf_rs::{Backend, Btf, Type};
use tracer_common::KernelOffsets;

pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

#[derive(Clone, Debug, thiserror::Error)]
pub enum KernelBtfError {
    #[error(
        "cannot read the kernel's BTF at {VMLINUX_BTF} (a kernel built with CONFIG_DEBUG_INFO_BTF is required): {0}"
    )]
    Unavailable(String),
    #[error("the kernel's BTF has no struct {0}")]
    NoStruct(String),
    #[error("the kernel's struct {strukt} has no field {field}")]
    NoField { strukt: String, field: String },
}

pub struct KernelBtf {
    btf: Btf,
    /// The ids of the types named by the names given at load, found in one pass.
    named: HashMap<String, Vec<u32>>,
    /// Passes over every type's name for a name not given at load (each some milliseconds).
    scans: Cell<usize>,
}

/// The `struct pt_regs` fields USDT arguments are read from (every general register and `ip`).
pub const PT_REGS_FIELDS: [&str; 17] =
    ["ax", "bx", "cx", "dx", "si", "di", "bp", "sp", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "ip"];

/// The `uprobe` system call's functions, as the kernel's BTF names them (the first on x86-64).
const UPROBE_SYSCALL: [&str; 2] = ["__x64_sys_uprobe", "__do_sys_uprobe"];

/// Every type name [`KernelFacts::read`] looks up: the structs of [`KernelBtf::offsets`], the
/// tracepoint's typedef, the `uprobe` system call's functions. A test checks that reading the
/// facts looks up no other.
const FACT_NAMES: [&str; 24] = [
    "task_struct",
    "signal_struct",
    "linux_binprm",
    "file",
    "inode",
    "super_block",
    "files_struct",
    "fdtable",
    "socket",
    "socket_alloc",
    "sock",
    "tcp_sock",
    "unix_sock",
    "unix_address",
    "sk_buff",
    "unix_skb_parms",
    "pipe_inode_info",
    "pipe_buffer",
    "kernel_siginfo",
    "pt_regs",
    "mm_struct",
    "btf_trace_sched_process_exit",
    UPROBE_SYSCALL[0],
    UPROBE_SYSCALL[1],
];

/// What a trace needs from the running kernel's BTF, read once per process.
#[derive(Clone, Debug)]
pub struct KernelFacts {
    offsets: Result<KernelOffsets, KernelBtfError>,
    pt_regs: Result<Vec<(&'static str, u32)>, KernelBtfError>,
    sched_exit_args: Option<usize>,
    uprobe_syscall: bool,
}

impl KernelFacts {
    /// The running kernel's facts: its BTF parsed on first use, read, and dropped.
    pub fn running() -> Result<&'static KernelFacts, KernelBtfError> {
        static RUNNING: std::sync::OnceLock<Result<KernelFacts, KernelBtfError>> = std::sync::OnceLock::new();
        RUNNING
            .get_or_init(|| KernelBtf::load_indexing(&FACT_NAMES).map(|btf| KernelFacts::read(&btf)))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Everything the tracer reads of `btf`.
    pub fn read(btf: &KernelBtf) -> KernelFacts {
        KernelFacts {
            offsets: btf.offsets(),
            pt_regs: PT_REGS_FIELDS.into_iter().map(|f| Ok((f, btf.offset("pt_regs", f)?))).collect(),
            sched_exit_args: btf.tracepoint_args("sched_process_exit"),
            uprobe_syscall: UPROBE_SYSCALL.iter().any(|f| btf.has_function(f)),
        }
    }

    /// Every offset the eBPF programs read with.
    pub fn offsets(&self) -> Result<KernelOffsets, KernelBtfError> {
        self.offsets.clone()
    }

    /// The offsets of [`PT_REGS_FIELDS`] in `struct pt_regs`.
    pub fn pt_regs(&self) -> Result<&[(&'static str, u32)], KernelBtfError> {
        self.pt_regs.as_deref().map_err(Clone::clone)
    }

    /// How many arguments `sched_process_exit` passes (see [`KernelBtf::tracepoint_args`]).
    pub fn sched_exit_args(&self) -> Option<usize> {
        self.sched_exit_args
    }

    /// Whether the kernel has the `uprobe` system call (Linux 6.18+), through which a uprobe on
    /// a 5-byte nop, rewritten into a call, enters the kernel without a trap.
    pub fn uprobe_syscall(&self) -> bool {
        self.uprobe_syscall
    }
}

/// How many times this process parsed the kernel's BTF (it is several megabytes: once is enough).
static PARSED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl KernelBtf {
    /// Opens the running kernel's BTF. Use [`KernelFacts::running`], which does it once.
    pub fn load() -> Result<KernelBtf, KernelBtfError> {
        Self::load_indexing(&[])
    }

    /// Opens the running kernel's BTF and finds the types named `names` in one pass over the
    /// type names (other names cost a pass each).
    fn load_indexing(names: &[&str]) -> Result<KernelBtf, KernelBtfError> {
        PARSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let btf = match Btf::from_file_with_backend(VMLINUX_BTF, Backend::Mmap) {
            Ok(btf) => btf,
            Err(_) => map_copy(VMLINUX_BTF)?,
        };
        KernelBtf::indexing(btf, names)
    }

    fn indexing(btf: Btf, names: &[&str]) -> Result<KernelBtf, KernelBtfError> {
        let mut named: HashMap<String, Vec<u32>> = names.iter().map(|n| (n.to_string(), Vec::new())).collect();
        if !names.is_empty() {
            let alternatives: Vec<String> = names.iter().map(|n| regex::escape(n)).collect();
            let pattern = regex::Regex::new(&format!("^(?:{})$", alternatives.join("|")))
                .expect("escaped names make a valid pattern");
            for id in btf.resolve_ids_by_regex(&pattern).map_err(unavailable)? {
                let ty = btf.resolve_type_by_id(id).map_err(unavailable)?;
                if let Some(name) = ty.as_btf_type().and_then(|t| btf.resolve_name(t).ok())
                    && let Some(ids) = named.get_mut(&name)
                {
                    ids.push(id);
                }
            }
        }
        Ok(KernelBtf { btf, named, scans: Cell::new(0) })
    }

    /// How many times this process has parsed the kernel's BTF.
    pub fn times_parsed() -> usize {
        PARSED.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Held by every test that parses the BTF, so that `the_running_kernels_btf_is_parsed_once`
    /// counts its own parses only (a test binary runs its tests on several threads at once).
    #[cfg(test)]
    pub(crate) fn parsing_alone() -> std::sync::MutexGuard<'static, ()> {
        static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        ALONE.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The types named `name`: those found at load, or found now in a pass of their own.
    fn types_named(&self, name: &str) -> impl Iterator<Item = Type> + '_ {
        let ids = match self.named.get(name) {
            Some(ids) => ids.clone(),
            None => {
                self.scans.set(self.scans.get() + 1);
                self.btf.resolve_ids_by_name(name).unwrap_or_default()
            }
        };
        ids.into_iter().filter_map(|id| self.btf.resolve_type_by_id(id).ok())
    }

    fn find_struct(&self, name: &str) -> Result<btf_rs::Struct, KernelBtfError> {
        self.types_named(name)
            .find_map(|t| match t {
                Type::Struct(s) | Type::Union(s) if !s.members.is_empty() => Some(s),
                _ => None,
            })
            .ok_or_else(|| KernelBtfError::NoStruct(name.to_string()))
    }

    /// Strips typedefs and qualifiers.
    fn resolve(&self, mut ty: Type) -> Type {
        for _ in 0..16 {
            let next = match &ty {
                Type::Typedef(t) => self.btf.resolve_chained_type(t),
                Type::Const(t) => self.btf.resolve_chained_type(t),
                Type::Volatile(t) => self.btf.resolve_chained_type(t),
                Type::Restrict(t) => self.btf.resolve_chained_type(t),
                Type::TypeTag(t) => self.btf.resolve_chained_type(t),
                _ => return ty,
            };
            match next {
                Ok(n) => ty = n,
                Err(_) => return ty,
            }
        }
        ty
    }

    /// Byte offset of `field` in `s`, looking through anonymous struct and union members (the kernel
    /// wraps fields in them, e.g. `mm_struct`'s randomized-layout block).
    fn find_member(&self, s: &btf_rs::Struct, field: &str) -> Option<u32> {
        for m in &s.members {
            let name = self.btf.resolve_name(m).unwrap_or_default();
            if name == field {
                return Some(m.bit_offset() / 8);
            }
            if name.is_empty()
                && let Ok(ty) = self.btf.resolve_chained_type(m)
                && let Type::Struct(inner) | Type::Union(inner) = self.resolve(ty)
                && let Some(off) = self.find_member(&inner, field)
            {
                return Some(m.bit_offset() / 8 + off);
            }
        }
        None
    }

    /// Byte offset of `path` (`field` or `field.subfield` through named nested structs) in `strukt`.
    pub fn offset(&self, strukt: &str, path: &str) -> Result<u32, KernelBtfError> {
        let no_field = || KernelBtfError::NoField { strukt: strukt.to_string(), field: path.to_string() };
        let mut current = self.find_struct(strukt)?;
        let mut total = 0;
        let mut parts = path.split('.').peekable();
        while let Some(part) = parts.next() {
            total += self.find_member(&current, part).ok_or_else(no_field)?;
            if parts.peek().is_some() {
                current = self.member_struct(&current, part).ok_or_else(no_field)?;
            }
        }
        Ok(total)
    }

    /// The struct type of member `field` of `s` (through anonymous members).
    fn member_struct(&self, s: &btf_rs::Struct, field: &str) -> Option<btf_rs::Struct> {
        for m in &s.members {
            let name = self.btf.resolve_name(m).unwrap_or_default();
            let ty = self.resolve(self.btf.resolve_chained_type(m).ok()?);
            if name == field {
                return match ty {
                    Type::Struct(inner) | Type::Union(inner) => Some(inner),
                    _ => None,
                };
            }
            if name.is_empty()
                && let Type::Struct(inner) | Type::Union(inner) = ty
                && let Some(found) = self.member_struct(&inner, field)
            {
                return Some(found);
            }
        }
        None
    }

    /// How many `TP_PROTO` arguments the tracepoint `name` passes a raw tracepoint program (its
    /// `btf_trace_<name>` typedef, a pointer to a prototype whose first parameter is the
    /// context); `None` when the kernel has no such tracepoint.
    pub fn tracepoint_args(&self, name: &str) -> Option<usize> {
        self.types_named(&format!("btf_trace_{name}")).find_map(|t| {
            let Type::Typedef(t) = t else { return None };
            let Type::Ptr(p) = self.btf.resolve_chained_type(&t).ok()? else { return None };
            match self.btf.resolve_chained_type(&p).ok()? {
                Type::FuncProto(proto) => Some(proto.parameters.len().saturating_sub(1)),
                _ => None,
            }
        })
    }

    /// Whether the kernel has a function named `name` (a `FUNC` in its BTF).
    pub fn has_function(&self, name: &str) -> bool {
        self.types_named(name).any(|t| matches!(t, Type::Func(_)))
    }

    /// Whether the enum `name` has a value named `value` (a kernel ABI constant's existence).
    pub fn enum_has_value(&self, name: &str, value: &str) -> bool {
        self.types_named(name).any(|t| match t {
            Type::Enum(e) => e.members.iter().any(|m| self.btf.resolve_name(m).is_ok_and(|n| n == value)),
            _ => false,
        })
    }

    /// Size in bytes of `strukt`.
    pub fn size_of(&self, strukt: &str) -> Result<u32, KernelBtfError> {
        Ok(self.find_struct(strukt)?.size() as u32)
    }

    /// Every offset the eBPF programs read with.
    pub fn offsets(&self) -> Result<KernelOffsets, KernelBtfError> {
        let sock = |field: &str| self.offset("sock", field);
        Ok(KernelOffsets {
            task_pid: self.offset("task_struct", "pid")?,
            task_tgid: self.offset("task_struct", "tgid")?,
            task_exit_code: self.offset("task_struct", "exit_code")?,
            task_signal: self.offset("task_struct", "signal")?,
            signal_flags: self.offset("signal_struct", "flags")?,
            signal_group_exit_code: self.offset("signal_struct", "group_exit_code")?,
            bprm_file: self.offset("linux_binprm", "file")?,
            bprm_filename: self.offset("linux_binprm", "filename")?,
            file_inode: self.offset("file", "f_inode")?,
            inode_ino: self.offset("inode", "i_ino")?,
            inode_sb: self.offset("inode", "i_sb")?,
            sb_dev: self.offset("super_block", "s_dev")?,
            task_files: self.offset("task_struct", "files")?,
            files_fdt: self.offset("files_struct", "fdt")?,
            fdtable_fd: self.offset("fdtable", "fd")?,
            fdtable_max_fds: self.offset("fdtable", "max_fds")?,
            file_private_data: self.offset("file", "private_data")?,
            inode_mode: self.offset("inode", "i_mode")?,
            sb_magic: self.offset("super_block", "s_magic")?,
            socket_sk: self.offset("socket", "sk")?,
            // A socket's inode lives next to it: `struct socket_alloc { socket; vfs_inode }`.
            socket_inode: self.offset("socket_alloc", "vfs_inode")? - self.offset("socket_alloc", "socket")?,
            sock_family: sock("__sk_common.skc_family")?,
            sock_num: sock("__sk_common.skc_num")?,
            sock_dport: sock("__sk_common.skc_dport")?,
            sock_rcv_saddr: sock("__sk_common.skc_rcv_saddr")?,
            sock_daddr: sock("__sk_common.skc_daddr")?,
            sock_v6_rcv_saddr: sock("__sk_common.skc_v6_rcv_saddr")?,
            sock_v6_daddr: sock("__sk_common.skc_v6_daddr")?,
            sock_type: sock("sk_type")?,
            sock_protocol: sock("sk_protocol")?,
            sock_socket: sock("sk_socket")?,
            sock_receive_queue: sock("sk_receive_queue")?,
            tcp_write_seq: self.offset("tcp_sock", "write_seq")?,
            tcp_copied_seq: self.offset("tcp_sock", "copied_seq")?,
            unix_peer: self.offset("unix_sock", "peer")?,
            unix_addr: self.offset("unix_sock", "addr")?,
            unix_address_len: self.offset("unix_address", "len")?,
            unix_address_name: self.offset("unix_address", "name")?,
            skb_next: self.offset("sk_buff", "next")?,
            skb_len: self.offset("sk_buff", "len")?,
            skb_cb: self.offset("sk_buff", "cb")?,
            unix_skb_consumed: self.offset("unix_skb_parms", "consumed")?,
            pipe_head: self.offset("pipe_inode_info", "head")?,
            pipe_tail: self.offset("pipe_inode_info", "tail")?,
            pipe_ring_size: self.offset("pipe_inode_info", "ring_size")?,
            pipe_bufs: self.offset("pipe_inode_info", "bufs")?,
            pipe_buffer_len: self.offset("pipe_buffer", "len")?,
            pipe_buffer_size: self.size_of("pipe_buffer")?,
            siginfo_code: self.offset("kernel_siginfo", "si_code")?,
            siginfo_pid: self.offset("kernel_siginfo", "_sifields._kill._pid")?,
            regs_di: self.offset("pt_regs", "di")?,
            regs_si: self.offset("pt_regs", "si")?,
            regs_dx: self.offset("pt_regs", "dx")?,
            regs_r10: self.offset("pt_regs", "r10")?,
            regs_r8: self.offset("pt_regs", "r8")?,
            task_mm: self.offset("task_struct", "mm")?,
            mm_exe_file: self.offset("mm_struct", "exe_file")?,
            task_ptrace: self.offset("task_struct", "ptrace")?,
        })
    }
}

fn unavailable(e: impl std::fmt::Display) -> KernelBtfError {
    KernelBtfError::Unavailable(e.to_string())
}

/// The BTF at `path` read once into a memory file, and that mapped. The kernel's own file is
/// mapped where the kernel lets it be (6.18 does); 6.1 and 6.12 refuse to map it.
fn map_copy(path: &str) -> Result<Btf, KernelBtfError> {
    let bytes = std::fs::read(path).map_err(unavailable)?;
    let fd =
        nix::sys::memfd::memfd_create(c"vmlinux-btf", nix::sys::memfd::MFdFlags::MFD_CLOEXEC).map_err(unavailable)?;
    let mut copy = std::fs::File::from(fd);
    copy.write_all(&bytes).map_err(unavailable)?;
    Btf::from_file_with_backend(format!("/proc/self/fd/{}", copy.as_raw_fd()), Backend::Mmap).map_err(unavailable)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the BTF of the kernel these tests run on; every kernel the tracer supports has it.
    #[test]
    fn finds_every_offset_in_the_running_kernel() {
        let _alone = KernelBtf::parsing_alone();
        let btf = KernelBtf::load().expect("kernel BTF");
        let o = btf.offsets().expect("offsets");
        // pid and tgid are adjacent `pid_t`s in every kernel since 2.6.
        assert_eq!(o.task_tgid, o.task_pid + 4, "{o:?}");
        assert!(o.task_exit_code > 0 && o.bprm_file > 0 && o.inode_sb > 0, "{o:?}");
        // `sock_common` starts `sock`; its address pair comes first, the family after the ports.
        assert_eq!((o.sock_daddr, o.sock_rcv_saddr), (0, 4), "{o:?}");
        assert!(o.sock_family > o.sock_num && o.sock_num > o.sock_dport, "{o:?}");
        // A `pipe_buffer` holds at least a page pointer, offset, length and ops pointer.
        assert!(o.pipe_buffer_size >= 24, "{o:?}");
        assert!(o.socket_inode > 0, "{o:?}");
    }

    #[test]
    fn the_running_kernels_btf_is_parsed_once() {
        let _alone = KernelBtf::parsing_alone();
        let before = KernelBtf::times_parsed();
        let a = KernelFacts::running().expect("kernel BTF") as *const KernelFacts;
        let b = KernelFacts::running().expect("kernel BTF") as *const KernelFacts;
        assert_eq!(a, b);
        // Other tests of this binary may have parsed it first; either way, at most once here.
        assert!(KernelBtf::times_parsed() - before <= 1);
    }

    /// The `uprobe` system call is in the BTF exactly when it is in the kernel's symbols (an
    /// independent source: `/proc/kallsyms`, which start-up no longer reads).
    #[test]
    fn the_uprobe_syscall_is_found_in_btf() {
        let _alone = KernelBtf::parsing_alone();
        let btf = KernelBtf::load().expect("kernel BTF");
        let kallsyms = std::fs::read_to_string("/proc/kallsyms").expect("/proc/kallsyms");
        let in_kallsyms = kallsyms.lines().any(|l| l.ends_with(" __x64_sys_uprobe"));
        assert_eq!(UPROBE_SYSCALL.iter().any(|f| btf.has_function(f)), in_kallsyms);
        assert!(btf.has_function("do_exit"));
        assert!(!btf.has_function("task_struct"), "a struct is not a function");
        assert!(!btf.has_function("no_such_function_xyz"));
    }

    /// The facts come from the types found in the one pass at load, and they are those that
    /// looking each name up on its own finds.
    #[test]
    fn the_facts_are_read_from_the_names_found_at_load() {
        let _alone = KernelBtf::parsing_alone();
        let indexed = KernelBtf::load_indexing(&FACT_NAMES).expect("kernel BTF");
        let facts = KernelFacts::read(&indexed);
        assert_eq!(indexed.scans.get(), 0, "a name read by KernelFacts::read is missing from FACT_NAMES");
        let plain = KernelBtf::load().expect("kernel BTF");
        let each = KernelFacts::read(&plain);
        assert!(plain.scans.get() >= FACT_NAMES.len());
        assert_eq!(facts.offsets().expect("offsets"), each.offsets().expect("offsets"));
        assert_eq!(facts.pt_regs().expect("pt_regs"), each.pt_regs().expect("pt_regs"));
        assert_eq!(facts.sched_exit_args(), each.sched_exit_args());
        assert_eq!(facts.uprobe_syscall(), each.uprobe_syscall());
        // A name not given at load is still found, in a pass of its own.
        assert!(indexed.has_function("do_exit"));
        assert_eq!(indexed.scans.get(), 1);
    }

    /// The copy that kernels which refuse to map their BTF are read from says what the mapping
    /// says.
    #[test]
    fn a_copy_of_the_btf_reads_as_the_btf() {
        let _alone = KernelBtf::parsing_alone();
        let copy = KernelBtf::indexing(map_copy(VMLINUX_BTF).expect("a copy"), &FACT_NAMES).expect("indexed");
        let mapped = KernelBtf::load_indexing(&FACT_NAMES).expect("kernel BTF");
        let (a, b) = (KernelFacts::read(&copy), KernelFacts::read(&mapped));
        assert_eq!(a.offsets().expect("offsets"), b.offsets().expect("offsets"));
        assert_eq!(a.uprobe_syscall(), b.uprobe_syscall());
    }

    #[test]
    fn finds_fields_inside_anonymous_members() {
        let _alone = KernelBtf::parsing_alone();
        let btf = KernelBtf::load().expect("kernel BTF");
        // `mm_struct` keeps its fields in an anonymous struct.
        let off = btf.offset("mm_struct", "exe_file").expect("mm_struct.exe_file");
        assert!(off > 0);
    }

    #[test]
    fn names_what_is_missing() {
        let _alone = KernelBtf::parsing_alone();
        let btf = KernelBtf::load().expect("kernel BTF");
        let err = btf.offset("task_struct", "no_such_field").unwrap_err();
        assert_eq!(err.to_string(), "the kernel's struct task_struct has no field no_such_field");
        assert!(matches!(btf.offset("no_such_struct_xyz", "a"), Err(KernelBtfError::NoStruct(_))));
    }
}
