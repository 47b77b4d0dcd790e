package transporttest

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/b2bd/b2bd/internal/errs"
	kvlayout "github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/transport"
)

// Block-write geometry: blocks of 512 B in a pool of 64 per segment.
const (
	kvBlock = 512
	kvPool  = 64
)

// kvSegs is a layout over nreg regions of kvPool*kvBlock*per bytes each:
// per segments per region. fused: a region's segments interleave per
// block (every layer of a block together, as vLLM's cross-layer layout),
// so they fuse into one group; else each segment is its own array, one
// after the other.
func kvSegs(nreg, per int, fused bool) ([]kvlayout.Segment, uint64) {
	size := uint64(kvPool * kvBlock * per)
	var segs []kvlayout.Segment
	for r := 0; r < nreg; r++ {
		for k := 0; k < per; k++ {
			s := kvlayout.Segment{Region: fmt.Sprintf("r%d", r), BlockLen: kvBlock, NumBlocks: kvPool}
			if fused {
				s.Offset, s.Stride = uint64(k*kvBlock), uint64(per*kvBlock)
			} else {
				s.Offset, s.Stride = uint64(k*kvPool*kvBlock), kvBlock
			}
			segs = append(segs, s)
		}
	}
	return segs, size
}

// kvRegions regions on each side of a kvPair, kvPer segments in each.
const kvRegions, kvPer = 3, 2

// kvPair is a source and a destination layout of kvRegions regions each,
// either side fused or separate, paired.
type kvPair struct {
	src, dst     *kvlayout.Layout
	pair         *kvlayout.Pair
	ssize, dsize uint64 // a source and a destination region's size
}

