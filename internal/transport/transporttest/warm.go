package transporttest

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// testWarm: a warm-up (Request.Warm) moves no byte and holds no pin
// after it returned, for a write and, where the kind reads, for a read
// (one that does not answers errs.ErrUnimplemented); a warm-up that
// carries descriptors is refused; and a batch after it lands every block,
// both ways.
func testWarm(t *testing.T, f Factory) {
	r := start(t, f)
	const n = 64 << 10
	src, sb := r.source(t, n)
	_, dst, db := r.dest(t, n)
	poisoned(db)
	warm := func(op transport.Ops, local transport.Registration, remote transport.RemoteRegion) error {
		_, err := r.conn.Post(context.Background(), &transport.Request{Op: op, Local: local, Remote: remote, Warm: true})
		return err
	}
	for round := 1; round <= 2; round++ { // a second warm-up finds it warm
		if err := warm(transport.OpWrite, src, dst); err != nil {
			t.Fatalf("warm-up %d for a write: %v", round, err)
		}
	}
	if !allPoison(db) {
		t.Fatal("a warm-up changed the destination")
	}
	if h := r.rin.Held(); h != 0 {
		t.Fatalf("%d pins held after a warm-up returned", h)
	}
	b := desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{8}}
	if _, err := r.conn.Post(context.Background(), &transport.Request{Op: transport.OpWrite, Local: src, Remote: dst, Batch: &b, Warm: true}); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("a warm-up with descriptors: %v, want InvalidArgument", err)
	}
	if !allPoison(db) {
		t.Fatal("a refused warm-up changed the destination")
	}
	rng := rand.New(rand.NewPCG(5, 5))
	fill(rng, sb)
	l := slots(rng, "after warm-up", 32, []uint64{512}, 1024, false)
	if _, err := transport.Write(context.Background(), r.conn, src, dst, &l.b); err != nil {
		t.Fatalf("write after the warm-up: %v", err)
	}
	check(t, sb, db, &l.b)

	_, remote, rb := r.readable(t, n)
	err := warm(transport.OpRead, src, remote)
	if r.caps.Ops&transport.OpRead == 0 {
		if !errors.Is(err, errs.ErrUnimplemented) {
			t.Fatalf("a warm-up for a read on a kind that cannot read: %v, want Unimplemented", err)
		}
		return
	}
	if err != nil {
		t.Fatalf("warm-up for a read: %v", err)
	}
	fill(rng, rb)
	poisoned(sb)
	if _, err := transport.Read(context.Background(), r.conn, src, remote, &l.b); err != nil {
		t.Fatalf("read after the warm-up: %v", err)
	}
	check(t, rb, sb, &l.b) // a read's batch: Src in the remote, Dst in the local
}
