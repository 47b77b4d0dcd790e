package peer

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/transport"
)

// gatedConn is a fakeConn whose writes wait for gate to close, saying on
// entered that they began.
type gatedConn struct {
	fakeConn
	gate    chan struct{}
	entered chan struct{}
	broken  atomic.Bool
}

func (c *gatedConn) Write(context.Context, transport.Registration, transport.RemoteRegion, *desc.Batch) (transport.Stats, error) {
	c.entered <- struct{}{}
	<-c.gate
	return transport.Stats{}, nil
}

func (c *gatedConn) Err() error {
	if c.broken.Load() {
		return net.ErrClosed
	}
	return c.fakeConn.Err()
}

func (c *gatedConn) Post(ctx context.Context, r *transport.Request) (transport.Stats, error) {
	h := transport.Handlers{Write: c.Write}
	return h.Post(ctx, r)
}

// TestConnsPerPeer: batches to one peer take an idle connection, a new one
// while every connection is busy and the set has room, and share the least
// busy one beyond that; an idle peer's next batch connects nothing; a
// connection that reports an error is dropped and replaced; once idle, all
// but one are closed.
func TestConnsPerPeer(t *testing.T) {
	const addr = "127.0.0.1:7470"
	for _, tc := range []struct {
		name          string
		max, batches  int
		single        bool // the kind's Caps.SingleConn
		wantConnected int32
	}{
		{"one connection serialises", 1, 3, false, 1},
		{"a connection per busy batch", 4, 3, false, 3},
		{"capped at the limit", 2, 5, false, 2},
		{"a single-connection kind keeps one", 4, 3, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _, ft := newTestManager(t)
			m.SetLimits(Limits{ConnsPerPeer: tc.max})
			if tc.single {
				d, _ := transport.Lookup(transport.TCP)
				d.Caps.SingleConn = true
				m.SetDrivers(func(k transport.Kind) (transport.Driver, bool) { return d, k == transport.TCP })
			}
			limit := tc.max
			if tc.single {
				limit = 1
			}
			gate := make(chan struct{})
			entered := make(chan struct{}, tc.batches)
			var made []*gatedConn
			var mu sync.Mutex
			ft.dial = func() transport.Conn {
				c := &gatedConn{gate: gate, entered: entered}
				mu.Lock()
				made = append(made, c)
				mu.Unlock()
				return c
			}
			ctx := context.Background()
			var wg sync.WaitGroup
			errc := make(chan error, tc.batches)
			for i := 0; i < tc.batches; i++ {
				s, err := m.Get(ctx, addr, transport.TCP, writeNeed)
				if err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, err := s.Conn.Post(ctx, oneWrite())
					errc <- err
				}()
				// A batch beyond the connections queues on its
				// connection and never enters Write until the gate opens.
				if i < limit {
					select {
					case <-entered:
					case <-time.After(10 * time.Second):
						t.Fatalf("batch %d never began", i)
					}
				}
			}
			if got := ft.connects.Load(); got != tc.wantConnected {
				t.Fatalf("%d connections for %d busy batches (limit %d), want %d", got, tc.batches, tc.max, tc.wantConnected)
			}
			close(gate)
			wg.Wait()
			close(errc)
			for err := range errc {
				if err != nil {
					t.Fatal(err)
				}
			}
			// Idle now: the next batch takes a connection that exists.
			if _, err := m.Get(ctx, addr, transport.TCP, writeNeed); err != nil {
				t.Fatal(err)
			}
			if got := ft.connects.Load(); got != tc.wantConnected {
				t.Fatalf("an idle peer's batch connected again: %d connections", got)
			}
			// One connection breaks: it is closed and dropped at the next
			// Get, and the others stay.
			mu.Lock()
			made[0].broken.Store(true)
			mu.Unlock()
			s, err := m.Get(ctx, addr, transport.TCP, writeNeed)
			if err != nil {
				t.Fatal(err)
			}
			if s.Conn.(*trackedConn).Conn == transport.Conn(made[0]) {
				t.Fatal("Get handed out a broken connection")
			}
			if !made[0].closed.Load() {
				t.Fatal("the broken connection was not closed")
			}
			for _, c := range made[1:] {
				if c.closed.Load() {
					t.Fatal("a healthy connection was closed with the broken one")
				}
			}
			// Unused for longer than extraConnIdle: the reaper closes
			// every connection but one, and keeps the peer.
			m.kept.reap(time.Now().Add(extraConnIdle+time.Second), DefaultIdleTimeout)
			open := 0
			mu.Lock()
			for _, c := range made {
				if !c.closed.Load() {
					open++
				}
			}
			mu.Unlock()
			if open != 1 {
				t.Fatalf("%d connections open after the burst went idle, want 1", open)
			}
		})
	}
}

