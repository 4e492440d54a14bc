pub const FUNCTION_MASK: u64 = 0xffff_ffff;
pub const GO: u64 = 1 << 32;
pub const GO_RETURN: u64 = 1 << 33;
pub const STRINGS: u64 = 1 << 34;
/// A native function's probe on one of its `ret` instructions (returns probed where they
/// happen, so that no frame of the program holds a trampoline's address: see
/// `functions::unwinding` in user space): the probe writes a return record.
pub const RET_SITE: u64 = 1 << 35;
/// With `RET_SITE`: the probe is on a jump out of the function (a tail call), so the return
/// value is the callee's, not known yet.
pub const TAIL_CALL: u64 = 1 << 36;
/// With `TAIL_CALL`: a conditional jump, an exit only when the flags say it is taken; its
/// condition code (x86's, 0 `jo` .. 15 `jg`) is at `OPERAND_SHIFT`.
pub const CONDITIONAL: u64 = 1 << 37;
/// With `TAIL_CALL`: `jmp reg`, an exit only when the target is outside the function; the
/// register (x86's number) is at `OPERAND_SHIFT`, the site's offset from the function's start
/// at `SITE_SHIFT`, so the probe can say where the jump goes relative to the function.
pub const INDIRECT: u64 = 1 << 38;
/// On an entry probe: the function's first instruction is also one of its exits (`jmp other`
/// as the whole body, an empty function's `ret`), described by the exit bits of this cookie
/// (`TAIL_CALL`, `CONDITIONAL`, `INDIRECT` and theirs): one probe writes the call, then the
/// return. (Two probes at one address would run in no set order.)
pub const ALSO_EXIT: u64 = 1 << 39;
/// The function has a predicate (`-f 'FUNC if EXPR'`): an entry probe evaluates it and drops
/// the call when it fails; a return probe drops the return of a call its entry dropped.
pub const FILTERED: u64 = 1 << 44;
/// The call is decided at its return (`ret-if`, `--min-duration`): the entry probe holds its
/// record in the kernel (`HELD`, by thread and entry stack pointer) instead of writing it, and
/// the return probe writes both, or neither.
pub const HOLD: u64 = 1 << 45;
/// Triggers or `--depth` are on (`--start-at`, `--stop-at`, `--depth`): the entry probe asks
/// its thread's gate (`GATES`, see `gate`) whether the call is written and opens it there; a
/// return probe writes the return only if the gate says its call was written.
pub const GATED: u64 = 1 << 46;
/// With `GATED`: the function has a role in the `GATE_ROLES` map (a start or stop trigger,
/// or no return probe), looked up by the entry probe.
pub const GATE_ROLE: u64 = 1 << 47;
pub const OPERAND_SHIFT: u32 = 40;
pub const SITE_SHIFT: u32 = 48;
pub const GOID_OFFSET_SHIFT: u32 = 48;

/// The cookie of a C (System V) probe: the function index alone.
pub const fn plain(function: u32) -> u64 {
    function as u64
}

/// The cookie of a Go probe: entry, or a `ret` instruction when `ret`.
pub const fn go(function: u32, ret: bool, goid_offset: u16) -> u64 {
    function as u64 | GO | if ret { GO_RETURN } else { 0 } | (goid_offset as u64) << GOID_OFFSET_SHIFT
}

pub const fn function(cookie: u64) -> u32 {
    (cookie & FUNCTION_MASK) as u32
}

/// The cookie of a native function's probe on a `ret` instruction (`tail`: on a jump out).
pub const fn ret_site(function: u32, tail: bool) -> u64 {
    function as u64 | RET_SITE | if tail { TAIL_CALL } else { 0 }
}

/// The cookie of a native function's probe on a conditional jump out.
pub const fn ret_site_if(function: u32, condition: u8) -> u64 {
    ret_site(function, true) | CONDITIONAL | ((condition & 0xf) as u64) << OPERAND_SHIFT
}

/// The cookie of a native function's probe on `jmp reg`, `site` bytes after its start.
pub const fn ret_site_to(function: u32, register: u8, site: u16) -> u64 {
    ret_site(function, true) | INDIRECT | ((register & 0xf) as u64) << OPERAND_SHIFT | (site as u64) << SITE_SHIFT
}

/// An entry probe's cookie that also stands for the exit `exit` (a `ret_site*` cookie) at the
/// same instruction.
pub const fn with_exit(entry: u64, exit: u64) -> u64 {
    entry | ALSO_EXIT | (exit & (TAIL_CALL | CONDITIONAL | INDIRECT | 0xf << OPERAND_SHIFT | 0xffff << SITE_SHIFT))
}

