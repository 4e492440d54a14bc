//! The DWARF module on real fixture binaries.

use std::path::Path;

use tracer_user::{
    debuginfo::{DebugInfo, DebugSearch, FunctionInfo, abi::Place},
    symbols::SymbolTable,
};
use tracer_tests::fixture;

fn place(p: &Result<Place, tracer_user::debuginfo::abi::Unknown>) -> String {
    match p {
        Ok(Place::Reg(r)) => r.name().into(),
        Ok(Place::RegPair(a, b)) => format!("{}:{}", a.name(), b.name()),
        Ok(Place::Reference(r)) => format!("&{}", r.name()),
        Ok(Place::Stack { offset, spilled }) => format!("stack+{offset}{}", if *spilled { " (spilled)" } else { "" }),
        Ok(Place::Float) => "xmm".into(),
        Ok(Place::PartlyFloat) => "int+xmm".into(),
        Ok(Place::Split) => "split".into(),
        Ok(Place::Nothing) => "nothing".into(),
        Err(e) => format!("unknown: {e:?}"),
    }
}

fn dump(path: &Path) {
    let data = std::fs::read(path).unwrap();
    let symbols = SymbolTable::parse(path, &data).unwrap();
    let found = DebugInfo::find(path, &data, &DebugSearch::default()).unwrap();
    let info = found.info.unwrap();
    let addrs: Vec<u64> = symbols.functions.iter().map(|f| f.address).collect();
    let fns = info.functions(&addrs).unwrap();
    for f in &symbols.functions {
        let Some(i) = fns.get(&f.address) else { continue };
        if i.file.as_ref().is_none_or(|p| !p.to_string_lossy().contains("fixtures")) {
            continue;
        }
        show(&f.name, i);
    }
}

fn show(sym: &str, i: &FunctionInfo) {
    println!("{sym} {:?}:{:?} {:?}", i.file, i.line, i.language);
    if let Some(s) = &i.signature {
        println!("  optimized {} variadic {}", s.optimized, s.variadic);
        for p in &s.params {
            println!("  {:?}: {} [{}] = {} (abi {}, dwarf {:?}) {:?}", p.name, p.ty.name, p.ty.size, place(&p.entry), place(&p.abi), p.dwarf, p.ty.kind);
        }
        if let Some(r) = &s.ret {
            println!("  -> {} = {}", r.ty.name, place(&r.place));
        }
    }
}

#[test]
fn dump_all() {
    for f in ["params", "params_o2", "params_dwarf4", "params_cpp", "params_cpp_o2", "rust_params", "rust_params_o3"] {
        println!("==== {f}");
        dump(&fixture(f));
    }
}
