package peer

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// fakePeer answers handshakes and counts them.
type fakePeer struct {
	b2bv1.UnimplementedPeerServer
	handshakes atomic.Int32
	instance   atomic.Uint64 // sent as the handshake's instance_id
}

func (f *fakePeer) Handshake(context.Context, *b2bv1.HandshakeRequest) (*b2bv1.HandshakeResponse, error) {
	f.handshakes.Add(1)
	return &b2bv1.HandshakeResponse{ProtocolVersion: ProtocolVersion, NodeName: "fake", InstanceId: f.instance.Load(),
		Adverts: map[string][]byte{"tcp": nil}}, nil
}

// writeNeed is what a push needs of a kind.
var writeNeed = transport.Need{Op: transport.OpWrite}

// fakeTransport hands out fakeConns.
type fakeTransport struct {
	transport.Quiet
	connects atomic.Int32
	dial     func() transport.Conn // nil: a fakeConn
	refuse   atomic.Bool           // Connect fails
	// connect, when set, is the whole Connect (after the count).
	connect func(context.Context) (transport.Conn, error)
}

func (t *fakeTransport) Kind() transport.Kind { return transport.TCP }
func (t *fakeTransport) Register(memory.Memory) (transport.Registration, error) {
	return nil, nil
}
func (t *fakeTransport) Connect(ctx context.Context, _ transport.Peer) (transport.Conn, error) {
	t.connects.Add(1)
	if t.connect != nil {
		return t.connect(ctx)
	}
	if t.refuse.Load() {
		return nil, errors.New("fake: connection refused")
	}
	if t.dial != nil {
		return t.dial(), nil
	}
	return &fakeConn{}, nil
}
func (t *fakeTransport) Close() error { return nil }

type fakeConn struct {
	transport.NoPrepare
	closed atomic.Bool
}

func (c *fakeConn) Write(context.Context, transport.Registration, transport.RemoteRegion, *desc.Batch) (transport.Stats, error) {
	return transport.Stats{}, nil
}
func (c *fakeConn) Err() error {
	if c.closed.Load() {
		return net.ErrClosed
	}
	return nil
}
func (c *fakeConn) Close() error { c.closed.Store(true); return nil }

// Post routes to Write (block ids: one Write per stretch); it cannot read.
func (c *fakeConn) Post(ctx context.Context, r *transport.Request) (transport.Stats, error) {
	h := transport.Handlers{Write: c.Write}
	return h.Post(ctx, r)
}

func newTestManager(t *testing.T) (*Manager, *fakePeer, *fakeTransport) {
	t.Helper()
	fp := &fakePeer{}
	m, _, ft := newTestManagerWith(t, fp)
	return m, fp, ft
}

// newTestManagerWith is newTestManager with the peer's Peer service given.
func newTestManagerWith(t *testing.T, fp b2bv1.PeerServer) (*Manager, b2bv1.PeerServer, *fakeTransport) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	b2bv1.RegisterPeerServer(srv, fp)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	ft := &fakeTransport{}
	m := New(&b2bv1.HandshakeRequest{ProtocolVersion: ProtocolVersion, NodeName: "me"}, []transport.Transport{ft}, hclog.NewNullLogger(), false,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() }))
	t.Cleanup(func() { m.Close() })
	return m, fp, ft
}

// TestBrokenByStaleSession: several batches share a connection and all fail
// on it. The first report replaces it; later reports about the same, already
// replaced, connection must leave the fresh one (carrying retries) alone.
func TestBrokenByStaleSession(t *testing.T) {
	ctx := context.Background()
	const addr = "127.0.0.1:7470"
	for _, tc := range []struct {
		name    string
		reports int // batches that saw the old connection fail
	}{
		{"one batch", 1},
		{"many batches", 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, fp, ft := newTestManager(t)
			old, err := m.Get(ctx, addr, transport.TCP, writeNeed)
			if err != nil {
				t.Fatal(err)
			}
			m.Broken(addr, old) // the first failure: the connection goes
			if !old.Conn.(*trackedConn).Conn.(*fakeConn).closed.Load() {
				t.Fatal("the broken connection was not closed")
			}
			fresh, err := m.Get(ctx, addr, transport.TCP, writeNeed) // a retry connects afresh
			if err != nil {
				t.Fatal(err)
			}
			if fresh.Conn == old.Conn {
				t.Fatal("Get returned the broken connection")
			}
			for i := 1; i < tc.reports; i++ {
				m.Broken(addr, old) // the other batches report the same old connection
			}
			again, err := m.Get(ctx, addr, transport.TCP, writeNeed) // another batch's retry
			if err != nil {
				t.Fatal(err)
			}
			if fresh.Conn.(*trackedConn).Conn.(*fakeConn).closed.Load() || again.Conn != fresh.Conn {
				t.Fatalf("reports about a replaced connection closed the fresh one (connects %d, handshakes %d)", ft.connects.Load(), fp.handshakes.Load())
			}
			if got := ft.connects.Load(); got != 2 {
				t.Fatalf("%d connects, want 2 (the first and one fresh)", got)
			}
		})
	}
}

// TestInstance: the peer's instance ID is known after a handshake, kept when
// the connection breaks (so a plan can still compare it), and replaced by
// the next handshake's.
func TestInstance(t *testing.T) {
	ctx := context.Background()
	const addr = "127.0.0.1:7470"
	m, fp, _ := newTestManager(t)
	if got := m.Instance(addr); got != 0 {
		t.Fatalf("instance %d before any handshake", got)
	}
	fp.instance.Store(11)
	s, err := m.Get(ctx, addr, "", writeNeed)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Instance(addr); got != 11 {
		t.Fatalf("instance %d, want 11", got)
	}
	fp.instance.Store(12) // the peer restarted
	m.Broken(addr, s)
	if got := m.Instance(addr); got != 11 {
		t.Fatalf("instance %d after Broken, want the last known 11", got)
	}
	if _, err := m.Get(ctx, addr, "", writeNeed); err != nil {
		t.Fatal(err)
	}
	if got, hs := m.Instance(addr), fp.handshakes.Load(); got != 12 || hs != 2 {
		t.Fatalf("instance %d after %d handshakes, want 12 after 2", got, hs)
	}
}
