package rails

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/peer"
	"github.com/b2bd/b2bd/internal/transport"
	"github.com/b2bd/b2bd/internal/transport/tcp"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// advertPeer answers a handshake with fixed adverts and hands signals to
// its rails: the peer daemon as the choice and a rails connect see it.
type advertPeer struct {
	b2bv1.UnimplementedPeerServer
	adverts map[string][]byte
	rails   *Transport
}

func (p *advertPeer) Signal(ctx context.Context, req *b2bv1.SignalRequest) (*b2bv1.SignalResponse, error) {
	out, err := p.rails.HandleSignal(ctx, req.GetPayload())
	if err != nil {
		return nil, err
	}
	return &b2bv1.SignalResponse{Payload: out}, nil
}

func (p *advertPeer) Handshake(context.Context, *b2bv1.HandshakeRequest) (*b2bv1.HandshakeResponse, error) {
	return &b2bv1.HandshakeResponse{ProtocolVersion: peer.ProtocolVersion, NodeName: "b", Adverts: p.adverts}, nil
}

// TestAutomaticChoiceWithRails: a daemon with several RDMA devices runs
// rails under the verbs kind, which writes but cannot read. The peer
// manager, reading the registered drivers' Caps (the only declaration),
// must send an automatic pull over tcp, keep pushes on rails, and refuse
// a pull that names verbs, naming what it lacks.
func TestAutomaticChoiceWithRails(t *testing.T) {
	g := newRig(t, 1<<20, Config{})
	local, err := tcp.New(tcp.Config{}, &registry{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	remote, err := tcp.New(tcp.Config{}, &registry{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()

	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	b2bv1.RegisterPeerServer(srv, &advertPeer{adverts: map[string][]byte{
		string(transport.Verbs): g.b.Advertise().Data,
		string(transport.TCP):   remote.Advertise().Data,
	}, rails: g.b})
	go srv.Serve(lis)
	defer srv.Stop()
	m := peer.New(&b2bv1.HandshakeRequest{ProtocolVersion: peer.ProtocolVersion, NodeName: "a"}, []transport.Transport{g.a, local}, nil, false,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() }))
	defer m.Close()

	ctx := context.Background()
	const addr = "127.0.0.1:7470"
	for _, tc := range []struct {
		name string
		want transport.Kind
		need transport.Need
		kind transport.Kind // chosen; "" when refused
		err  string
	}{
		{name: "automatic pull falls back to tcp", need: transport.Need{Op: transport.OpRead, Memory: memory.Host}, kind: transport.TCP},
		{name: "automatic push takes rails", need: transport.Need{Op: transport.OpWrite, Memory: memory.Host}, kind: transport.Verbs},
		{name: "pull over verbs refused", want: transport.Verbs, need: transport.Need{Op: transport.OpRead, Memory: memory.Host},
			err: "transport verbs cannot read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := m.Get(ctx, addr, tc.want, tc.need)
			if tc.err != "" {
				if !errors.Is(err, errs.ErrFailedPrecondition) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Get = %v, want FailedPrecondition containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			if s.Kind != tc.kind {
				t.Fatalf("chose %s, want %s", s.Kind, tc.kind)
			}
			if tc.need.Op == transport.OpRead && s.Caps.Ops&transport.OpRead == 0 {
				t.Fatalf("chose %s, whose caps %v cannot read", s.Kind, s.Caps.Ops)
			}
		})
	}
}
