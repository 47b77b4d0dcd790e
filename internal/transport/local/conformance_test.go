package local

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
	"github.com/b2bd/b2bd/internal/transport/transporttest"
)

// TestConformance runs the transport contract's suite between two
// same-host transports (two daemons' worth, one process), with two copy
// streams, over shm-file regions as the registry maps them.
func TestConformance(t *testing.T) {
	dir := t.TempDir()
	transporttest.Run(t, transporttest.Factory{
		Kind:   transport.Local,
		Memory: func(t testing.TB, size int) memory.Memory { return shmRegion(t, dir, size) },
		New: func(t testing.TB, send, recv transport.Inbound) *transporttest.Pair {
			// A short directory: a Unix socket's path has 108 bytes.
			d, derr := os.MkdirTemp("", "shc")
			if derr != nil {
				t.Fatal(derr)
			}
			t.Cleanup(func() { os.RemoveAll(d) })
			r, err := New(Config{Dir: filepath.Join(d, "recv"), Node: "recv", Streams: 2}, recv, nil)
			if err != nil {
				t.Fatal(err)
			}
			s, err := New(Config{Dir: filepath.Join(d, "send"), Node: "send", Streams: 2}, send, nil)
			if err != nil {
				r.Close()
				t.Fatal(err)
			}
			return &transporttest.Pair{Sender: s, Receiver: r, Connect: func(ctx context.Context) (transport.Conn, error) {
				return s.Connect(ctx, transport.Peer{Address: "local", Node: "recv", Advert: MarshalEndpoint(r.Endpoint())})
			}}
		},
	})
}
