//! Compiles the C and C++ fixtures (their paths reach the tests as `FIXTURE_*` variables), and the
//! Perfetto protos that `tracer` writes with (`tracer-user/proto/`), so that the tests decode its
//! Perfetto traces with the published definitions rather than with the tracer's own code.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?} failed: {status}");
}

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    let cc = cc::Build::new().cargo_metadata(false).get_compiler().path().to_path_buf();
    let cxx = cc::Build::new().cpp(true).cargo_metadata(false).get_compiler().path().to_path_buf();
    let src = Path::new("fixtures");
    println!("cargo::rerun-if-changed=fixtures");

    let calls = out.join("calls");
    run(Command::new(&cc).args(["-O0", "-pthread", "-o"]).arg(&calls).arg(src.join("c/calls.c")));

    // The same program, stripped: only .dynsym (every global, thanks to -rdynamic) is left.
    let stripped = out.join("calls_stripped");
    run(Command::new(&cc).args(["-O0", "-pthread", "-rdynamic", "-o"]).arg(&stripped).arg(src.join("c/calls.c")));
    run(Command::new("strip").arg(&stripped));

    // Non-PIE, with a 5-byte nop at every function entry (-pg at compile time only: linking with
    // -pg would add gprof's start-up and gmon.out).
    let bench_obj = out.join("bench.o");
    run(Command::new(&cc)
        .args(["-c", "-O2", "-fno-pie", "-pg", "-mfentry", "-mnop-mcount", "-o"])
        .arg(&bench_obj)
        .arg(src.join("c/bench.c")));
    let bench = out.join("bench");
    run(Command::new(&cc).args(["-no-pie", "-o"]).arg(&bench).arg(&bench_obj));

    let demo = out.join("client_server_demo");
    run(Command::new(&cc).args(["-O0", "-pthread", "-o"]).arg(&demo).arg(src.join("c/client_server_demo.c")));

    let ipc = out.join("ipc");
    run(Command::new(&cc).args(["-O0", "-o"]).arg(&ipc).arg(src.join("c/ipc.c")));

    let timing = out.join("timing");
    run(Command::new(&cc).args(["-O0", "-pthread", "-o"]).arg(&timing).arg(src.join("c/timing.c")));

    let shapes = out.join("shapes");
    run(Command::new(&cxx).args(["-O0", "-o"]).arg(&shapes).arg(src.join("cpp/shapes.cpp")));

    // USDT probes made with <sys/sdt.h>: at -O0 their arguments are in memory (-N(%rbp)), at -O2
    // in registers and as sym(%rip).
    let sdt = |name: &str, opt: &str| {
        let path = out.join(name);
        run(Command::new(&cc)
            .args([opt, "-Wall", "-o"])
            .arg(&path)
            .arg(src.join("c/sdt_probes.c"))
            .arg(src.join("c/sdt_gated.c")));
        path
    };
    let sdt_o0 = sdt("sdt_probes_o0", "-O0");
    let sdt_o2 = sdt("sdt_probes_o2", "-O2");

    // Program events through the C header, as C and as C++.
    let include = Path::new("../tracer-events/include");
    println!("cargo::rerun-if-changed=../tracer-events/include");
    let events_c = out.join("events_c");
    run(Command::new(&cc)
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(include)
        .arg("-o")
        .arg(&events_c)
        .arg(src.join("c/events.c")));
    let events_cxx = out.join("events_cxx");
    run(Command::new(&cxx)
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-x", "c++", "-I"])
        .arg(include)
        .arg("-o")
        .arg(&events_cxx)
        .arg(src.join("c/events.c")));

    let throws = out.join("throws");
    run(Command::new(&cxx).args(["-O2", "-o"]).arg(&throws).arg(src.join("cpp/throws.cpp")));

    for (name, path) in [
        ("CALLS", &calls),
        ("CALLS_STRIPPED", &stripped),
        ("BENCH", &bench),
        ("SHAPES", &shapes),
        ("CLIENT_SERVER_DEMO", &demo),
        ("IPC", &ipc),
        ("TIMING", &timing),
        ("SDT_PROBES_O0", &sdt_o0),
        ("SDT_PROBES_O2", &sdt_o2),
        ("EVENTS_C", &events_c),
        ("EVENTS_CXX", &events_cxx),
        ("THROWS", &throws),
    ] {
        println!("cargo::rustc-env=FIXTURE_{name}={}", path.display());
    }

    println!("cargo::rerun-if-changed=../tracer-user/proto");
    let descriptors = protox::compile(["protos/perfetto/trace/trace.proto"], ["../tracer-user/proto"])
        .unwrap_or_else(|e| panic!("cannot compile the Perfetto protos: {e:?}"));
    prost_build::Config::new()
        .compile_fds(descriptors)
        .unwrap_or_else(|e| panic!("cannot generate Rust for the Perfetto protos: {e}"));
}
