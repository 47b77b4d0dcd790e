package tcp

import (
	"context"
	"testing"

	"github.com/b2bd/b2bd/internal/transport"
	"github.com/b2bd/b2bd/internal/transport/transporttest"
)

// TestConformance runs the transport contract's suite over loopback, with
// two streams so that a batch is split.
func TestConformance(t *testing.T) {
	transporttest.Run(t, transporttest.Factory{
		Kind: transport.TCP,
		// Found by the suite: a receiver that took the frame
		// off the socket late (stalled in Pin) still places it, and counts
		// it as landed, after the sender answered DeadlineExceeded or
		// Canceled; closing the streams does not withdraw bytes already in
		// the receiver's socket buffer. A fix needs the protocol to fence
		// a cut-off batch (the receiver checks a per-batch abort before
		// placing, or the sender waits for the receiver's word).
		New: func(t testing.TB, send, recv transport.Inbound) *transporttest.Pair {
			a, err := New(Config{Listen: "127.0.0.1:0", Streams: 2, MinShareBytes: 64 << 10}, send, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, err := New(Config{Listen: "127.0.0.1:0"}, recv, nil)
			if err != nil {
				a.Close()
				t.Fatal(err)
			}
			return &transporttest.Pair{Sender: a, Receiver: b, Connect: func(ctx context.Context) (transport.Conn, error) {
				return a.Connect(ctx, transport.Peer{Address: "127.0.0.1:1", Advert: MarshalAdvert(b.Addr(), b.Token())})
			}}
		},
	})
}
