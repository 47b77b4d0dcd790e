package batch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/transport"
)

// prepConn is a fakeConn that prepares: its Prepared writes the merged batch
// through the fakeConn.
type prepConn struct {
	*fakeConn
	mu               sync.Mutex
	prepares, closes int
}

func (c *prepConn) Prepare(r *transport.Request) (transport.Prepared, error) {
	src, dst, b, err := transport.PreparedWrite(r)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.prepares++
	n := b.N()
	return &fakePrepared{c: c, src: src, dst: dst, b: desc.Batch{Src: b.Src[:n:n], Dst: b.Dst[:n:n], Len: b.Len[:n:n]}}, nil
}

type fakePrepared struct {
	c   *prepConn
	src transport.Registration
	dst transport.RemoteRegion
	b   desc.Batch
}

func (p *fakePrepared) Write(ctx context.Context) (transport.Stats, error) {
	return transport.Write(ctx, p.c.fakeConn, p.src, p.dst, &p.b)
}

func (p *fakePrepared) Close() error {
	p.c.mu.Lock()
	p.c.closes++
	p.c.mu.Unlock()
	return nil
}

var owner1 = Owner{Caller: region.Caller{UID: 1000, GID: 1000, Known: true}, Conn: 1}

// preparedRig rigs a service over fp and prepares its request for owner1's
// connection (as the region's owner).
func preparedRig(t testing.TB, fp *fakePeers) (*Service, Request, PlanInfo) {
	t.Helper()
	s, req := rig(t, fp)
	info, err := s.Plans().Prepare(context.Background(), req, ownerOf(req))
	if err != nil {
		t.Fatal(err)
	}
	return s, req, info
}

func ownerOf(req Request) Owner { return Owner{Caller: req.Caller, Conn: owner1.Conn} }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestPrepareSubmitRelease(t *testing.T) {
	for _, prep := range []bool{false, true} {
		t.Run(fmt.Sprintf("preparer=%v", prep), func(t *testing.T) {
			c := &fakeConn{keys: []uint64{}}
			var pc *prepConn
			fp := &fakePeers{conns: []*fakeConn{c}, answers: []answer{{size: regionSize, cached: true}}, insts: []uint64{42}}
			if prep {
				pc = &prepConn{fakeConn: c}
				fp.wrap = func(*fakeConn) transport.Conn { return pc }
			}
			s, req, info := preparedRig(t, fp)
			if info.Handle == 0 || info.Blocks != 2 || info.Bytes != 8192 || info.Segments != 2 || info.Kind != transport.TCP {
				t.Fatalf("info %+v", info)
			}
			if info.Phases.Validate <= 0 || info.Phases.Resolve <= 0 || info.Phases.Total < info.Phases.Validate+info.Phases.Resolve {
				t.Fatalf("phases %+v", info.Phases)
			}
			// Prepare resolved afresh even with a cached answer on offer.
			if fp.forgets != 1 || fp.resolves != 1 || fp.gets != 1 {
				t.Fatalf("forgets %d resolves %d gets %d", fp.forgets, fp.resolves, fp.gets)
			}
			// The plan holds its source.
			err := s.cfg.Registry.Deregister(req.Src, req.Caller)
			if errs.Class(err) != errs.ErrFailedPrecondition || !strings.Contains(err.Error(), "prepared plan") {
				t.Fatalf("deregister under a plan: %v", err)
			}
			for i := 0; i < 3; i++ {
				res, err := s.Plans().Submit(ctxT(t), ownerOf(req), info.Handle)
				if err != nil || res.Blocks != 2 || res.Bytes != 8192 || res.Stats.Segments != 2 || res.Phases.Total <= 0 || res.Phases.Validate != 0 {
					t.Fatalf("submit %d: %+v %v", i, res, err)
				}
			}
			if c.writes != 3 || fp.resolves != 1 || fp.gets != 1 || s.Counters().BatchesSent.Load() != 3 || s.Counters().BytesSent.Load() != 3*8192 {
				t.Fatalf("writes %d resolves %d gets %d sent %d", c.writes, fp.resolves, fp.gets, s.Counters().BatchesSent.Load())
			}
			if len(c.keys) != 3 || c.keys[0] != 7 {
				t.Fatalf("keys %v", c.keys)
			}
			if pc != nil && (pc.prepares != 1 || pc.closes != 0) {
				t.Fatalf("prepares %d closes %d", pc.prepares, pc.closes)
			}
			if err := s.Plans().Release(ownerOf(req), info.Handle); err != nil {
				t.Fatal(err)
			}
			if pc != nil && pc.closes != 1 {
				t.Fatalf("closes %d after release", pc.closes)
			}
			if s.Plans().Len() != 0 {
				t.Fatalf("%d plans after release", s.Plans().Len())
			}
			if _, err := s.Plans().Submit(ctxT(t), ownerOf(req), info.Handle); errs.Class(err) != errs.ErrNotFound {
				t.Fatalf("submit after release: %v", err)
			}
			if err := s.Plans().Release(ownerOf(req), info.Handle); errs.Class(err) != errs.ErrNotFound {
				t.Fatalf("release twice: %v", err)
			}
			if err := s.cfg.Registry.Deregister(req.Src, req.Caller); err != nil {
				t.Fatalf("deregister after release: %v", err)
			}
		})
	}
}

