//! Embeds the eBPF object that `cargo xtask build` built and named in `TRACER_EBPF_OBJECT`.
//!
//! Without it (a plain `cargo build`, `cargo clippy`, `cargo test` of the pure-logic modules) an
//! empty object is embedded and `tracer record` says how to build properly.

use std::{env, fs, path::PathBuf};

fn main() {
    println!("cargo::rerun-if-env-changed=TRACER_EBPF_OBJECT");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("tracer-ebpf.o");
    match env::var_os("TRACER_EBPF_OBJECT") {
        Some(path) => {
            let path = PathBuf::from(path);
            println!("cargo::rerun-if-changed={}", path.display());
            fs::copy(&path, &out).unwrap_or_else(|e| panic!("cannot copy the eBPF object {}: {e}", path.display()));
        }
        None => fs::write(&out, []).expect("write an empty eBPF object"),
    }
}
