package batch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/transport"
)

// TestRetryPolicy drives the policy alone: each attempt's outcome is
// scripted (the attempts after the script succeed), and what the policy
// did with it is counted: attempts, stale resolutions dropped, connections
// reported broken, and the outcome.
func TestRetryPolicy(t *testing.T) {
	cut := fmt.Errorf("%w: tcp: connection reset by peer", errs.ErrAborted)
	notSent := fmt.Errorf("%w: %w: tcp: connection to b is broken", errs.ErrUnavailable, transport.ErrNotSent)
	refused := fmt.Errorf("%w: key 7 is not registered", errs.ErrNotFound)
	bounds := fmt.Errorf("%w: descriptors.dst_offsets[1] = 65536 is past the region", errs.ErrInvalidArgument)
	closing := fmt.Errorf("%w: grpc: the client connection is closing", errs.ErrUnavailable)
	fault := fmt.Errorf("tcp: send: %w", &memguard.Fault{Side: memguard.Source, Addr: 0x1000})
	planStale := fmt.Errorf("%w: plan 1 is stale; prepare it again", errs.ErrFailedPrecondition)

	// Sessions: one whose connection broke, one whose connection is fine.
	broken := func() transport.Session { return transport.Session{Kind: transport.TCP, Conn: &fakeConn{err: cut}} }
	live := func() transport.Session { return transport.Session{Kind: transport.TCP, Conn: &fakeConn{}} }
	type step struct {
		r   ran
		err error
	}
	wrote := func(sess transport.Session, cached bool, err error) step {
		return step{ran{sess: sess, posted: true, cached: cached}, err}
	}
	repeat := func(n int, s step) []step {
		out := make([]step, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		steps    []step
		done     bool  // the caller's ctx is done before the first attempt
		plan     bool  // the stale handler is a plan's: the outcome is its error
		attempts int   // runs of the attempt
		forgets  int   // stale resolutions dropped
		broken   int   // connections reported broken to the peer manager
		want     error // the outcome's class; nil: success
		msg      string
	}{
		{name: "success", attempts: 1},

		// Nothing sent: free runs again, bounded, not spending the retry.
		{name: "not sent, then success", steps: []step{wrote(broken(), false, notSent)}, attempts: 2, broken: 1},
		{name: "not sent, a cut, not sent: the cut's retry is still there",
			steps:    []step{wrote(broken(), false, notSent), wrote(broken(), false, cut), wrote(broken(), false, notSent)},
			attempts: 4, broken: 3},
		{name: "not sent forever: maxNotSent free runs, then the one retry",
			steps:    repeat(maxNotSent+5, wrote(broken(), false, notSent)),
			attempts: maxNotSent + 2, broken: maxNotSent + 2, want: errs.ErrUnavailable,
			msg: "(after a retry on a fresh connection; the first attempt failed: "},
		{name: "not sent, caller gone", steps: []step{wrote(broken(), false, notSent)}, done: true,
			attempts: 1, broken: 1, want: errs.ErrUnavailable},

		// A connection that broke: one retry on a fresh one.
		{name: "cut, then success", steps: []step{wrote(broken(), false, cut)}, attempts: 2, broken: 1},
		{name: "cut twice", steps: []step{wrote(broken(), false, cut), wrote(broken(), false, fmt.Errorf("%w: broken pipe", errs.ErrUnavailable))},
			attempts: 2, broken: 2, want: errs.ErrUnavailable,
			msg: "broken pipe (after a retry on a fresh connection; the first attempt failed: aborted: tcp: connection reset by peer)"},
		{name: "cut by a memory fault", steps: []step{wrote(broken(), false, fault)}, attempts: 1, broken: 1, want: errs.ErrDataLoss},
		{name: "cut, caller gone", steps: []step{wrote(broken(), false, cut)}, done: true, attempts: 1, broken: 1, want: errs.ErrAborted},
		{name: "refused on a live connection, uncached", steps: []step{wrote(live(), false, bounds)}, attempts: 1, want: errs.ErrInvalidArgument},

		// The peer's connection closed under the resolve, a data path had.
		{name: "resolve cut, then success", steps: []step{{ran{sess: live()}, closing}}, attempts: 2},
		{name: "resolve cut twice", steps: []step{{ran{sess: live()}, closing}, {ran{sess: live()}, closing}},
			attempts: 2, want: errs.ErrUnavailable, msg: "(after a retry on a fresh connection; the first attempt failed: "},
		{name: "no data path", steps: []step{{ran{}, closing}}, attempts: 1, want: errs.ErrUnavailable},
		{name: "resolve refused", steps: []step{{ran{sess: live()}, refused}}, attempts: 1, want: errs.ErrNotFound},

		// A stale cached resolution: dropped, resolved afresh once.
		{name: "refused key, cached, then success", steps: []step{wrote(live(), true, refused)}, attempts: 2, forgets: 1},
		{name: "refused key, cached, twice", steps: []step{wrote(live(), true, refused), wrote(live(), true, refused)},
			attempts: 2, forgets: 2, want: errs.ErrNotFound, msg: "key 7 is not registered"},
		{name: "refused key, uncached", steps: []step{wrote(live(), false, refused)}, attempts: 1, want: errs.ErrNotFound},
		{name: "refused key, cached, caller gone", steps: []step{wrote(live(), true, refused)}, done: true,
			attempts: 1, forgets: 1, want: errs.ErrNotFound},
		{name: "not found on a broken connection: the fresh retry", steps: []step{wrote(broken(), true, refused)},
			attempts: 2, broken: 1},
		{name: "bounds against a cached size, then success", steps: []step{{ran{cached: true, suspect: true}, bounds}}, attempts: 2, forgets: 1},
		{name: "bounds against a fresh size", steps: []step{{ran{suspect: true}, bounds}}, attempts: 1, want: errs.ErrInvalidArgument},
		{name: "stale after a cut: dropped, not retried", steps: []step{wrote(broken(), false, cut), wrote(live(), true, refused)},
			attempts: 2, forgets: 1, broken: 1, want: errs.ErrNotFound,
			msg: "(after a retry on a fresh connection; the first attempt failed: aborted: "},
		{name: "stale, then a cut: both retries", steps: []step{wrote(live(), true, refused), wrote(broken(), false, cut)},
			attempts: 3, forgets: 1, broken: 1},
		{name: "refused key of a plan: its stale error as is", steps: []step{wrote(broken(), false, cut), wrote(live(), true, refused)}, plan: true,
			attempts: 2, forgets: 1, broken: 1, want: errs.ErrFailedPrecondition, msg: planStale.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp := &fakePeers{}
			s := New(Config{Peers: fp})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.done {
				cancel()
			}
			forgets, attempts, reruns := 0, 0, 0
			stale := func(error) error {
				forgets++
				if tc.plan {
					return planStale
				}
				return nil
			}
			err := s.retry(ctx, retryPolicy{peer: "b:7470", fresh: "a retry on a fresh connection"}, stale, func(ctx context.Context, rerun bool) (ran, error) {
				attempts++
				if rerun {
					reruns++
				}
				if attempts > len(tc.steps) {
					return ran{}, nil
				}
				st := tc.steps[attempts-1]
				return st.r, st.err
			})
			if attempts != tc.attempts || forgets != tc.forgets || fp.broken != tc.broken || reruns != attempts-1 {
				t.Errorf("%d attempts (%d reruns), %d forgets, %d broken; want %d, %d, %d", attempts, reruns, forgets, fp.broken, tc.attempts, tc.forgets, tc.broken)
			}
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("err = %v, want success", err)
			case tc.want != nil && (errs.Class(err) != tc.want || !strings.Contains(fmt.Sprint(err), tc.msg)):
				t.Fatalf("err = %v (%v), want %v with %q", err, errs.Class(err), tc.want, tc.msg)
			case tc.plan && err != planStale:
				t.Fatalf("err = %v, want the plan's stale error as is", err)
			case tc.want != nil && tc.attempts == 1 && !errors.Is(err, tc.steps[0].err):
				t.Fatalf("err = %v, want the only attempt's", err)
			}
		})
	}
}
