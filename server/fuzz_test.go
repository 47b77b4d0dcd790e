package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/peer"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
	"github.com/b2bd/b2bd/server"
)

// FuzzPeerMessages feeds arbitrary bytes, as each message the Peer service
// accepts, to the real handlers: nothing may panic, and every refusal must be
// a gRPC status with a deliberate code.
func FuzzPeerMessages(f *testing.F) {
	seed := func(kind byte, m proto.Message) {
		b, _ := proto.Marshal(m)
		f.Add(kind, b)
	}
	seed(0, &b2bv1.HandshakeRequest{ProtocolVersion: peer.ProtocolVersion, NodeName: "x", Kinds: []string{"tcp", "verbs"}})
	seed(0, &b2bv1.HandshakeRequest{ProtocolVersion: 99})
	seed(1, &b2bv1.ResolveRegionRequest{Name: "fuzz"})
	seed(1, &b2bv1.ResolveRegionRequest{Name: ""})
	seed(2, &b2bv1.SignalRequest{Kind: "verbs", Payload: []byte{0x0a, 0x00}})
	seed(2, &b2bv1.SignalRequest{Kind: "echo", Payload: []byte("x")})
	seed(3, &b2bv1.NotifyRequest{Region: "fuzz", Notification: []byte("n"), Blocks: 1})
	seed(3, &b2bv1.NotifyRequest{Region: "fuzz", Notification: make([]byte, 5000)})
	f.Add(byte(1), []byte{0xff, 0xff, 0xff})

	reg, err := region.New(region.Config{ShmDir: f.TempDir()})
	if err != nil {
		f.Fatal(err)
	}
	defer reg.Close()
	if _, err := reg.AllocHost(4096, region.Export{Name: "fuzz", To: []string{"someone"}}, region.Caller{}); err != nil {
		f.Fatal(err)
	}
	pm := peer.New(&b2bv1.HandshakeRequest{}, []transport.Transport{}, nil, true)
	srv := server.New(server.Config{NodeName: "fuzz", Registry: reg, Peers: pm, MaxDescriptors: desc.DefaultMaxBlocks,
		Signals: map[transport.Kind]transport.SignalHandler{"echo": echoSignal{}}}).Peer()
	ctx := context.Background()
	ok := map[codes.Code]bool{codes.OK: true, codes.InvalidArgument: true, codes.NotFound: true,
		codes.PermissionDenied: true, codes.FailedPrecondition: true}

	f.Fuzz(func(t *testing.T, kind byte, data []byte) {
		var err error
		switch kind % 4 {
		case 0:
			var m b2bv1.HandshakeRequest
			if proto.Unmarshal(data, &m) != nil {
				return
			}
			_, err = srv.Handshake(ctx, &m)
		case 1:
			var m b2bv1.ResolveRegionRequest
			if proto.Unmarshal(data, &m) != nil {
				return
			}
			_, err = srv.ResolveRegion(ctx, &m)
		case 2:
			var m b2bv1.SignalRequest
			if proto.Unmarshal(data, &m) != nil {
				return
			}
			_, err = srv.Signal(ctx, &m)
		case 3:
			var m b2bv1.NotifyRequest
			if proto.Unmarshal(data, &m) != nil {
				return
			}
			_, err = srv.Notify(ctx, &m)
		}
		if c := status.Code(err); !ok[c] {
			t.Fatalf("message kind %d: unexpected code %v: %v", kind%4, c, err)
		}
	})
}

// echoSignal answers a signal with its payload, or refuses an empty one.
type echoSignal struct{}

func (echoSignal) HandleSignal(ctx context.Context, payload []byte) ([]byte, error) {
	if len(payload) == 0 {
		return nil, fmt.Errorf("%w: empty", errs.ErrInvalidArgument)
	}
	return payload, nil
}

// TestPeerSignal: Signal hands the payload to its kind's handler and
// returns the answer; a kind without one, or a name over the limit, is
// refused with the code and the reason.
func TestPeerSignal(t *testing.T) {
	reg, err := region.New(region.Config{ShmDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	pm := peer.New(&b2bv1.HandshakeRequest{}, []transport.Transport{}, nil, true)
	srv := server.New(server.Config{NodeName: "n", Registry: reg, Peers: pm, MaxDescriptors: desc.DefaultMaxBlocks,
		Signals: map[transport.Kind]transport.SignalHandler{"echo": echoSignal{}}}).Peer()
	ctx := context.Background()
	resp, err := srv.Signal(ctx, &b2bv1.SignalRequest{Kind: "echo", Payload: []byte("hello")})
	if err != nil || string(resp.GetPayload()) != "hello" {
		t.Fatalf("echo: %q, %v", resp.GetPayload(), err)
	}
	for _, c := range []struct {
		req  *b2bv1.SignalRequest
		code codes.Code
		msg  string
	}{
		{&b2bv1.SignalRequest{Kind: "verbs", Payload: []byte("x")}, codes.FailedPrecondition, `kind "verbs": this daemon runs no transport of that kind`},
		{&b2bv1.SignalRequest{Kind: "echo"}, codes.InvalidArgument, "empty"},
		{&b2bv1.SignalRequest{Kind: strings.Repeat("k", 65)}, codes.InvalidArgument, "kind is 65 bytes, over the limit of 64"},
	} {
		_, err := srv.Signal(ctx, c.req)
		if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.msg) {
			t.Errorf("Signal(%.20q): %v, want %v %q", c.req.GetKind(), err, c.code, c.msg)
		}
	}
}
