package tcp

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/transport"
)

// TestWrongPortAnswersGRPC: a gRPC client that dials the data port gets
// every call refused at once with FailedPrecondition naming the peer port
// (on the address it reached when the peer port listens on all of them),
// and a data transfer on the same listener still works.
func TestWrongPortAnswersGRPC(t *testing.T) {
	for _, tc := range []struct{ peerAddr, want string }{
		{"127.0.0.1:7470", "the peer port is 127.0.0.1:7470 (--peer-listen)"},
		{"[::]:7470", "the peer port is 127.0.0.1:7470 (--peer-listen)"},
		{"", "the peer port is its --peer-listen address"},
	} {
		p := newPair(t, 1<<16, 1)
		if tc.peerAddr != "" {
			p.b.SetPeerAddr(tc.peerAddr)
		}
		cc, err := grpc.NewClient("passthrough:///"+p.b.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		// A deadline far off: the answer must come from the data port.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = cc.Invoke(ctx, "/b2b.v1.Peer/Handshake", &emptypb.Empty{}, &emptypb.Empty{})
		cancel()
		cc.Close()
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "is b2bd's data port (--data-listen)") ||
			!strings.Contains(err.Error(), tc.want) {
			t.Fatalf("peer port %q: %v, want FailedPrecondition saying %q", tc.peerAddr, err, tc.want)
		}
		p.roundTrip(t)
	}
}

// roundTrip writes a block over the pair and checks that it landed.
func (p *pair) roundTrip(t *testing.T) {
	t.Helper()
	src, dst := p.srcMem.Host, p.dstMem.Host
	copy(src[:8], "wrongprt")
	b := desc.Batch{Src: []uint64{0}, Dst: []uint64{64}, Len: []uint64{8}}
	if _, err := transport.Write(context.Background(), p.conn, p.src, p.dst, &b); err != nil {
		t.Fatal(err)
	}
	if string(dst[64:72]) != "wrongprt" {
		t.Fatalf("block did not land: %q", dst[64:72])
	}
}
