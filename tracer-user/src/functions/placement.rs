//! Where a function's entry probe is cheapest, and which path the kernel takes for each probe.
//!
//! A uprobe replaces an instruction with `int3`. What the hit costs depends on the instruction it
//! replaced, as Linux 6.18's `arch/x86/kernel/uprobes.c` handles it:
//!
//! - **optimized**: a 5-byte nop (`0f 1f 44 00 00`, any 5-byte `nop`/`nopl` from 6.18 on) that
//!   does not cross a page: after the first hit the kernel rewrites it into a `call` to a
//!   trampoline that enters the kernel by the `uprobe` syscall (`can_optimize`,
//!   `arch_uprobe_optimize`). No trap at all (about 0.3 µs a hit here).
//! - **emulated**: any other nop, `jmp`/`call`/`jcc` with a relative target, `push reg`
//!   (`branch_setup_xol_ops`, `push_setup_xol_ops`): one trap, the instruction emulated in the
//!   kernel, no single-step.
//! - **trap**: everything else (`endbr64`, `lea`, `sub rsp`, `mov`, `ret`): the trap, then the
//!   instruction single-stepped out of line, a second trap (about 15 µs a hit on this VM).
//!
//! So a function that starts with `endbr64` (CET, `-fcf-protection`) and then a 5-byte nop
//! (`-pg -mfentry -mnop-mcount`) should be probed on the nop, four bytes in. That is the same point
//! for everything an entry probe sees: `endbr64` and nops change no register, flag or memory, so
//! the arguments are the caller's and the return address is still on top of the stack, which is
//! what a uretprobe attached there replaces. [`native_entry`] moves the probe over such leading
//! instructions to the first point of the fastest path, unless some branch of the function comes
//! back to that point (then a probe there would fire on more than entry).

use iced_x86::{Code as Opcode, Instruction, Mnemonic, OpKind};

pub use crate::event::{ProbePath, ProbePaths};
use crate::{functions::disasm::FunctionCode, kernel::features::KernelProbes};

/// Where a native function's entry (and return) probes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryPoint {
    /// Bytes after the function's symbol.
    pub offset: u64,
    pub path: ProbePath,
}

/// Leading instructions searched for a better entry point.
const ENTRY_SEARCH: usize = 8;
const PAGE_SIZE: u64 = 4096;

/// The path the kernel takes for a probe on `insn`, whose first byte is at file offset
/// `file_offset` (a file offset and the address it is mapped at agree modulo the page size, which
/// is what the kernel's "does not cross a page" check needs).
pub fn classify(insn: &Instruction, bytes: &[u8], file_offset: u64, kernel: KernelProbes) -> ProbePath {
    let len = insn.len() as u64;
    if is_nop(insn) {
        let within_page = PAGE_SIZE - (file_offset % PAGE_SIZE) >= 5;
        return if kernel.optimizes_nop5 && len == 5 && within_page {
            ProbePath::Optimized
        } else {
            ProbePath::Emulated
        };
    }
    // A 16-bit operand-size override on a branch (`66 e8`) is not emulated.
    let operand_size_prefix = bytes.first() == Some(&0x66);
    // (`loop` and `jrcxz` are not among them.)
    let relative_branch = matches!(insn.code(), Opcode::Jmp_rel8_64 | Opcode::Jmp_rel32_64 | Opcode::Call_rel32_64)
        || (insn.op0_kind() == OpKind::NearBranch64 && is_jcc(insn.mnemonic()));
    if relative_branch && !operand_size_prefix {
        return ProbePath::Emulated;
    }
    // `push reg`: one byte, or two with REX.B (`41 55`).
    if insn.code() == Opcode::Push_r64 && len <= 2 && (len == 1 || bytes.first() == Some(&0x41)) {
        return ProbePath::Emulated;
    }
    ProbePath::Trap
}

/// A conditional jump (`70`-`7f`, `0f 80`-`0f 8f`).
fn is_jcc(m: Mnemonic) -> bool {
    use Mnemonic::*;
    matches!(m, Jo | Jno | Jb | Jae | Je | Jne | Jbe | Ja | Js | Jns | Jp | Jnp | Jl | Jge | Jle | Jg)
}

/// Nops as the kernel knows them: `0x90` with any prefixes (`66 90`, `pause`) and `0f 1f /0`.
fn is_nop(insn: &Instruction) -> bool {
    matches!(
        insn.code(),
        Opcode::Nopw
            | Opcode::Nopd
            | Opcode::Nopq
            | Opcode::Pause
            | Opcode::Nop_rm16
            | Opcode::Nop_rm32
            | Opcode::Nop_rm64
    )
}

