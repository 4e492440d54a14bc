//! x86-64 machine code of one function, decoded with iced-x86: where it returns and what its entry
//! looks like, so that probes can be placed on instructions rather than only at symbols.
//!
//! Used for Go functions (an entry probe after the stack-bound check, a probe on every `ret`), and
//! general enough for other placements (an `endbr64` or a patchable nop at the entry).

use iced_x86::{Code as Opcode, Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DisasmError {
    #[error("invalid instruction at {address:#x}")]
    Invalid { address: u64 },
    #[error("no code")]
    Empty,
}

/// The decoded instructions of one function, in address order.
#[derive(Clone, Debug)]
pub struct FunctionCode {
    start: u64,
    end: u64,
    instructions: Vec<Instruction>,
}

/// How a function begins, as far as probe placement cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Go's prologue: a compare of the stack pointer (or `rsp - N`) with `g.stackguard0`
    /// (`[r14+0x10]`) and a conditional jump to a block that calls `runtime.morestack*` and jumps
    /// back to the function's first instruction. `body` is the first instruction after the jump:
    /// reached once per call, however often the stack had to grow first, with the argument
    /// registers still as the caller set them.
    GoStackCheck { body: u64 },
    /// Anything else: the first instruction is where the function starts once per call.
    Plain,
}

/// A way out of a native function other than a call: where a return probe goes when returns are
/// probed where they happen rather than by replacing the return address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// A `ret`.
    Return(u64),
    /// A jump out of the function (a tail call): its frame ends there.
    Jump(u64),
    /// A conditional jump out (`jne other_function`): an exit only when taken, which the probe
    /// tells from the flags; `condition` is the x86 condition code (the low nibble of `0x7N`).
    JumpIf { address: u64, condition: u8 },
    /// `jmp reg`: a switch's jump table or a tail call through a pointer; an exit when the target
    /// is outside the function, which the probe tells from the register (`register`: its x86
    /// number, rax 0 .. r15 15).
    JumpTo { address: u64, register: u8 },
}

impl Exit {
    pub fn address(self) -> u64 {
        match self {
            Exit::Return(a) | Exit::Jump(a) | Exit::JumpIf { address: a, .. } | Exit::JumpTo { address: a, .. } => a,
        }
    }

    /// The same exit at `f(address)` (a virtual address to a file offset).
    pub fn map(self, f: impl FnOnce(u64) -> u64) -> Exit {
        match self {
            Exit::Return(a) => Exit::Return(f(a)),
            Exit::Jump(a) => Exit::Jump(f(a)),
            Exit::JumpIf { address, condition } => Exit::JumpIf { address: f(address), condition },
            Exit::JumpTo { address, register } => Exit::JumpTo { address: f(address), register },
        }
    }
}

/// Every exit of a function whose code is `parts` (its symbol's bytes, then any split-off cold
/// part, `foo.cold`, which shares its frame), or `None` when one cannot be told (a `jmp` through
/// memory).
pub fn exits(parts: &[FunctionCode]) -> Option<Vec<Exit>> {
    let inside = |target: u64| parts.iter().any(|p| p.contains(target));
    let mut exits = Vec::new();
    for i in parts.iter().flat_map(|p| &p.instructions) {
        let address = i.ip();
        let exit = match i.mnemonic() {
            Mnemonic::Ret => Exit::Return(address),
            Mnemonic::Jmp => match i.op0_kind() {
                OpKind::NearBranch64 if inside(i.near_branch_target()) => continue,
                OpKind::NearBranch64 => Exit::Jump(address),
                OpKind::Register => Exit::JumpTo { address, register: register_number(i.op0_register())? },
                _ => return None,
            },
            m => match jcc_condition(m) {
                Some(_) if inside(i.near_branch_target()) => continue,
                Some(condition) => Exit::JumpIf { address, condition },
                // `jrcxz`, `loop`: never seen leaving a function; refuse rather than guess.
                None if i.op0_kind() == OpKind::NearBranch64
                    && !matches!(m, Mnemonic::Call)
                    && !inside(i.near_branch_target()) =>
                {
                    return None;
                }
                None => continue,
            },
        };
        exits.push(exit);
    }
    Some(exits)
}

/// The condition code of a conditional jump (`jo` 0 .. `jg` 15), as the flags test it.
fn jcc_condition(m: Mnemonic) -> Option<u8> {
    const JCC: [Mnemonic; 16] = [
        Mnemonic::Jo,
        Mnemonic::Jno,
        Mnemonic::Jb,
        Mnemonic::Jae,
        Mnemonic::Je,
        Mnemonic::Jne,
        Mnemonic::Jbe,
        Mnemonic::Ja,
        Mnemonic::Js,
        Mnemonic::Jns,
        Mnemonic::Jp,
        Mnemonic::Jnp,
        Mnemonic::Jl,
        Mnemonic::Jge,
        Mnemonic::Jle,
        Mnemonic::Jg,
    ];
    JCC.iter().position(|&j| j == m).map(|n| n as u8)
}

