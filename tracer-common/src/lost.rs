//! What the kernel side could not record, counted by cause in the `LOST` array.

use crate::RecordKind;

numbered_enum! {
    /// Slots of the per-CPU `LOST` array: what the kernel side could not record, by cause. The
    /// first slots count ring-buffer reserve failures ([`LostSlot::ring_full`] says which kind
    /// goes where, exhaustively, so a new [`RecordKind`] cannot share another's counter); the
    /// others count things the kernel side had to give up on.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub enum LostSlot {
        /// The ring buffer was full at a call (C or Go).
        Call = 0,
        /// The ring buffer was full at a return (C or Go).
        Return = 1,
        /// The ring buffer was full at a fork or an exec.
        Spawn = 2,
        Exit = 3,
        Ipc = 4,
        Signal = 5,
        /// The ring buffer was full at a program's own event (`log`).
        Log = 6,
        Usdt = 7,
        /// A traced process forked, but the traced-pid map was full: the child is not traced.
        UntrackedChild = 8,
        /// A traced IPC syscall could not be remembered between entry and exit (map full).
        IpcInflight = 9,
        /// Messages of a `sendmmsg`/`recvmmsg` beyond the first [`MAX_MMSG`](crate::MAX_MMSG) (not recorded).
        IpcMmsgBeyondLimit = 10,
        /// `--capture-bytes`: a transfer's payload could not be read from the process's memory
        /// (the transfer is recorded, without its bytes).
        IpcPayloadUnreadable = 11,
        /// `tracer top`: a traced thread's call stack could not be kept (its map was full): its
        /// calls are not counted.
        TopThreadsFull = 12,
        /// `tracer top --by-process`: a (process, function) pair found its map full: not counted.
        TopKeysFull = 13,
        /// `tracer top`: calls nested deeper than [`top::MAX_DEPTH`](crate::top::MAX_DEPTH) (the kernel gives them no
        /// return probe), counted but not timed.
        TopTooDeep = 14,
        /// `tracer top`: calls whose return never came (left by `longjmp` or an exception).
        TopNoReturn = 15,
        /// The ring buffer was full at a breakpoint (`-B`).
        Break = 16,
        /// The ring buffer was full at a watchpoint hit (`-w`).
        Watch = 17,
    }
}

impl LostSlot {
    /// Number of slots in the `LOST` map.
    pub const COUNT: u32 = Self::ALL.len() as u32;

    /// Where a record of this kind is counted when the ring buffer has no room for it.
    pub const fn ring_full(kind: RecordKind) -> LostSlot {
        match kind {
            RecordKind::Call | RecordKind::GoCall => LostSlot::Call,
            RecordKind::Return | RecordKind::GoReturn => LostSlot::Return,
            RecordKind::Fork | RecordKind::Exec => LostSlot::Spawn,
            RecordKind::Exit => LostSlot::Exit,
            RecordKind::Ipc => LostSlot::Ipc,
            RecordKind::Signal => LostSlot::Signal,
            RecordKind::UserEvent => LostSlot::Log,
            RecordKind::Usdt => LostSlot::Usdt,
            RecordKind::Break => LostSlot::Break,
            RecordKind::Watch => LostSlot::Watch,
        }
    }

    /// The name `trace_end.lost_events` gives the slot's count; `None` for `top`'s own slots,
    /// which `top` reports itself.
    pub const fn trace_name(self) -> Option<&'static str> {
        Some(match self {
            LostSlot::Call => "call",
            LostSlot::Return => "return",
            LostSlot::Spawn => "spawn",
            LostSlot::Exit => "exit",
            LostSlot::Ipc => "ipc",
            LostSlot::Signal => "signal",
            LostSlot::Log => "log",
            LostSlot::Usdt => "usdt",
            LostSlot::Break => "break",
            LostSlot::Watch => "watch",
            LostSlot::UntrackedChild => "untraced_children",
            LostSlot::IpcInflight => "ipc_untracked_syscalls",
            LostSlot::IpcMmsgBeyondLimit => "ipc_messages_beyond_limit",
            LostSlot::IpcPayloadUnreadable => "ipc_payload_unreadable",
            LostSlot::TopThreadsFull | LostSlot::TopKeysFull | LostSlot::TopTooDeep | LostSlot::TopNoReturn => {
                return None;
            }
        })
    }
}

// The slots index the `LOST` array: their numbers must be 0, 1, 2, ... in order.
const _: () = {
    let mut i = 0;
    while i < LostSlot::ALL.len() {
        assert!(LostSlot::ALL[i] as usize == i, "LostSlot numbers must run 0, 1, 2, ... with no gap");
        i += 1;
    }
};
