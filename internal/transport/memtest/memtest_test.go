package memtest

import (
	"context"
	"testing"

	"github.com/b2bd/b2bd/internal/transport"
	"github.com/b2bd/b2bd/internal/transport/transporttest"
)

func TestConformance(t *testing.T) {
	transporttest.Run(t, transporttest.Factory{
		Kind: Kind,

		New: func(t testing.TB, send, recv transport.Inbound) *transporttest.Pair {
			a, b := New(send), New(recv)
			addr := t.Name()
			t.Cleanup(b.Listen(addr))
			return &transporttest.Pair{Sender: a, Receiver: b, Connect: func(ctx context.Context) (transport.Conn, error) {
				return a.Connect(ctx, transport.Peer{Address: addr})
			}}
		},
	})
}

// TestRegistered: importing the package is all it takes to offer the kind.
func TestRegistered(t *testing.T) {
	d, ok := transport.Lookup(Kind)
	if !ok {
		t.Fatal("memtest did not register itself")
	}
	tr, err := d.New(transport.Env{})
	if err != nil || tr.Kind() != Kind {
		t.Fatalf("New = %v, %v", tr, err)
	}
	if ds, err := transport.Registered(); err != nil || len(ds) == 0 {
		t.Fatalf("Registered = %v, %v", ds, err)
	}
}
