//! Prints the path of a compiled fixture (`cargo xtask bench` and `demo` use the same builds as
//! the tests).

fn main() {
    let name = std::env::args().nth(1).unwrap_or_default();
    println!("{}", tracer_tests::fixture(&name).display());
}
