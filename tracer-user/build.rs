//! Embeds the eBPF object that `cargo xtask build` built and named in `TRACER_EBPF_OBJECT`, and
//! generates the Perfetto trace types and the OTLP messages from the vendored `.proto` files.
//!
//! Without the object (a plain `cargo build`, `cargo clippy`, `cargo test` of the pure-logic
//! modules) an empty one is embedded and `tracer record` says how to build properly.
//!
//! The protos are compiled by `protox`, a protobuf compiler in Rust, so that no `protoc` has to be
//! installed; `prost-build` turns the descriptors into Rust.

use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo::rerun-if-env-changed=TRACER_EBPF_OBJECT");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let out = out_dir.join("tracer-ebpf.o");
    match env::var_os("TRACER_EBPF_OBJECT") {
        Some(path) => {
            let path = PathBuf::from(path);
            println!("cargo::rerun-if-changed={}", path.display());
            fs::copy(&path, &out).unwrap_or_else(|e| panic!("cannot copy the eBPF object {}: {e}", path.display()));
        }
        None => fs::write(&out, []).expect("write an empty eBPF object"),
    }

    println!("cargo::rerun-if-changed=proto");
    let descriptors = protox::compile(
        [
            "protos/perfetto/trace/trace.proto",
            // OTLP's request messages (the services in these files are not generated: no gRPC).
            "opentelemetry/proto/collector/trace/v1/trace_service.proto",
            "opentelemetry/proto/collector/logs/v1/logs_service.proto",
        ],
        ["proto"],
    )
    .unwrap_or_else(|e| panic!("cannot compile the Perfetto and OTLP protos: {e:?}"));
    prost_build::Config::new()
        // OTLP's comments hold indented JSON examples, which rustdoc would run as doctests.
        .disable_comments([".opentelemetry"])
        .compile_fds(descriptors)
        .unwrap_or_else(|e| panic!("cannot generate Rust for the Perfetto and OTLP protos: {e}"));
}