/// A 64-bit general register's x86 number (rax 0, rcx 1, rdx 2, rbx 3, rsp 4, rbp 5, rsi 6,
/// rdi 7, r8 8 .. r15 15).
fn register_number(r: Register) -> Option<u8> {
    const GPR: [Register; 16] = [
        Register::RAX,
        Register::RCX,
        Register::RDX,
        Register::RBX,
        Register::RSP,
        Register::RBP,
        Register::RSI,
        Register::RDI,
        Register::R8,
        Register::R9,
        Register::R10,
        Register::R11,
        Register::R12,
        Register::R13,
        Register::R14,
        Register::R15,
    ];
    GPR.iter().position(|&g| g == r).map(|n| n as u8)
}

/// `g.stackguard0` in Go's `runtime.g` (after `stack.lo` and `stack.hi`): stable since Go 1.0.
const GO_STACKGUARD0: i64 = 0x10;
/// The stack check is within the first few instructions of a Go function.
const PROLOGUE_SEARCH: usize = 6;
/// Instructions in the morestack block before it jumps back.
const MORESTACK_BLOCK: usize = 16;

impl FunctionCode {
    /// Decodes `code`, the bytes of a function at virtual address `address`. Decoding stops at the
    /// end of the bytes; any invalid instruction is an error (the bytes are not code, or the size
    /// is wrong), so nothing is placed on a guess.
    pub fn decode(code: &[u8], address: u64) -> Result<FunctionCode, DisasmError> {
        if code.is_empty() {
            return Err(DisasmError::Empty);
        }
        let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
        let mut instructions = Vec::new();
        while decoder.can_decode() {
            let instruction = decoder.decode();
            if instruction.is_invalid() {
                return Err(DisasmError::Invalid { address: instruction.ip() });
            }
            instructions.push(instruction);
        }
        Ok(FunctionCode { start: address, end: address + code.len() as u64, instructions })
    }

    pub fn instructions(&self) -> &[Instruction] {
        &self.instructions
    }

    pub fn start(&self) -> u64 {
        self.start
    }

    /// Addresses of the function's `ret` instructions.
    pub fn returns(&self) -> Vec<u64> {
        self.instructions.iter().filter(|i| i.mnemonic() == Mnemonic::Ret).map(Instruction::ip).collect()
    }

    /// Whether the function may leave by a jump out of its own bytes (a tail call): such an exit
    /// passes no `ret` of this function.
    pub fn jumps_out(&self) -> bool {
        self.instructions.iter().any(|i| {
            i.mnemonic() == Mnemonic::Jmp
                && (i.op0_kind() != OpKind::NearBranch64 || !self.contains(i.near_branch_target()))
        })
    }

    fn contains(&self, address: u64) -> bool {
        (self.start..self.end).contains(&address)
    }

    fn index_of(&self, address: u64) -> Option<usize> {
        self.instructions.binary_search_by_key(&address, Instruction::ip).ok()
    }

    /// Describes the function's entry.
    pub fn entry(&self) -> Entry {
        let prologue = &self.instructions[..self.instructions.len().min(PROLOGUE_SEARCH)];
        for (i, cmp) in prologue.iter().enumerate() {
            if !is_stackguard_compare(cmp) {
                continue;
            }
            let (Some(jump), Some(body)) = (self.instructions.get(i + 1), self.instructions.get(i + 2)) else {
                break;
            };
            let unsigned_below_or_equal = matches!(jump.code(), Opcode::Jbe_rel8_64 | Opcode::Jbe_rel32_64);
            if unsigned_below_or_equal && self.morestack_block_returns_to_start(jump.near_branch_target()) {
                return Entry::GoStackCheck { body: body.ip() };
            }
            break;
        }
        Entry::Plain
    }

    /// Whether the block at `target` calls something and then jumps back to the function's start.
    fn morestack_block_returns_to_start(&self, target: u64) -> bool {
        let Some(first) = self.index_of(target) else { return false };
        let mut called = false;
        for i in self.instructions[first..].iter().take(MORESTACK_BLOCK) {
            match i.mnemonic() {
                Mnemonic::Call => called = true,
                Mnemonic::Jmp => {
                    return called && i.op0_kind() == OpKind::NearBranch64 && i.near_branch_target() == self.start;
                }
                // Any other branch (a conditional jump, a return) is not the morestack block's.
                _ if i.op0_kind() == OpKind::NearBranch64 || i.mnemonic() == Mnemonic::Ret => return false,
                _ => {}
            }
        }
        false
    }
}

