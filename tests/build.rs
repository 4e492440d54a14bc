//! Compiles the C, C++, Rust and Go fixtures (their paths reach the tests as `FIXTURE_*` variables), and the
//! Perfetto protos that `tracer` writes with (`tracer-user/proto/`), so that the tests decode its
//! Perfetto traces with the published definitions rather than with the tracer's own code.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (`cargo xtask setup` installs it)"));
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
        .args(["-c", "-O2", "-fno-pie", "-pg", "-mfentry", "-mnop-mcount", "-fcf-protection=none", "-o"])
        .arg(&bench_obj)
        .arg(src.join("c/bench.c")));
    let bench = out.join("bench");
    run(Command::new(&cc).args(["-no-pie", "-o"]).arg(&bench).arg(&bench_obj));

    // The parameters benchmark: built as bench is, with DWARF, and the same file without it.
    let bench_params_obj = out.join("bench_params.o");
    run(Command::new(&cc)
        .args(["-c", "-g", "-O2", "-fno-pie", "-pg", "-mfentry", "-mnop-mcount", "-fcf-protection=none", "-o"])
        .arg(&bench_params_obj)
        .arg(src.join("c/bench_params.c")));
    let bench_params = out.join("bench_params");
    run(Command::new(&cc).args(["-no-pie", "-o"]).arg(&bench_params).arg(&bench_params_obj));
    let bench_params_nodwarf = out.join("bench_params_nodwarf");
    run(Command::new("objcopy").arg("--strip-debug").arg(&bench_params).arg(&bench_params_nodwarf));

    // `work()` of the same program built the other three ways of issue 12's table, for probe
    // placement: with CET (`endbr64`, then the 5-byte nop), plain (`lea` first), and with GCC's
    // patchable entry (five one-byte nops).
    let mut work_builds = Vec::new();
    for (name, flags) in [
        ("bench_cet", &["-pg", "-mfentry", "-mnop-mcount", "-fcf-protection=full"][..]),
        ("bench_plain", &["-fcf-protection=none"][..]),
        ("bench_pfe5", &["-fpatchable-function-entry=5", "-fcf-protection=none"][..]),
    ] {
        let obj = out.join(format!("{name}.o"));
        run(Command::new(&cc)
            .args(["-c", "-O2", "-fno-pie"])
            .args(flags)
            .arg("-o")
            .arg(&obj)
            .arg(src.join("c/bench.c")));
        let exe = out.join(name);
        run(Command::new(&cc).args(["-no-pie", "-o"]).arg(&exe).arg(&obj));
        work_builds.push((name.to_uppercase(), exe));
    }

    // Breakpoints and watchpoints: locals in memory (-O0) and in registers (-O1).
    let mut breakpoint_builds = Vec::new();
    for (name, opt) in [("breakpoints_o0", "-O0"), ("breakpoints_o1", "-O1")] {
        let exe = out.join(name);
        run(Command::new(&cc).args(["-g", opt, "-pthread", "-o"]).arg(&exe).arg(src.join("c/breakpoints.c")));
        breakpoint_builds.push((name.to_uppercase(), exe));
    }
    // The same program with `counter` renamed `tally` (at the same address: nothing else differs)
    // and written with other values: what the first build execs in the watchpoint-at-exec test.
    let renamed = out.join("breakpoints_renamed");
    run(Command::new(&cc)
        .args(["-g", "-O0", "-pthread", "-Dcounter=tally", "-DSTEP=3", "-o"])
        .arg(&renamed)
        .arg(src.join("c/breakpoints.c")));
    breakpoint_builds.push(("BREAKPOINTS_RENAMED".to_string(), renamed));

    let demo = out.join("client_server_demo");
    run(Command::new(&cc).args(["-O0", "-pthread", "-o"]).arg(&demo).arg(src.join("c/client_server_demo.c")));

    let ipc = out.join("ipc");
    run(Command::new(&cc).args(["-O0", "-pthread", "-o"]).arg(&ipc).arg(src.join("c/ipc.c")));

    let timing = out.join("timing");
    run(Command::new(&cc).args(["-O0", "-pthread", "-o"]).arg(&timing).arg(src.join("c/timing.c")));

    let shapes = out.join("shapes");
    run(Command::new(&cxx).args(["-O0", "-o"]).arg(&shapes).arg(src.join("cpp/shapes.cpp")));

    // Parameters at source level (debuginfo tests): the C fixture at -O0 (gcc's default DWARF 5),
    // at -O2 (location lists), at -O2 with DWARF 4 (.debug_loc), and stripped with its DWARF in a
    // separate file beside it, found through .gnu_debuglink; the C++ fixture at -O0 and -O2; the
    // Rust fixture at -O0 and -O3, by the rustc that builds the tests.
    let params_c = src.join("c/params.c");
    let params = out.join("params");
    run(Command::new(&cc).args(["-g", "-O0", "-o"]).arg(&params).arg(&params_c));
    // Predicates (filters tests): at -O0 (parameters where the ABI puts them), and for the
    // benchmark at -O2 with 5-byte nop entries (the kernel's fast probe path).
    let filters = out.join("filters");
    run(Command::new(&cc).args(["-g", "-O0", "-o"]).arg(&filters).arg(src.join("c/filters.c")));
    let filters_nop_obj = out.join("filters_nop.o");
    run(Command::new(&cc)
        .args(["-c", "-g", "-O2", "-fno-pie", "-pg", "-mfentry", "-mnop-mcount", "-fcf-protection=none", "-o"])
        .arg(&filters_nop_obj)
        .arg(src.join("c/filters.c")));
    let filters_nop = out.join("filters_nop");
    run(Command::new(&cc).args(["-no-pie", "-o"]).arg(&filters_nop).arg(&filters_nop_obj));
    // Strings in pages of .rodata that the program has not touched (sleepable string reads).
    let cold_strings = out.join("cold_strings");
    run(Command::new(&cc).args(["-g", "-O2", "-o"]).arg(&cold_strings).arg(src.join("c/cold_strings.c")));
    let params_o2 = out.join("params_o2");
    run(Command::new(&cc).args(["-g", "-O2", "-o"]).arg(&params_o2).arg(&params_c));
    let params_dwarf4 = out.join("params_dwarf4");
    run(Command::new(&cc).args(["-g", "-gdwarf-4", "-O2", "-o"]).arg(&params_dwarf4).arg(&params_c));
    let params_stripped = out.join("params_stripped");
    let params_debug = out.join("params_stripped.debug");
    // -rdynamic: the functions stay in .dynsym once stripped, as a shared library's do.
    run(Command::new(&cc).args(["-g", "-O0", "-rdynamic", "-o"]).arg(&params_stripped).arg(&params_c));
    run(Command::new("objcopy").arg("--only-keep-debug").arg(&params_stripped).arg(&params_debug));
    run(Command::new("strip").arg(&params_stripped));
    run(Command::new("objcopy").arg(format!("--add-gnu-debuglink={}", params_debug.display())).arg(&params_stripped));
    // Functions in two source files, for `-f 'SOURCE_FILE:NAME'`.
    let twofiles = out.join("twofiles");
    run(Command::new(&cc)
        .args(["-g", "-O0", "-o"])
        .arg(&twofiles)
        .arg(src.join("c/twofiles/main.c"))
        .arg(src.join("c/twofiles/net.c")));
    let params_cpp_src = src.join("cpp/params.cpp");
    let params_cpp = out.join("params_cpp");
    run(Command::new(&cxx).args(["-g", "-O0", "-o"]).arg(&params_cpp).arg(&params_cpp_src));
    let params_cpp_o2 = out.join("params_cpp_o2");
    run(Command::new(&cxx).args(["-g", "-O2", "-o"]).arg(&params_cpp_o2).arg(&params_cpp_src));
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let params_rs = src.join("rust/params.rs");
    let rust_params = out.join("rust_params");
    let rust_params_o3 = out.join("rust_params_o3");
    for (path, opt) in [(&rust_params, "opt-level=0"), (&rust_params_o3, "opt-level=3")] {
        run(Command::new(&rustc)
            .args(["--edition", "2024", "--crate-type", "bin", "-g", "-C", opt, "-o"])
            .arg(path)
            .arg(&params_rs)
            .env_remove("CARGO_ENCODED_RUSTFLAGS"));
    }

    // Go, with the toolchain `cargo xtask setup` installs (Debian's golang-go): offline, its
    // caches inside OUT_DIR, no cgo. Once with DWARF (where the tracer reads the goroutine id's
    // offset), once without (`-w`: the offset comes from the Go version in the build info), and
    // stripped as distributions ship Go (`-s -w`: functions only in `.gopclntab`), as an
    // executable and position-independent (the table in `.data.rel.ro.gopclntab`).
    let go = std::env::var_os("GO").unwrap_or_else(|| "go".into());
    let go_build = |dir: &Path| {
        let mut cmd = Command::new(&go);
        cmd.current_dir(dir)
            .args(["build", "-trimpath"])
            .env("GOCACHE", out.join("go-cache"))
            .env("GOPATH", out.join("go-path"))
            .env("GOFLAGS", "-mod=mod")
            .env("GOPROXY", "off")
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", "0");
        cmd
    };
    let gofixture = out.join("gofixture");
    let gofixture_nodwarf = out.join("gofixture_nodwarf");
    let gofixture_stripped = out.join("gofixture_stripped");
    let gofixture_stripped_pie = out.join("gofixture_stripped_pie");
    for (path, flags) in [
        (&gofixture, &["-ldflags="][..]),
        (&gofixture_nodwarf, &["-ldflags=-w"]),
        (&gofixture_stripped, &["-ldflags=-s -w"]),
        (&gofixture_stripped_pie, &["-ldflags=-s -w", "-buildmode=pie"]),
    ] {
        run(go_build(&src.join("go")).args(flags).arg("-o").arg(path).arg("."));
    }
    // Debian's gofmt is stripped; the same gofmt rebuilt from its GOROOT's sources (golang-go
    // brings them), with the same compiler, keeps its symbols.
    let goroot = Command::new(&go).args(["env", "GOROOT"]).output().expect("go env GOROOT");
    assert!(goroot.status.success(), "go env GOROOT: {goroot:?}");
    let goroot = PathBuf::from(String::from_utf8(goroot.stdout).expect("GOROOT in UTF-8").trim());
    let debian_gofmt = goroot.join("bin/gofmt");
    let gofmt_symbols = out.join("gofmt_symbols");
    run(go_build(&out).arg("-o").arg(&gofmt_symbols).arg("cmd/gofmt"));

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

    // Stacks left by unwinding (return probes must not break it): C++ exceptions, longjmp, Rust
    // panics, each through three traced levels.
    let unwinds_cpp = out.join("unwinds_cpp");
    run(Command::new(&cxx).args(["-O2", "-o"]).arg(&unwinds_cpp).arg(src.join("cpp/unwinds.cpp")));
    let longjmps = out.join("longjmps");
    run(Command::new(&cc).args(["-O2", "-o"]).arg(&longjmps).arg(src.join("c/longjmps.c")));
    let unwinds_rust = out.join("unwinds_rust");
    run(Command::new(&rustc)
        .args(["--edition", "2024", "--crate-type", "bin", "-C", "opt-level=2", "-C", "panic=unwind", "-o"])
        .arg(&unwinds_rust)
        .arg(src.join("rust/unwinds.rs"))
        .env_remove("CARGO_ENCODED_RUSTFLAGS"));

    for (name, path) in [
        ("PARAMS", &params),
        ("FILTERS", &filters),
        ("FILTERS_NOP", &filters_nop),
        ("PARAMS_O2", &params_o2),
        ("PARAMS_DWARF4", &params_dwarf4),
        ("PARAMS_STRIPPED", &params_stripped),
        ("PARAMS_CPP", &params_cpp),
        ("PARAMS_CPP_O2", &params_cpp_o2),
        ("RUST_PARAMS", &rust_params),
        ("RUST_PARAMS_O3", &rust_params_o3),
        ("CALLS", &calls),
        ("CALLS_STRIPPED", &stripped),
        ("BENCH", &bench),
        ("BENCH_PARAMS", &bench_params),
        ("BENCH_PARAMS_NODWARF", &bench_params_nodwarf),
        ("COLD_STRINGS", &cold_strings),
        ("TWOFILES", &twofiles),
        ("SHAPES", &shapes),
        ("CLIENT_SERVER_DEMO", &demo),
        ("IPC", &ipc),
        ("TIMING", &timing),
        ("SDT_PROBES_O0", &sdt_o0),
        ("SDT_PROBES_O2", &sdt_o2),
        ("EVENTS_C", &events_c),
        ("EVENTS_CXX", &events_cxx),
        ("THROWS", &throws),
        ("UNWINDS_CPP", &unwinds_cpp),
        ("LONGJMPS", &longjmps),
        ("UNWINDS_RUST", &unwinds_rust),
        ("GOFIXTURE", &gofixture),
        ("GOFIXTURE_NODWARF", &gofixture_nodwarf),
        ("GOFIXTURE_STRIPPED", &gofixture_stripped),
        ("GOFIXTURE_STRIPPED_PIE", &gofixture_stripped_pie),
        ("DEBIAN_GOFMT", &debian_gofmt),
        ("GOFMT_SYMBOLS", &gofmt_symbols),
    ] {
        println!("cargo::rustc-env=FIXTURE_{name}={}", path.display());
    }
    for (name, path) in work_builds.iter().chain(&breakpoint_builds) {
        println!("cargo::rustc-env=FIXTURE_{name}={}", path.display());
    }

    println!("cargo::rerun-if-changed=../tracer-user/proto");
    let descriptors = protox::compile(["protos/perfetto/trace/trace.proto"], ["../tracer-user/proto"])
        .unwrap_or_else(|e| panic!("cannot compile the Perfetto protos: {e:?}"));
    prost_build::Config::new()
        .compile_fds(descriptors)
        .unwrap_or_else(|e| panic!("cannot generate Rust for the Perfetto protos: {e}"));
}
