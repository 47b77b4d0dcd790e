package batch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// forgetfulPeers is fakePeers whose first failGets Gets fail the way the
// peer manager's do when a handshake times out (a paused peer, a submit's
// short deadline): the peer's state is dropped, so Instance is 0 until the
// next handshake.
type forgetfulPeers struct {
	*fakePeers
	failGets int
}

func (f *forgetfulPeers) Get(ctx context.Context, addr string, want transport.Kind, need transport.Need) (transport.Session, error) {
	f.mu.Lock()
	if f.failGets > 0 {
		f.failGets--
		f.instance = 0
		f.mu.Unlock()
		return transport.Session{}, fmt.Errorf("peer %s: handshake: %w", addr, context.DeadlineExceeded)
	}
	f.mu.Unlock()
	return f.fakePeers.Get(ctx, addr, want, need)
}

// A plan whose connection was replaced, by a peer that did not restart,
// survives: a failed re-bind leaves it usable, and the next submit binds it
// to a fresh connection. Only another instance ID makes it stale.
func TestPreparedSurvivesConnLoss(t *testing.T) {
	cut := fmt.Errorf("%w: tcp: connection reset by peer", errs.ErrAborted)
	for _, tc := range []struct {
		name     string
		insts    []uint64 // per successful Get
		failGets int      // re-binds that fail after the cut
		stale    string   // "": the plan survives
	}{
		{"handshake failed once, same peer", []uint64{1, 1}, 1, ""},
		{"handshake failed twice, same peer", []uint64{1, 1}, 2, ""},
		{"no failed handshake, same peer", []uint64{1, 1}, 0, ""},
		{"handshake failed, then the peer restarted", []uint64{1, 2}, 1, "its peer b:7470 restarted; prepare it again"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp := &forgetfulPeers{fakePeers: &fakePeers{conns: []*fakeConn{{errs: []error{cut}, breaks: true}, {}},
				answers: []answer{{size: regionSize}}, insts: tc.insts}}
			s, req := rig(t, fp.fakePeers)
			s.paths.peers = fp
			info, err := s.Plans().Prepare(context.Background(), req, ownerOf(req))
			if err != nil {
				t.Fatal(err)
			}
			fp.mu.Lock()
			fp.failGets = tc.failGets
			fp.mu.Unlock()
			var last error
			for i := 0; i <= tc.failGets; i++ {
				_, last = s.Plans().Submit(ctxT(t), ownerOf(req), info.Handle)
				if i < tc.failGets && (last == nil || strings.Contains(last.Error(), "stale")) {
					t.Fatalf("submit %d while the peer is unreachable: %v", i, last)
				}
			}
			if tc.stale != "" {
				want := fmt.Sprintf("plan %d is stale: %s", info.Handle, tc.stale)
				if errs.Class(last) != errs.ErrFailedPrecondition || !strings.Contains(last.Error(), want) {
					t.Fatalf("err = %v, want %q", last, want)
				}
				return
			}
			if last != nil {
				t.Fatalf("submit after the peer came back: %v", last)
			}
			if w := fp.conns[1].writes; w != 1 {
				t.Fatalf("%d writes on the fresh connection, want 1", w)
			}
			if _, err := s.Plans().Submit(ctxT(t), ownerOf(req), info.Handle); err != nil || fp.conns[1].writes != 2 {
				t.Fatalf("next submit: %v (%d writes)", err, fp.conns[1].writes)
			}
		})
	}
}

// A destination that resolves with another key after the connection broke
// is checked by a fresh handshake before the plan is called stale: the
// manager's handshake may predate a restart that its control channel
// reconnected over by itself. The new instance ID names the restart; the
// same one, a re-registration.
func TestPreparedMovedDestination(t *testing.T) {
	cut := fmt.Errorf("%w: tcp: connection reset by peer", errs.ErrAborted)
	for _, tc := range []struct {
		name  string
		insts []uint64 // per Get: prepare, re-bind, the fresh handshake
		why   string
	}{
		{"restart seen by the fresh handshake", []uint64{1, 1, 2}, "its peer b:7470 restarted"},
		{"re-registered", []uint64{1, 1, 1}, `dst_region "kv" on peer b:7470 was re-registered or its export changed`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp := &fakePeers{conns: []*fakeConn{{errs: []error{cut}, breaks: true}, {}},
				answers: []answer{{size: regionSize}, {size: regionSize, key: 8}}, insts: tc.insts}
			s, req, info := preparedRig(t, fp)
			_, err := s.Plans().Submit(ctxT(t), ownerOf(req), info.Handle)
			want := fmt.Sprintf("plan %d is stale: %s", info.Handle, tc.why)
			if errs.Class(err) != errs.ErrFailedPrecondition || !strings.Contains(err.Error(), want) {
				t.Fatalf("err = %v, want %q", err, want)
			}
			if fp.gets != 3 || fp.broken != 2 {
				t.Fatalf("%d gets, %d broken: want 3 and 2 (the write's, the check's)", fp.gets, fp.broken)
			}
			for _, c := range fp.conns[1:] {
				if c.writes != 0 {
					t.Fatal("a stale plan wrote on a fresh connection")
				}
			}
		})
	}
}

// flakyPrep is a prepConn whose Prepare fails, before building anything,
// while *fail is above 0: the fresh connection was broken by another batch
// between Get and Prepare.
type flakyPrep struct {
	*prepConn
	fail *int
}

func (c *flakyPrep) Prepare(r *transport.Request) (transport.Prepared, error) {
	c.mu.Lock()
	if *c.fail > 0 {
		*c.fail--
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: %w: tcp: connection to b is broken: writev: i/o timeout", errs.ErrUnavailable, transport.ErrNotSent)
	}
	c.mu.Unlock()
	return c.prepConn.Prepare(r)
}

