//go:build cgo && linux

package verbs

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/b2bd/b2bd/internal/layout"
)

// The block expansion's tests: the C expansion (b2bv_bexpand, and the
// chains b2bv_bpost_chain plans from it) against layout.Pair.Expand, the
// Go reference, for fused and separate segments, merges and repeats. Pure
// C over arrays: cgo, no device.

// blockGeom builds a layout of nreg regions × per segments of blk bytes and
// pool blocks each: fused interleaves a region's segments per block (one
// group), else each segment is its own array; pad > 0 leaves a gap after
// every block (no merges).
func blockGeom(t testing.TB, name string, nreg, per int, blk, pool uint64, fused bool, pad uint64) *layout.Layout {
	t.Helper()
	var segs []layout.Segment
	slot := blk + pad
	for r := 0; r < nreg; r++ {
		for k := 0; k < per; k++ {
			s := layout.Segment{Region: fmt.Sprintf("r%d", r), BlockLen: blk, NumBlocks: pool}
			if fused {
				s.Offset, s.Stride = uint64(k)*blk, uint64(per)*blk+pad
			} else {
				s.Offset, s.Stride = uint64(k)*pool*slot, slot
			}
			segs = append(segs, s)
		}
	}
	l, err := layout.New(name, segs, func(string) (uint64, error) { return 1 << 40, nil }, layout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// blockTable copies p's templates into C; region i of either side sits at
// base (i+1) << 40 with key 0x100+i (source) or 0x200+i (destination).
func blockTable(t testing.TB, p *layout.Pair) *BlockTable {
	t.Helper()
	gs := make([]BlockGroup, p.NumGroups())
	for g := range gs {
		x := p.GroupTemplate(g)
		gs[g] = BlockGroup{SrcBase: x.SrcBase, DstBase: x.DstBase, SrcStride: x.SrcStride, DstStride: x.DstStride,
			BlockLen: x.BlockLen, SrcRegion: x.SrcRegion, DstRegion: x.DstRegion, Mergeable: x.Mergeable}
	}
	ns, nd := len(p.Src().Regions()), len(p.Dst().Regions())
	tab, err := NewBlockTable(gs, ns, nd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tab.Close() })
	for i := 0; i < ns; i++ {
		tab.SetSrc(i, BlockRegion{Addr: uint64(i+1) << 40, Limit: 1 << 40, Key: 0x100 + uint32(i)})
	}
	for i := 0; i < nd; i++ {
		tab.SetDst(i, BlockRegion{Addr: uint64(i+1) << 40, Limit: 1 << 40, Key: 0x200 + uint32(i)})
	}
	return tab
}

func validate(t testing.TB, p *layout.Pair, src, dst []uint32) layout.IDs {
	t.Helper()
	var pl layout.Planner
	ids, err := pl.Validate(p, layout.Request{SrcIDs: layout.PackIDs(src), DstIDs: layout.PackIDs(dst)})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// expandC expands the whole request with the C expansion, chunk runs at a time.
func expandC(t testing.TB, tab *BlockTable, p *layout.Pair, ids layout.IDs, chunk int) []layout.Run {
	t.Helper()
	cur, err := NewBlockCursor(chunk)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	cur.Start(BlockPos{}, BlockPos{Group: uint32(p.NumGroups())})
	src, dst, lens, first := make([]uint64, chunk), make([]uint64, chunk), make([]uint64, chunk), make([]uint32, chunk)
	var out []layout.Run
	for guard := 0; ; guard++ {
		if guard > 1<<22 {
			t.Fatal("expansion does not terminate")
		}
		n, g, err := cur.ExpandBlocks(tab, ids.Src, ids.Dst, src, dst, lens, first)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return out
		}
		x := p.GroupTemplate(int(g))
		for k := 0; k < n; k++ {
			out = append(out, layout.Run{SrcOff: src[k], DstOff: dst[k], Len: lens[k], SrcRegion: x.SrcRegion, DstRegion: x.DstRegion, Group: g, First: first[k]})
		}
	}
}

// blockIDs draws n entries: runs of consecutive ids on both sides (merges),
// and, with repeats, source ids that repeat; destination ids unique.
func blockIDs(rng *rand.Rand, pool, n int, repeats bool) (src, dst []uint32) {
	used := make([]bool, pool)
	for len(dst) < n {
		d0, s0 := rng.IntN(pool), rng.IntN(pool)
		for k := 0; k < 1+rng.IntN(6) && len(dst) < n; k++ {
			d := d0 + k
			if d >= pool || used[d] {
				break
			}
			s := min(s0+k, pool-1)
			if repeats && rng.IntN(4) == 0 {
				s = rng.IntN(3)
			}
			used[d] = true
			src, dst = append(src, uint32(s)), append(dst, uint32(d))
		}
	}
	return src, dst
}

type geom struct {
	name                   string
	sreg, sper, dreg, dper int
	sfused, dfused         bool
	spad, dpad             uint64
}

func geoms() []geom {
	return []geom{
		{"separate", 3, 2, 3, 2, false, false, 0, 0},
		{"fused both", 2, 4, 2, 4, true, true, 0, 0},
		{"fused to separate", 2, 4, 4, 2, true, false, 0, 0},
		{"padded (no merges)", 2, 3, 3, 2, false, false, 64, 0},
		{"one region per segment", 8, 1, 8, 1, false, false, 0, 0},
		{"all fused, padded", 1, 6, 1, 6, true, true, 32, 32},
	}
}

// TestExpandBlocksMatchesPair: the C expansion gives exactly Pair.Expand's
// runs, in its order, for every geometry and chunk size.
func TestExpandBlocksMatchesPair(t *testing.T) {
	rng := rand.New(rand.NewPCG(24, 23))
	const blk, pool = 64, 96
	for _, g := range geoms() {
		for _, chunk := range []int{1, 3, 256} {
			for _, repeats := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/chunk%d/repeats=%v", g.name, chunk, repeats), func(t *testing.T) {
					sl := blockGeom(t, "s", g.sreg, g.sper, blk, pool, g.sfused, g.spad)
					dl := blockGeom(t, "d", g.dreg, g.dper, blk, pool, g.dfused, g.dpad)
					p, err := layout.NewPair(sl, dl, layout.Limits{})
					if err != nil {
						t.Fatal(err)
					}
					tab := blockTable(t, p)
					for round := 0; round < 5; round++ {
						src, dst := blockIDs(rng, pool, 1+rng.IntN(pool), repeats)
						ids := validate(t, p, src, dst)
						want := p.Expand(nil, ids)
						got := expandC(t, tab, p, ids, chunk)
						if !slices.Equal(got, want) {
							t.Fatalf("round %d: C expansion differs from Pair.Expand:\n got %d runs %v\nwant %d runs %v", round, len(got), head(got), len(want), head(want))
						}
					}
				})
			}
		}
	}
}

