//! How full an SQS event source mapping's batches are at a given rate. An order's bill depends
//! on it (one invocation, one receive and one delete per batch), and batches are full only
//! under load: at a light load, with no batching window, a poller finds one message or two.
//!
//! The mapping is simulated, not guessed: messages arrive at random at the rate; at most
//! `concurrency` batches run at once; a free poller takes the messages waiting when the first
//! arrives, or gathers them for the batching window, up to the batch size; each batch then
//! takes its invocation's duration.

use sas_rng::SplitMix;

/// Messages simulated for each figure: enough for its first two decimals to hold.
const MESSAGES: usize = 200_000;

/// An SQS event source mapping.
#[derive(Clone, Copy, Debug)]
pub struct Mapping {
    /// Batches at once (`MaximumConcurrency`).
    pub concurrency: usize,
    /// How long one batch's invocation takes, in seconds.
    pub invocation_s: f64,
    /// `MaximumBatchingWindowInSeconds`.
    pub window_s: f64,
    /// `BatchSize`.
    pub batch_size: usize,
}

/// Mean messages a batch of `mapping` holds when messages arrive at `rate` a second.
pub fn mean_batch(mapping: &Mapping, rate: f64) -> f64 {
    if rate <= 0.0 {
        return 1.0;
    }
    let random = SplitMix::seeded(0x5eed_ba7c);
    let mut at = 0.0;
    let arrivals: Vec<f64> = (0..MESSAGES)
        .map(|_| {
            // Exponential gaps: arrivals at random, at `rate` on average.
            at += -(1.0 - random.unit()).ln() / rate;
            at
        })
        .collect();
    let mut free = vec![0.0_f64; mapping.concurrency.max(1)];
    let (mut next, mut batches) = (0, 0usize);
    while next < arrivals.len() {
        let (slot, since) =
            free.iter().copied().enumerate().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap_or((0, 0.0));
        // A long poll answers as soon as a message is there; a window keeps gathering, until
        // the batch is full.
        let opens = since.max(arrivals[next]);
        let mut closes = opens + mapping.window_s;
        let mut taken = 0;
        while next < arrivals.len() && taken < mapping.batch_size && arrivals[next] <= closes {
            next += 1;
            taken += 1;
        }
        if taken == mapping.batch_size {
            closes = opens.max(arrivals[next - 1]);
        }
        free[slot] = closes + mapping.invocation_s;
        batches += 1;
    }
    arrivals.len() as f64 / batches as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(window_s: f64) -> Mapping {
        Mapping { concurrency: 2, invocation_s: 0.04, window_s, batch_size: 10 }
    }

    #[test]
    fn batches_fill_with_the_load_and_the_window() {
        // A light load finds one message at a time.
        let light = mean_batch(&mapping(0.0), 1.0);
        assert!((1.0..1.05).contains(&light), "{light}");
        // Busy pollers find what waited meanwhile.
        let busy = mean_batch(&mapping(0.0), 100.0);
        assert!(busy > 2.0 && busy < 10.0, "{busy}");
        // Past what two pollers take one message at a time, batches fill up.
        assert!(mean_batch(&mapping(0.0), 2_000.0) > 9.5);
        // A window of a second gathers the messages of that second, up to the batch size.
        let windowed = mean_batch(&mapping(1.0), 5.0);
        assert!((5.0..7.0).contains(&windowed), "{windowed}");
        assert!(mean_batch(&mapping(1.0), 50.0) > 9.9);
    }
}
