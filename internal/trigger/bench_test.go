package trigger_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/trigger"
)

// BenchmarkLag measures the lag from a host store into the counter to the
// trigger's fire, under each policy and poll period, with the watcher
// already running (a layer's trigger is armed long before its counter
// comes) and the store at a random phase of the poll. It reports the
// median and 99th percentile lag in µs and the process's CPU time per
// wall second (the watcher's cost while armed):
//
//	go test ./internal/trigger -run - -bench Lag -benchtime 2000x
func BenchmarkLag(b *testing.B) {
	cases := []struct {
		name string
		p    trigger.Policy
	}{
		{"spin", trigger.Policy{Spin: trigger.SpinAlways}},
	}
	for _, d := range []time.Duration{5 * time.Microsecond, 10 * time.Microsecond, 20 * time.Microsecond, 50 * time.Microsecond, 100 * time.Microsecond} {
		cases = append(cases, struct {
			name string
			p    trigger.Policy
		}{fmt.Sprintf("nanosleep-%s", d), trigger.Policy{Spin: trigger.SpinNever, Poll: d}})
	}
	for _, d := range []time.Duration{20 * time.Microsecond, 100 * time.Microsecond, time.Millisecond} {
		cases = append(cases, struct {
			name string
			p    trigger.Policy
		}{fmt.Sprintf("timer-%s", d), trigger.Policy{Spin: trigger.SpinNever, Poll: d, TimerSleep: true}})
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			w := trigger.New(tc.p)
			c, word := newCounter("bench")
			keep, _ := w.Arm(c, 1<<62, time.Time{}, func(time.Time) {}, func(error) {})
			defer keep.Cancel()
			rng := rand.New(rand.NewPCG(3, 4))
			lags := make([]time.Duration, 0, b.N)
			done := make(chan time.Time, 1)
			var ru0, ru1 unix.Rusage
			_ = unix.Getrusage(unix.RUSAGE_SELF, &ru0)
			start := time.Now()
			b.ResetTimer()
			for i := range b.N {
				v := uint64(i + 1)
				if _, err := w.Arm(c, v, time.Time{}, func(time.Time) { done <- time.Now() }, func(error) {}); err != nil {
					b.Fatal(err)
				}
				time.Sleep(time.Duration(rng.Int64N(int64(200 * time.Microsecond))))
				t0 := time.Now()
				atomic.StoreUint64(word, v)
				lags = append(lags, (<-done).Sub(t0))
			}
			b.StopTimer()
			wall := time.Since(start)
			_ = unix.Getrusage(unix.RUSAGE_SELF, &ru1)
			cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
			slices.Sort(lags)
			b.ReportMetric(float64(lags[len(lags)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(lags[len(lags)*99/100].Nanoseconds())/1e3, "p99-µs")
			b.ReportMetric(cpu.Seconds()/wall.Seconds(), "cpu-s/s")
		})
	}
}
