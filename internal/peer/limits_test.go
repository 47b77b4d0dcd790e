package peer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

func openFDs(t *testing.T) int {
	t.Helper()
	names, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(names)
}

// closedLoopbackPort is a port nothing listens on (bound, then closed).
func closedLoopbackPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	return port
}

// TestDeadPeersLeaveNoState: Gets to 100 distinct unreachable addresses
// each fail with Unavailable and leave nothing behind: no peer kept, and
// goroutines and file descriptors back at their baseline (polled, with a
// bounded deadline), with the default (long) idle timeout.
func TestDeadPeersLeaveNoState(t *testing.T) {
	m := New(&b2bv1.HandshakeRequest{ProtocolVersion: ProtocolVersion}, []transport.Transport{&fakeTransport{}}, hclog.NewNullLogger(), true)
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	baseG, baseFD := runtime.NumGoroutine(), openFDs(t)
	port := closedLoopbackPort(t)
	for i := range 100 {
		addr := fmt.Sprintf("127.0.0.%d:%s", 2+i, port)
		if _, err := m.Get(ctx, addr, "", writeNeed); !errors.Is(err, errs.ErrUnavailable) {
			t.Fatalf("Get %s: %v, want Unavailable", addr, err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		kept := m.kept.count()
		g, fd := runtime.NumGoroutine(), openFDs(t)
		if kept == 0 && g <= baseG && fd <= baseFD {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 100 dead peers: %d peers kept, %d goroutines (baseline %d), %d fds (baseline %d)", kept, g, baseG, fd, baseFD)
		}
		time.Sleep(10 * time.Millisecond) // a poll interval, not a synchronisation
	}
}

// TestIdlePeerReaped: a peer unused for the idle timeout has its data
// connection and control channel closed and is forgotten (the reaper
// goroutine ends with it); the next Get connects and handshakes afresh.
func TestIdlePeerReaped(t *testing.T) {
	ctx := context.Background()
	m, fp, ft := newTestManager(t)
	m.SetLimits(Limits{IdleTimeout: 20 * time.Millisecond})
	s, err := m.Get(ctx, "127.0.0.1:7470", "", writeNeed)
	if err != nil {
		t.Fatal(err)
	}
	// The reaper forgets the peer under the table's lock and closes its
	// connections just after, so the closing is polled for too.
	conn := s.Conn.(*trackedConn).Conn.(*fakeConn)
	deadline := time.Now().Add(20 * time.Second)
	for m.Peers() != 0 || reaperRunning(m) || !conn.closed.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("idle peer still kept (%d peers, reaper running %v, data connection closed %v)", m.Peers(), reaperRunning(m), conn.closed.Load())
		}
		time.Sleep(5 * time.Millisecond) // a poll interval
	}
	if _, err := m.Get(ctx, "127.0.0.1:7470", "", writeNeed); err != nil {
		t.Fatal(err)
	}
	if h, c := fp.handshakes.Load(), ft.connects.Load(); h != 2 || c != 2 {
		t.Fatalf("%d handshakes and %d connects, want 2 each (afresh after the reaping)", h, c)
	}
}

func reaperRunning(m *Manager) bool {
	m.kept.mu.Lock()
	defer m.kept.mu.Unlock()
	return m.kept.reapStop != nil
}

