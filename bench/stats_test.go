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