func head(rs []layout.Run) []layout.Run { return rs[:min(len(rs), 8)] }

// piece is n bytes from absolute source address src to destination dst.
type piece struct{ src, dst, n uint64 }

func coalescePieces(ps []piece) []piece {
	var out []piece
	for _, r := range ps {
		if k := len(out) - 1; k >= 0 && out[k].dst+out[k].n == r.dst && out[k].src+out[k].n == r.src {
			out[k].n += r.n
			continue
		}
		out = append(out, r)
	}
	return out
}

// runPieces maps Pair.Expand's runs to absolute addresses (blockTable's bases).
func runPieces(runs []layout.Run) []piece {
	var ps []piece
	for _, r := range runs {
		ps = append(ps, piece{uint64(r.SrcRegion+1)<<40 + r.SrcOff, uint64(r.DstRegion+1)<<40 + r.DstOff, r.Len})
	}
	return ps
}

// planBlocks plans the request's range [from, to) in chains without
// posting, checks each WR (keys per group, opcode, immediate on the
// range's last WR only, wr_id naming the group), and returns the bytes.
func planBlocks(t testing.TB, ch *Chain, tab *BlockTable, p *layout.Pair, ids layout.IDs, op WROpcode, from, to BlockPos, chunk int) []piece {
	t.Helper()
	cur, err := NewBlockCursor(chunk)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	cur.Start(from, to)
	params := ChainParams{Op: op, MaxWR: 7, MaxSGE: 3, MaxWRBytes: 300, SignalEvery: 4}
	ch.Setup(&params)
	ch.SetSeq(0)
	imm := op == WRWrite
	ch.Start(Pos{}, Pos{}, imm, 77)
	var got []piece
	var seq uint32
	for guard := 0; ; guard++ {
		if guard > 1<<20 {
			t.Fatal("block planner does not terminate")
		}
		res, err := ch.PlanBlocks(tab, cur, ids.Src, ids.Dst)
		if err != nil {
			t.Fatal(err)
		}
		var bytes uint64
		for j := 0; j < res.WRs; j++ {
			w := ch.WR(j)
			seq++
			s, kind, g := SplitWRID(w.WRID)
			if s != seq || kind != DataKind(op) || int(g) >= p.NumGroups() {
				t.Fatalf("WR %d: wr_id seq %d kind %d group %d", j, s, kind, g)
			}
			x := p.GroupTemplate(int(g))
			lkey, rkey := 0x100+x.SrcRegion, 0x200+x.DstRegion
			if op == WRRead {
				lkey, rkey = 0x200+x.DstRegion, 0x100+x.SrcRegion
			}
			if w.RKey != rkey {
				t.Fatalf("WR %d of group %d: rkey %#x, want %#x", j, g, w.RKey, rkey)
			}
			last := res.Done && j == res.WRs-1
			wantOp := op
			if last && imm {
				wantOp = WRWriteWithImm
			}
			if w.Opcode != wantOp || (wantOp == WRWriteWithImm && w.Imm != 77) {
				t.Fatalf("WR %d: opcode %d imm %d, want %d", j, w.Opcode, w.Imm, wantOp)
			}
			if len(w.SGEs) > params.MaxSGE {
				t.Fatalf("WR %d: %d SGEs", j, len(w.SGEs))
			}
			var wb uint64
			for _, sg := range w.SGEs {
				if sg.LKey != lkey {
					t.Fatalf("WR %d: lkey %#x, want %#x", j, sg.LKey, lkey)
				}
				if op == WRRead {
					got = append(got, piece{w.RemoteAddr + wb, sg.Addr, uint64(sg.Len)})
				} else {
					got = append(got, piece{sg.Addr, w.RemoteAddr + wb, uint64(sg.Len)})
				}
				wb += uint64(sg.Len)
			}
			if wb > params.MaxWRBytes {
				t.Fatalf("WR %d carries %d bytes", j, wb)
			}
			bytes += wb
		}
		if bytes != res.Bytes || res.Seq != seq {
			t.Fatalf("chain reports %d bytes seq %d, WRs carry %d seq %d", res.Bytes, res.Seq, bytes, seq)
		}
		if res.Done {
			return got
		}
		if res.WRs == 0 {
			t.Fatal("a chain of 0 WRs, not done")
		}
	}
}

