//! What user space tells the eBPF programs at load time: their configuration and the kernel's offsets.

/// Key of the `TARGET_INODES` map: a process that exec's a file with this device and inode
/// becomes traced (`--binary`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InodeKey {
    /// The kernel's `dev_t` encoding: `major << 20 | minor`.
    pub dev: u64,
    pub ino: u64,
}

/// Byte offsets of kernel structure fields, read from the running kernel's BTF at start-up.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_exit_code: u32,
    /// `task_struct.signal`, `signal_struct.flags` and `.group_exit_code`: a process ended by
    /// `exit_group` or a fatal signal has its status there, whichever thread exits last.
    pub task_signal: u32,
    pub signal_flags: u32,
    pub signal_group_exit_code: u32,
    pub bprm_file: u32,
    pub bprm_filename: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    // IPC: from an fd to its file and the object behind it.
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdtable_fd: u32,
    pub fdtable_max_fds: u32,
    pub file_private_data: u32,
    pub inode_mode: u32,
    pub sb_magic: u32,
    pub socket_sk: u32,
    /// Offset of the socket's inode from the `struct socket` (`socket_alloc.vfs_inode`).
    pub socket_inode: u32,
    pub sock_family: u32,
    pub sock_num: u32,
    pub sock_dport: u32,
    pub sock_rcv_saddr: u32,
    pub sock_daddr: u32,
    pub sock_v6_rcv_saddr: u32,
    pub sock_v6_daddr: u32,
    pub sock_type: u32,
    pub sock_protocol: u32,
    pub sock_socket: u32,
    pub sock_receive_queue: u32,
    pub tcp_write_seq: u32,
    pub tcp_copied_seq: u32,
    pub unix_peer: u32,
    pub unix_addr: u32,
    pub unix_address_len: u32,
    pub unix_address_name: u32,
    pub skb_next: u32,
    pub skb_len: u32,
    pub skb_cb: u32,
    pub unix_skb_consumed: u32,
    pub pipe_head: u32,
    pub pipe_tail: u32,
    pub pipe_ring_size: u32,
    pub pipe_bufs: u32,
    pub pipe_buffer_len: u32,
    pub pipe_buffer_size: u32,
    pub siginfo_code: u32,
    pub siginfo_pid: u32,
    // The syscall arguments the IPC programs use (the first five: di, si, dx, r10, r8), in the
    // user registers (`struct pt_regs`).
    pub regs_di: u32,
    pub regs_si: u32,
    pub regs_dx: u32,
    pub regs_r10: u32,
    pub regs_r8: u32,
    /// `task_struct.mm` and `mm_struct.exe_file`: the image a process runs (for watchpoints).
    pub task_mm: u32,
    pub mm_exe_file: u32,
    /// `task_struct.ptrace`: non-zero while a debugger (gdb, strace) traces the task, which the
    /// exec program then does not stop (the debugger would see the stop).
    pub task_ptrace: u32,
}

/// Read-only configuration of the eBPF programs, set by user space at load time.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Which records to emit: [`kind_bit`](crate::kind_bit) of each enabled [`RecordKind`](crate::RecordKind).
    pub enabled_kinds: u32,
    /// 1: a child of a traced process is traced (added on fork, in the kernel).
    pub follow_children: u32,
    /// 1: the `TARGET_INODES` map has entries (`--binary`), so exec looks the new file up.
    pub has_target_inodes: u32,
    /// 1: `tracer top --by-process`: statistics per process and function, not per function.
    pub top_by_process: u32,
    /// Records do not wake the reader up (it polls) until this many bytes wait in the ring: a
    /// wake-up per record costs the traced program more than the record itself.
    pub wakeup_bytes: u64,
    /// `--capture-bytes`: payload bytes copied from each IPC transfer (0: none), at most
    /// [`CAPTURE_BYTES_MAX`](crate::CAPTURE_BYTES_MAX).
    pub capture_bytes: u32,
    /// 1: `--debug-kernel`: the programs' rare failure paths log a line through aya-log.
    pub debug: u32,
    /// `--min-duration`: a call whose cookie has `cookie::HOLD` is written only if it lasted at
    /// least this long (0: any duration).
    pub min_duration_ns: u64,
    /// `--depth`: a `cookie::GATED` call nested deeper than this many open gated calls on its
    /// thread is not written (0: any depth up to [`gate::MAX_OPEN`](crate::gate::MAX_OPEN)).
    pub max_depth: u32,
    /// 1: some `--start-at` was given, so a thread starts not recording (see [`gate::Thread`](crate::gate::Thread)).
    pub start_off: u32,
    /// 1: function patterns were given: a traced process that execs an image not yet in
    /// `RESOLVED_IMAGES` is stopped until user space has resolved the patterns against it (one
    /// under ptrace is not stopped: [`ExecResolve::Running`](crate::ExecResolve::Running)).
    pub resolve_execs: u32,
    /// How many call rings (`CALL_RINGS`' elements) there are: CPU `c` writes to ring
    /// `c % call_rings` (see [`call_rings`](crate::call_rings)); 0: none, every record goes to
    /// `EVENTS`.
    pub call_rings: u32,
    /// With `-w`: the executable the watched variables were found in. A hit in a process that
    /// runs another image (it exec'd one after the watchpoints were opened, which survive exec)
    /// is not the variable's and is dropped. All zero: no such check.
    pub watch_image: InodeKey,
    pub offsets: KernelOffsets,
}