func newKVPair(t *testing.T, srcName, dstName string, srcFused, dstFused bool) kvPair {
	t.Helper()
	ss, ssize := kvSegs(kvRegions, kvPer, srcFused)
	ds, dsize := kvSegs(kvRegions, kvPer, dstFused)
	sl, err := kvlayout.New(srcName, ss, func(string) (uint64, error) { return ssize, nil }, kvlayout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	dl, err := kvlayout.New(dstName, ds, func(string) (uint64, error) { return dsize, nil }, kvlayout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := kvlayout.NewPair(sl, dl, kvlayout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return kvPair{src: sl, dst: dl, pair: pair, ssize: ssize, dsize: dsize}
}

// check fails t unless block srcIDs[i] of every segment of sbuf landed as
// block dstIDs[i] of dbuf (by checksum), and every other byte of dbuf is
// still poison; dst ("destination") names dbuf's side. It returns the
// bytes that landed.
func (p kvPair) check(t *testing.T, srcIDs, dstIDs []uint32, sbuf, dbuf [][]byte, dst string) uint64 {
	t.Helper()
	covered := make([][]bool, len(dbuf))
	for i := range covered {
		covered[i] = make([]bool, p.dsize)
	}
	var landed uint64
	for k := range p.src.NumSegments() {
		st, dt := p.src.Template(k), p.dst.Template(k)
		for i := range srcIDs {
			so := st.Base + uint64(srcIDs[i])*st.Stride
			do := dt.Base + uint64(dstIDs[i])*dt.Stride
			got, exp := dbuf[dt.Region][do:do+kvBlock], sbuf[st.Region][so:so+kvBlock]
			if xxhash.Sum64(got) != xxhash.Sum64(exp) {
				t.Fatalf("segment %d entry %d (block %d -> %d): the %s block differs from its source", k, i, srcIDs[i], dstIDs[i], dst)
			}
			for x := do; x < do+kvBlock; x++ {
				covered[dt.Region][x] = true
			}
			landed += kvBlock
		}
	}
	for ri := range dbuf {
		for x, cv := range covered[ri] {
			if !cv && dbuf[ri][x] != poison {
				t.Fatalf("%s region %d byte %d, outside every target block, was written", dst, ri, x)
			}
		}
	}
	return landed
}

// testBlocks moves block-id requests with Conn.WriteBlocks (in one go
// where the kind's Caps.Blocks says so, as concurrent stretch Writes
// otherwise): 3 source regions into 3 destination regions, with
// fused and separate segments on either side, runs of consecutive ids
// (merges), repeated source ids, and checks every block of every segment
// by checksum, every other destination byte untouched, and the landing.
func testBlocks(t *testing.T, f Factory) {
	r := start(t, f)
	cases := []struct {
		name             string
		srcFused, dstFus bool
		ids              func(rng *rand.Rand) (src, dst []uint32)
	}{
		{"merges", false, false, func(rng *rand.Rand) ([]uint32, []uint32) {
			// 10..19 -> 30..39 merges into one run per segment; then scattered.
			var s, d []uint32
			for i := uint32(0); i < 10; i++ {
				s, d = append(s, 10+i), append(d, 30+i)
			}
			for _, x := range []uint32{3, 50, 7} {
				s, d = append(s, x), append(d, x+1)
			}
			return s, d
		}},
		{"repeated sources", false, true, func(rng *rand.Rand) ([]uint32, []uint32) {
			var s, d []uint32
			for i, p := range rng.Perm(kvPool)[:40] {
				s, d = append(s, uint32(i%5)), append(d, uint32(p))
			}
			return s, d
		}},
		{"fused to separate, random", true, false, func(rng *rand.Rand) ([]uint32, []uint32) {
			var s, d []uint32
			for i, p := range rng.Perm(kvPool)[:kvPool/2] {
				s, d = append(s, uint32(rng.Perm(kvPool)[i])), append(d, uint32(p))
			}
			return s, d
		}},
	}
	rng := rand.New(rand.NewPCG(23, 2))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r.fresh(t)
			kp := newKVPair(t, "src", "dst", c.srcFused, c.dstFus)
			nreg, ssize, dsize := kvRegions, kp.ssize, kp.dsize
			var w transport.Blocks
			w.Pair = kp.pair
			var sbuf, dbuf [][]byte
			for i := 0; i < nreg; i++ {
				reg, b := r.source(t, int(ssize))
				fill(rng, b)
				w.Local, sbuf = append(w.Local, reg), append(sbuf, b)
				_, rr, db := r.dest(t, int(dsize))
				poisoned(db)
				w.Remote, dbuf = append(w.Remote, rr), append(dbuf, db)
			}
			srcIDs, dstIDs := c.ids(rng)
			var pl kvlayout.Planner
			ids, err := pl.Validate(kp.pair, kvlayout.Request{SrcIDs: kvlayout.PackIDs(srcIDs), DstIDs: kvlayout.PackIDs(dstIDs)})
			if err != nil {
				t.Fatal(err)
			}
			w.IDs = ids
			before := r.rin.landedBytes.Load()
			var sc transport.BlockScratch
			if _, err := transport.PostBlocks(context.Background(), r.conn, transport.OpWrite, &w, &sc); err != nil {
				t.Fatalf("WriteBlocks: %v", err)
			}
			want := kp.check(t, srcIDs, dstIDs, sbuf, dbuf, "destination")
			if got := r.rin.landedBytes.Load() - before; got != want {
				t.Fatalf("the receiver counted %d bytes landed, want %d", got, want)
			}
			if n := r.rin.Held(); n != 0 {
				t.Fatalf("%d pins held after WriteBlocks returned", n)
			}
		})
	}
}

