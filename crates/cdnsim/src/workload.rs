//! The viewers of a run, drawn as the paper describes them (Section 3.2):
//! arrivals with Gamma-distributed gaps, a channel by Zipf popularity, a
//! bitrate from 1 to 20 Mb/s by a Poisson distribution over the list, a
//! triangular session length from 1 minute to 1 hour, and an access AS —
//! weighted by a heavy-tailed (Pareto) population per AS, since the
//! paper's countries have a few large access networks and many small
//! ones. The distributions are `rand_distr`'s; everything comes from one
//! seed (ChaCha8), so a run is repeatable.

use rand::distr::weighted::WeightedIndex;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Gamma, Pareto, Triangular, Zipf};

/// The paper's video qualities (bits/s): 360p to 4K.
pub const BITRATES: [f64; 6] = [1e6, 2.5e6, 5e6, 8e6, 10e6, 20e6];

/// What the viewers are like.
#[derive(Clone, Debug)]
pub struct Params {
    pub viewers: usize,
    pub channels: u32,
    /// Zipf exponent of channel popularity.
    pub zipf: f64,
    /// Mean of the Poisson distribution over [`BITRATES`] (truncated to it).
    pub bitrate_mean: f64,
    /// Session length: min, mode, max (seconds).
    pub session: (f64, f64, f64),
    /// Shape of the Gamma-distributed gaps (< 1: burstier than Poisson).
    pub gap_shape: f64,
    /// Viewers watching at once once arrivals and departures balance: sets
    /// the mean gap (mean session / this).
    pub concurrency: f64,
    /// Pareto shape of the access ASes' populations.
    pub population_shape: f64,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            viewers: 1_000_000,
            channels: 200,
            zipf: 1.2,
            bitrate_mean: 2.0,
            session: (60.0, 1830.0, 3600.0),
            gap_shape: 0.5,
            concurrency: 100_000.0,
            population_shape: 1.2,
        }
    }
}

/// One viewer.
#[derive(Clone, Debug, PartialEq)]
pub struct Viewer {
    /// Arrival (seconds from the run's start).
    pub arrive: f64,
    /// Channel, 0 the most popular.
    pub channel: u32,
    pub bitrate: f64,
    pub session_s: f64,
    /// Index (into the list given) of its access AS.
    pub access: usize,
}

/// The probabilities of the bitrates: Poisson(`mean`) over their ranks,
/// truncated to the list.
pub fn bitrate_weights(mean: f64) -> [f64; 6] {
    let mut w = [0.0; 6];
    let mut p = (-mean).exp();
    for (k, x) in w.iter_mut().enumerate() {
        *x = p;
        p *= mean / (k + 1) as f64;
    }
    let s: f64 = w.iter().sum();
    w.map(|x| x / s)
}

/// The viewers of a run: `p.viewers` of them, in arrival order, spread over
/// `accesses` access ASes (their count), for `seed`.
pub fn viewers(p: &Params, accesses: usize, seed: u64) -> Result<impl Iterator<Item = Viewer>, String> {
    if accesses == 0 {
        return Err("the topology has no access AS for viewers".into());
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (lo, mode, hi) = p.session;
    let session = Triangular::new(lo, hi, mode).map_err(|e| format!("session lengths {lo}..{mode}..{hi}: {e}"))?;
    let mean_session = (lo + mode + hi) / 3.0;
    let mean_gap = mean_session / p.concurrency.max(1e-9);
    let gaps = Gamma::new(p.gap_shape, mean_gap / p.gap_shape).map_err(|e| format!("arrival gaps: {e}"))?;
    let channel = Zipf::new(p.channels.max(1) as f64, p.zipf).map_err(|e| format!("channel popularity: {e}"))?;
    let bitrate = WeightedIndex::new(bitrate_weights(p.bitrate_mean)).map_err(|e| format!("bitrates: {e}"))?;
    let pareto = Pareto::new(1.0, p.population_shape).map_err(|e| format!("AS populations: {e}"))?;
    let population: Vec<f64> = (0..accesses).map(|_| pareto.sample(&mut rng)).collect();
    let access = WeightedIndex::new(&population).map_err(|e| format!("AS populations: {e}"))?;
    let mut t = 0.0;
    let n = p.viewers;
    Ok((0..n).map(move |_| {
        t += gaps.sample(&mut rng);
        Viewer {
            arrive: t,
            channel: channel.sample(&mut rng) as u32 - 1,
            bitrate: BITRATES[bitrate.sample(&mut rng)],
            session_s: session.sample(&mut rng),
            access: access.sample(&mut rng),
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(n: usize, seed: u64) -> Vec<Viewer> {
        viewers(&Params { viewers: n, ..Params::default() }, 50, seed).unwrap().collect()
    }

    #[test]
    fn the_draws_follow_their_distributions() {
        let p = Params::default();
        let v = draw(200_000, 3);
        // Zipf(200, 1.2): each of the first ranks within 3 % of its share.
        let h: f64 = (1..=200).map(|k| (k as f64).powf(-1.2)).sum();
        for rank in 0..5u32 {
            let want = ((rank + 1) as f64).powf(-1.2) / h;
            let got = v.iter().filter(|x| x.channel == rank).count() as f64 / v.len() as f64;
            assert!((got - want).abs() < 0.03 * want + 0.002, "rank {rank}: {got} against {want}");
        }
        assert!(v.iter().all(|x| x.channel < 200));
        // Gamma gaps: mean = mean session / concurrency, variance =
        // mean² / shape.
        let gaps: Vec<f64> = v.windows(2).map(|w| w[1].arrive - w[0].arrive).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        let want_mean = 1830.0 / 100_000.0;
        assert!((mean / want_mean - 1.0).abs() < 0.02, "mean gap {mean}");
        assert!((var / (want_mean * want_mean / p.gap_shape) - 1.0).abs() < 0.05, "gap variance {var}");
        // Bitrates: Poisson(2) over the six ranks.
        let w = bitrate_weights(2.0);
        for (k, &b) in BITRATES.iter().enumerate() {
            let got = v.iter().filter(|x| x.bitrate == b).count() as f64 / v.len() as f64;
            assert!((got - w[k]).abs() < 0.01, "{b}: {got} against {}", w[k]);
        }
        // Triangular sessions: within bounds, mean (min + mode + max) / 3.
        assert!(v.iter().all(|x| (60.0..=3600.0).contains(&x.session_s)));
        let ms = v.iter().map(|x| x.session_s).sum::<f64>() / v.len() as f64;
        assert!((ms / 1830.0 - 1.0).abs() < 0.01, "mean session {ms}");
        // Access ASes: all used, a heavy tail (the busiest far above the mean).
        let mut per = vec![0usize; 50];
        for x in &v {
            per[x.access] += 1;
        }
        assert!(per.iter().max().unwrap() > &(3 * v.len() / 50));
    }

    #[test]
    fn a_seed_gives_the_same_viewers_and_bad_parameters_are_refused() {
        assert_eq!(draw(1000, 9), draw(1000, 9));
        assert_ne!(draw(1000, 9), draw(1000, 10));
        assert!(viewers(&Params::default(), 0, 1).is_err());
        let bad = Params { session: (600.0, 60.0, 3600.0), ..Params::default() };
        assert!(viewers(&bad, 5, 1).err().unwrap().contains("session lengths"));
        let bad = Params { gap_shape: 0.0, ..Params::default() };
        assert!(viewers(&bad, 5, 1).err().unwrap().contains("arrival gaps"));
    }
}