func TestSubmitStale(t *testing.T) {
	cut := fmt.Errorf("%w: tcp: connection reset by peer", errs.ErrAborted)
	refused := fmt.Errorf("%w: key 7 is not registered", errs.ErrNotFound)
	for _, tc := range []struct {
		name   string
		fp     func() *fakePeers
		before func(fp *fakePeers) // between prepare and submit
		why    string              // in the stale error
		writes int                 // on the first conn
	}{
		{"peer restarted, seen by another batch's handshake", func() *fakePeers {
			return &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{size: regionSize}}, insts: []uint64{1}}
		}, func(fp *fakePeers) { fp.mu.Lock(); fp.instance = 2; fp.mu.Unlock() }, "its peer b:7470 restarted", 0},
		{"peer restarted, seen after the connection broke", func() *fakePeers {
			return &fakePeers{conns: []*fakeConn{{errs: []error{cut}, breaks: true}, {}}, answers: []answer{{size: regionSize}}, insts: []uint64{1, 2}}
		}, nil, "its peer b:7470 restarted", 1},
		{"receiver refused the key", func() *fakePeers {
			return &fakePeers{conns: []*fakeConn{{errs: []error{refused}}}, answers: []answer{{size: regionSize}}, insts: []uint64{1}}
		}, nil, `dst_region "kv" on peer b:7470 refused its key`, 1},
		{"destination re-registered, seen after the connection broke", func() *fakePeers {
			return &fakePeers{conns: []*fakeConn{{errs: []error{cut}, breaks: true}, {}}, answers: []answer{{size: regionSize}, {size: regionSize, key: 8}}, insts: []uint64{1}}
		}, nil, `dst_region "kv" on peer b:7470 was re-registered or its export changed`, 1},
		{"destination gone, seen after the connection broke", func() *fakePeers {
			return &fakePeers{conns: []*fakeConn{{errs: []error{cut}, breaks: true}, {}}, answers: []answer{{size: regionSize}, {err: fmt.Errorf("%w: region kv is not exported", errs.ErrNotFound)}}, insts: []uint64{1}}
		}, nil, "region kv is not exported", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp := tc.fp()
			s, req, info := preparedRig(t, fp)
			if tc.before != nil {
				tc.before(fp)
			}
			_, err := s.Plans().Submit(ctxT(t), ownerOf(req), info.Handle)
			want := fmt.Sprintf("plan %d is stale: ", info.Handle)
			if errs.Class(err) != errs.ErrFailedPrecondition || !strings.Contains(err.Error(), want) ||
				!strings.Contains(err.Error(), tc.why) || !strings.HasSuffix(err.Error(), "; prepare it again") {
				t.Fatalf("err = %v (%v)", err, errs.Class(err))
			}
			if w := fp.conns[0].writes; w != tc.writes {
				t.Fatalf("%d writes, want %d", w, tc.writes)
			}
			// Stale stays stale, with no write and no call.
			gets, resolves := fp.gets, fp.resolves
			_, err2 := s.Plans().Submit(ctxT(t), ownerOf(req), info.Handle)
			if err2 == nil || err2.Error() != err.Error() || fp.gets != gets || fp.resolves != resolves || fp.conns[0].writes != tc.writes {
				t.Fatalf("second submit: %v", err2)
			}
			for _, c := range fp.conns[1:] {
				if c.writes != 0 {
					t.Fatalf("a stale plan wrote on a fresh connection")
				}
			}
			if s.Counters().BatchesFailed.Load() != 2 || s.Counters().BatchesSent.Load() != 0 {
				t.Fatal("counters")
			}
		})
	}
}

