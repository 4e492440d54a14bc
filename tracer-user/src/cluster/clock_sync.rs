//! How far each agent's clock is from the collector's, from round trips and from causality.
//!
//! A round trip bounds the offset exactly: the agent read its clock between the collector's send
//! (`t0`) and receive (`t1`), so `agent - t1 <= offset <= agent - t0`. Over a trace the offset is
//! a line (a constant plus drift) through all those intervals: the short round trips pin it, the
//! long ones (a link that stalled) hardly constrain it. Then causality narrows it further: a message received on host B cannot have arrived
//! before it left host A, so every link bounds `offset(B) - offset(A)`; the bounds are propagated
//! across hosts and each offset is fixed as close to its round-trip estimate as they allow.

/// One round trip, in Unix nanoseconds: the collector's send and receive times and the agent's
/// clock when it answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockSample {
    pub t0: u64,
    pub t1: u64,
    pub agent_ns: u64,
}

impl ClockSample {
    pub fn round_trip(&self) -> u64 {
        self.t1.saturating_sub(self.t0)
    }

    /// The offset (agent minus collector) if the answer was read halfway.
    pub fn midpoint_offset(&self) -> i64 {
        self.agent_ns as i64 - (self.t0 / 2 + self.t1 / 2) as i64
    }

    /// Exact bounds on the offset.
    pub fn bounds(&self) -> (i64, i64) {
        (self.agent_ns as i64 - self.t1 as i64, self.agent_ns as i64 - self.t0 as i64)
    }
}

/// An agent's clock relative to the collector's: `offset(t) = offset_ns + drift * (t - at_ns)`,
/// where `t` is the agent's time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClockModel {
    pub offset_ns: i64,
    /// Nanoseconds of offset gained per nanosecond.
    pub drift: f64,
    pub at_ns: u64,
    /// Half the width of the interval the offset is known to lie in.
    pub uncertainty_ns: u64,
}

impl ClockModel {
    pub const ZERO: ClockModel = ClockModel { offset_ns: 0, drift: 0.0, at_ns: 0, uncertainty_ns: 0 };

    pub fn offset_at(&self, agent_ts: u64) -> i64 {
        self.offset_ns + (self.drift * (agent_ts as f64 - self.at_ns as f64)) as i64
    }

    /// An agent timestamp on the collector's clock.
    pub fn correct(&self, agent_ts: u64) -> u64 {
        (agent_ts as i64 - self.offset_at(agent_ts)).max(0) as u64
    }
}

/// Round trips are thinned to the best of each window of at least this long...
const WINDOW_NS: u64 = 1_000_000_000;
/// ...and at most this many windows over the trace, so that the pairwise drift bounds stay cheap
/// on long traces.
const MAX_WINDOWS: u64 = 1_000;
/// No real clock drifts faster than this (crystals are specified to about 100 ppm, and NTP slews by
/// at most 500 ppm): a drift beyond it means the round trips are not measuring a clock.
const MAX_DRIFT: f64 = 500e-6;

