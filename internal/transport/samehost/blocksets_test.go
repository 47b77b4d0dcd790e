package samehost

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/transport"
)

// multiPair is nreg source regions on the sender and nreg destination
// regions on the receiver, one segment each (the KV bench's shape: one
// layer tensor per region), and a block write over them.
type multiPair struct {
	*pair
	srcs, dsts []transport.Registration
	w          transport.BlockWrite
	rd         transport.BlockRead
}

func newMultiPair(t testing.TB, nreg, pool, blk, nids int) *multiPair {
	t.Helper()
	p := newPair(t, 4096)
	dir := t.TempDir()
	m := &multiPair{pair: p}
	size := uint64(pool * blk)
	var segs []layout.Segment
	for r := 0; r < nreg; r++ {
		segs = append(segs, layout.Segment{Region: fmt.Sprintf("r%d", r), BlockLen: uint64(blk), Stride: uint64(blk), NumBlocks: uint64(pool)})
		s, err := p.send.Register(shmRegion(t, dir, int(size)))
		if err != nil {
			t.Fatal(err)
		}
		d, err := p.recv.Register(shmRegion(t, dir, int(size)))
		if err != nil {
			t.Fatal(err)
		}
		p.in.add(d)
		fill(s.Memory().Host, byte(r))
		m.srcs, m.dsts = append(m.srcs, s), append(m.dsts, d)
		m.w.Src = append(m.w.Src, s)
		m.w.Dst = append(m.w.Dst, transport.RemoteRegion{Name: fmt.Sprintf("d%d", r), Size: size, Key: d.Key()})
	}
	l, err := layout.New("l", segs, func(string) (uint64, error) { return size, nil }, layout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := layout.NewPair(l, l, layout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, uint64(nreg)))
	var sids, dids []uint32
	dp := rng.Perm(pool)
	for i, x := range rng.Perm(pool)[:nids] {
		sids, dids = append(sids, uint32(x)), append(dids, uint32(dp[i]))
	}
	var pl layout.Planner
	ids, err := pl.Validate(pr, layout.Request{SrcIDs: layout.PackIDs(sids), DstIDs: layout.PackIDs(dids)})
	if err != nil {
		t.Fatal(err)
	}
	// The planner's scratch may back ids: keep copies that outlive it.
	m.w.Pair, m.w.IDs = pr, ids
	return m
}

// BenchmarkWriteBlocks160: a block request over 160 regions per side with
// 4 ids of 64 B: nearly all of its time is per (source, destination)
// stretch, not copying.
func BenchmarkWriteBlocks160(b *testing.B) {
	m := newMultiPair(b, 160, 64, 64, 4)
	bw := m.conn.(transport.BlockWriter)
	var sc transport.BlockScratch
	ctx := context.Background()
	if _, err := bw.WriteBlocks(ctx, &m.w, &sc); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := bw.WriteBlocks(ctx, &m.w, &sc); err != nil {
			b.Fatal(err)
		}
	}
}

var _ = filepath.Join
