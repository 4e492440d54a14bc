//! The layouts against the real processes: each fixture runs under ptrace, stopped at the first
//! instruction of every function it calls from `main` (where the entry uprobe fires) and at the
//! return address (where the return probe fires). The registers there, and the strings the probe
//! layout says to read, read from its memory exactly as the kernel program is to read them, are
//! formatted and compared with the values in the fixture sources' comments. This checks the
//! entry locations (the System V and Rust ABI models, and DWARF where it overrules them) against
//! what the compilers really did, before any kernel program reads them. No root needed: a
//! process may trace its own child.

use std::{collections::BTreeMap, os::unix::fs::FileExt as _, os::unix::process::CommandExt as _, path::Path};

use serde_json::{Value, json};
use tracer_tests::fixture;
use tracer_user::{
    debuginfo::{
        DebugInfo, DebugSearch,
        format::{format_params, format_return},
        layout::{
            CapturedString, DEFAULT_STRING_SIZE, FunctionLayout, ProbeLayout, Reg, Registers, StringKind, StringRead,
            StringStatus,
        },
        types::Kind,
    },
    functions::symbols::SymbolTable,
};

/// One call as the probes would see it.
#[derive(Debug)]
struct Call {
    params: Value,
    ret: Option<Value>,
}

/// Reads one string as the kernel program is to: a C string up to its NUL within `size + 1`
/// bytes, a slice up to its length; truncated past `size`.
fn capture(mem: &std::fs::File, read: &StringRead, regs: &Registers, size: u16) -> (StringStatus, Vec<u8>) {
    let ptr = regs.get(Reg::try_from(read.ptr).unwrap());
    if ptr == 0 {
        return (StringStatus::Null, Vec::new());
    }
    let size = size as usize;
    let slice_len = (read.kind == StringKind::Slice as u8).then(|| regs.get(Reg::try_from(read.len).unwrap()) as usize);
    let want = slice_len.map_or(size + 1, |l| l.min(size));
    let mut buf = vec![0u8; want];
    let mut got = 0;
    // A C string may end before a page that is not mapped: read byte runs until one fails.
    while got < want {
        match mem.read_at(&mut buf[got..], ptr + got as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    match slice_len {
        Some(_) if got < want => (StringStatus::Fault, Vec::new()),
        Some(len) => (if len > size { StringStatus::Truncated } else { StringStatus::Complete }, buf),
        None => match buf[..got].iter().position(|&b| b == 0) {
            Some(end) => (StringStatus::Complete, buf[..end].to_vec()),
            None if got == want => (StringStatus::Truncated, buf[..size].to_vec()),
            None => (StringStatus::Fault, Vec::new()),
        },
    }
}

fn peek(pid: libc::pid_t, addr: u64) -> u64 {
    unsafe {
        libc::ptrace(libc::PTRACE_PEEKDATA, pid, addr as *mut libc::c_void, std::ptr::null_mut::<libc::c_void>()) as u64
    }
}

fn poke(pid: libc::pid_t, addr: u64, word: u64) {
    let r = unsafe { libc::ptrace(libc::PTRACE_POKEDATA, pid, addr as *mut libc::c_void, word as *mut libc::c_void) };
    assert_eq!(r, 0, "poke {addr:#x}");
}

/// Puts an int3 at `addr`, returning the word it replaced.
fn breakpoint(pid: libc::pid_t, addr: u64) -> u64 {
    let word = peek(pid, addr);
    poke(pid, addr, (word & !0xff) | 0xcc);
    word
}

fn regs_of(pid: libc::pid_t) -> libc::user_regs_struct {
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    let r =
        unsafe { libc::ptrace(libc::PTRACE_GETREGS, pid, std::ptr::null_mut::<libc::c_void>(), &mut regs as *mut _) };
    assert_eq!(r, 0);
    regs
}

fn set_regs(pid: libc::pid_t, regs: &libc::user_regs_struct) {
    let r = unsafe { libc::ptrace(libc::PTRACE_SETREGS, pid, std::ptr::null_mut::<libc::c_void>(), regs as *const _) };
    assert_eq!(r, 0);
}

/// Where the file's addresses are in the process: its first mapping (PIE) or nothing (fixed).
fn load_bias(pid: libc::pid_t, path: &Path, data: &[u8]) -> u64 {
    use object::Object as _;
    if object::File::parse(data).unwrap().kind() != object::ObjectKind::Dynamic {
        return 0;
    }
    let real = std::fs::canonicalize(path).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let line = maps.lines().find(|l| l.ends_with(real.to_str().unwrap())).expect("the fixture is mapped");
    u64::from_str_radix(line.split('-').next().unwrap(), 16).unwrap()
}

/// Runs `path`, stopping at each of `functions` once, and returns each one's call.
fn trace(path: &Path, functions: &[&str]) -> BTreeMap<String, Call> {
    let data = std::fs::read(path).unwrap();
    let symbols = SymbolTable::parse(path, &data).unwrap();
    let found = DebugInfo::find(path, &data, &DebugSearch::default()).unwrap();
    let wanted: Vec<_> = functions
        .iter()
        .map(|name| symbols.functions.iter().find(|f| f.name == *name).unwrap_or_else(|| panic!("no symbol {name}")))
        .collect();
    let infos = found.info.unwrap().functions(&wanted.iter().map(|f| f.address).collect::<Vec<_>>()).unwrap();
    let layouts: Vec<FunctionLayout> = wanted
        .iter()
        .map(|f| FunctionLayout::new(infos[&f.address].signature.as_ref().unwrap(), DEFAULT_STRING_SIZE))
        .collect();

    let mut cmd = std::process::Command::new(path);
    cmd.stdout(std::process::Stdio::null());
    unsafe {
        cmd.pre_exec(|| {
            if libc::ptrace(
                libc::PTRACE_TRACEME,
                0,
                std::ptr::null_mut::<libc::c_void>(),
                std::ptr::null_mut::<libc::c_void>(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Reaped below by waitpid (std's Child would not see the ptrace stops).
    #[allow(clippy::zombie_processes)]
    let child = cmd.spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let _kill_on_failure = KillOnDrop(pid);
    let wait = || {
        let mut status = 0;
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        status
    };
    let status = wait();
    assert!(libc::WIFSTOPPED(status), "stopped at exec");
    let bias = load_bias(pid, path, &data);
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();

    // Entry breakpoints by address: (function index, original word).
    let mut entries: BTreeMap<u64, (usize, u64)> = BTreeMap::new();
    for (i, f) in wanted.iter().enumerate() {
        let addr = bias + f.address;
        entries.insert(addr, (i, breakpoint(pid, addr)));
    }
    let mut returns: BTreeMap<u64, (usize, u64)> = BTreeMap::new();
    let mut calls: BTreeMap<String, Call> = BTreeMap::new();
    let strings_of = |probe: &ProbeLayout, reads: &[StringRead], regs: &Registers| -> Vec<(StringStatus, Vec<u8>)> {
        reads.iter().map(|r| capture(&mem, r, regs, probe.string_size)).collect()
    };
    let mut signal = 0;
    loop {
        unsafe {
            libc::ptrace(libc::PTRACE_CONT, pid, std::ptr::null_mut::<libc::c_void>(), signal as *mut libc::c_void)
        };
        let status = wait();
        if libc::WIFEXITED(status) {
            assert_eq!(libc::WEXITSTATUS(status), 0, "{} exit status", path.display());
            break;
        }
        assert!(libc::WIFSTOPPED(status));
        signal = libc::WSTOPSIG(status);
        if signal != libc::SIGTRAP {
            continue;
        }
        signal = 0;
        let mut regs = regs_of(pid);
        let at = regs.rip - 1;
        if let Some((i, word)) = entries.remove(&at) {
            let layout = &layouts[i];
            let captured = Registers::at_entry([regs.rdi, regs.rsi, regs.rdx, regs.rcx, regs.r8, regs.r9]);
            let reads = &layout.probe.entry[..layout.probe.entry_strings as usize];
            let owned = strings_of(&layout.probe, reads, &captured);
            let strings: Vec<CapturedString> =
                owned.iter().map(|(s, b)| CapturedString { status: *s, bytes: b }).collect();
            let params = format_params(layout, &captured, &strings);
            calls.insert(
                wanted[i].name.clone(),
                Call { params: Value::Object(params.into_iter().collect()), ret: None },
            );
            poke(pid, at, word);
            let return_address = peek(pid, regs.rsp);
            returns.insert(return_address, (i, breakpoint(pid, return_address)));
        } else if let Some((i, word)) = returns.remove(&at) {
            let layout = &layouts[i];
            let captured = Registers::at_return(regs.rax, regs.rdx);
            let owned = strings_of(&layout.probe, std::slice::from_ref(&layout.probe.ret), &captured);
            let string = (layout.probe.ret.kind != StringKind::None as u8)
                .then(|| CapturedString { status: owned[0].0, bytes: &owned[0].1 });
            calls.get_mut(&wanted[i].name).unwrap().ret = format_return(layout, &captured, string.as_ref());
            poke(pid, at, word);
        } else {
            panic!("a trap at {at:#x} that is no breakpoint of ours");
        }
        regs.rip = at;
        set_regs(pid, &regs);
    }
    assert!(
        entries.is_empty(),
        "never called: {:?}",
        entries.values().map(|(i, _)| wanted[*i].name.clone()).collect::<Vec<_>>()
    );
    // Pointers differ from run to run: each is checked to be one, then compared as "<pointer>".
    for (i, f) in wanted.iter().enumerate() {
        let call = calls.get_mut(&f.name).unwrap();
        for p in &layouts[i].params {
            let v = &mut call.params[&p.name];
            if p.ty.kind == Kind::Pointer && v.is_string() {
                assert!(v.as_str().is_some_and(|s| s.starts_with("0x") && s != "0x0"), "{}: {v}", p.name);
                *v = json!("<pointer>");
            }
        }
    }
    calls
}

/// Kills the traced child if the test fails before it exits (a no-op once it is reaped).
struct KillOnDrop(libc::pid_t);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            unsafe {
                libc::kill(self.0, libc::SIGKILL);
                libc::waitpid(self.0, std::ptr::null_mut(), 0);
            }
        }
    }
}

fn unreadable(why: &str) -> Value {
    json!({ "unreadable": why })
}

fn check(calls: &BTreeMap<String, Call>, name: &str, params: Value, ret: Option<Value>) {
    let call = calls.get(name).unwrap_or_else(|| panic!("{name} not called"));
    assert_eq!(call.params, params, "{name} parameters");
    assert_eq!(call.ret, ret, "{name} return value");
}

const C_FUNCTIONS: &[&str] = &[
    "ints",
    "more_ints",
    "text",
    "greet",
    "floats",
    "structs",
    "eight",
    "make_big",
    "swap_wide",
    "wide_int",
    "sum",
    "nothing",
];

fn check_c(fixture_name: &str) {
    let calls = trace(&fixture(fixture_name), C_FUNCTIONS);
    let float = unreadable("in a floating-point register");
    let stack_spilled = unreadable("on the stack: no integer register was left");
    check(
        &calls,
        "ints",
        json!({"c": -5, "s": -300, "i": -70000, "l": -5_000_000_000i64, "uc": 200, "us": 60000}),
        Some(json!(-42)),
    );
    check(
        &calls,
        "more_ints",
        json!({"ui": 4_000_000_000u32, "ul": 18_000_000_000_000_000_000u64, "ll": -9_000_000_000_000_000_000i64, "t": 7, "b": true}),
        Some(json!(18_000_000_000_000_000_000u64)),
    );
    check(
        &calls,
        "text",
        json!({"c": "A", "name": "alice", "buf": "bob", "bytes": "<pointer>", "col": "BLUE", "lv": "HIGH", "p": stack_spilled}),
        Some(json!(true)),
    );
    check(&calls, "greet", json!({"who": "carol"}), Some(json!("hello")));
    check(
        &calls,
        "floats",
        json!({"d": float, "f": float, "after": 7, "ld": unreadable("passed in memory, on the stack"), "last": 8}),
        Some(float.clone()),
    );
    check(
        &calls,
        "structs",
        json!({
            "p": unreadable("a struct of 8 bytes: members are not decoded"),
            "w": unreadable("a struct of 16 bytes: members are not decoded"),
            "m": unreadable("partly in a floating-point register"),
            "b": unreadable("passed in memory, on the stack"),
            "u": unreadable("a union of 4 bytes: members are not decoded"),
            "after": 11,
        }),
        Some(json!(12)),
    );
    check(
        &calls,
        "eight",
        json!({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": stack_spilled, "h": stack_spilled}),
        Some(json!(9)),
    );
    check(
        &calls,
        "make_big",
        json!({"seed": 3, "w": unreadable("a struct of 16 bytes: members are not decoded")}),
        Some(unreadable("passed by reference")),
    );
    check(
        &calls,
        "swap_wide",
        json!({"w": unreadable("a struct of 16 bytes: members are not decoded")}),
        Some(unreadable("a struct of 16 bytes: members are not decoded")),
    );
    let v = if fixture_name == "params" {
        json!(((1u128 << 64) | 2).to_string())
    } else {
        unreadable("DWARF says rsi:rdi, the calling convention rdi:rsi")
    };
    check(&calls, "wide_int", json!({"v": v, "after": 9}), Some(json!(((1u128 << 64) | 3).to_string())));
    check(&calls, "sum", json!({"count": 2}), Some(json!(2)));
    check(&calls, "nothing", json!({}), None);
}

#[test]
fn c_fixture_at_o0_reads_the_values_it_was_called_with() {
    check_c("params");
}

#[test]
fn c_fixture_at_o2_reads_the_values_it_was_called_with() {
    check_c("params_o2");
}

#[test]
fn cpp_fixture_reads_the_values_it_was_called_with() {
    for name in ["params_cpp", "params_cpp_o2"] {
        let add = "shop::Counter::add(char const*, int, shop::Size)";
        let calm = "shop::Counter::calm(shop::Mood) const";
        let refs = "shop::refs(shop::Counter&, long&, long const&, char const*&)";
        let take = "shop::take(shop::Ticket, int)";
        let calls = trace(&fixture(name), &[add, calm, refs, take]);
        check(&calls, add, json!({"this": "<pointer>", "what": "apples", "n": 4, "size": "Large"}), Some(json!(14)));
        check(&calls, calm, json!({"this": "<pointer>", "mood": "Angry"}), Some(json!(false)));
        check(&calls, refs, json!({"c": "<pointer>", "n": "<pointer>", "m": "<pointer>", "s": "<pointer>"}), None);
        check(&calls, take, json!({"t": unreadable("passed by reference"), "after": 5}), Some(json!(82)));
    }
}

const RUST_FUNCTIONS: &[&str] = &[
    "params::greet",
    "params::signed_and_small",
    "params::wide",
    "params::flags",
    "params::scaled",
    "params::shapes",
    "params::hello",
    "params::make_big",
];

#[test]
fn rust_fixture_at_o0_reads_the_values_it_was_called_with() {
    let calls = trace(&fixture("rust_params"), RUST_FUNCTIONS);
    check(&calls, "params::greet", json!({"name": "alice", "times": 3}), Some(json!(15)));
    check(
        &calls,
        "params::signed_and_small",
        json!({"a": -5, "b": -300, "c": -70000, "d": -5_000_000_000i64, "e": 200, "f": 60000}),
        Some(json!(-5_000_010_105i64)),
    );
    check(
        &calls,
        "params::wide",
        json!({"g": 4_000_000_000u32, "h": 18_000_000_000_000_000_000u64, "i": -7, "j": 7, "k": i128::MIN.to_string()}),
        Some(json!("-170141183460469231713687303711884105728")),
    );
    check(
        &calls,
        "params::flags",
        json!({"on": true, "letter": "é", "color": "Blue", "level": "Low"}),
        Some(json!("é")),
    );
    check(
        &calls,
        "params::scaled",
        json!({"x": unreadable("in a floating-point register"), "n": 9}),
        Some(unreadable("in a floating-point register")),
    );
    check(
        &calls,
        "params::shapes",
        json!({
            "m": unreadable("a struct of 8 bytes: members are not decoded"),
            "p": unreadable("a struct of 16 bytes: members are not decoded"),
            "s": unreadable("a struct of 4 bytes: members are not decoded"),
            "big": unreadable("passed by reference"),
            "after": 10,
        }),
        Some(json!(52)),
    );
    check(&calls, "params::hello", json!({"name": "bob"}), Some(json!("hello, bob")));
    check(&calls, "params::make_big", json!({"seed": 7}), Some(unreadable("passed by reference")));
}

#[test]
fn rust_fixture_at_o3_reads_the_values_it_was_called_with() {
    let calls = trace(&fixture("rust_params_o3"), RUST_FUNCTIONS);
    // The optimiser moved `times` to rsi (see tests/debuginfo.rs): following DWARF reads 3.
    check(&calls, "params::greet", json!({"name": unreadable("partly optimized out"), "times": 3}), Some(json!(15)));
    check(
        &calls,
        "params::signed_and_small",
        json!({"a": -5, "b": -300, "c": -70000, "d": -5_000_000_000i64, "e": 200, "f": 60000}),
        Some(json!(-5_000_010_105i64)),
    );
    check(
        &calls,
        "params::flags",
        json!({"on": true, "letter": "é", "color": "Blue", "level": "Low"}),
        Some(json!("é")),
    );
    check(&calls, "params::hello", json!({"name": "bob"}), Some(json!("hello, bob")));
    check(&calls, "params::make_big", json!({"seed": 7}), Some(unreadable("passed by reference")));
    check(
        &calls,
        "params::shapes",
        json!({
            "m": unreadable("a struct of 8 bytes: members are not decoded"),
            "p": unreadable("a struct of 16 bytes: members are not decoded"),
            "s": unreadable("partly optimized out"),
            "big": unreadable("optimized out"),
            "after": unreadable("in a stack slot, not yet written at entry"),
        }),
        Some(json!(52)),
    );
}