// A re-bind that meets a connection broken before the plan was built on it
// runs again, as Run's batches do on ErrNotSent, without spending the
// submit's one retry.
func TestPreparedRebindNotSent(t *testing.T) {
	cut := fmt.Errorf("%w: tcp: connection reset by peer", errs.ErrAborted)
	fail := 0
	fp := &fakePeers{conns: []*fakeConn{{errs: []error{cut}, breaks: true}, {}}, answers: []answer{{size: regionSize}}, insts: []uint64{1}}
	fp.wrap = func(c *fakeConn) transport.Conn { return &flakyPrep{prepConn: &prepConn{fakeConn: c}, fail: &fail} }
	s, req, info := preparedRig(t, fp)
	fail = 2
	if _, err := s.Plans().Submit(ctxT(t), ownerOf(req), info.Handle); err != nil {
		t.Fatalf("submit: %v", err)
	}
	if fail != 0 || fp.conns[1].writes != 1 {
		t.Fatalf("%d failures left, %d writes on the fresh connection", fail, fp.conns[1].writes)
	}
}

// A plan whose connection broke between submits found nothing of the
// next submit sent: re-binding it is a free run again, as Run's batches
// get on transport.ErrNotSent, so the submit keeps its one retry for a
// connection that breaks under its write.
func TestPreparedBrokenBetweenSubmitsKeepsTheRetry(t *testing.T) {
	cut := fmt.Errorf("%w: tcp: connection reset by peer", errs.ErrAborted)
	fp := &fakePeers{conns: []*fakeConn{{}, {errs: []error{cut}, breaks: true}, {}}, answers: []answer{{size: regionSize}}, insts: []uint64{1}}
	s, req, info := preparedRig(t, fp)
	fp.conns[0].mu.Lock()
	fp.conns[0].err = cut // broken while idle
	fp.conns[0].mu.Unlock()
	if _, err := s.Plans().Submit(ctxT(t), ownerOf(req), info.Handle); err != nil {
		t.Fatalf("submit: %v", err)
	}
	if fp.gets != 3 || fp.broken != 2 || fp.conns[0].writes != 0 || fp.conns[1].writes != 1 || fp.conns[2].writes != 1 {
		t.Fatalf("%d gets, %d broken, writes %d/%d/%d: want 3, 2, 0/1/1", fp.gets, fp.broken, fp.conns[0].writes, fp.conns[1].writes, fp.conns[2].writes)
	}
}

// stuckPreparer is a connection whose Prepare waits for gate, as a
// same-host connection's warm-up waits on a stopped peer (to its own 30 s
// bound: Prepare takes no context).
type stuckPreparer struct {
	*fakeConn
	gate     chan struct{}
	prepared atomic.Int32
	closed   atomic.Int32
}

func (c *stuckPreparer) Prepare(*transport.Request) (transport.Prepared, error) {
	<-c.gate
	c.prepared.Add(1)
	return &countedPrepared{c: c}, nil
}

type countedPrepared struct{ c *stuckPreparer }

func (p *countedPrepared) Write(context.Context) (transport.Stats, error) {
	return transport.Stats{}, nil
}
func (p *countedPrepared) Close() error {
	p.c.closed.Add(1)
	return nil
}

// A submit whose plan is prepared again on a fresh connection answers at
// its own deadline when that Prepare waits on the peer, and so does a
// submit queued behind it; the late Prepare's work is freed once it ends.
func TestPreparedRebindAnswersAtDeadline(t *testing.T) {
	cut := fmt.Errorf("%w: tcp: connection reset by peer", errs.ErrAborted)
	stuck := &stuckPreparer{fakeConn: &fakeConn{}, gate: make(chan struct{})}
	fp := &fakePeers{conns: []*fakeConn{{errs: []error{cut}, breaks: true}, stuck.fakeConn},
		answers: []answer{{size: regionSize}}, insts: []uint64{1}}
	fp.wrap = func(c *fakeConn) transport.Conn {
		if c == stuck.fakeConn {
			return stuck
		}
		return &prepConn{fakeConn: c}
	}
	s, req, info := preparedRig(t, fp)
	const deadline = 200 * time.Millisecond
	var once sync.Once
	release := func() { once.Do(func() { close(stuck.gate) }) }
	time.AfterFunc(6*time.Second, release) // a submit that waits for it fails below, not hangs
	errc := make(chan error, 2)
	took := make(chan time.Duration, 2)
	for range 2 { // the second waits for the first's re-bind
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			start := time.Now()
			_, err := s.Plans().Submit(ctx, ownerOf(req), info.Handle)
			took <- time.Since(start)
			errc <- err
		}()
	}
	for range 2 {
		err, d := <-errc, <-took
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("submit while the re-bind's Prepare waits: %v, want DeadlineExceeded", err)
		}
		// The Prepare is held for as long as the test runs: an answer well
		// before 5 s can only be the submit's own deadline.
		if d > 5*time.Second {
			t.Fatalf("submit answered after %v, its deadline %v: it waited for the Prepare", d, deadline)
		}
	}
	release()
	if err := s.Plans().Release(ownerOf(req), info.Handle); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); stuck.closed.Load() != stuck.prepared.Load() || stuck.prepared.Load() == 0; {
		if time.Now().After(end) {
			t.Fatalf("%d late Prepares, %d closed", stuck.prepared.Load(), stuck.closed.Load())
		}
		time.Sleep(10 * time.Millisecond) // a poll interval, not a synchronisation
	}
}