/// The offset model of an agent from its round trips (at least one).
///
/// Each round trip bounds the offset at its time exactly, so the model is a line through every
/// sample's interval. No drift is assumed unless the intervals rule a constant offset out; then
/// the drift is the middle of those that fit every interval. The offset is the middle of what the
/// intervals leave at that drift, which is never looser than the best single round trip. If no
/// plausible line fits, the best round trip alone is used.
pub fn estimate(samples: &[ClockSample]) -> Option<ClockModel> {
    let best = *samples.iter().min_by_key(|s| s.round_trip())?;
    let kept = thin(samples);
    let x = |s: &ClockSample| s.agent_ns as f64 - best.agent_ns as f64;
    // Pairwise: a line through both intervals has a slope in [b_min, b_max].
    let (mut b_min, mut b_max) = (-MAX_DRIFT, MAX_DRIFT);
    for (i, p) in kept.iter().enumerate() {
        for q in &kept[i + 1..] {
            let (p, q) = if x(p) <= x(q) { (p, q) } else { (q, p) };
            let dx = x(q) - x(p);
            if dx > 0.0 {
                let ((p_lo, p_hi), (q_lo, q_hi)) = (p.bounds(), q.bounds());
                b_min = b_min.max((q_lo - p_hi) as f64 / dx);
                b_max = b_max.min((q_hi - p_lo) as f64 / dx);
            }
        }
    }
    let single = ClockModel {
        offset_ns: best.midpoint_offset(),
        drift: 0.0,
        at_ns: best.agent_ns,
        uncertainty_ns: best.round_trip().div_ceil(2),
    };
    if b_min > b_max {
        return Some(single);
    }
    let drift = if b_min <= 0.0 && 0.0 <= b_max { 0.0 } else { (b_min + b_max) / 2.0 };
    // The offset at `best`'s time that every interval allows, at that drift.
    let lo = kept.iter().map(|s| s.bounds().0 as f64 - drift * x(s)).fold(f64::NEG_INFINITY, f64::max);
    let hi = kept.iter().map(|s| s.bounds().1 as f64 - drift * x(s)).fold(f64::INFINITY, f64::min);
    if lo > hi {
        return Some(single);
    }
    Some(ClockModel {
        offset_ns: ((lo + hi) / 2.0).round() as i64,
        drift,
        at_ns: best.agent_ns,
        uncertainty_ns: ((hi - lo) / 2.0).ceil() as u64,
    })
}

/// The best (shortest) round trip of each window, in time order.
fn thin(samples: &[ClockSample]) -> Vec<ClockSample> {
    let first = samples.iter().map(|s| s.t0).min().unwrap_or(0);
    let span = samples.iter().map(|s| s.t0).max().unwrap_or(0) - first;
    let window = WINDOW_NS.max(span / MAX_WINDOWS + 1);
    let mut best: std::collections::BTreeMap<u64, ClockSample> = std::collections::BTreeMap::new();
    for s in samples {
        let w = best.entry((s.t0 - first) / window).or_insert(*s);
        if s.round_trip() < w.round_trip() {
            *w = *s;
        }
    }
    best.into_values().collect()
}

/// A message from host `from` (sent at `sent`) received on host `to` (at `received`), both on
/// their own clocks with drift already removed (the offsets left to find are constant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    pub from: usize,
    pub to: usize,
    pub sent: i64,
    pub received: i64,
}

/// The outcome of refining offsets with causality.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refined {
    /// Per host: the offset to subtract.
    pub offsets: Vec<i64>,
    /// Per host: half the width of the interval the offset may lie in, after the links.
    pub uncertainties: Vec<u64>,
    /// False when the links contradict the round trips (then the round-trip estimates stand).
    pub consistent: bool,
}