// TestBusyPeerNotReaped: a peer with a write in flight, or with a live
// prepared batch, is never idle, however long ago it was last got.
func TestBusyPeerNotReaped(t *testing.T) {
	ctx := context.Background()
	const addr = "127.0.0.1:7470"
	later := time.Now().Add(time.Hour)
	for _, tc := range []struct {
		name string
		hold func(t *testing.T, s Session) (release func())
	}{
		{"write in flight", func(t *testing.T, s Session) func() {
			inside, unblock, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
			s.Conn.(*trackedConn).Conn.(*blockingConn).inside, s.Conn.(*trackedConn).Conn.(*blockingConn).unblock = inside, unblock
			go func() {
				defer close(done)
				_, _ = transport.Write(ctx, s.Conn, nil, transport.RemoteRegion{}, &desc.Batch{})
			}()
			<-inside
			return func() { close(unblock); <-done }
		}},
		{"prepared batch", func(t *testing.T, s Session) func() {
			p, err := transport.Prepare(s.Conn, nil, transport.RemoteRegion{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			if w, ok := p.(interface{ WorkRequests() uint64 }); !ok || w.WorkRequests() != 7 {
				t.Fatal("the prepared batch lost its WorkRequests")
			}
			if _, err := p.(transport.Prepared).Write(ctx); err != nil {
				t.Fatal(err)
			}
			return func() { p.Close(); p.Close() } // twice: counted once
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newBlockingManager(t)
			s, err := m.Get(ctx, addr, "", writeNeed)
			if err != nil {
				t.Fatal(err)
			}
			release := tc.hold(t, s)
			m.kept.reap(later, time.Minute)
			if m.Peers() != 1 {
				release()
				t.Fatal("a busy peer was reaped")
			}
			release()
			m.kept.reap(later, time.Minute)
			if m.Peers() != 0 {
				t.Fatal("the peer, idle once its use ended, was kept")
			}
		})
	}
}

// TestMaxPeers: beyond the cap a new peer is refused with ResourceExhausted
// naming the cap and its flag; once a kept peer is reaped, it is accepted.
func TestMaxPeers(t *testing.T) {
	ctx := context.Background()
	m, _, _ := newTestManager(t)
	m.SetLimits(Limits{MaxPeers: 2, IdleTimeout: time.Minute})
	for _, a := range []string{"127.0.0.1:1", "127.0.0.1:2"} {
		if _, err := m.Get(ctx, a, "", writeNeed); err != nil {
			t.Fatal(err)
		}
	}
	_, err := m.Get(ctx, "127.0.0.1:3", "", writeNeed)
	if !errors.Is(err, errs.ErrResourceExhausted) || !strings.Contains(err.Error(), "(--max-peers) is 2") {
		t.Fatalf("third peer: %v, want ResourceExhausted naming --max-peers and 2", err)
	}
	if _, err := m.Get(ctx, "127.0.0.1:1", "", writeNeed); err != nil {
		t.Fatalf("a kept peer under the cap: %v", err)
	}
	m.kept.reap(time.Now().Add(time.Hour), time.Minute)
	if _, err := m.Get(ctx, "127.0.0.1:3", "", writeNeed); err != nil {
		t.Fatalf("third peer after the others were reaped: %v", err)
	}
}

// TestPeerStateLoggedOnce: a peer that goes away is logged once as
// unreachable, however many batches then fail on it; it is logged as
// connected once per time it comes (back).
func TestPeerStateLoggedOnce(t *testing.T) {
	ctx := context.Background()
	var out syncBuf
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	b2bv1.RegisterPeerServer(srv, &fakePeer{})
	go srv.Serve(lis)
	var down sync.Mutex
	isDown := false
	m := New(&b2bv1.HandshakeRequest{ProtocolVersion: ProtocolVersion}, []transport.Transport{&fakeTransport{}},
		hclog.New(&hclog.LoggerOptions{Output: &out, Level: hclog.Info}), false,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) {
			down.Lock()
			defer down.Unlock()
			if isDown {
				return nil, errors.New("connection refused")
			}
			return lis.Dial()
		}))
	defer m.Close()
	const addr = "127.0.0.1:7470"
	s, err := m.Get(ctx, addr, "", writeNeed)
	if err != nil {
		t.Fatal(err)
	}
	down.Lock()
	isDown = true
	down.Unlock()
	srv.Stop()
	m.Broken(addr, s)
	for range 5 {
		if _, err := m.Get(ctx, addr, "", writeNeed); err == nil {
			t.Fatal("Get succeeded with the peer down")
		}
	}
	if n := strings.Count(out.String(), "peer unreachable"); n != 1 {
		t.Fatalf("%d \"peer unreachable\" lines after 5 failed batches, want 1:\n%s", n, out.String())
	}
	if n := strings.Count(out.String(), "peer connected"); n != 1 {
		t.Fatalf("%d \"peer connected\" lines, want 1:\n%s", n, out.String())
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// blockingConn's Write waits for unblock when set; it prepares batches.
type blockingConn struct {
	fakeConn
	inside, unblock chan struct{}
}

func (c *blockingConn) Write(context.Context, transport.Registration, transport.RemoteRegion, *desc.Batch) (transport.Stats, error) {
	if c.inside != nil {
		close(c.inside)
		<-c.unblock
	}
	return transport.Stats{}, nil
}

func (c *blockingConn) Post(ctx context.Context, r *transport.Request) (transport.Stats, error) {
	h := transport.Handlers{Write: c.Write}
	return h.Post(ctx, r)
}

func (c *blockingConn) Prepare(*transport.Request) (transport.Prepared, error) {
	return fakePrepared{}, nil
}

type fakePrepared struct{}

func (fakePrepared) Write(context.Context) (transport.Stats, error) { return transport.Stats{}, nil }
func (fakePrepared) Close() error                                   { return nil }
func (fakePrepared) WorkRequests() uint64                           { return 7 }

type blockingTransport struct{ fakeTransport }

func (t *blockingTransport) Connect(context.Context, transport.Peer) (transport.Conn, error) {
	return &blockingConn{}, nil
}

func newBlockingManager(t *testing.T) *Manager {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	b2bv1.RegisterPeerServer(srv, &fakePeer{})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	m := New(&b2bv1.HandshakeRequest{ProtocolVersion: ProtocolVersion}, []transport.Transport{&blockingTransport{}}, nil, false,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() }))
	t.Cleanup(m.Close)
	return m
}