pub const fn is_also_exit(cookie: u64) -> bool {
    cookie & ALSO_EXIT != 0
}

/// The exit cookie an `ALSO_EXIT` entry cookie carries (without strings to read: its return
/// value, if any, is read by no layout).
pub const fn exit_of(entry: u64) -> u64 {
    (entry & !(ALSO_EXIT | STRINGS)) | RET_SITE
}

pub const fn is_conditional(cookie: u64) -> bool {
    cookie & CONDITIONAL != 0
}

pub const fn is_indirect(cookie: u64) -> bool {
    cookie & INDIRECT != 0
}

/// A conditional jump's condition code, or an indirect jump's register.
pub const fn operand(cookie: u64) -> u8 {
    ((cookie >> OPERAND_SHIFT) & 0xf) as u8
}

/// An indirect jump's offset from its function's start.
pub const fn site(cookie: u64) -> u64 {
    cookie >> SITE_SHIFT
}

/// Whether x86 condition `code` holds under `flags` (rflags).
pub const fn condition_holds(code: u8, flags: u64) -> bool {
    let cf = flags & 1 != 0;
    let pf = flags & (1 << 2) != 0;
    let zf = flags & (1 << 6) != 0;
    let sf = flags & (1 << 7) != 0;
    let of = flags & (1 << 11) != 0;
    let base = match code >> 1 {
        0 => of,
        1 => cf,
        2 => zf,
        3 => cf || zf,
        4 => sf,
        5 => pf,
        6 => sf != of,
        _ => zf || sf != of,
    };
    base != (code & 1 != 0)
}

pub const fn is_ret_site(cookie: u64) -> bool {
    cookie & RET_SITE != 0
}

pub const fn is_tail_call(cookie: u64) -> bool {
    cookie & TAIL_CALL != 0
}

pub const fn is_go(cookie: u64) -> bool {
    cookie & GO != 0
}

pub const fn is_go_return(cookie: u64) -> bool {
    cookie & GO_RETURN != 0
}

pub const fn is_filtered(cookie: u64) -> bool {
    cookie & FILTERED != 0
}

pub const fn is_held(cookie: u64) -> bool {
    cookie & HOLD != 0
}

pub const fn is_gated(cookie: u64) -> bool {
    cookie & GATED != 0
}

pub const fn has_gate_role(cookie: u64) -> bool {
    cookie & GATE_ROLE != 0
}

pub const fn reads_strings(cookie: u64) -> bool {
    cookie & STRINGS != 0
}

pub const fn goid_offset(cookie: u64) -> u32 {
    (cookie >> GOID_OFFSET_SHIFT) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_read_the_flags_as_the_cpu_does() {
        const CF: u64 = 1;
        const ZF: u64 = 1 << 6;
        const SF: u64 = 1 << 7;
        const OF: u64 = 1 << 11;
        // je/jne (4/5), jb (2), jbe (6), jl (12), jle (14), jg (15), jo (0).
        assert!(condition_holds(4, ZF) && !condition_holds(5, ZF) && condition_holds(5, 0));
        assert!(condition_holds(2, CF) && !condition_holds(3, CF));
        assert!(condition_holds(6, ZF) && condition_holds(6, CF) && condition_holds(7, 0));
        assert!(condition_holds(12, SF) && !condition_holds(12, SF | OF) && condition_holds(13, SF | OF));
        assert!(condition_holds(14, ZF) && condition_holds(15, SF | OF) && !condition_holds(15, ZF));
        assert!(condition_holds(0, OF) && condition_holds(1, 0));
    }

    #[test]
    fn ret_site_cookies_keep_their_parts() {
        let c = ret_site_to(77, 13, 0x1234);
        assert!(is_ret_site(c) && is_tail_call(c) && is_indirect(c) && !is_conditional(c) && !is_go(c));
        assert_eq!((function(c), operand(c), site(c)), (77, 13, 0x1234));
        let c = ret_site_if(5, 15);
        assert!(is_conditional(c) && !is_indirect(c));
        assert_eq!((function(c), operand(c)), (5, 15));
        assert!(!is_tail_call(ret_site(5, false)));
        // An entry that is also a tail call through rax, 0 bytes in.
        let entry = with_exit(plain(9) | STRINGS, ret_site_to(9, 0, 0));
        assert!(is_also_exit(entry) && !is_ret_site(entry));
        assert_eq!(exit_of(entry), ret_site_to(9, 0, 0));
    }
}