func TestSubmitRetry(t *testing.T) {
	cut := fmt.Errorf("%w: tcp: connection reset by peer", errs.ErrAborted)
	fault := fmt.Errorf("tcp: send: %w", &memguard.Fault{Side: memguard.Source, Addr: 0x1000})
	for _, tc := range []struct {
		name     string
		conns    []*fakeConn
		ctx      func() (context.Context, context.CancelFunc)
		class    error // nil: success
		msg      string
		gets     int
		prepares int
	}{
		{"broken once, then prepared again on a fresh connection", []*fakeConn{{errs: []error{cut}, breaks: true}, {}}, nil, nil, "", 2, 2},
		{"broken twice", []*fakeConn{{errs: []error{cut}, breaks: true}, {errs: []error{cut}, breaks: true}}, nil, errs.ErrAborted,
			"(after preparing again on a fresh connection; the first attempt failed: batch of 2 blocks to b:7470/kv over tcp: aborted: tcp: connection reset by peer)", 2, 2},
		{"memory fault: no retry", []*fakeConn{{errs: []error{fault}, breaks: true}, {}}, nil, errs.ErrDataLoss, "src_region_id ", 1, 1},
		{"caller gave up: no retry", []*fakeConn{{errs: []error{cut}, breaks: true}, {}}, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, context.Canceled, "", 1, 1},
		{"a failure that leaves the connection usable", []*fakeConn{{errs: []error{fmt.Errorf("%w: range past the region", errs.ErrInvalidArgument)}}}, nil, errs.ErrInvalidArgument, "range past", 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pcs []*prepConn
			fp := &fakePeers{conns: tc.conns, answers: []answer{{size: regionSize}}, insts: []uint64{5}}
			fp.wrap = func(c *fakeConn) transport.Conn {
				pc := &prepConn{fakeConn: c}
				pcs = append(pcs, pc)
				return pc
			}
			s, req, info := preparedRig(t, fp)
			ctx := ctxT(t)
			if tc.ctx != nil {
				var cancel context.CancelFunc
				ctx, cancel = tc.ctx()
				defer cancel()
			}
			_, err := s.Plans().Submit(ctx, ownerOf(req), info.Handle)
			if tc.class == nil && err != nil || tc.class != nil && (errs.Class(err) != tc.class || !strings.Contains(err.Error(), tc.msg)) {
				t.Fatalf("err = %v (%v)", err, errs.Class(err))
			}
			prepares := 0
			for _, pc := range pcs {
				prepares += pc.prepares
			}
			if fp.gets != tc.gets || prepares != tc.prepares {
				t.Fatalf("gets %d prepares %d", fp.gets, prepares)
			}
			if tc.gets == 2 && pcs[0].closes != 1 {
				t.Fatalf("the broken connection's prepared work was not freed")
			}
			if tc.class == nil { // the fresh binding is kept for the next submit
				if _, err := s.Plans().Submit(ctxT(t), ownerOf(req), info.Handle); err != nil || fp.gets != tc.gets {
					t.Fatalf("next submit: %v, gets %d", err, fp.gets)
				}
			}
		})
	}
}

