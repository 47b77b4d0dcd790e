package soak

import (
	"context"
	"sync"
	"time"
)

// schedMonitor measures this process's scheduling delay: a goroutine asks
// to sleep 1 ms and records how much later it woke, per 100 ms bucket. An
// answer's allowance past its deadline grows by the worst delay seen around
// the call, so a loaded machine does not read as a late daemon.
type schedMonitor struct{ series }

// series is the largest of a measure per 100 ms bucket since start.
type series struct {
	mu      sync.Mutex
	start   time.Time
	buckets []time.Duration
	max     time.Duration
}

const (
	schedBucket = 100 * time.Millisecond
	lookback    = 2 * time.Second
	// lookahead: the delays measured just after a call count for it (a
	// sleeper starved across its end reports on waking); an answer past
	// its deadline is judged once this much time has passed.
	lookahead = time.Second
)

func newSchedMonitor() *schedMonitor { return &schedMonitor{series{start: time.Now()}} }

func newSeries(start time.Time) *series { return &series{start: start} }

func (m *schedMonitor) run(ctx context.Context) {
	const nap = time.Millisecond
	for ctx.Err() == nil {
		t0 := time.Now()
		time.Sleep(nap)
		late := time.Since(t0) - nap
		m.record(time.Now(), late)
	}
}

// record notes a delay of late that ended at at. It counts in every
// bucket the delay spanned: a starved sleeper learns of its delay only
// when it wakes, after the calls it delayed may have been judged.
func (m *series) record(at time.Time, late time.Duration) {
	lo := max(int(at.Add(-late).Sub(m.start)/schedBucket), 0)
	i := int(at.Sub(m.start) / schedBucket)
	m.mu.Lock()
	defer m.mu.Unlock()
	for len(m.buckets) <= i {
		m.buckets = append(m.buckets, 0)
	}
	for j := lo; j <= i; j++ {
		m.buckets[j] = max(m.buckets[j], late)
	}
	m.max = max(m.max, late)
}

// worst is the largest delay measured from lookback before from until
// lookahead after to.
func (m *series) worst(from, to time.Time) time.Duration {
	lo := int(from.Add(-lookback).Sub(m.start) / schedBucket)
	hi := int(to.Add(lookahead).Sub(m.start) / schedBucket)
	m.mu.Lock()
	defer m.mu.Unlock()
	var w time.Duration
	for i := max(lo, 0); i <= hi && i < len(m.buckets); i++ {
		w = max(w, m.buckets[i])
	}
	return w
}

// slack is the allowance past a deadline: the fixed 100 ms, plus four
// times the worst scheduling delay measured here around the call (the
// daemon's timer, the goroutine that stops the data path, the one that
// writes the answer and this process's wake-up each may be that late),
// plus twice the worst Ping latency of the given daemons around it (an
// answer cannot come sooner than the daemon answers its cheapest call).
func (m *schedMonitor) slack(from, to time.Time, pings ...*series) (total, margin time.Duration) {
	margin = 4 * m.worst(from, to)
	var p time.Duration
	for _, s := range pings {
		if s != nil {
			p = max(p, s.worst(from, to))
		}
	}
	margin += 2 * p
	return 100*time.Millisecond + margin, margin
}

func (m *series) maxDelay() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.max
}
