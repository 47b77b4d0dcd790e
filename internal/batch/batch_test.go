package batch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/notify"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/transport"
)

// fakeTransport registers memory with a fixed key; it never connects (the
// fake peers hand out connections).
type fakeTransport struct{ transport.Quiet }

func (fakeTransport) Kind() transport.Kind { return transport.TCP }
func (fakeTransport) Register(m memory.Memory) (transport.Registration, error) {
	return fakeReg{m: m}, nil
}
func (fakeTransport) Connect(context.Context, transport.Peer) (transport.Conn, error) {
	return nil, errors.New("fake transport: no connect")
}
func (fakeTransport) Close() error { return nil }

type fakeReg struct {
	transport.SingleKey
	m memory.Memory
}

func (r fakeReg) Memory() memory.Memory    { return r.m }
func (r fakeReg) Key() transport.RemoteKey { return transport.RemoteKey{Key: 1} }
func (r fakeReg) Close() error             { return nil }

// fakeConn fails its writes with errs in order (nil: success); a failed
// write breaks it when breaks is set.
type fakeConn struct {
	transport.NoPrepare
	mu     sync.Mutex
	errs   []error
	breaks bool
	writes int
	err    error
	keys   []uint64 // the destination key of each write
	// entered, when set, is told of each write, which then waits for gate.
	entered chan struct{}
	gate    chan struct{}
}

func (c *fakeConn) Write(ctx context.Context, src transport.Registration, dst transport.RemoteRegion, b *desc.Batch) (transport.Stats, error) {
	if c.entered != nil {
		c.entered <- struct{}{}
		<-c.gate
	}
	c.mu.Lock()
	if c.keys != nil {
		c.keys = append(c.keys, dst.Key.Key)
	}
	defer c.mu.Unlock()
	c.writes++
	if c.err != nil {
		// Broken, as a real connection is: every later write fails too
		// (a write that raced the break must not land and succeed).
		return transport.Stats{}, c.err
	}
	var err error
	if len(c.errs) > 0 {
		err, c.errs = c.errs[0], c.errs[1:]
	}
	if err != nil {
		if c.breaks {
			c.err = err
		}
		return transport.Stats{}, err
	}
	return transport.Stats{Segments: uint64(b.N()), WorkRequests: 1}, nil
}