func TestPlanOwnership(t *testing.T) {
	fp := &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{size: regionSize}}}
	s, req, info := preparedRig(t, fp)
	for _, o := range []Owner{
		{Caller: req.Caller, Conn: owner1.Conn + 1}, // same user, another connection
		{Caller: region.Caller{UID: 4242, Known: true}, Conn: owner1.Conn},
		{},
	} {
		if _, err := s.Plans().Submit(ctxT(t), o, info.Handle); errs.Class(err) != errs.ErrNotFound || !strings.Contains(err.Error(), fmt.Sprintf("plan %d: no such prepared transfer", info.Handle)) {
			t.Fatalf("submit by %+v: %v", o, err)
		}
		if err := s.Plans().Release(o, info.Handle); errs.Class(err) != errs.ErrNotFound {
			t.Fatalf("release by %+v: %v", o, err)
		}
	}
	if _, err := s.Plans().Submit(ctxT(t), ownerOf(req), info.Handle^1); errs.Class(err) != errs.ErrNotFound {
		t.Fatalf("unknown handle: %v", err)
	}
	if fp.conns[0].writes != 0 || s.Plans().Len() != 1 {
		t.Fatalf("writes %d plans %d", fp.conns[0].writes, s.Plans().Len())
	}
}

func TestPlanLimit(t *testing.T) {
	fp := &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{size: regionSize}}}
	s, req, first := preparedRig(t, fp)
	s.Plans().SetMax(2)
	o := ownerOf(req)
	if _, err := s.Plans().Prepare(ctxT(t), req, o); err != nil {
		t.Fatal(err)
	}
	_, err := s.Plans().Prepare(ctxT(t), req, Owner{Caller: o.Caller, Conn: 99}) // the limit is per identity, not per connection
	if errs.Class(err) != errs.ErrResourceExhausted || !strings.Contains(err.Error(), "holds 2 prepared plans, the limit (--max-plans) is 2") {
		t.Fatalf("err = %v", err)
	}
	if s.Plans().Len() != 2 {
		t.Fatalf("%d plans", s.Plans().Len())
	}
	if err := s.Plans().Release(o, first.Handle); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Plans().Prepare(ctxT(t), req, o); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	// A failed prepare does not count.
	bad := req
	bad.Dst = ""
	s.Plans().SetMax(3)
	if _, err := s.Plans().Prepare(ctxT(t), bad, o); errs.Class(err) != errs.ErrInvalidArgument {
		t.Fatal(err)
	}
	if _, err := s.Plans().Prepare(ctxT(t), req, o); err != nil {
		t.Fatalf("a failed prepare was counted: %v", err)
	}
}

func TestReleaseConnAndClose(t *testing.T) {
	fp := &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{size: regionSize}}}
	s, req, _ := preparedRig(t, fp)
	other := Owner{Caller: req.Caller, Conn: 7}
	kept, err := s.Plans().Prepare(ctxT(t), req, other)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.Plans().ReleaseConn(owner1.Conn); n != 1 || s.Plans().Len() != 1 {
		t.Fatalf("released %d, %d left", n, s.Plans().Len())
	}
	if n := s.Plans().ReleaseConn(0); n != 0 {
		t.Fatalf("conn 0 released %d", n)
	}
	if _, err := s.Plans().Submit(ctxT(t), other, kept.Handle); err != nil {
		t.Fatal(err)
	}
	if err := s.cfg.Registry.Deregister(req.Src, req.Caller); errs.Class(err) != errs.ErrFailedPrecondition {
		t.Fatalf("deregister with a plan left: %v", err)
	}
	s.Close()
	if s.Plans().Len() != 0 {
		t.Fatalf("%d plans after Close", s.Plans().Len())
	}
	if _, err := s.Plans().Prepare(ctxT(t), req, other); errs.Class(err) != errs.ErrUnavailable {
		t.Fatalf("prepare after Close: %v", err)
	}
	if err := s.cfg.Registry.Deregister(req.Src, req.Caller); err != nil {
		t.Fatalf("deregister after Close: %v", err)
	}
}