// TestPlanBlocksMapsEveryByte: the chains planned from the C expansion,
// over the whole request or cut into QP shares at (group, entry)
// positions, move exactly Pair.Expand's bytes, WRITE and READ.
func TestPlanBlocksMapsEveryByte(t *testing.T) {
	rng := rand.New(rand.NewPCG(24, 1))
	const blk, pool = 64, 96
	ch := mustChain(t, 16, 4)
	for _, g := range geoms() {
		for _, op := range []WROpcode{WRWrite, WRRead} {
			t.Run(fmt.Sprintf("%s/op%d", g.name, op), func(t *testing.T) {
				sl := blockGeom(t, "s", g.sreg, g.sper, blk, pool, g.sfused, g.spad)
				dl := blockGeom(t, "d", g.dreg, g.dper, blk, pool, g.dfused, g.dpad)
				p, err := layout.NewPair(sl, dl, layout.Limits{})
				if err != nil {
					t.Fatal(err)
				}
				tab := blockTable(t, p)
				for round := 0; round < 4; round++ {
					src, dst := blockIDs(rng, pool, 1+rng.IntN(pool), round%2 == 1)
					ids := validate(t, p, src, dst)
					want := coalescePieces(runPieces(p.Expand(nil, ids)))
					end := BlockPos{Group: uint32(p.NumGroups())}
					got := coalescePieces(planBlocks(t, ch, tab, p, ids, op, BlockPos{}, end, 1+rng.IntN(5)))
					if !slices.Equal(got, want) {
						t.Fatalf("round %d: whole range maps %v, want %v", round, got[:min(4, len(got))], want[:min(4, len(want))])
					}
					// Shares cut at random positions, in order.
					var cuts []BlockPos
					for k := 0; k < 3; k++ {
						cuts = append(cuts, BlockPos{Group: uint32(rng.IntN(p.NumGroups())), Entry: uint32(rng.IntN(ids.N()))})
					}
					slices.SortFunc(cuts, func(a, b BlockPos) int {
						if a.Group != b.Group {
							return int(a.Group) - int(b.Group)
						}
						return int(a.Entry) - int(b.Entry)
					})
					cuts = append(append([]BlockPos{{}}, cuts...), end)
					var all []piece
					for k := 0; k+1 < len(cuts); k++ {
						if cuts[k] == cuts[k+1] {
							continue
						}
						all = append(all, planBlocks(t, ch, tab, p, ids, op, cuts[k], cuts[k+1], 4)...)
					}
					if got := coalescePieces(all); !slices.Equal(got, want) {
						t.Fatalf("round %d: shares cut at %v map %v, want %v", round, cuts, got[:min(4, len(got))], want[:min(4, len(want))])
					}
				}
			})
		}
	}
}