func (c *fakeConn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
func (c *fakeConn) Close() error { return nil }

// Post routes to Write (block ids: one Write per stretch); it cannot read.
// A plain write goes straight to Write, so that it allocates nothing (a
// Handlers made here would allocate its method value).
func (c *fakeConn) Post(ctx context.Context, r *transport.Request) (transport.Stats, error) {
	if r.Op == transport.OpWrite && r.Batch != nil && r.Blocks == nil {
		return c.Write(ctx, r.Local, r.Remote, r.Batch)
	}
	h := transport.Handlers{Write: c.Write}
	return h.Post(ctx, r)
}

type answer struct {
	size   uint64
	cached bool
	err    error
	key    uint64 // 0: 7
}

// fakePeers hands out conns in order (the last one again when they run
// out) and resolutions in order (likewise).
type fakePeers struct {
	mu        sync.Mutex
	conns     []*fakeConn
	answers   []answer
	notifyErr error
	// insts are the peer's instance IDs, the i-th set by the i-th Get (the
	// last one again when they run out); none: Instance is 0.
	insts    []uint64
	instance uint64
	// wrap, when set, turns the conn a Get hands out into a Conn that
	// prepares (the Sessions' Caps then say Prepared).
	wrap func(*fakeConn) transport.Conn
	// caps, when set, are the Caps the Sessions carry (else a kind that
	// writes and reads host memory).
	caps *transport.Caps

	gets, resolves, forgets, broken int
	holds, released                 int // ResolveHeld's holds, and those let go
	notified                        []notify.Notification
}

func (f *fakePeers) Get(ctx context.Context, addr string, want transport.Kind, need transport.Need) (transport.Session, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.conns[min(f.gets, len(f.conns)-1)]
	if len(f.insts) > 0 {
		f.instance = f.insts[min(f.gets, len(f.insts)-1)]
	}
	f.gets++
	var conn transport.Conn = c
	caps := transport.Caps{Ops: transport.OpWrite | transport.OpRead, Memory: []memory.Kind{memory.Host}}
	if f.wrap != nil {
		conn = f.wrap(c)
		caps.Prepared = true // every wrap here prepares
	}
	if f.caps != nil {
		caps = *f.caps
	}
	return transport.Session{Kind: transport.TCP, Conn: conn, Caps: caps, Name: "b", Reused: f.gets == 1}, nil
}

func (f *fakePeers) Resolve(ctx context.Context, addr string, s transport.Session, name string, _ transport.Access) (transport.Resolution, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.answers[min(f.resolves, len(f.answers)-1)]
	f.resolves++
	if a.err != nil {
		return transport.Resolution{}, false, a.err
	}
	key := a.key
	if key == 0 {
		key = 7
	}
	return transport.Resolution{Name: name, Size: a.size, Keys: map[transport.Kind]transport.RegionKey{transport.TCP: {Key: transport.RemoteKey{Key: key}}}}, a.cached, nil
}

// ResolveHeld is Resolve whose fresh answers hold until released: holds
// and releases are counted (rig checks every hold was released once).
func (f *fakePeers) ResolveHeld(ctx context.Context, addr string, s transport.Session, name string, a transport.Access) (transport.Resolution, bool, func(), error) {
	r, cached, err := f.Resolve(ctx, addr, s, name, a)
	if err != nil || cached {
		return r, cached, func() {}, err
	}
	f.mu.Lock()
	f.holds++
	f.mu.Unlock()
	var once atomic.Bool
	return r, cached, func() {
		if once.Swap(true) {
			panic("a hold released twice")
		}
		f.mu.Lock()
		f.released++
		f.mu.Unlock()
	}, nil
}

func (f *fakePeers) Forget(addr, name string, _ transport.Access) {
	f.mu.Lock()
	f.forgets++
	f.mu.Unlock()
}

// ResolveLayout: no layouts here (layoutPeers has them).
func (f *fakePeers) ResolveLayout(context.Context, string, string, transport.Access) (*transport.LayoutResolution, bool, error) {
	return nil, false, errs.ErrUnimplemented
}
func (f *fakePeers) ForgetLayout(string, string, transport.Access) {}
func (f *fakePeers) Broken(addr string, s transport.Session) {
	f.mu.Lock()
	f.broken++
	f.mu.Unlock()
}
func (f *fakePeers) Notify(ctx context.Context, addr string, n notify.Notification) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.notified = append(f.notified, n)
	return f.notifyErr
}
func (f *fakePeers) Instance(addr string) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.instance
}

const regionSize = 1 << 20