func TestReleaseWhileSubmitting(t *testing.T) {
	c := &fakeConn{}
	pc := &prepConn{fakeConn: c}
	fp := &fakePeers{conns: []*fakeConn{c}, answers: []answer{{size: regionSize}}, wrap: func(*fakeConn) transport.Conn { return pc }}
	s, req, info := preparedRig(t, fp)
	c.entered, c.gate = make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		_, err := s.Plans().Submit(ctxT(t), ownerOf(req), info.Handle)
		done <- err
	}()
	<-c.entered
	if err := s.Plans().Release(ownerOf(req), info.Handle); err != nil {
		t.Fatal(err)
	}
	// Released, but the submit in flight still holds the source and the work.
	if _, err := s.Plans().Submit(ctxT(t), ownerOf(req), info.Handle); errs.Class(err) != errs.ErrNotFound {
		t.Fatalf("a new submit of a released plan: %v", err)
	}
	if err := s.cfg.Registry.Deregister(req.Src, req.Caller); errs.Class(err) != errs.ErrFailedPrecondition {
		t.Fatalf("deregister under a submit: %v", err)
	}
	pc.mu.Lock()
	closes := pc.closes
	pc.mu.Unlock()
	if closes != 0 {
		t.Fatal("prepared work freed under its write")
	}
	close(c.gate)
	if err := <-done; err != nil {
		t.Fatalf("the submit in flight: %v", err)
	}
	if pc.closes != 1 {
		t.Fatalf("closes %d", pc.closes)
	}
	if err := s.cfg.Registry.Deregister(req.Src, req.Caller); err != nil {
		t.Fatalf("deregister after the submit: %v", err)
	}
}

func TestSubmitAllocatesNothing(t *testing.T) {
	fp := &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{size: regionSize}}, insts: []uint64{3}}
	s, req, info := preparedRig(t, fp)
	ctx := ctxT(t)
	o := ownerOf(req)
	var err error
	n := testing.AllocsPerRun(100, func() {
		_, err = s.Plans().Submit(ctx, o, info.Handle)
	})
	if err != nil || n != 0 {
		t.Fatalf("%v allocations per submit (err %v)", n, err)
	}
}

func BenchmarkSubmit(b *testing.B) {
	fp := &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{size: regionSize}}, insts: []uint64{3}}
	s, req, info := preparedRig(b, fp)
	o := ownerOf(req)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.Plans().Submit(ctx, o, info.Handle); err != nil {
			b.Fatal(err)
		}
	}
}

// TestPrepareCallerGone: a caller that went away while its plan was being
// made never learns the handle; the plan is not kept.
func TestPrepareCallerGone(t *testing.T) {
	fp := &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{size: regionSize}}}
	s, req := rig(t, fp)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the fakes do not look at ctx: the plan is made, then dropped
	_, err := s.Plans().Prepare(ctx, req, ownerOf(req))
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "caller went away") {
		t.Fatalf("err = %v", err)
	}
	if s.Plans().Len() != 0 {
		t.Fatalf("%d plans kept", s.Plans().Len())
	}
	if err := s.cfg.Registry.Deregister(req.Src, req.Caller); err != nil {
		t.Fatalf("the dropped plan still holds the source: %v", err)
	}
}
