//! Percentiles of call durations: exact for small samples, within 1% for large ones, in bounded
//! memory.
//!
//! Up to [`EXACT_SAMPLES`] durations are kept and percentiles are exact (nearest rank: the
//! smallest sample with at least `q` of the samples at or below it). Past that the samples move
//! into a DDSketch (Masson, Rim and Lee, VLDB 2019, via the `sketches-ddsketch` crate) with a
//! relative accuracy of [`SKETCH_RELATIVE_ACCURACY`]: any percentile it returns is within 0.5% of
//! the true value of a sample at that rank, using at most [`SKETCH_MAX_BINS`] bins (a few KiB)
//! whatever the number of calls.
//!
//! A sketch costs a logarithm per sample, a tenth of `report`'s time on a trace of one busy
//! function; but a small function's calls take few distinct nanosecond counts (a few hundred,
//! over and over), so samples in sketch mode are first counted in a small table of recent values
//! ([`PENDING`] slots, direct-mapped by value) and go into the sketch as one `add_with_count` when
//! another value takes their slot, or when a percentile is asked for. The sketch then holds
//! exactly the bins, minimum and maximum that adding each sample would have given: the
//! percentiles do not change. Where durations rarely repeat (a larger function's), the table
//! would only add its own misses (1-5 % more `report` CPU on the export bench's trace, this
//! machine's noise): a sketch whose table hits fewer than half of a [`WINDOW`] of samples drops it
//! for good.

use sketches_ddsketch::{Config, DDSketch};

/// Samples kept exactly before switching to the sketch.
pub const EXACT_SAMPLES: usize = 10_000;
/// The sketch's guaranteed relative error.
pub const SKETCH_RELATIVE_ACCURACY: f64 = 0.005;
/// Enough bins for 0.5% accuracy over 1 ns to about 10^9 s without collapsing.
pub const SKETCH_MAX_BINS: u32 = 8192;

/// Slots of a sketch's table of pending samples (a power of two): 8 KiB a function, for the
/// functions called more than [`EXACT_SAMPLES`] times.
pub const PENDING: usize = 512;
/// Samples over which a sketch's table must hit half the time to be kept.
pub const WINDOW: u32 = 4096;

#[derive(Clone)]
pub enum Percentiles {
    Exact(Vec<u64>),
    Sketch(Box<Sketch>),
}

/// A DDSketch, and the samples not yet in it.
#[derive(Clone)]
pub struct Sketch {
    sketch: DDSketch,
    /// `(value, count)` by `value % PENDING`, a count of 0 for an empty slot; `None` once it
    /// stopped paying.
    pending: Option<Box<[(u64, u64); PENDING]>>,
    /// Samples and table hits in the current window.
    window: (u32, u32),
}

impl Sketch {
    fn new() -> Sketch {
        Sketch {
            sketch: DDSketch::new(Config::new(SKETCH_RELATIVE_ACCURACY, SKETCH_MAX_BINS, 1.0)),
            pending: Some(Box::new([(0, 0); PENDING])),
            window: (0, 0),
        }
    }

    fn add(&mut self, value: u64) {
        let Some(pending) = &mut self.pending else {
            self.sketch.add(value as f64);
            return;
        };
        let slot = &mut pending[value as usize & (PENDING - 1)];
        if slot.0 == value {
            slot.1 += 1;
            self.window.1 += 1;
        } else {
            if slot.1 > 0 {
                self.sketch.add_with_count(slot.0 as f64, slot.1);
            }
            *slot = (value, 1);
        }
        self.window.0 += 1;
        if self.window.0 == WINDOW {
            if self.window.1 < WINDOW / 2 {
                self.flush();
                self.pending = None;
            }
            self.window = (0, 0);
        }
    }

    /// Moves every pending sample into the sketch.
    fn flush(&mut self) {
        for slot in self.pending.iter_mut().flat_map(|p| p.iter_mut()) {
            if slot.1 > 0 {
                self.sketch.add_with_count(slot.0 as f64, slot.1);
                slot.1 = 0;
            }
        }
    }

    fn count(&self) -> u64 {
        self.sketch.count() as u64 + self.pending.iter().flat_map(|p| p.iter()).map(|s| s.1).sum::<u64>()
    }
}

impl std::fmt::Debug for Percentiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Percentiles::Exact(v) => write!(f, "Exact({} samples)", v.len()),
            Percentiles::Sketch(s) => write!(f, "Sketch({} samples)", s.count()),
        }
    }
}

impl Default for Percentiles {
    fn default() -> Self {
        Percentiles::Exact(Vec::new())
    }
}

