//! Rust fixture with exactly known behaviour: fib(12) (465 calls), scale(10|20|30, 3), a thread
//! calling worker(0..3) (returns i + 1000), then exits 4.

use std::hint::black_box;

#[inline(never)]
fn fib(n: u64) -> u64 {
    if n < 2 { n } else { fib(black_box(n - 1)) + fib(black_box(n - 2)) }
}

#[inline(never)]
fn scale(x: u64, factor: u64) -> u64 {
    black_box(x * factor)
}

#[inline(never)]
fn worker(i: u64) -> u64 {
    black_box(i + 1000)
}

fn main() {
    let f = fib(black_box(12));
    let s: u64 = [10, 20, 30].into_iter().map(|x| scale(black_box(x), black_box(3))).sum();
    let t = std::thread::spawn(|| (0..4).map(|i| worker(black_box(i))).sum::<u64>()).join().unwrap();
    println!("fib {f} scale {s} worker {t}");
    std::process::exit(4);
}