/// Instructions that change nothing a probe sees, so the entry probe may move past them.
fn is_neutral(insn: &Instruction) -> bool {
    is_nop(insn) || matches!(insn.code(), Opcode::Endbr64 | Opcode::Endbr32)
}

/// The entry point of a native function whose code is `code` (its bytes `bytes`, mapped from file
/// offset `file_offset`): the first point of the fastest path among the function's first
/// instruction and those right after leading `endbr64`s and nops.
pub fn native_entry(code: &FunctionCode, bytes: &[u8], file_offset: u64, kernel: KernelProbes) -> EntryPoint {
    let start = code.start();
    let insns = code.instructions();
    let point = |insn: &Instruction| {
        let offset = insn.ip() - start;
        let at = offset as usize;
        let insn_bytes = bytes.get(at..at + insn.len()).unwrap_or(&[]);
        EntryPoint { offset, path: classify(insn, insn_bytes, file_offset + offset, kernel) }
    };
    let Some(first) = insns.first() else { return EntryPoint { offset: 0, path: ProbePath::Trap } };
    let mut best = point(first);
    for (i, insn) in insns.iter().enumerate().take(ENTRY_SEARCH) {
        if best.path == ProbePath::Optimized || !is_neutral(insn) {
            break;
        }
        let Some(next) = insns.get(i + 1) else { break };
        let candidate = point(next);
        if candidate.path < best.path && !is_branch_target(insns, next.ip()) {
            best = candidate;
        }
    }
    best
}

/// Whether any branch of the function goes to `address`.
fn is_branch_target(insns: &[Instruction], address: u64) -> bool {
    insns.iter().any(|i| {
        matches!(i.op0_kind(), OpKind::NearBranch64 | OpKind::NearBranch32 | OpKind::NearBranch16)
            && i.near_branch_target() == address
    })
}

/// The path of a probe on the first instruction of `bytes` (for a probe whose point was chosen
/// elsewhere, a Go entry or a `ret`).
pub fn classify_at(bytes: &[u8], address: u64, file_offset: u64, kernel: KernelProbes) -> ProbePath {
    let mut decoder = iced_x86::Decoder::with_ip(64, bytes, address, iced_x86::DecoderOptions::NONE);
    let insn = decoder.decode();
    if insn.is_invalid() {
        return ProbePath::Trap;
    }
    classify(&insn, &bytes[..insn.len().min(bytes.len())], file_offset, kernel)
}

/// Functions named in the summary line.
const NAMED: usize = 5;

/// Where the probes went, for stderr: one line, and advice on the slow ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSummary {
    /// How many functions take each path and, when some trap, which.
    pub line: String,
    /// When some trap: what gives them the fast path (a paragraph, which the CLI shows once per
    /// machine and with `-v`, not at every run).
    pub advice: Option<String>,
}