// oneWrite is a one-block write request for a fake connection.
func oneWrite() *transport.Request {
	return &transport.Request{Op: transport.OpWrite, Batch: &desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{8}}}
}

// TestExtraDialFails: when a connection beyond the first cannot be made, the
// batch queues on a busy one (no error, the handshake kept), and no other is
// tried for extraDialBackoff.
func TestExtraDialFails(t *testing.T) {
	const addr = "127.0.0.1:7470"
	m, fp, ft := newTestManager(t)
	ctx := context.Background()
	s := busyFirst(t, m, ft, addr, func(context.Context, int32) (transport.Conn, error) {
		return nil, errors.New("fake: connection refused")
	})
	for i := 0; i < 3; i++ {
		s2, err := m.Get(ctx, addr, transport.TCP, writeNeed)
		if err != nil {
			t.Fatalf("Get %d: %v", i, err)
		}
		if s2.Conn != s.Conn {
			t.Fatalf("Get %d handed out another connection", i)
		}
	}
	if got := ft.connects.Load(); got != 2 {
		t.Fatalf("%d connects, want 2: one extra tried, then none within the backoff", got)
	}
	if got := fp.handshakes.Load(); got != 1 {
		t.Fatalf("%d handshakes: a failed extra dial dropped the peer's handshake", got)
	}
}

// TestExtraDialLeavesGetsGoing: while a connection beyond the first is being
// dialed (slowly: a loaded peer), other batches' Get take the connections
// there are, and the dial counts toward the limit; the dialing batch gets the
// new connection. If the peer's connections are reset meanwhile (the manager
// closed), the new one is closed, not kept.
func TestExtraDialLeavesGetsGoing(t *testing.T) {
	const addr = "127.0.0.1:7470"
	for _, mode := range []string{"dialed", "reset while dialing", "broken while dialing"} {
		reset := mode == "reset while dialing"
		t.Run(mode, func(t *testing.T) {
			m, _, ft := newTestManager(t)
			m.SetLimits(Limits{ConnsPerPeer: 2})
			second, third := &fakeConn{}, &fakeConn{}
			dialing, letDial := make(chan struct{}), make(chan struct{})
			var once sync.Once
			release := func() { once.Do(func() { close(letDial) }) }
			defer release() // a failed check must not leave the dial (and Close) waiting
			ctx := context.Background()
			s := busyFirst(t, m, ft, addr, func(_ context.Context, n int32) (transport.Conn, error) {
				if n == 2 {
					close(dialing)
					<-letDial
					return second, nil
				}
				return third, nil
			})
			type got struct {
				s   Session
				err error
			}
			dialer := make(chan got, 1)
			go func() {
				s, err := m.Get(ctx, addr, transport.TCP, writeNeed)
				dialer <- got{s, err}
			}()
			<-dialing
			other := make(chan got, 1)
			go func() {
				s, err := m.Get(ctx, addr, transport.TCP, writeNeed)
				other <- got{s, err}
			}()
			select {
			case g := <-other:
				if g.err != nil || g.s.Conn != s.Conn {
					t.Fatalf("Get during another's dial: %v (same connection %v), want the busy first one", g.err, g.s.Conn == s.Conn)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("a Get waited for another batch's dial")
			}
			if reset {
				closed := make(chan struct{})
				go func() { m.Close(); close(closed) }()
				<-closed // Close takes the peer's lock, which the dial does not hold
			}
			if mode == "broken while dialing" {
				// A neighbour's batch on the busy connection failed (a
				// cancel mid-frame, say): the dialing batch is not at
				// fault, and must get a connection, not the error.
				m.Broken(addr, s)
			}
			release()
			g := <-dialer
			if mode == "broken while dialing" {
				if g.err != nil || g.s.Conn.(*trackedConn).Conn != transport.Conn(third) {
					t.Fatalf("the dialing Get after its neighbour's connection broke: %v, want a fresh connection", g.err)
				}
				if !second.closed.Load() {
					t.Fatal("the connection dialed across the reset was kept open")
				}
				return
			}
			if reset {
				if g.err == nil {
					t.Fatal("the dialing Get succeeded on a peer closed meanwhile")
				}
				if !second.closed.Load() {
					t.Fatal("the connection dialed across the reset was kept open")
				}
				return
			}
			if g.err != nil || g.s.Reused || g.s.Conn.(*trackedConn).Conn != transport.Conn(second) {
				t.Fatalf("the dialing Get: %v (reused %v), want the new connection", g.err, g.s.Reused)
			}
			if n := ft.connects.Load(); n != 2 {
				t.Fatalf("%d connects, want 2", n)
			}
		})
	}
}

// TestCancelledExtraDialNoBackoff: an extra dial that failed because its
// own batch was cancelled says nothing of the peer, so the next busy Get
// dials again rather than waiting out the failed-dial backoff.
func TestCancelledExtraDialNoBackoff(t *testing.T) {
	const addr = "127.0.0.1:7471"
	m, _, ft := newTestManager(t)
	m.SetLimits(Limits{ConnsPerPeer: 3})
	ctx := context.Background()
	busyFirst(t, m, ft, addr, func(ctx context.Context, n int32) (transport.Conn, error) {
		if n == 2 {
			<-ctx.Done() // its batch is cancelled while it dials
			return nil, ctx.Err()
		}
		return &fakeConn{}, nil
	})
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		for ft.connects.Load() < 2 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	if _, err := m.Get(cctx, addr, transport.TCP, writeNeed); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled Get: %v", err)
	}
	g, err := m.Get(ctx, addr, transport.TCP, writeNeed)
	if err != nil || g.Reused {
		t.Fatalf("the next busy Get: %v (reused %v), want a new connection: a cancel is not the peer's failure", err, g.Reused)
	}
	if n := ft.connects.Load(); n != 3 {
		t.Fatalf("%d connects, want 3", n)
	}
}