// FuzzExpandBlocks: for arbitrary ids over arbitrary geometries, the C
// expansion equals Pair.Expand.
func FuzzExpandBlocks(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, uint8(0), uint8(3))
	f.Add([]byte{10, 11, 12, 13, 30, 31, 32, 33, 0, 0, 1, 5}, uint8(5), uint8(1))
	f.Add(make([]byte, 40), uint8(2), uint8(200))
	f.Fuzz(func(t *testing.T, data []byte, gsel, chunk uint8) {
		gs := geoms()
		g := gs[int(gsel)%len(gs)]
		const blk, pool = 16, 64
		sl := blockGeom(t, "s", g.sreg, g.sper, blk, pool, g.sfused, g.spad)
		dl := blockGeom(t, "d", g.dreg, g.dper, blk, pool, g.dfused, g.dpad)
		p, err := layout.NewPair(sl, dl, layout.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		// Pairs of bytes: a source id, a destination id (unique: the rest dropped).
		var src, dst []uint32
		var seen [pool]bool
		for k := 0; k+1 < len(data); k += 2 {
			s, d := uint32(data[k])%pool, uint32(data[k+1])%pool
			if seen[d] {
				continue
			}
			seen[d] = true
			src, dst = append(src, s), append(dst, d)
		}
		if len(src) == 0 {
			return
		}
		tab := blockTable(t, p)
		ids := validate(t, p, src, dst)
		want := p.Expand(nil, ids)
		if got := expandC(t, tab, p, ids, 1+int(chunk)); !slices.Equal(got, want) {
			t.Fatalf("C expansion %v, want %v", head(got), head(want))
		}
	})
}

// BenchmarkExpandBlocks: the request (160 segments × 512 random
// ids) planned into chains from the C expansion, no device: 0 allocs/op.
func BenchmarkExpandBlocks(b *testing.B) {
	for _, c := range []struct {
		name string
		seq  bool
	}{{"random", false}, {"sequential", true}} {
		b.Run(c.name, func(b *testing.B) {
			const nseg, pool, n = 160, 1024, 512
			sl := blockGeom(b, "s", nseg, 1, 8192, pool, false, 0)
			dl := blockGeom(b, "d", nseg, 1, 8192, pool, false, 0)
			p, err := layout.NewPair(sl, dl, layout.Limits{})
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			src, dst := make([]uint32, n), make([]uint32, n)
			sp, dp := rng.Perm(pool), rng.Perm(pool)
			for i := range src {
				src[i], dst[i] = uint32(sp[i]), uint32(dp[i])
				if c.seq {
					src[i], dst[i] = uint32(i), uint32(i+7)
				}
			}
			ids := validate(b, p, src, dst)
			tab := blockTable(b, p)
			ch := mustChain(b, 256, 16)
			cur, err := NewBlockCursor(256)
			if err != nil {
				b.Fatal(err)
			}
			defer cur.Close()
			params := ChainParams{Op: WRWrite, MaxWR: 256, MaxSGE: 16, MaxWRBytes: 1 << 20, SignalEvery: 32}
			ch.Setup(&params)
			end := BlockPos{Group: uint32(p.NumGroups())}
			b.ReportAllocs()
			b.ResetTimer()
			for it := 0; it < b.N; it++ {
				cur.Start(BlockPos{}, end)
				for {
					res, err := ch.PlanBlocks(tab, cur, ids.Src, ids.Dst)
					if err != nil {
						b.Fatal(err)
					}
					if res.Done {
						break
					}
				}
			}
		})
	}
}