impl ProbePaths {
    /// How many functions take each path and, when some trap, which and what gives them the fast
    /// path on this `kernel`: compiler flags for C, C++ and Rust; for the functions `is_go` says
    /// are Go's, whose `ret` probes (placed when `returns`) trap whatever the build (the Go
    /// toolchain has no patchable entry), what does help there.
    pub fn summary(&self, is_go: impl Fn(&str) -> bool, returns: bool, kernel: KernelProbes) -> Option<ProbeSummary> {
        if self.is_empty() {
            return None;
        }
        let counts: Vec<String> =
            ProbePath::ALL.iter().map(|&p| format!("{} {}", self.list(p).len(), p.name())).collect();
        let mut line = format!("probes: {}", counts.join(", "));
        if self.trap.is_empty() {
            return Some(ProbeSummary { line, advice: None });
        }
        let mut names: Vec<&str> = self.trap.iter().take(NAMED).map(String::as_str).collect();
        if self.trap.len() > NAMED {
            names.push("...");
        }
        line.push_str(&format!("; slow (a trap and a single-step, ~15 µs a hit): {}", names.join(", ")));
        let (go, native): (Vec<&String>, Vec<&String>) = self.trap.iter().partition(|f| is_go(f));
        let mut advice = Vec::new();
        if !native.is_empty() {
            advice.push(format!(
                "For the fast path give {}functions a 5-byte nop entry{}: C/C++ with gcc -pg -mfentry \
                 -mnop-mcount (compile only) or clang -fpatchable-function-entry=5, Rust nightly \
                 #[patchable_function_entry(entry_nops = 5)]; on stable Rust -C force-frame-pointers=yes (C/C++ \
                 -fno-omit-frame-pointer) gives an emulated push rbp entry.",
                if go.is_empty() { "" } else { "C, C++ and Rust " },
                if kernel.optimizes_nop5 {
                    ""
                } else {
                    " (one trap, emulated, on this kernel; no trap from Linux 6.18)"
                },
            ));
        }
        if !go.is_empty() {
            advice.push(
                if returns {
                    "Go functions' ret probes trap whatever the build (no Go compiler flag gives a patchable \
                     entry or return); recording their calls only (-e call) removes those."
                } else {
                    "No Go compiler flag gives Go functions a patchable entry."
                }
                .to_string(),
            );
        }
        Some(ProbeSummary { line, advice: Some(advice.join(" ")) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ON: KernelProbes = KernelProbes { optimizes_nop5: true };
    const OFF: KernelProbes = KernelProbes { optimizes_nop5: false };

    fn entry(bytes: &[u8], file_offset: u64, kernel: KernelProbes) -> EntryPoint {
        let code = FunctionCode::decode(bytes, 0x401000).unwrap();
        native_entry(&code, bytes, file_offset, kernel)
    }

    const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];
    const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
    const LEA_RET: [u8; 5] = [0x48, 0x8d, 0x47, 0x01, 0xc3]; // lea rax,[rdi+1]; ret

    fn concat(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn the_four_builds_of_work() {
        // -pg -mfentry -mnop-mcount
        let b = concat(&[&NOP5, &LEA_RET]);
        assert_eq!(entry(&b, 0x1230, ON), EntryPoint { offset: 0, path: ProbePath::Optimized });
        // the same with -fcf-protection: the probe moves onto the nop
        let b = concat(&[&ENDBR64, &NOP5, &LEA_RET]);
        assert_eq!(entry(&b, 0x1230, ON), EntryPoint { offset: 4, path: ProbePath::Optimized });
        // plain -O2
        assert_eq!(entry(&LEA_RET, 0x1220, ON), EntryPoint { offset: 0, path: ProbePath::Trap });
        // -fpatchable-function-entry=5 (GCC: five one-byte nops)
        let b = concat(&[&[0x90; 5], &LEA_RET]);
        assert_eq!(entry(&b, 0x1230, ON), EntryPoint { offset: 0, path: ProbePath::Emulated });
        // ... with -fcf-protection: onto the first nop
        let b = concat(&[&ENDBR64, &[0x90; 5], &LEA_RET]);
        assert_eq!(entry(&b, 0x1230, ON), EntryPoint { offset: 4, path: ProbePath::Emulated });
        // plain with -fcf-protection: nothing better than the entry
        let b = concat(&[&ENDBR64, &LEA_RET]);
        assert_eq!(entry(&b, 0x1220, ON), EntryPoint { offset: 0, path: ProbePath::Trap });
    }

    #[test]
    fn frame_pointer_prologues_are_emulated() {
        // endbr64; push rbp; mov rbp,rsp; ...
        let b = concat(&[&ENDBR64, &[0x55, 0x48, 0x89, 0xe5, 0x5d], &[0xc3]]);
        assert_eq!(entry(&b, 0, ON), EntryPoint { offset: 4, path: ProbePath::Emulated });
        // push r15 (REX.B)
        assert_eq!(entry(&[0x41, 0x57, 0x41, 0x5f, 0xc3], 0, ON).path, ProbePath::Emulated);
    }

    #[test]
    fn nop5_rules() {
        // LLVM's patchable entry: nopl 0x8(%rax,%rax,1) is a 5-byte nopl too.
        let b = concat(&[&[0x0f, 0x1f, 0x44, 0x00, 0x08], &LEA_RET]);
        assert_eq!(entry(&b, 0, ON).path, ProbePath::Optimized);
        // Crossing a page: emulated.
        let b = concat(&[&NOP5, &LEA_RET]);
        assert_eq!(entry(&b, 4096 - 3, ON).path, ProbePath::Emulated);
        // A kernel without the uprobe syscall emulates it.
        assert_eq!(entry(&b, 0, OFF).path, ProbePath::Emulated);
        // After an endbr64 that sits at the page's end, the nop is on the next page: fine.
        let b = concat(&[&ENDBR64, &NOP5, &LEA_RET]);
        assert_eq!(entry(&b, 4096 - 4, ON), EntryPoint { offset: 4, path: ProbePath::Optimized });
    }

    #[test]
    fn never_moves_onto_a_branch_target() {
        // endbr64; nop5; dec rdi; jnz <nop5>; ret
        let b = concat(&[&ENDBR64, &NOP5, &[0x48, 0xff, 0xcf, 0x75, 0xf6, 0xc3]]);
        let code = FunctionCode::decode(&b, 0x401000).unwrap();
        assert!(is_branch_target(code.instructions(), 0x401004));
        assert_eq!(entry(&b, 0, ON), EntryPoint { offset: 0, path: ProbePath::Trap });
    }

    #[test]
    fn branches_and_others() {
        let p = |b: &[u8]| classify_at(b, 0x1000, 0, ON);
        assert_eq!(p(&[0xe9, 0, 0, 0, 0]), ProbePath::Emulated); // jmp rel32
        assert_eq!(p(&[0xeb, 0]), ProbePath::Emulated); // jmp rel8
        assert_eq!(p(&[0xe8, 0, 0, 0, 0]), ProbePath::Emulated); // call rel32
        assert_eq!(p(&[0x74, 0]), ProbePath::Emulated); // je rel8
        assert_eq!(p(&[0x66, 0x90]), ProbePath::Emulated); // xchg ax,ax
        assert_eq!(p(&[0xc3]), ProbePath::Trap); // ret
        assert_eq!(p(&ENDBR64), ProbePath::Trap);
        assert_eq!(p(&[0x48, 0x83, 0xec, 0x18]), ProbePath::Trap); // sub rsp,0x18
        assert_eq!(p(&[0xff, 0xe0]), ProbePath::Trap); // jmp rax
    }

    #[test]
    fn summary_names_the_slow_ones() {
        let native = |_: &str| false;
        let mut paths = ProbePaths::default();
        assert_eq!(paths.summary(native, true, ON), None);
        paths.add("work", ProbePath::Optimized);
        assert_eq!(
            paths.summary(native, true, ON).unwrap(),
            ProbeSummary { line: "probes: 1 optimized, 0 emulated, 0 trap".into(), advice: None }
        );
        for n in ["a", "b", "c", "d", "e", "f"] {
            paths.add(n, ProbePath::Trap);
        }
        let ProbeSummary { line, advice } = paths.summary(native, true, ON).unwrap();
        assert_eq!(
            line,
            "probes: 1 optimized, 0 emulated, 6 trap; slow (a trap and a single-step, ~15 µs a hit): a, b, c, d, e, ..."
        );
        let advice = advice.unwrap();
        assert!(advice.starts_with("For the fast path give functions a 5-byte nop entry: C/C++"), "{advice}");
        assert!(advice.contains("-mnop-mcount") && advice.contains("force-frame-pointers"), "{advice}");
        // Before 6.18 the nop is emulated, not optimized: the advice says what it buys there.
        let advice = paths.summary(native, true, OFF).unwrap().advice.unwrap();
        assert!(
            advice.contains("5-byte nop entry (one trap, emulated, on this kernel; no trap from Linux 6.18): C/C++"),
            "{advice}"
        );
        assert!(!advice.contains("Go"), "{advice}");
    }

    /// Go functions get advice that fits Go: no C or Rust compiler flags for them.
    #[test]
    fn go_functions_are_not_told_compiler_flags() {
        let mut paths = ProbePaths::default();
        paths.add("main.work", ProbePath::Trap);
        paths.add("main.main", ProbePath::Trap);
        let go = |f: &str| f.starts_with("main.");
        let ProbeSummary { line, advice } = paths.summary(go, true, ON).unwrap();
        assert!(line.starts_with("probes: 0 optimized, 0 emulated, 2 trap; slow"), "{line}");
        assert!(line.ends_with(": main.work, main.main"), "{line}");
        let advice = advice.unwrap();
        assert!(advice.starts_with("Go functions' ret probes trap whatever the build"), "{advice}");
        assert!(advice.contains("(-e call)"), "{advice}");
        // Calls only: no ret probe to blame, no -e call to advise.
        let calls_only = paths.summary(go, false, ON).unwrap().advice.unwrap();
        assert_eq!(calls_only, "No Go compiler flag gives Go functions a patchable entry.");
        for flag in ["gcc", "clang", "Rust", "C/C++", "5-byte nop"] {
            assert!(!advice.contains(flag), "{flag} in {advice}");
        }
        // Mixed: each gets its own advice, the flags said to be for C, C++ and Rust.
        paths.add("work", ProbePath::Trap);
        let advice = paths.summary(go, true, ON).unwrap().advice.unwrap();
        assert!(advice.contains("give C, C++ and Rust functions a 5-byte nop entry"), "{advice}");
        assert!(advice.contains("Go functions' ret probes trap"), "{advice}");
    }
}