// testBlocksCancel: a block write over 3 regions is cancelled while the
// receiver is stalled in Pin; it must answer Canceled, and no byte may
// land once it answered (compared after the receiver was let go and
// finished with everything it began).
func testBlocksCancel(t *testing.T, f Factory) {
	r := start(t, f)
	const nreg, per = 3, 2
	ss, size := kvSegs(nreg, per, false)
	l, err := kvlayout.New("l", ss, func(string) (uint64, error) { return size, nil }, kvlayout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := kvlayout.NewPair(l, l, kvlayout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 5))
	w := transport.Blocks{Pair: pair}
	var dbuf [][]byte
	for i := 0; i < nreg; i++ {
		reg, b := r.source(t, int(size))
		fill(rng, b)
		_, rr, db := r.dest(t, int(size))
		poisoned(db)
		w.Local, w.Remote, dbuf = append(w.Local, reg), append(w.Remote, rr), append(dbuf, db)
	}
	var ids []uint32
	for _, p := range rng.Perm(kvPool) {
		ids = append(ids, uint32(p))
	}
	var pl kvlayout.Planner
	if w.IDs, err = pl.Validate(pair, kvlayout.Request{SrcIDs: kvlayout.PackIDs(ids), DstIDs: kvlayout.PackIDs(ids)}); err != nil {
		t.Fatal(err)
	}
	stall, entered := r.rin.Stall, (<-chan struct{})(r.rin.entered)
	if r.p.Stall != nil {
		stall, entered = r.p.Stall, nil
	}
	resume := stall()
	defer resume()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		select {
		case <-entered:
		case <-time.After(50 * time.Millisecond): // a kind that never pins: cancel anyway
		}
		stop()
	}()
	var sc transport.BlockScratch
	_, err = transport.PostBlocks(ctx, r.conn, transport.OpWrite, &w, &sc)
	var snap [][]byte
	for _, db := range dbuf {
		snap = append(snap, bytes.Clone(db))
	}
	if err == nil {
		t.Fatal("WriteBlocks succeeded while the receiver was stalled")
	}
	if got := errs.Class(err); got != context.Canceled {
		t.Fatalf("err = %v: class %v, want %v", err, got, context.Canceled)
	}
	resume()
	if r.conn.Err() != nil {
		_ = r.conn.Close()
	}
	if err := r.rin.settle(10 * time.Second); err != nil {
		t.Fatalf("after the cancel: %v", err)
	}
	for i := range dbuf {
		if late, first := diff(snap[i], dbuf[i]); late > 0 {
			gap(t, f, GapLateBytes, fmt.Sprintf("%d bytes of destination region %d (first at offset %d) changed after WriteBlocks answered", late, i, first))
		}
	}
}

// testBlocksRead pulls block-id requests with Conn.ReadBlocks: the peer's 3 regions
// into 3 of ours, fused and separate segments, merging runs and repeated
// source ids, every block of every segment checked and every other byte
// of ours untouched.
func testBlocksRead(t *testing.T, f Factory) {
	r := start(t, f)
	r.reader(t)
	cases := []struct {
		name             string
		srcFused, dstFus bool
		ids              func(rng *rand.Rand) (src, dst []uint32)
	}{
		{"merges", false, false, func(rng *rand.Rand) ([]uint32, []uint32) {
			var s, d []uint32
			for i := uint32(0); i < 20; i++ {
				s, d = append(s, 5+i), append(d, 40+i)
			}
			return append(s, 1, 63), append(d, 2, 0)
		}},
		{"repeated sources, fused", true, true, func(rng *rand.Rand) ([]uint32, []uint32) {
			var s, d []uint32
			for i, p := range rng.Perm(kvPool)[:40] {
				s, d = append(s, uint32(i%5)), append(d, uint32(p))
			}
			return s, d
		}},
		{"separate to fused, every block", false, true, func(rng *rand.Rand) ([]uint32, []uint32) {
			var s, d []uint32
			for i, p := range rng.Perm(kvPool) {
				s, d = append(s, uint32(i)), append(d, uint32(p))
			}
			return s, d
		}},
	}
	rng := rand.New(rand.NewPCG(24, 1))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r.fresh(t)
			kp := newKVPair(t, "peer", "ours", c.srcFused, c.dstFus)
			nreg, ssize, dsize := kvRegions, kp.ssize, kp.dsize
			rd := transport.Blocks{Pair: kp.pair}
			var sbuf, dbuf [][]byte
			for i := 0; i < nreg; i++ {
				_, rr, sb := r.readable(t, int(ssize))
				fill(rng, sb)
				rd.Remote, sbuf = append(rd.Remote, rr), append(sbuf, sb)
				reg, db := r.source(t, int(dsize))
				poisoned(db)
				rd.Local, dbuf = append(rd.Local, reg), append(dbuf, db)
			}
			srcIDs, dstIDs := c.ids(rng)
			var pl kvlayout.Planner
			var err error
			if rd.IDs, err = pl.Validate(kp.pair, kvlayout.Request{SrcIDs: kvlayout.PackIDs(srcIDs), DstIDs: kvlayout.PackIDs(dstIDs)}); err != nil {
				t.Fatal(err)
			}
			var sc transport.BlockScratch
			st, err := transport.PostBlocks(context.Background(), r.conn, transport.OpRead, &rd, &sc)
			if err != nil {
				t.Fatalf("ReadBlocks: %v", err)
			}
			if st.Segments == 0 {
				t.Fatal("ReadBlocks reported no blocks")
			}
			kp.check(t, srcIDs, dstIDs, sbuf, dbuf, "our")
		})
	}
}