/// Chooses one offset per host: within its round-trip interval `estimate ± uncertainty`, such that
/// every linked receive comes at least a nanosecond after its send (`received - off[to] > sent -
/// off[from]`), as close to the estimates as that allows. Strictly after: an offset clamped to a
/// link's bound would otherwise put the receive on the very nanosecond of its send, and the merge
/// orders a tie by host, so a receive on the lower host would come first (and an OTLP export of
/// the merged trace could not link it to a send it had not seen yet). Hosts whose offset is known exactly (the collector's own) have
/// uncertainty 0.
pub fn refine(estimates: &[(i64, u64)], links: &[Link]) -> Refined {
    let n = estimates.len();
    let mut lo: Vec<i64> = estimates.iter().map(|&(e, u)| e - u as i64).collect();
    let mut hi: Vec<i64> = estimates.iter().map(|&(e, u)| e + u as i64).collect();
    // off[to] - off[from] <= received - sent - 1: the tightest bound per ordered pair.
    let mut bound = vec![vec![i64::MAX; n]; n];
    for l in links {
        if l.from != l.to && l.from < n && l.to < n {
            bound[l.from][l.to] = bound[l.from][l.to].min(l.received.saturating_sub(l.sent).saturating_sub(1));
        }
    }
    let propagate = |lo: &mut Vec<i64>, hi: &mut Vec<i64>| {
        // Bellman-Ford style: at most n rounds to settle, more means a contradiction.
        for _ in 0..=n {
            let mut changed = false;
            for a in 0..n {
                for b in 0..n {
                    let d = bound[a][b];
                    if d == i64::MAX {
                        continue;
                    }
                    // off[b] <= off[a] + d  and  off[a] >= off[b] - d.
                    if hi[a].saturating_add(d) < hi[b] {
                        hi[b] = hi[a].saturating_add(d);
                        changed = true;
                    }
                    if lo[b].saturating_sub(d) > lo[a] {
                        lo[a] = lo[b].saturating_sub(d);
                        changed = true;
                    }
                }
            }
            if !changed {
                return (0..n).all(|i| lo[i] <= hi[i]);
            }
        }
        false
    };
    if !propagate(&mut lo, &mut hi) {
        return Refined {
            offsets: estimates.iter().map(|&(e, _)| e).collect(),
            uncertainties: estimates.iter().map(|&(_, u)| u).collect(),
            consistent: false,
        };
    }
    let uncertainties = (0..n).map(|i| ((hi[i] - lo[i]) as u64).div_ceil(2)).collect();
    // Fix the hosts one by one, each as near its estimate as the others allow.
    let mut offsets = vec![0; n];
    for i in 0..n {
        offsets[i] = estimates[i].0.clamp(lo[i], hi[i]);
        lo[i] = offsets[i];
        hi[i] = offsets[i];
        propagate(&mut lo, &mut hi);
    }
    Refined { offsets, uncertainties, consistent: true }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t0: u64, rtt: u64, offset: i64) -> ClockSample {
        ClockSample { t0, t1: t0 + rtt, agent_ns: (t0 as i64 + rtt as i64 / 2 + offset) as u64 }
    }

    #[test]
    fn the_tightest_round_trip_wins() {
        let samples = [sample(1_000, 500, 7_000), sample(2_000, 40, 7_000), sample(3_000, 900, 6_000)];
        let m = estimate(&samples).unwrap();
        assert_eq!(m.offset_ns, 7_000);
        assert_eq!(m.uncertainty_ns, 20);
        assert_eq!(m.drift, 0.0);
        let (lo, hi) = samples[1].bounds();
        assert!(lo <= 7_000 && 7_000 <= hi);
        assert_eq!(m.correct(1_000_000 + 7_000), 1_000_000);
    }

    #[test]
    fn drift_is_found_over_a_long_trace() {
        // 50 ppm: 50 µs gained per second.
        let samples: Vec<ClockSample> =
            (0..10).map(|s| sample(s * 1_000_000_000 + 5, 20, 1_000_000 + s as i64 * 50_000)).collect();
        let m = estimate(&samples).unwrap();
        assert!((m.drift - 50e-6).abs() < 1e-7, "{m:?}");
        let t = samples[9].agent_ns;
        assert!((m.offset_at(t) - (1_000_000 + 9 * 50_000)).abs() < 100, "{}", m.offset_at(t));
    }

    #[test]
    fn no_drift_is_invented_from_noisy_round_trips() {
        // One clock (offset 3 µs), probed once a second for 8 s with round trips of 8 µs, except
        // while the link was down: those answers came back seconds late, read early or late.
        let mut samples: Vec<ClockSample> = (0..8).map(|s| sample(s * 1_000_000_000, 8_000, 3_000)).collect();
        samples[3] = ClockSample { t0: 3_000_000_000, t1: 5_500_000_000, agent_ns: 3_000_100_000 };
        samples[4] = ClockSample { t0: 4_000_000_000, t1: 5_500_000_000, agent_ns: 5_499_900_000 };
        let m = estimate(&samples).unwrap();
        assert_eq!(m.drift, 0.0, "{m:?}");
        assert!((m.offset_ns - 3_000).abs() <= 4_000 && m.uncertainty_ns <= 4_000, "{m:?}");
        // The interval holds the truth at every sample.
        for s in samples {
            let (lo, hi) = s.bounds();
            assert!(lo <= m.offset_at(s.agent_ns) + m.uncertainty_ns as i64, "{s:?} {m:?}");
            assert!(m.offset_at(s.agent_ns) - m.uncertainty_ns as i64 <= hi, "{s:?} {m:?}");
        }
    }

    #[test]
    fn many_round_trips_are_thinned_to_one_per_window() {
        // Two days of samples, one a second: at most MAX_WINDOWS (+1) are compared.
        let samples: Vec<ClockSample> = (0..172_800).map(|s| sample(s * 1_000_000_000, 8_000 + s % 7, 0)).collect();
        assert!(thin(&samples).len() <= MAX_WINDOWS as usize + 1);
        assert_eq!(estimate(&samples).unwrap().drift, 0.0);
    }

    #[test]
    fn links_narrow_round_trip_intervals() {
        // Host 0 is the reference (known exactly); host 1's clock is 5 ms ahead, known from round
        // trips to within ±100 µs. Messages take 10 µs each way.
        let truth = 5_000_000;
        let estimates = [(0, 0), (truth + 60_000, 100_000)];
        let links = [
            // 0 -> 1: sent at 1_000 (host 0), received at 1_000 + 10_000 on host 0's clock.
            Link { from: 0, to: 1, sent: 1_000, received: 1_000 + 10_000 + truth },
            Link { from: 1, to: 0, sent: 50_000 + truth, received: 60_000 },
        ];
        let r = refine(&estimates, &links);
        assert!(r.consistent);
        assert_eq!(r.offsets[0], 0);
        assert!((r.offsets[1] - truth).abs() <= 10_000, "{r:?}");
        assert!(r.uncertainties[1] <= 10_000, "tighter than the round trips (100 µs): {r:?}");
        // Every linked receive comes after its send once corrected.
        for l in links {
            assert!(l.received - r.offsets[l.to] > l.sent - r.offsets[l.from], "{l:?}");
        }
    }

    #[test]
    fn a_receive_the_estimates_put_on_its_send_comes_after_it() {
        // Host 1's estimate puts its answer's receive on host 0 on the very nanosecond it was sent:
        // the offset moves by the least that orders them.
        let link = Link { from: 1, to: 0, sent: 500_000, received: 500_000 };
        let r = refine(&[(0, 0), (0, 1_000)], &[link]);
        assert!(r.consistent, "{r:?}");
        assert_eq!(r.offsets, [0, 1]);
        assert_eq!(link.received - r.offsets[0], link.sent - r.offsets[1] + 1);
    }

    #[test]
    fn without_links_the_estimates_stand() {
        let r = refine(&[(0, 0), (123, 50)], &[]);
        assert_eq!(r.offsets, [0, 123]);
        assert_eq!(r.uncertainties, [0, 50]);
    }

    #[test]
    fn contradictions_fall_back_to_the_estimates() {
        // A message that arrived 1 ms before it was sent, with exactly known clocks.
        let r = refine(&[(0, 0), (0, 0)], &[Link { from: 0, to: 1, sent: 2_000_000, received: 1_000_000 }]);
        assert!(!r.consistent);
        assert_eq!(r.offsets, [0, 0]);
    }

    #[test]
    fn three_hosts_chain() {
        // 0 -> 1 -> 2 and back; host 2's estimate is loose, the chain pins it.
        let estimates = [(0, 0), (1_000, 50), (2_000, 10_000)];
        let links = [
            Link { from: 1, to: 2, sent: 10_000 + 1_000, received: 10_000 + 2_000 + 5 },
            Link { from: 2, to: 1, sent: 20_000 + 2_000, received: 20_000 + 1_000 + 5 },
            Link { from: 0, to: 1, sent: 0, received: 1_000 + 5 },
        ];
        let r = refine(&estimates, &links);
        assert!(r.consistent, "{r:?}");
        assert!((r.offsets[2] - 2_000).abs() <= 60, "{r:?}");
        assert!(r.uncertainties[2] < 10_000, "{r:?}");
    }
}
