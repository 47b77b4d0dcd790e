package verbs

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/errs"
)

// stallSet is a sending set without QPs: enough for await, whose progress
// is then the receiver's acknowledgements alone.
func stallSet(stall time.Duration) *qpSet {
	t := &Transport{cfg: Config{StallTimeout: stall}, log: hclog.NewNullLogger()}
	s := &qpSet{t: t, peer: "peer", sender: true, broken: make(chan struct{}), ackSig: make(chan struct{}, 1), credSig: make(chan struct{}, 1)}
	s.stallTimer = time.NewTimer(time.Hour)
	s.stallTimer.Stop()
	return s
}

// TestAwaitStall: a wait with no progress for StallTimeout breaks the set
// with ErrAborted (so the batch is retried on a fresh connection); a wait
// that sees progress, its signal, or its caller's end does not stall.
func TestAwaitStall(t *testing.T) {
	const stall = 300 * time.Millisecond // generous: a busy CI machine delays goroutines
	for _, tc := range []struct {
		name  string
		drive func(s *qpSet, cancel context.CancelFunc)
		check func(t *testing.T, s *qpSet, err error, took time.Duration)
	}{
		{"nothing moves", func(*qpSet, context.CancelFunc) {}, func(t *testing.T, s *qpSet, err error, took time.Duration) {
			if !errors.Is(err, errs.ErrAborted) || !strings.Contains(err.Error(), "made no progress") {
				t.Fatalf("await = %v, want a stall (Aborted)", err)
			}
			if s.Err() == nil {
				t.Fatal("a stalled set is not broken")
			}
			if took < stall {
				t.Fatalf("stalled after %v, before the %v timeout", took, stall)
			}
		}},
		{"progress without the signal, then the signal", func(s *qpSet, _ context.CancelFunc) {
			for i := 0; i < 15; i++ { // 15 x stall/10: longer than one timeout in all
				time.Sleep(stall / 10)
				s.lastAck.Add(1)
			}
			s.ackSig <- struct{}{}
		}, func(t *testing.T, s *qpSet, err error, took time.Duration) {
			if err != nil || s.Err() != nil {
				t.Fatalf("await = %v (set %v), want nil: the connection kept moving", err, s.Err())
			}
			if took < stall {
				t.Fatalf("returned after %v, before the driver finished", took)
			}
		}},
		{"signal", func(s *qpSet, _ context.CancelFunc) { s.ackSig <- struct{}{} }, func(t *testing.T, s *qpSet, err error, _ time.Duration) {
			if err != nil || s.Err() != nil {
				t.Fatalf("await = %v (set %v), want nil", err, s.Err())
			}
		}},
		{"caller ends first", func(_ *qpSet, cancel context.CancelFunc) { cancel() }, func(t *testing.T, s *qpSet, err error, _ time.Duration) {
			if !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "made no progress") {
				t.Fatalf("await = %v, want the caller's cancellation", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := stallSet(stall)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go tc.drive(s, cancel)
			start := time.Now()
			err := s.await(ctx, 7, s.ackSig)
			tc.check(t, s, err, time.Since(start))
		})
	}
}