// rig is a batch service over a real registry (one host source region of
// regionSize) and fp.
func rig(t testing.TB, fp *fakePeers) (*Service, Request) {
	t.Helper()
	reg, err := region.New(region.Config{ShmDir: t.TempDir(), Transports: []transport.Transport{fakeTransport{}}, CUDAWhy: "no GPU in this test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	who := region.Caller{UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), Known: true}
	src, err := reg.AllocHost(regionSize, region.Export{}, who)
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{NodeName: "a", Registry: reg, Peers: fp, MaxDescriptors: 100})
	t.Cleanup(func() {
		// Whatever the outcome, every hold a resolution took was let go
		// (a hold left would refuse the peer's deregistration for good).
		fp.mu.Lock()
		defer fp.mu.Unlock()
		if fp.holds != fp.released {
			t.Errorf("%d resolutions held the destination, %d holds were released", fp.holds, fp.released)
		}
	})
	// Two blocks of 4 KiB, the second ending at 64 KiB + 4 KiB on the destination.
	p := desc.Packed{SrcOffsets: desc.Pack([]uint64{0, 8192}), DstOffsets: desc.Pack([]uint64{0, 65536}), BlockLength: 4096}
	return s, Request{Src: src.ID, Caller: who, Peer: "b:7470", Dst: "kv", Descriptors: &p}
}

func TestRetryOnStaleResolution(t *testing.T) {
	t.Run("size", func(t *testing.T) {
		// The cached size is too small for the batch: one fresh resolve.
		fp := &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{size: 4096, cached: true}, {size: regionSize}}}
		s, req := rig(t, fp)
		res, err := s.Transfer(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if fp.resolves != 2 || fp.forgets != 1 || fp.conns[0].writes != 1 || res.Blocks != 2 || res.Bytes != 8192 {
			t.Fatalf("resolves %d forgets %d writes %d result %+v", fp.resolves, fp.forgets, fp.conns[0].writes, res)
		}
	})
	t.Run("refused key", func(t *testing.T) {
		// The receiver refuses a cached key before placing a byte.
		c := &fakeConn{errs: []error{fmt.Errorf("%w: key 7 is not registered", errs.ErrNotFound)}}
		fp := &fakePeers{conns: []*fakeConn{c}, answers: []answer{{size: regionSize, cached: true}, {size: regionSize}}}
		s, req := rig(t, fp)
		if _, err := s.Transfer(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		if fp.resolves != 2 || fp.forgets != 1 || c.writes != 2 {
			t.Fatalf("resolves %d forgets %d writes %d", fp.resolves, fp.forgets, c.writes)
		}
	})
	t.Run("fresh resolution is not retried", func(t *testing.T) {
		fp := &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{size: 4096}}}
		s, req := rig(t, fp)
		_, err := s.Transfer(context.Background(), req)
		if errs.Class(err) != errs.ErrInvalidArgument || !strings.Contains(err.Error(), "descriptors.dst_offsets[1] = 65536") {
			t.Fatalf("err = %v", err)
		}
		if fp.resolves != 1 || fp.forgets != 0 {
			t.Fatalf("resolves %d forgets %d", fp.resolves, fp.forgets)
		}
	})
}

