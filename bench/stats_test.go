package bench

import (
	"math"
	"testing"
	"time"
)

func ms(v ...float64) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x * float64(time.Millisecond))
	}
	return out
}

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		in                    []time.Duration
		median, p99, min, max time.Duration
	}{
		{"empty", nil, 0, 0, 0, 0},
		{"one", ms(7), ms(7)[0], ms(7)[0], ms(7)[0], ms(7)[0]},
		{"five unsorted: p99 is the slowest", ms(5, 1, 4, 2, 3), ms(3)[0], ms(5)[0], ms(1)[0], ms(5)[0]},
		{"even count: mean of the middle two", ms(4, 1, 3, 2), 2500 * time.Microsecond, ms(4)[0], ms(1)[0], ms(4)[0]},
		{"200 samples: p99 is the 198th", ramp(200), ms(100)[0] + 500*time.Microsecond, ms(198)[0], ms(1)[0], ms(200)[0]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Summarize(tc.in)
			if s.Median != tc.median || s.P99 != tc.p99 || s.Min != tc.min || s.Max != tc.max {
				t.Fatalf("Summarize = %+v, want median %v p99 %v min %v max %v", s, tc.median, tc.p99, tc.min, tc.max)
			}
		})
	}
}

// ramp is 1 ms .. n ms, reversed so Summarize must sort.
func ramp(n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = time.Duration(n-i) * time.Millisecond
	}
	return out
}

func TestSummarizeDoesNotReorderInput(t *testing.T) {
	in := ms(3, 1, 2)
	Summarize(in)
	if in[0] != ms(3)[0] {
		t.Fatal("Summarize sorted its input in place")
	}
}

func TestRates(t *testing.T) {
	for _, tc := range []struct {
		name          string
		bytes         uint64
		blocks        int
		d             time.Duration
		gbps, mblocks float64
	}{
		{"1 GB in 1 s", 1e9, 10000, time.Second, 1, 0.01},
		{"10k x 2 MiB in 0.5 s", 10000 * 2 << 20, 10000, 500 * time.Millisecond, 41.94304, 0.02},
		{"zero time", 100, 1, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if g := GBps(tc.bytes, tc.d); math.Abs(g-tc.gbps) > 1e-9 {
				t.Errorf("GBps = %v, want %v", g, tc.gbps)
			}
			if m := MblocksPerSec(tc.blocks, tc.d); math.Abs(m-tc.mblocks) > 1e-9 {
				t.Errorf("MblocksPerSec = %v, want %v", m, tc.mblocks)
			}
		})
	}
}

func TestRatesOf(t *testing.T) {
	for _, tc := range []struct {
		name             string
		bytes            uint64
		in               []time.Duration
		median, min, max float64
	}{
		{"empty", 1e9, nil, 0, 0, 0},
		{"one", 1e9, ms(500), 2, 2, 2},
		{"three: min from the slowest, max from the fastest", 1e9, ms(1000, 250, 500), 2, 1, 4},
		{"even: median of the middle two times", 3e9, ms(1000, 2000, 1000, 2000), 2, 1.5, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := RatesOf(tc.bytes, tc.in)
			if math.Abs(r.Median-tc.median) > 1e-9 || math.Abs(r.Min-tc.min) > 1e-9 || math.Abs(r.Max-tc.max) > 1e-9 {
				t.Fatalf("RatesOf = %+v, want median %v min %v max %v", r, tc.median, tc.min, tc.max)
			}
		})
	}
}

func TestMedianRatio(t *testing.T) {
	for _, tc := range []struct {
		name         string
		ours, theirs []time.Duration
		ratio        float64
		ok           bool
	}{
		{"same", ms(10, 10, 10), ms(10, 10, 10), 1, true},
		{"ours twice as fast", ms(5, 5, 5), ms(10, 10, 10), 2, true},
		{"median with median, not best with median", ms(8, 10, 30), ms(5, 12, 20), 1.2, true},
		{"ours slower, an outlier on their side does not count", ms(12, 12, 13), ms(1, 10, 10), 10.0 / 12, true},
		{"no yardstick samples", ms(10), nil, 0, false},
		{"no samples of ours", nil, ms(10), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := MedianRatio(tc.ours, tc.theirs)
			if ok != tc.ok || math.Abs(r-tc.ratio) > 1e-9 {
				t.Fatalf("MedianRatio = %v, %v; want %v, %v", r, ok, tc.ratio, tc.ok)
			}
		})
	}
}

func TestOverFloor(t *testing.T) {
	for _, tc := range []struct {
		name      string
		xs, floor []time.Duration
		ratio     float64
		ok        bool
	}{
		{"at the floor", ms(0.3, 0.3, 0.3), ms(0.3, 0.3, 0.3), 1, true},
		{"medians, not means", ms(0.3, 0.36, 9), ms(0.3, 0.1, 0.31), 1.2, true},
		{"even counts", ms(1, 3), ms(1, 1), 2, true},
		{"no floor", ms(1), nil, 0, false},
		{"zero floor", ms(1), []time.Duration{0}, 0, false},
		{"no calls", nil, ms(1), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := OverFloor(tc.xs, tc.floor)
			if ok != tc.ok || math.Abs(r-tc.ratio) > 1e-9 {
				t.Fatalf("OverFloor = %v, %v; want %v, %v", r, ok, tc.ratio, tc.ok)
			}
		})
	}
}
