package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/transport"
)

// blockRig is a block write of 8 segments of 512 B blocks (pool 64) from
// one source region into 4 destination regions (2 segments each): 4
// stretches, so 4 pipelined batches.
func blockRig(t testing.TB) (*pair, *transport.BlockWrite, [][]byte) {
	const segs, nd, pool, blk = 8, 4, 64, 512
	p := newPair(t, segs*pool*blk, 2)
	w := &transport.BlockWrite{Src: []transport.Registration{p.src}}
	var dbufs [][]byte
	for d := 0; d < nd; d++ {
		m := hostMem(t, segs/nd*pool*blk)
		reg, err := p.b.Register(m)
		if err != nil {
			t.Fatal(err)
		}
		p.in.mu.Lock()
		p.in.regs[reg.Key().Key] = m
		p.in.mu.Unlock()
		w.Dst = append(w.Dst, transport.RemoteRegion{Name: fmt.Sprintf("d%d", d), Size: m.Len, Key: reg.Key()})
		dbufs = append(dbufs, m.Host)
	}
	var ss, ds []layout.Segment
	for s := 0; s < segs; s++ {
		ss = append(ss, layout.Segment{Region: "s", Offset: uint64(s * pool * blk), BlockLen: blk, Stride: blk, NumBlocks: pool})
		ds = append(ds, layout.Segment{Region: fmt.Sprintf("d%d", s/(segs/nd)), Offset: uint64(s % (segs / nd) * pool * blk), BlockLen: blk, Stride: blk, NumBlocks: pool})
	}
	size := func(string) (uint64, error) { return p.srcMem.Len, nil }
	sl, err := layout.New("s", ss, size, layout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	dl, err := layout.New("d", ds, func(string) (uint64, error) { return segs / nd * pool * blk, nil }, layout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if w.Pair, err = layout.NewPair(sl, dl, layout.Limits{}); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(9, 9))
	for i := range p.srcMem.Host {
		p.srcMem.Host[i] = byte(r.Uint32())
	}
	var src, dst []uint32
	dp := r.Perm(pool)
	for i, x := range r.Perm(pool)[:pool/2] {
		src, dst = append(src, uint32(x)), append(dst, uint32(dp[i]))
	}
	var pl layout.Planner
	if w.IDs, err = pl.Validate(w.Pair, layout.Request{SrcIDs: layout.PackIDs(src), DstIDs: layout.PackIDs(dst)}); err != nil {
		t.Fatal(err)
	}
	// Validate's ids alias the packed bytes (kept alive by w.IDs).
	return p, w, dbufs
}

// TestWriteBlocksAllocatesNothing: the pipelined block path, expansion to
// acks, allocates nothing once its scratch has grown, and lands every run.
func TestWriteBlocksAllocatesNothing(t *testing.T) {
	p, w, dbufs := blockRig(t)
	bw, ok := p.conn.(transport.BlockWriter)
	if !ok {
		t.Fatal("the tcp conn has no BlockWriter")
	}
	var sc transport.BlockScratch
	ctx := context.Background()
	if _, err := bw.WriteBlocks(ctx, w, &sc); err != nil { // warm-up
		t.Fatal(err)
	}
	for _, r := range w.Pair.Expand(nil, w.IDs) {
		got := dbufs[r.DstRegion][r.DstOff : r.DstOff+r.Len]
		if !bytes.Equal(got, p.srcMem.Host[r.SrcOff:r.SrcOff+r.Len]) {
			t.Fatalf("run %+v did not land", r)
		}
	}
	if a := testing.AllocsPerRun(50, func() {
		if _, err := bw.WriteBlocks(ctx, w, &sc); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Fatalf("%v allocations per block write", a)
	}
}

// TestWriteBlocksRefusal: a destination region the receiver no longer
// knows fails the block write with NotFound, names its stretch, leaves no
// pin behind, and fails the conn (later batches' acks may be unread).
func TestWriteBlocksRefusal(t *testing.T) {
	p, w, _ := blockRig(t)
	p.in.mu.Lock()
	delete(p.in.regs, w.Dst[2].Key.Key)
	p.in.mu.Unlock()
	var sc transport.BlockScratch
	_, err := transport.WriteBlocks(context.Background(), p.conn, w, &sc)
	if !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("err = %v, want NotFound", err)
	}
	var se *transport.StretchError
	if !errors.As(err, &se) || se.DstRegion != 2 {
		t.Fatalf("err = %v (%#v): want a StretchError naming destination region 2", err, se)
	}
	if p.conn.Err() == nil {
		t.Fatal("the conn carries on after a failed pipelined write")
	}
	p.conn.Close()
	for deadline := time.Now().Add(5 * time.Second); p.in.pins.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d pins held after the refused block write", p.in.pins.Load())
		}
	}
}