func TestRetryOnBrokenConnection(t *testing.T) {
	cut := fmt.Errorf("%w: tcp: connection reset by peer", errs.ErrAborted)
	t.Run("once, then success", func(t *testing.T) {
		first, second := &fakeConn{errs: []error{cut}, breaks: true}, &fakeConn{}
		fp := &fakePeers{conns: []*fakeConn{first, second}, answers: []answer{{size: regionSize}}}
		s, req := rig(t, fp)
		if _, err := s.Transfer(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		if fp.gets != 2 || fp.broken != 1 || first.writes != 1 || second.writes != 1 {
			t.Fatalf("gets %d broken %d writes %d/%d", fp.gets, fp.broken, first.writes, second.writes)
		}
	})
	t.Run("no second retry", func(t *testing.T) {
		first := &fakeConn{errs: []error{cut}, breaks: true}
		second := &fakeConn{errs: []error{fmt.Errorf("%w: tcp: broken pipe", errs.ErrUnavailable)}, breaks: true}
		fp := &fakePeers{conns: []*fakeConn{first, second, {}}, answers: []answer{{size: regionSize}}}
		s, req := rig(t, fp)
		_, err := s.Transfer(context.Background(), req)
		if err == nil || fp.gets != 2 || fp.broken != 2 {
			t.Fatalf("err %v gets %d broken %d", err, fp.gets, fp.broken)
		}
		// Both attempts' errors are in the message; the last one's class wins.
		msg := err.Error()
		if errs.Class(err) != errs.ErrUnavailable || !strings.Contains(msg, "broken pipe") ||
			!strings.Contains(msg, "(after a retry on a fresh connection; the first attempt failed: batch of 2 blocks to b:7470/kv over tcp: aborted: tcp: connection reset by peer)") {
			t.Fatalf("err = %v (%v)", err, errs.Class(err))
		}
		if s.Counters().BatchesFailed.Load() != 1 || s.Counters().BatchesSent.Load() != 0 {
			t.Fatal("counters")
		}
	})
	notSent := fmt.Errorf("%w: %w: tcp: connection to b is broken: an earlier batch was cut off", errs.ErrUnavailable, transport.ErrNotSent)
	t.Run("conns broken by others before anything was sent, then a cut, then success", func(t *testing.T) {
		// Three conns broken by other batches (one cancel each), then one
		// this batch breaks (its one retry), then success: nothing failed
		// the caller, for nothing of it was sent on the first three.
		conns := []*fakeConn{{errs: []error{notSent}, breaks: true}, {errs: []error{notSent}, breaks: true}, {errs: []error{notSent}, breaks: true},
			{errs: []error{cut}, breaks: true}, {}}
		fp := &fakePeers{conns: conns, answers: []answer{{size: regionSize}}}
		s, req := rig(t, fp)
		if _, err := s.Transfer(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		if fp.gets != 5 || fp.broken != 4 {
			t.Fatalf("gets %d broken %d", fp.gets, fp.broken)
		}
	})
	t.Run("not sent is bounded", func(t *testing.T) {
		// A peer that breaks every conn before the batch is sent ends it
		// after maxNotSent runs again, not never.
		c := &fakeConn{breaks: true}
		for range maxNotSent + 5 {
			c.errs = append(c.errs, notSent)
		}
		fp := &fakePeers{conns: []*fakeConn{c}, answers: []answer{{size: regionSize}}}
		s, req := rig(t, fp)
		_, err := s.Transfer(context.Background(), req)
		if !errors.Is(err, transport.ErrNotSent) || c.writes != maxNotSent+2 {
			t.Fatalf("err %v, writes %d, want %d", err, c.writes, maxNotSent+2)
		}
	})
	t.Run("a failure that leaves the connection usable", func(t *testing.T) {
		c := &fakeConn{errs: []error{fmt.Errorf("%w: range past the region", errs.ErrInvalidArgument)}}
		fp := &fakePeers{conns: []*fakeConn{c}, answers: []answer{{size: regionSize}}}
		s, req := rig(t, fp)
		if _, err := s.Transfer(context.Background(), req); errs.Class(err) != errs.ErrInvalidArgument || fp.gets != 1 {
			t.Fatalf("err %v gets %d", err, fp.gets)
		}
	})
}

// TestNoRetryOnMemoryFault: a fault fails the batch without a retry, and
// the message names the region of the side the fault carries, and not the
// other one.
func TestNoRetryOnMemoryFault(t *testing.T) {
	for _, tc := range []struct {
		side          memguard.Side
		blamed, spare string
	}{
		{memguard.Source, "src_region_id %s: ", `dst_region "kv"`},
		{memguard.Destination, `dst_region "kv" on b:7470: `, "src_region_id"},
	} {
		t.Run(tc.side.String(), func(t *testing.T) {
			fault := fmt.Errorf("tcp: send: %w", &memguard.Fault{Side: tc.side, Addr: 0x1000})
			c := &fakeConn{errs: []error{fault}, breaks: true}
			fp := &fakePeers{conns: []*fakeConn{c, {}}, answers: []answer{{size: regionSize}}}
			s, req := rig(t, fp)
			blamed := strings.ReplaceAll(tc.blamed, "%s", req.Src) // the source region's id
			_, err := s.Transfer(context.Background(), req)
			if errs.Class(err) != errs.ErrDataLoss || fp.gets != 1 {
				t.Fatalf("err %v (%v), gets %d", err, errs.Class(err), fp.gets)
			}
			if msg := err.Error(); !strings.Contains(msg, blamed) || strings.Contains(msg, tc.spare) {
				t.Fatalf("message %q: want it to name %q and not %q", msg, blamed, tc.spare)
			}
		})
	}
}

func TestCallerDeadlineOrCancel(t *testing.T) {
	// The connection breaks as the caller's ctx ends: no retry, and the
	// caller's deadline or cancellation is the outcome.
	dial := fmt.Errorf("%w: tcp: dial data stream 0: %w", errs.ErrUnavailable, os.ErrDeadlineExceeded)
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		}, context.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &fakeConn{errs: []error{dial}, breaks: true}
			fp := &fakePeers{conns: []*fakeConn{c, {}}, answers: []answer{{size: regionSize}}}
			s, req := rig(t, fp)
			ctx, cancel := tc.ctx()
			defer cancel()
			_, err := s.Transfer(ctx, req)
			if errs.Class(err) != tc.want || !errors.Is(err, dial) || fp.gets != 1 {
				t.Fatalf("err %v (%v), gets %d", err, errs.Class(err), fp.gets)
			}
		})
	}
	t.Run("resolve cut short by the caller", func(t *testing.T) {
		// The caller's cancel ends the resolve: the connection, which other
		// batches may be writing on, is not reported broken.
		fp := &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{err: fmt.Errorf("rpc: %w", context.Canceled)}}}
		s, req := rig(t, fp)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := s.Transfer(ctx, req); !errors.Is(err, context.Canceled) || fp.broken != 0 {
			t.Fatalf("err %v, broken %d, want Canceled and 0", err, fp.broken)
		}
	})
	t.Run("default timeout", func(t *testing.T) {
		fp := &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{size: regionSize}}}
		s, req := rig(t, fp)
		s.paths.peers = deadlineProbe{fp, t}
		if _, err := s.Transfer(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	})
}

