package peer

import (
	"context"
	"testing"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/transport"
)

// blockConn is a Conn that counts its writes and block writes.
type blockConn struct {
	transport.NoPrepare
	writes, blocks int
	busyDuring     int64
	st             *state
}

func (c *blockConn) Write(context.Context, transport.Registration, transport.RemoteRegion, *desc.Batch) (transport.Stats, error) {
	c.writes++
	return transport.Stats{}, nil
}
func (c *blockConn) Post(ctx context.Context, r *transport.Request) (transport.Stats, error) {
	h := transport.Handlers{Write: c.Write, WriteBlocks: c.WriteBlocks}
	return h.Post(ctx, r)
}
func (c *blockConn) Err() error   { return nil }
func (c *blockConn) Close() error { return nil }
func (c *blockConn) WriteBlocks(context.Context, *transport.Blocks, *transport.BlockScratch) (transport.Stats, error) {
	c.blocks++
	c.busyDuring = c.st.busy.Load()
	return transport.Stats{}, nil
}

// TestTrackedConnKeepsBlockWriter: the peer manager's wrapper hands a
// block write to the kind's own WriteBlocks (else every block write would
// silently take the generic path), and counts the peer busy while it runs.
func TestTrackedConnKeepsBlockWriter(t *testing.T) {
	st := &state{}
	inner := &blockConn{st: st}
	c := track(inner, st)
	l, err := layout.New("l", []layout.Segment{{Region: "r", BlockLen: 8, Stride: 8, NumBlocks: 4}}, func(string) (uint64, error) { return 32, nil }, layout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := layout.NewPair(l, l, layout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	var pl layout.Planner
	ids, err := pl.Validate(pair, layout.Request{SrcIDs: layout.PackIDs([]uint32{1}), DstIDs: layout.PackIDs([]uint32{2})})
	if err != nil {
		t.Fatal(err)
	}
	w := transport.Blocks{Pair: pair, IDs: ids, Local: make([]transport.Registration, 1), Remote: make([]transport.RemoteRegion, 1)}
	if _, err := transport.PostBlocks(context.Background(), c, transport.OpWrite, &w, &transport.BlockScratch{}); err != nil {
		t.Fatal(err)
	}
	if inner.blocks != 1 || inner.writes != 0 {
		t.Fatalf("through the tracked conn: %d WriteBlocks and %d Writes on the kind's conn; want 1 and 0", inner.blocks, inner.writes)
	}
	if inner.busyDuring != 1 {
		t.Fatalf("busy = %d while the block write ran, want 1", inner.busyDuring)
	}
	if b := st.busy.Load(); b != 0 {
		t.Fatalf("busy = %d after the block write, want 0", b)
	}
}
