package server

import (
	"testing"
	"time"
)

// The late-answer warning goes at most once a second and says how many it
// dropped since the last.
func TestLateLogRate(t *testing.T) {
	var l lateLog
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		at   time.Duration
		ok   bool
		more uint64
	}{
		{0, true, 0},
		{100 * time.Millisecond, false, 0},
		{900 * time.Millisecond, false, 0},
		{time.Second, true, 2},
		{1500 * time.Millisecond, false, 0},
		{3 * time.Second, true, 1},
	} {
		more, ok := l.due(t0.Add(tc.at))
		if ok != tc.ok || more != tc.more {
			t.Fatalf("at %v: due = %d, %v; want %d, %v", tc.at, more, ok, tc.more, tc.ok)
		}
	}
}
