//! Percentiles of call durations: exact for small samples, within 1% for large ones, in bounded
//! memory.
//!
//! Up to [`EXACT_SAMPLES`] durations are kept and percentiles are exact (nearest rank: the
//! smallest sample with at least `q` of the samples at or below it). Past that the samples move
//! into a DDSketch (Masson, Rim and Lee, VLDB 2019, via the `sketches-ddsketch` crate) with a
//! relative accuracy of [`SKETCH_RELATIVE_ACCURACY`]: any percentile it returns is within 0.5% of
//! the true value of a sample at that rank, using at most [`SKETCH_MAX_BINS`] bins (a few KiB)
//! whatever the number of calls.

use sketches_ddsketch::{Config, DDSketch};

/// Samples kept exactly before switching to the sketch.
pub const EXACT_SAMPLES: usize = 10_000;
/// The sketch's guaranteed relative error.
pub const SKETCH_RELATIVE_ACCURACY: f64 = 0.005;
/// Enough bins for 0.5% accuracy over 1 ns to about 10^9 s without collapsing.
pub const SKETCH_MAX_BINS: u32 = 8192;

#[derive(Clone)]
pub enum Percentiles {
    Exact(Vec<u64>),
    Sketch(Box<DDSketch>),
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
                let mut sketch = DDSketch::new(Config::new(SKETCH_RELATIVE_ACCURACY, SKETCH_MAX_BINS, 1.0));
                for &s in samples.iter() {
                    sketch.add(s as f64);
                }
                sketch.add(value as f64);
                *self = Percentiles::Sketch(Box::new(sketch));
            }
            Percentiles::Sketch(sketch) => sketch.add(value as f64),
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
            Percentiles::Sketch(sketch) => {
                sketch.quantile(q.clamp(0.0, 1.0)).ok().flatten().map(|v| v.round().max(0.0) as u64)
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
