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

// Rates are the GB/s of equal transfers of bytes each: at the median time,
// and at the slowest (Min) and fastest (Max). Empty input gives zeros.
type Rates struct {
	Median, Min, Max float64
}

// RatesOf summarizes the times of transfers of bytes each as rates.
func RatesOf(bytes uint64, samples []time.Duration) Rates {
	s := Summarize(samples)
	return Rates{Median: GBps(bytes, s.Median), Min: GBps(bytes, s.Max), Max: GBps(bytes, s.Min)}
}

// MedianRatio compares two sets of transfers of the same bytes, taken in
// the same run: our median rate over theirs. ok is false when either side
// has no samples or a zero median.
func MedianRatio(ours, theirs []time.Duration) (ratio float64, ok bool) {
	a, b := Summarize(ours).Median, Summarize(theirs).Median
	if a <= 0 || b <= 0 {
		return 0, false
	}
	return float64(b) / float64(a), true
}

// OverFloor is the median of xs over the median of floor (both taken in
// the same run, e.g. calls and the Pings interleaved with them). ok is false
// when either is empty or floor's median is not positive.
func OverFloor(xs, floor []time.Duration) (ratio float64, ok bool) {
	f := Summarize(floor).Median
	if len(xs) == 0 || f <= 0 {
		return 0, false
	}
	return float64(Summarize(xs).Median) / float64(f), true
}