// busyFirst gets addr's first connection and keeps it busy with a write
// until the test ends; the later connects (the n-th) are next's.
func busyFirst(t *testing.T, m *Manager, ft *fakeTransport, addr string, next func(ctx context.Context, n int32) (transport.Conn, error)) Session {
	t.Helper()
	gate := make(chan struct{})
	t.Cleanup(func() { close(gate) }) // before the manager's cleanup, registered first
	entered := make(chan struct{}, 4)
	first := &gatedConn{gate: gate, entered: entered}
	ft.connect = func(ctx context.Context) (transport.Conn, error) {
		if n := ft.connects.Load(); n > 1 {
			return next(ctx, n)
		}
		return first, nil
	}
	ctx := context.Background()
	s, err := m.Get(ctx, addr, transport.TCP, writeNeed)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = s.Conn.Post(ctx, oneWrite()) }()
	<-entered
	return s
}

// TestExtraDialAnswersAtDeadline: a batch whose extra dial ended while
// another call held the peer's lock (a handshake with a frozen peer) answers
// at its own deadline, not when the lock is let go; the dial's count is
// given back once it is. A soak saw a 26 ms call answer 836 ms late.
func TestExtraDialAnswersAtDeadline(t *testing.T) {
	const addr = "127.0.0.1:7472"
	m, _, ft := newTestManager(t)
	m.SetLimits(Limits{ConnsPerPeer: 3})
	dialing, letDial := make(chan struct{}), make(chan struct{})
	extra := &fakeConn{}
	busyFirst(t, m, ft, addr, func(_ context.Context, n int32) (transport.Conn, error) {
		if n > 2 {
			return &fakeConn{}, nil
		}
		close(dialing)
		<-letDial
		return extra, nil
	})
	st := m.kept.lookup(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := m.Get(ctx, addr, transport.TCP, writeNeed)
		errc <- err
	}()
	<-dialing
	st.mu.Lock() // another call's handshake, across the dial's end
	locked := true
	defer func() { // before the manager's cleanup, which takes the lock
		if locked {
			st.mu.Unlock()
		}
	}()
	close(letDial)
	select {
	case err := <-errc:
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, transport.ErrNotSent) {
			t.Errorf("Get: %v, want DeadlineExceeded, not sent", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the Get waited for the peer's lock past its deadline")
	}
	if !extra.closed.Load() {
		t.Error("the connection dialed for a call that gave up was kept open")
	}
	st.mu.Unlock()
	locked = false
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
		st.mu.Lock()
		n := st.conns[transport.TCP].dialing
		st.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("dialing %d 20 s after the lock was free", n)
		}
	}
	if _, err := m.Get(context.Background(), addr, transport.TCP, writeNeed); err != nil {
		t.Fatalf("the next Get: %v", err)
	}
}