// deadlineProbe checks that a batch whose caller set no deadline gets one.
type deadlineProbe struct {
	*fakePeers
	t *testing.T
}

func (d deadlineProbe) Get(ctx context.Context, addr string, want transport.Kind, need transport.Need) (transport.Session, error) {
	if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > time.Minute {
		d.t.Errorf("deadline %v %v, want DefaultTimeout (1m)", dl, ok)
	}
	return d.fakePeers.Get(ctx, addr, want, need)
}

// TestNotificationFailureAfterLanding: a batch whose bytes landed but whose
// note failed fails, and says how: a note the peer refused was not
// delivered; a note that left but got no answer (a frozen receiver, the
// caller's deadline) may still be delivered, and the message must not say
// it was not.
func TestNotificationFailureAfterLanding(t *testing.T) {
	for _, tc := range []struct {
		name      string
		notifyErr error
		want      string
		class     error
	}{
		{"refused", errs.Wrap(errs.ErrNotFound, "region kv is not exported"),
			"batch of 2 blocks landed at b:7470/kv, but its notification was not delivered: region kv is not exported", errs.ErrNotFound},
		{"unanswered", fmt.Errorf("%w (%w)", context.DeadlineExceeded, notify.ErrUnconfirmed),
			"batch of 2 blocks landed at b:7470/kv, but its notification was not confirmed: context deadline exceeded (" + notify.ErrUnconfirmed.Error() + ")", context.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp := &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{size: regionSize}}, notifyErr: tc.notifyErr}
			s, req := rig(t, fp)
			req.Notification = []byte("hello")
			_, err := s.Transfer(context.Background(), req)
			if err == nil || err.Error() != tc.want || errs.Class(err) != tc.class {
				t.Fatalf("err = %v (class %v)\nwant %s (class %v)", err, errs.Class(err), tc.want, tc.class)
			}
			if fp.conns[0].writes != 1 || len(fp.notified) != 1 || s.Counters().BatchesSent.Load() != 0 || s.Counters().BatchesFailed.Load() != 1 {
				t.Fatalf("writes %d notified %d", fp.conns[0].writes, len(fp.notified))
			}
			n := fp.notified[0]
			if n.Region != "kv" || n.Sender != "a" || string(n.Notification) != "hello" || n.Blocks != 2 || n.Bytes != 8192 {
				t.Fatalf("notification %+v", n)
			}
		})
	}
}

func TestPlanRunsTwice(t *testing.T) {
	// A plan is validated and merged once and may be posted again.
	fp := &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{size: regionSize}}}
	s, req := rig(t, fp)
	p, err := s.Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := 0; i < 2; i++ {
		res, err := s.Run(context.Background(), p)
		if err != nil || res.Stats.Segments != 2 {
			t.Fatalf("run %d: %+v %v", i, res, err)
		}
	}
	if s.Counters().BatchesSent.Load() != 2 {
		t.Fatal("counters")
	}
}

func TestPlanChecksFieldsFirst(t *testing.T) {
	fp := &fakePeers{conns: []*fakeConn{{}}, answers: []answer{{size: regionSize}}}
	s, req := rig(t, fp)
	req.Src, req.BadTransport = "", errors.New("bad transport")
	if _, err := s.Plan(req); err == nil || err.Error() != "invalid argument: src_region_id is empty" {
		t.Fatalf("err = %v", err)
	}
	req.Src = "r1"
	if _, err := s.Plan(req); err == nil || err.Error() != "bad transport" {
		t.Fatalf("err = %v", err)
	}
}