impl Percentiles {
    pub fn add(&mut self, value: u64) {
        match self {
            Percentiles::Exact(samples) if samples.len() < EXACT_SAMPLES => samples.push(value),
            Percentiles::Exact(samples) => {
                let mut sketch = Box::new(Sketch::new());
                for &s in samples.iter() {
                    sketch.add(s);
                }
                sketch.add(value);
                *self = Percentiles::Sketch(sketch);
            }
            Percentiles::Sketch(sketch) => sketch.add(value),
        }
    }

    pub fn is_exact(&self) -> bool {
        matches!(self, Percentiles::Exact(_))
    }

    /// The `q` quantile (0 to 1) of the samples, or `None` when there are none. Exact samples are
    /// sorted in place on first use.
    pub fn quantile(&mut self, q: f64) -> Option<u64> {
        match self {
            Percentiles::Exact(samples) => {
                if samples.is_empty() {
                    return None;
                }
                if !samples.is_sorted() {
                    samples.sort_unstable();
                }
                let rank = (q * samples.len() as f64).ceil() as usize;
                Some(samples[rank.clamp(1, samples.len()) - 1])
            }
            Percentiles::Sketch(s) => {
                s.flush();
                s.sketch.quantile(q.clamp(0.0, 1.0)).ok().flatten().map(|v| v.round().max(0.0) as u64)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_samples_are_exact_nearest_rank() {
        let mut p = Percentiles::default();
        assert_eq!(p.quantile(0.5), None);
        for v in [5, 1, 4, 2, 3, 6, 7, 8, 9, 10] {
            p.add(v);
        }
        assert!(p.is_exact());
        assert_eq!(p.quantile(0.5), Some(5));
        assert_eq!(p.quantile(0.9), Some(9));
        assert_eq!(p.quantile(0.99), Some(10));
        assert_eq!(p.quantile(0.0), Some(1));
        assert_eq!(p.quantile(1.0), Some(10));
    }

    /// The table of pending samples changes nothing: the same percentiles, to the bit, as a
    /// sketch that was given every sample, with values that repeat, values that take each other's
    /// slot, and percentiles asked for midway (the table emptied, then filled again).
    #[test]
    fn pending_samples_give_the_percentiles_of_a_sketch_fed_each_sample() {
        let mut p = Percentiles::default();
        let mut plain = DDSketch::new(Config::new(SKETCH_RELATIVE_ACCURACY, SKETCH_MAX_BINS, 1.0));
        let values = (0..300_000u64).map(|i| match i % 5 {
            0 => 700 + i % 300,                  // repeats, a few hundred distinct values
            1 => 700 + (i % 7) * PENDING as u64, // values that share a slot
            2 => 1 + i * 7919 % 1_000_000_007,   // nearly all distinct
            3 => 0,                              // zero (the sketch counts it apart)
            _ => 5,
        });
        for (i, v) in values.enumerate() {
            // From sample 200,000 on, nearly every value is new: the table stops paying, and goes.
            let v = if i >= 200_000 { 1 + (i as u64) * 7919 % 1_000_000_007 } else { v };
            p.add(v);
            plain.add(v as f64);
            if i == 150_000 || i == 299_999 {
                let Percentiles::Sketch(s) = &p else { panic!("past the exact samples") };
                assert_eq!(s.pending.is_some(), i < 200_000, "the table after {} samples", i + 1);
            }
            if i == 150_000 || i == 299_999 {
                for q in [0.0, 0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0] {
                    let want = plain.quantile(q).unwrap().map(|v| v.round().max(0.0) as u64);
                    assert_eq!(p.quantile(q), want, "p{q} after {} samples", i + 1);
                }
            }
        }
    }

    #[test]
    fn large_samples_stay_within_one_percent() {
        // A spread from 100 ns to about 1 s, in an order that is not sorted.
        let values: Vec<u64> = (0..200_000u64).map(|i| 100 + (i * 7919 % 200_000).pow(2) / 40).collect();
        let mut p = Percentiles::default();
        for &v in &values {
            p.add(v);
        }
        assert!(!p.is_exact());
        let mut sorted = values.clone();
        sorted.sort_unstable();
        let mut exact = Percentiles::Exact(sorted);
        for q in [0.01, 0.1, 0.5, 0.9, 0.99, 0.999] {
            let (want, got) = (exact.quantile(q).unwrap() as f64, p.quantile(q).unwrap() as f64);
            assert!((got - want).abs() <= want * 0.01, "p{q}: sketch {got}, exact {want}");
        }
    }
}
