package bench

import (
	"math"
	"slices"
	"time"
)

// Summary describes the timed batches of one size.
type Summary struct {
	Median, P99, Min, Max time.Duration
}

// Summarize returns the median (mean of the middle two for an even count)
// and the nearest-rank 99th percentile, which with few samples is the
// slowest batch: a p99 must not hide the worst run. Empty input gives zeros.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	return Summary{Median: median(s), P99: nearestRank(s, 99), Min: s[0], Max: s[len(s)-1]}
}

// median of sorted, non-empty s.
func median(s []time.Duration) time.Duration {
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return s[n/2-1] + (s[n/2]-s[n/2-1])/2
}

// nearestRank is the p-th percentile of sorted, non-empty s: the smallest
// sample with at least p% of samples at or below it.
func nearestRank(s []time.Duration, p float64) time.Duration {
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = max(1, min(rank, len(s)))
	return s[rank-1]
}

// GBps is payload bytes per second in units of 1e9.
func GBps(bytes uint64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) / d.Seconds() / 1e9
}

// MblocksPerSec is blocks per second in millions.
func MblocksPerSec(blocks int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(blocks) / d.Seconds() / 1e6
}
