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

// testBlocks moves block-id requests with transport.WriteBlocks, through
// the kind's BlockWriter where it declares one and the concurrent stretch
// Writes otherwise: 3 source regions into 3 destination regions, with
// fused and separate segments on either side, runs of consecutive ids
// (merges), repeated source ids, and checks every block of every segment
// by checksum, every other destination byte untouched, and the landing.
func testBlocks(t *testing.T, f Factory) {
	r := start(t, f)
	_, has := r.conn.(transport.BlockWriter)
	t.Run("Declared", func(t *testing.T) { declared(t, f, Blocks, has) })
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
			const nreg, per = 3, 2
			ss, ssize := kvSegs(nreg, per, c.srcFused)
			ds, dsize := kvSegs(nreg, per, c.dstFus)
			size := func(uint64) func(string) (uint64, error) {
				return func(string) (uint64, error) { return ssize, nil }
			}
			sl, err := kvlayout.New("src", ss, size(ssize), kvlayout.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			dl, err := kvlayout.New("dst", ds, func(string) (uint64, error) { return dsize, nil }, kvlayout.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			pair, err := kvlayout.NewPair(sl, dl, kvlayout.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			var w transport.BlockWrite
			w.Pair = pair
			var sbuf, dbuf [][]byte
			for i := 0; i < nreg; i++ {
				reg, b := r.source(t, int(ssize))
				fill(rng, b)
				w.Src, sbuf = append(w.Src, reg), append(sbuf, b)
				_, rr, db := r.dest(t, int(dsize))
				poisoned(db)
				w.Dst, dbuf = append(w.Dst, rr), append(dbuf, db)
			}
			srcIDs, dstIDs := c.ids(rng)
			var pl kvlayout.Planner
			ids, err := pl.Validate(pair, kvlayout.Request{SrcIDs: kvlayout.PackIDs(srcIDs), DstIDs: kvlayout.PackIDs(dstIDs)})
			if err != nil {
				t.Fatal(err)
			}
			w.IDs = ids
			before := r.rin.landedBytes.Load()
			var sc transport.BlockScratch
			if _, err := transport.WriteBlocks(context.Background(), r.conn, &w, &sc); err != nil {
				t.Fatalf("WriteBlocks: %v", err)
			}
			// Every block of every segment, and nothing else.
			covered := make([][]bool, nreg)
			for i := range covered {
				covered[i] = make([]bool, dsize)
			}
			var want uint64
			for k := range ss {
				st, dt := sl.Template(k), dl.Template(k)
				for i := range srcIDs {
					so := st.Base + uint64(srcIDs[i])*st.Stride
					do := dt.Base + uint64(dstIDs[i])*dt.Stride
					got, exp := dbuf[dt.Region][do:do+kvBlock], sbuf[st.Region][so:so+kvBlock]
					if xxhash.Sum64(got) != xxhash.Sum64(exp) {
						t.Fatalf("segment %d entry %d (block %d -> %d): the destination block differs from the source", k, i, srcIDs[i], dstIDs[i])
					}
					for x := do; x < do+kvBlock; x++ {
						covered[dt.Region][x] = true
					}
					want += kvBlock
				}
			}
			for ri := range dbuf {
				for x, cv := range covered[ri] {
					if !cv && dbuf[ri][x] != poison {
						t.Fatalf("destination region %d byte %d, outside every target block, was written", ri, x)
					}
				}
			}
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
	w := transport.BlockWrite{Pair: pair}
	var dbuf [][]byte
	for i := 0; i < nreg; i++ {
		reg, b := r.source(t, int(size))
		fill(rng, b)
		_, rr, db := r.dest(t, int(size))
		poisoned(db)
		w.Src, w.Dst, dbuf = append(w.Src, reg), append(w.Dst, rr), append(dbuf, db)
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
	_, err = transport.WriteBlocks(ctx, r.conn, &w, &sc)
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

// testBlocksRead pulls block-id requests with transport.ReadBlocks (the
// kind's BlockReader, or one Read per stretch): the peer's 3 readable
// regions into 3 local ones, fused and separate segments, merges and
// repeated source ids; every block of every segment checked, every other
// local byte untouched. Kinds that cannot pull skip it (as declared).
func testBlocksRead(t *testing.T, f Factory) {
	r := start(t, f)
	r.reader(t)
	rng := rand.New(rand.NewPCG(24, 3))
	for _, c := range []struct {
		name             string
		srcFused, dstFus bool
		repeats          bool
	}{{"separate", false, false, false}, {"fused to separate, repeats", true, false, true}, {"separate to fused", false, true, false}} {
		t.Run(c.name, func(t *testing.T) {
			r.fresh(t)
			const nreg, per = 3, 2
			ss, ssize := kvSegs(nreg, per, c.srcFused)
			ds, dsize := kvSegs(nreg, per, c.dstFus)
			sl, err := kvlayout.New("remote", ss, func(string) (uint64, error) { return ssize, nil }, kvlayout.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			dl, err := kvlayout.New("local", ds, func(string) (uint64, error) { return dsize, nil }, kvlayout.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			pair, err := kvlayout.NewPair(sl, dl, kvlayout.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			br := transport.BlockRead{Pair: pair}
			var sbuf, dbuf [][]byte
			for i := 0; i < nreg; i++ {
				_, rr, b := r.readable(t, int(ssize))
				fill(rng, b)
				br.Src, sbuf = append(br.Src, rr), append(sbuf, b)
				reg, db := r.source(t, int(dsize))
				poisoned(db)
				br.Dst, dbuf = append(br.Dst, reg), append(dbuf, db)
			}
			// runs of consecutive ids (merges) and scattered ones
			var srcIDs, dstIDs []uint32
			perm := rng.Perm(kvPool)
			for i := 0; i < 8; i++ {
				srcIDs, dstIDs = append(srcIDs, uint32(20+i)), append(dstIDs, uint32(40+i))
			}
			for _, p := range perm {
				if len(dstIDs) == kvPool/2 {
					break
				}
				if p >= 40 && p < 48 {
					continue
				}
				s := uint32(rng.IntN(kvPool))
				if c.repeats {
					s = uint32(rng.IntN(3))
				}
				srcIDs, dstIDs = append(srcIDs, s), append(dstIDs, uint32(p))
			}
			var pl kvlayout.Planner
			if br.IDs, err = pl.Validate(pair, kvlayout.Request{SrcIDs: kvlayout.PackIDs(srcIDs), DstIDs: kvlayout.PackIDs(dstIDs)}); err != nil {
				t.Fatal(err)
			}
			var sc transport.BlockScratch
			if _, err := transport.ReadBlocks(context.Background(), r.conn, &br, &sc); err != nil {
				t.Fatalf("ReadBlocks: %v", err)
			}
			covered := make([][]bool, nreg)
			for i := range covered {
				covered[i] = make([]bool, dsize)
			}
			for k := range ss {
				st, dt := sl.Template(k), dl.Template(k)
				for i := range srcIDs {
					so := st.Base + uint64(srcIDs[i])*st.Stride
					do := dt.Base + uint64(dstIDs[i])*dt.Stride
					if xxhash.Sum64(dbuf[dt.Region][do:do+kvBlock]) != xxhash.Sum64(sbuf[st.Region][so:so+kvBlock]) {
						t.Fatalf("segment %d entry %d (block %d -> %d): the local block differs from the peer's", k, i, srcIDs[i], dstIDs[i])
					}
					for x := do; x < do+kvBlock; x++ {
						covered[dt.Region][x] = true
					}
				}
			}
			for ri := range dbuf {
				for x, cv := range covered[ri] {
					if !cv && dbuf[ri][x] != poison {
						t.Fatalf("local region %d byte %d, outside every target block, was written", ri, x)
					}
				}
			}
			if n := r.rin.Held(); n != 0 {
				t.Fatalf("%d pins held after ReadBlocks returned", n)
			}
		})
	}
}
