//! Reads the DWARF of every function of each ELF file given, as the tracer will at attach, and
//! prints how long that took: `cargo run --release -p tracer-user --example debuginfo_read -- FILE...`
//! (`cargo xtask bench --only dwarf` runs it on the fixtures, libc and the tracer itself).
//! With `--show NAME`, prints what it found for the functions whose symbol contains NAME.

use std::{path::PathBuf, time::Instant};

use tracer_user::{
    debuginfo::{DebugInfo, DebugSearch},
    functions::symbols::SymbolTable,
};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut files = Vec::new();
    let mut show = None;
    while let Some(a) = args.next() {
        if a == "--show" {
            show = args.next();
        } else {
            files.push(PathBuf::from(a));
        }
    }
    const RUNS: usize = 5;
    for path in files {
        let mut times = Vec::new();
        let mut summary = String::new();
        for run in 0..RUNS {
            let start = Instant::now();
            let data = std::fs::read(&path)?;
            let symbols = SymbolTable::parse(&path, &data)?;
            let found = DebugInfo::find(&path, &data, &DebugSearch::default())?;
            let Some(info) = found.info else {
                println!("{}: no debug info ({:?})", path.display(), found.rejected);
                break;
            };
            let addresses: Vec<u64> = symbols.functions.iter().map(|f| f.address).collect();
            let functions = info.functions(&addresses)?;
            times.push(start.elapsed());
            if run == 0 {
                let with_signature = functions.values().filter(|f| f.signature.is_some()).count();
                let params: usize =
                    functions.values().filter_map(|f| f.signature.as_ref()).map(|s| s.params.len()).sum();
                summary = format!(
                    "{} functions in the symbol table, {} described ({} with parameters and types, {} parameters); DWARF from {:?}",
                    addresses.len(),
                    functions.len(),
                    with_signature,
                    params,
                    info.origin()
                );
                if let Some(name) = &show {
                    for f in symbols.functions.iter().filter(|f| f.name.contains(name.as_str())) {
                        println!("{} {:#x}: {:#?}", f.name, f.address, functions.get(&f.address));
                    }
                }
            }
        }
        if times.is_empty() {
            continue;
        }
        times.sort();
        println!("{}: median {:.1} ms of {RUNS} runs; {summary}", path.display(), times[RUNS / 2].as_secs_f64() * 1e3);
    }
    Ok(())
}
