package tcp

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// TestBehindACutBatch: after a batch was cut off by its deadline (the conn
// failed with its stream's "i/o timeout"), every later batch on the conn,
// prepared or not, and a Prepare, fail with Unavailable and ErrNotSent:
// nothing of them left, so the batch layer runs them again on a fresh conn
// without spending their one retry. A prepared Write used to say only
// Unavailable, and a submit queued behind another's 1 ms deadline failed
// with that deadline's "writev: i/o timeout".
func TestBehindACutBatch(t *testing.T) {
	p := newPair(t, 4<<20, 2)
	b := desc.Batch{Src: []uint64{0, 2 << 20}, Dst: []uint64{2 << 20, 0}, Len: []uint64{1 << 20, 1 << 20}}
	pr := prepare(t, p, p.dst, &b)
	p.in.mu.Lock() // the receiver cannot pin, so it never acks: the batch is cut by its deadline
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err := transport.Write(ctx, p.conn, p.src, p.dst, &b)
	cancel()
	p.in.mu.Unlock()
	if !errors.Is(err, context.DeadlineExceeded) || p.conn.Err() == nil {
		t.Fatalf("cut batch: err = %v, conn err = %v", err, p.conn.Err())
	}
	for _, tc := range []struct {
		name string
		run  func() error
	}{
		{"prepared write", func() error { _, err := pr.Write(context.Background()); return err }},
		{"write", func() error { _, err := transport.Write(context.Background(), p.conn, p.src, p.dst, &b); return err }},
		{"prepare", func() error { _, err := transport.Prepare(p.conn, p.src, p.dst, &b); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if !errors.Is(err, transport.ErrNotSent) || errs.Class(err) != errs.ErrUnavailable || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v (%v): want Unavailable and ErrNotSent, not the cut batch's deadline", err, errs.Class(err))
			}
		})
	}
}