/// `cmp rsp, [r14+0x10]` or `cmp r12, [r14+0x10]` (after `lea r12, [rsp-N]`), either operand order.
fn is_stackguard_compare(i: &Instruction) -> bool {
    i.mnemonic() == Mnemonic::Cmp
        && (0..i.op_count()).any(|n| {
            i.op_kind(n) == OpKind::Memory
                && i.memory_base() == Register::R14
                && i.memory_index() == Register::None
                && i.memory_displacement64() as i64 == GO_STACKGUARD0
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `main.deep` of a Go 1.19 program (a 0x218-byte frame, so the check is on `rsp - 0x198`):
    /// lea/cmp/jbe, body, two rets, a call to panicIndex, and the morestack block.
    const GO_DEEP: &[u8] = &[
        0x4c, 0x8d, 0xa4, 0x24, 0x68, 0xfe, 0xff, 0xff, // lea r12,[rsp-0x198]
        0x4d, 0x3b, 0x66, 0x10, // cmp r12,[r14+0x10]
        0x76, 0x13, // jbe +0x13 (the morestack block)
        0x48, 0x83, 0xec, 0x18, // sub rsp,0x18            <- body
        0x48, 0x85, 0xc0, // test rax,rax
        0x75, 0x05, // jne +5
        0x48, 0x83, 0xc4, 0x18, // add rsp,0x18
        0xc3, // ret
        0x48, 0x83, 0xc4, 0x18, // add rsp,0x18
        0xc3, // ret
        // morestack block:
        0x48, 0x89, 0x44, 0x24, 0x08, // mov [rsp+8],rax
        0xe8, 0x00, 0x00, 0x00, 0x00, // call (morestack)
        0x48, 0x8b, 0x44, 0x24, 0x08, // mov rax,[rsp+8]
        0xeb, 0xce, // jmp start
    ];

    #[test]
    fn finds_go_stack_check_and_returns() {
        let code = FunctionCode::decode(GO_DEEP, 0x1000).unwrap();
        assert_eq!(code.entry(), Entry::GoStackCheck { body: 0x100e });
        assert_eq!(code.returns(), [0x101b, 0x1020]);
        assert_eq!(code.start(), 0x1000);
        assert!(!code.jumps_out());
    }

    #[test]
    fn small_frames_compare_rsp_itself() {
        // cmp rsp,[r14+0x10]; jbe +3; ret; call 0; jmp start
        let bytes = [0x49, 0x3b, 0x66, 0x10, 0x76, 0x01, 0xc3, 0xe8, 0, 0, 0, 0, 0xeb, 0xf2];
        let code = FunctionCode::decode(&bytes, 0x2000).unwrap();
        assert_eq!(code.entry(), Entry::GoStackCheck { body: 0x2006 });
        assert_eq!(code.returns(), [0x2006]);
    }

    #[test]
    fn other_prologues_are_plain() {
        // push rbp; mov rbp,rsp; pop rbp; ret
        let code = FunctionCode::decode(&[0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3], 0x3000).unwrap();
        assert_eq!(code.entry(), Entry::Plain);
        assert_eq!(code.returns(), [0x3005]);
        // A stack check whose jump target does not jump back to the start is not Go's.
        let bytes = [0x49, 0x3b, 0x66, 0x10, 0x76, 0x01, 0xc3, 0xe8, 0, 0, 0, 0, 0xc3];
        assert_eq!(FunctionCode::decode(&bytes, 0x2000).unwrap().entry(), Entry::Plain);
    }

    #[test]
    fn native_exits_are_returns_and_jumps_out() {
        let bytes = [
            0x85, 0xff, // test edi,edi
            0x0f, 0x85, 0x00, 0x10, 0x00, 0x00, // jne +0x1000 (out: a conditional tail call)
            0x74, 0x02, // je +2 (inside)
            0xff, 0xe0, // jmp rax
            0xe9, 0x00, 0x20, 0x00, 0x00, // jmp +0x2000 (out)
            0xc3, // ret
        ];
        let code = FunctionCode::decode(&bytes, 0x1000).unwrap();
        assert_eq!(
            exits(&[code]).unwrap(),
            [
                Exit::JumpIf { address: 0x1002, condition: 5 },
                Exit::JumpTo { address: 0x100a, register: 0 },
                Exit::Jump(0x100c),
                Exit::Return(0x1011),
            ]
        );
        // A jump into the split-off cold part is not an exit; the cold part's `ret` is.
        let hot = FunctionCode::decode(&[0xe9, 0xfb, 0x0f, 0x00, 0x00], 0x1000).unwrap(); // jmp 0x2000
        let cold = FunctionCode::decode(&[0x90, 0xc3], 0x2000).unwrap();
        assert_eq!(exits(&[hot, cold]).unwrap(), [Exit::Return(0x2001)]);
        // `jmp [rax]`: where it goes cannot be told.
        assert_eq!(exits(&[FunctionCode::decode(&[0xff, 0x20], 0x1000).unwrap()]), None);
    }

    #[test]
    fn tail_jumps_and_bad_bytes() {
        // jmp far away
        let code = FunctionCode::decode(&[0xe9, 0x00, 0x10, 0x00, 0x00], 0x4000).unwrap();
        assert!(code.jumps_out());
        assert!(code.returns().is_empty());
        // `push es` does not exist in 64-bit mode.
        assert_eq!(FunctionCode::decode(&[0x06], 0x5000).unwrap_err(), DisasmError::Invalid { address: 0x5000 });
        assert_eq!(FunctionCode::decode(&[], 0).unwrap_err(), DisasmError::Empty);
    }
}
