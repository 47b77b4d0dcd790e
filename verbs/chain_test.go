//go:build cgo && linux

package verbs

import (
	"errors"
	"fmt"
	"math/rand"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

// run is a piece of the byte mapping: len bytes from src go to dst.
type run struct{ dst, src, n uint64 }

// coalesce merges consecutive runs that continue on both sides, so two
// mappings compare equal however the planner cut them.
func coalesce(rs []run) []run {
	var out []run
	for _, r := range rs {
		if r.n == 0 {
			continue
		}
		if k := len(out) - 1; k >= 0 && out[k].dst+out[k].n == r.dst && out[k].src+out[k].n == r.src {
			out[k].n += r.n
			continue
		}
		out = append(out, r)
	}
	return out
}

// expected is the mapping of [from, to) of a batch, in batch order.
func expected(src, dst, lens []uint64, from, to Pos) []run {
	var rs []run
	for i := from.I; i <= to.I && int(i) < len(src); i++ {
		lo, hi := uint64(0), lens[i]
		if i == from.I {
			lo = from.Off
		}
		if i == to.I {
			hi = to.Off
		}
		if hi > lo {
			rs = append(rs, run{dst[i] + lo, src[i] + lo, hi - lo})
		}
	}
	return coalesce(rs)
}

type planCase struct {
	p        ChainParams
	from, to Pos
	immLast  bool
	imm      uint32
}

type planOut struct {
	chains []ChainResult
	wrs    [][]WRInfo
}

// planAll plans a range to its end, checking every structural invariant,
// and returns the chains and the mapping their WRs carry.
func planAll(t testing.TB, ch *Chain, c planCase, src, dst, lens []uint64) (planOut, []run, error) {
	t.Helper()
	ch.Setup(&c.p)
	ch.SetSeq(0)
	ch.Start(c.from, c.to, c.immLast, c.imm)
	var out planOut
	var got []run
	var seq uint32
	k := c.p.SignalEvery
	if k < 1 {
		k = 1
	}
	for guard := 0; ; guard++ {
		if guard > 1<<20 {
			t.Fatalf("planner does not terminate")
		}
		res, err := ch.Plan(src, dst, lens)
		if err != nil {
			return out, nil, err
		}
		if res.WRs > c.p.MaxWR {
			t.Fatalf("chain of %d WRs > max %d", res.WRs, c.p.MaxWR)
		}
		var wrs []WRInfo
		var chainBytes uint64
		for j := 0; j < res.WRs; j++ {
			w := ch.WR(j)
			seq++
			gs, kind, blk := SplitWRID(w.WRID)
			if gs != seq || kind != KindData {
				t.Fatalf("WR %d: wr_id seq %d kind %d, want seq %d data", j, gs, kind, seq)
			}
			if int(blk) >= len(src) {
				t.Fatalf("WR %d: wr_id names block %d of %d", j, blk, len(src))
			}
			if len(w.SGEs) == 0 || len(w.SGEs) > c.p.MaxSGE {
				t.Fatalf("WR %d has %d SGEs (max %d)", j, len(w.SGEs), c.p.MaxSGE)
			}
			if w.RKey != c.p.RKey {
				t.Fatalf("WR %d rkey %#x", j, w.RKey)
			}
			if w.RemoteAddr < c.p.DstBase {
				t.Fatalf("WR %d remote %#x below region", j, w.RemoteAddr)
			}
			r := w.RemoteAddr - c.p.DstBase
			var wb uint64
			for _, s := range w.SGEs {
				if s.LKey != c.p.LKey || s.Len == 0 {
					t.Fatalf("WR %d bad SGE %+v", j, s)
				}
				if s.Addr < c.p.SrcBase || s.Addr-c.p.SrcBase+uint64(s.Len) > c.p.SrcLimit {
					t.Fatalf("WR %d SGE %+v outside source region", j, s)
				}
				got = append(got, run{r + wb, s.Addr - c.p.SrcBase, uint64(s.Len)})
				wb += uint64(s.Len)
			}
			if r+wb > c.p.DstLimit {
				t.Fatalf("WR %d writes [%d,%d) outside destination of %d", j, r, r+wb, c.p.DstLimit)
			}
			if c.p.MaxWRBytes > 0 && wb > c.p.MaxWRBytes {
				t.Fatalf("WR %d carries %d > max %d", j, wb, c.p.MaxWRBytes)
			}
			if c.p.MaxChainBytes > 0 && j > 0 && chainBytes >= c.p.MaxChainBytes {
				t.Fatalf("chain continues past %d bytes", c.p.MaxChainBytes)
			}
			chainBytes += wb
			wantSig := (j+1)%k == 0 || j == res.WRs-1
			if w.Signaled != wantSig {
				t.Fatalf("WR %d/%d signaled=%v, want %v (K=%d)", j, res.WRs, w.Signaled, wantSig, k)
			}
			wantInline := c.p.InlineMax > 0 && wb <= uint64(c.p.InlineMax)
			if w.Inline != wantInline {
				t.Fatalf("WR %d inline=%v for %d bytes (max %d)", j, w.Inline, wb, c.p.InlineMax)
			}
			last := res.Done && j == res.WRs-1
			if last && c.immLast {
				if w.Opcode != WRWriteWithImm || w.Imm != c.imm {
					t.Fatalf("last WR opcode %d imm %#x, want WRITE_WITH_IMM %#x", w.Opcode, w.Imm, c.imm)
				}
			} else if w.Opcode != WRWrite {
				t.Fatalf("WR %d opcode %d, want RDMA_WRITE", j, w.Opcode)
			}
			wrs = append(wrs, w)
		}
		if chainBytes != res.Bytes {
			t.Fatalf("chain reports %d bytes, WRs carry %d", res.Bytes, chainBytes)
		}
		if res.Seq != seq {
			t.Fatalf("seq %d, want %d", res.Seq, seq)
		}
		out.chains = append(out.chains, res)
		out.wrs = append(out.wrs, wrs)
		if res.Done {
			if cur := ch.Cursor(); cur != c.to {
				t.Fatalf("done at cursor %+v, want end %+v", cur, c.to)
			}
			break
		}
		if res.WRs == 0 {
			t.Fatalf("chain of 0 WRs but not done")
		}
	}
	return out, coalesce(got), nil
}

func mustChain(t testing.TB, wr, sge int) *Chain {
	t.Helper()
	ch, err := NewChain(wr, sge)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.Close() })
	return ch
}

func baseParams() ChainParams {
	return ChainParams{SrcBase: 0x10000, DstBase: 0x900000, SrcLimit: 1 << 30, DstLimit: 1 << 30,
		LKey: 0x11, RKey: 0x22, MaxWR: 64, MaxSGE: 4, MaxWRBytes: 1 << 20, SignalEvery: 16}
}

func TestPlanTable(t *testing.T) {
	type batch struct{ src, dst, lens []uint64 }
	seqBlocks := func(n int, sz, srcStride, dstStride uint64) batch {
		var b batch
		for i := 0; i < n; i++ {
			b.src = append(b.src, uint64(i)*srcStride)
			b.dst = append(b.dst, uint64(i)*dstStride)
			b.lens = append(b.lens, sz)
		}
		return b
	}
	tests := []struct {
		name     string
		b        batch
		mod      func(*ChainParams)
		wantWRs  int
		wantSGEs int
		chains   int
	}{
		{"adjacent both sides merge into one WR", seqBlocks(10, 128, 128, 128), nil, 1, 1, 1},
		{"dst contiguous, src scattered: gather by max_sge", seqBlocks(10, 128, 4096, 128), nil, 3, 10, 1},
		{"scattered both: one WR per block", seqBlocks(10, 128, 4096, 4096), nil, 10, 10, 1},
		{"scattered, chain of 4", seqBlocks(10, 128, 4096, 4096), func(p *ChainParams) { p.MaxWR = 4 }, 10, 10, 3},
		{"big block cut by max_wr_bytes", seqBlocks(1, 5000, 0, 0), func(p *ChainParams) { p.MaxWRBytes = 2048 }, 3, 3, 1},
		{"merge stops at max_wr_bytes, never splits small blocks", seqBlocks(10, 1000, 1000, 1000), func(p *ChainParams) { p.MaxWRBytes = 4000 }, 3, 3, 1},
		{"size-aware chain: stop at chain bytes", seqBlocks(8, 1<<16, 1<<17, 1<<17), func(p *ChainParams) { p.MaxChainBytes = 1 << 17 }, 8, 8, 4},
		{"one SGE: gather disabled", seqBlocks(6, 64, 4096, 64), func(p *ChainParams) { p.MaxSGE = 1 }, 6, 6, 1},
		{"inline small WRs", seqBlocks(4, 64, 4096, 4096), func(p *ChainParams) { p.InlineMax = 64 }, 4, 4, 1},
		{"zero-length blocks skipped", batch{[]uint64{0, 100, 200}, []uint64{0, 5000, 128}, []uint64{128, 0, 64}}, nil, 1, 2, 1},
		{"empty batch", batch{}, nil, 0, 0, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := baseParams()
			if tc.mod != nil {
				tc.mod(&p)
			}
			ch := mustChain(t, 64, 8)
			n := uint32(len(tc.b.src))
			c := planCase{p: p, to: Pos{I: n}, immLast: true, imm: 0xABCD0001}
			out, got, err := planAll(t, ch, c, tc.b.src, tc.b.dst, tc.b.lens)
			if err != nil {
				t.Fatal(err)
			}
			var wrs, sges int
			for _, r := range out.chains {
				wrs += r.WRs
				sges += r.SGEs
			}
			if wrs != tc.wantWRs || sges != tc.wantSGEs || len(out.chains) != tc.chains {
				t.Fatalf("got %d WRs, %d SGEs, %d chains; want %d, %d, %d", wrs, sges, len(out.chains), tc.wantWRs, tc.wantSGEs, tc.chains)
			}
			if want := expected(tc.b.src, tc.b.dst, tc.b.lens, c.from, c.to); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("mapping\n got %v\nwant %v", got, want)
			}
		})
	}
}

func TestPlanSubrangeAndCursor(t *testing.T) {
	// Three QPs share one 10-block batch cut mid-block, as the transport does.
	src := []uint64{0, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000}
	dst := []uint64{0, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000}
	lens := []uint64{1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000}
	cuts := []Pos{{0, 0}, {3, 500}, {6, 0}, {10, 0}}
	var all []run
	for q := 0; q < 3; q++ {
		ch := mustChain(t, 8, 4)
		_, got, err := planAll(t, ch, planCase{p: baseParams(), from: cuts[q], to: cuts[q+1], immLast: true, imm: uint32(q)}, src, dst, lens)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, got...)
	}
	want := expected(src, dst, lens, Pos{}, Pos{I: 10})
	if fmt.Sprint(coalesce(all)) != fmt.Sprint(want) {
		t.Fatalf("union of ranges\n got %v\nwant %v", coalesce(all), want)
	}
}

func TestPlanBounds(t *testing.T) {
	tests := []struct {
		name string
		src  uint64
		dst  uint64
		n    uint64
	}{
		{"src past end", 1<<20 - 10, 0, 64},
		{"dst past end", 0, 1<<20 - 10, 64},
		{"offset overflow", ^uint64(0) - 10, 0, 64},
		{"length overflow", 0, 0, ^uint64(0)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := baseParams()
			p.SrcLimit, p.DstLimit = 1<<20, 1<<20
			ch := mustChain(t, 8, 4)
			src := []uint64{0, tc.src}
			dst := []uint64{4096, tc.dst}
			lens := []uint64{64, tc.n}
			ch.Setup(&p)
			ch.Start(Pos{}, Pos{I: 2}, false, 0)
			_, err := ch.Plan(src, dst, lens)
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("got %v, want ErrInvalidArgument", err)
			}
			if cur := ch.Cursor(); cur != (Pos{}) {
				t.Fatalf("cursor moved to %+v on error", cur)
			}
		})
	}
	t.Run("bad range", func(t *testing.T) {
		ch := mustChain(t, 8, 4)
		p := baseParams()
		ch.Setup(&p)
		ch.Start(Pos{}, Pos{I: 5}, false, 0)
		if _, err := ch.Plan([]uint64{0}, []uint64{0}, []uint64{8}); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Fatalf("got %v", err)
		}
		if _, err := ch.Plan([]uint64{0}, []uint64{0, 1}, []uint64{8}); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Fatalf("got %v", err)
		}
	})
}

// FuzzPlan: for arbitrary block lists and planner limits, the planner never
// leaves either region, never exceeds max_sge/max_wr/max_wr_bytes, and maps
// exactly the bytes of the range, in order, once.
func FuzzPlan(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, uint8(4), uint8(8), uint16(0), uint8(3), uint16(0), uint8(0))
	f.Add([]byte{0, 0, 0, 0, 255, 255, 0, 1}, uint8(1), uint8(1), uint16(7), uint8(1), uint16(100), uint8(3))
	f.Add(make([]byte, 64), uint8(30), uint8(64), uint16(300), uint8(16), uint16(1), uint8(9))
	f.Fuzz(func(t *testing.T, data []byte, maxSGE, maxWR uint8, maxWRBytes uint16, sig uint8, chainBytes uint16, cut uint8) {
		// Each 3 bytes make a block: length, a src step, a dst step. Steps
		// of 0 make blocks adjacent, so merging and gathering both happen.
		const limit = 1 << 16
		var src, dst, lens []uint64
		var s, d uint64
		for k := 0; k+2 < len(data) && len(src) < 400; k += 3 {
			n := uint64(data[k] % 97)
			ss := uint64(data[k+1]&0x7) * uint64(data[k+1]>>3)
			ds := uint64(data[k+2]&0x7) * uint64(data[k+2]>>3)
			if data[k+1]&0x80 != 0 && s >= 200 {
				s -= 200 // backwards: sources out of order
			}
			s += ss
			d += ds
			src, dst, lens = append(src, s), append(dst, d), append(lens, n)
			s += n
			d += n
		}
		p := baseParams()
		p.SrcBase, p.DstBase = 0x1000, 0x2000
		p.SrcLimit, p.DstLimit = limit, limit
		p.MaxSGE = int(maxSGE%8) + 1
		p.MaxWR = int(maxWR%32) + 1
		p.MaxWRBytes = uint64(maxWRBytes % 512)
		p.SignalEvery = int(sig%8) + 1
		p.MaxChainBytes = uint64(chainBytes % 1024)
		p.InlineMax = int(cut % 4 * 16)
		ch := mustChain(t, 32, 8)
		n := uint32(len(src))
		to := Pos{I: n}
		// Optionally end mid-block, as a QP's share may.
		if n > 0 && cut&0x80 != 0 {
			i := uint32(cut) % n
			to = Pos{I: i, Off: lens[i] / 2}
		}
		_, got, err := planAll(t, ch, planCase{p: p, to: to, immLast: cut&1 == 1, imm: 77}, src, dst, lens)
		outOfRange := false
		for i := range src {
			if src[i]+lens[i] > limit || dst[i]+lens[i] > limit {
				outOfRange = true
			}
		}
		if err != nil {
			if !outOfRange || !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		want := expected(src, dst, lens, Pos{}, to)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("mapping\n got %v\nwant %v", got, want)
		}
	})
}

// randomBatch places n blocks of sz bytes at random distinct slots of a
// region, the worst case for merging (every block its own WR).
func randomBatch(n int, sz uint64, seed int64) (src, dst, lens []uint64, size uint64) {
	r := rand.New(rand.NewSource(seed))
	size = uint64(n) * sz * 2
	ps, pd := r.Perm(2*n), r.Perm(2*n)
	for i := 0; i < n; i++ {
		src = append(src, uint64(ps[i])*sz)
		dst = append(dst, uint64(pd[i])*sz)
		lens = append(lens, sz)
	}
	return
}

// BenchmarkPlanChain measures the pure C planner (what PostChain runs
// before ibv_post_send) on 10,000 random 128 B blocks; ns/WR is reported.
func BenchmarkPlanChain(b *testing.B) {
	for _, chainLen := range []int{16, 64, 256} {
		b.Run(fmt.Sprintf("chain=%d", chainLen), func(b *testing.B) {
			src, dst, lens, size := randomBatch(10000, 128, 1)
			ch := mustChain(b, chainLen, 8)
			p := baseParams()
			p.SrcLimit, p.DstLimit = size, size
			p.MaxWR = chainLen
			ch.Setup(&p)
			end := Pos{I: uint32(len(src))}
			ch.Start(Pos{}, end, true, 1)
			b.ReportAllocs()
			b.ResetTimer()
			wrs := 0
			for k := 0; k < b.N; k++ {
				res, err := ch.Plan(src, dst, lens)
				if err != nil {
					b.Fatal(err)
				}
				wrs += res.WRs
				if res.Done {
					ch.Start(Pos{}, end, true, 1)
				}
			}
			b.StopTimer()
			if wrs > 0 {
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(wrs), "ns/WR")
			}
		})
	}
}

// TestPlanAllocs pins "zero allocations per chain" in the regular test run.
func TestPlanAllocs(t *testing.T) {
	src, dst, lens, size := randomBatch(1000, 128, 2)
	ch := mustChain(t, 64, 8)
	p := baseParams()
	p.SrcLimit, p.DstLimit = size, size
	ch.Setup(&p)
	end := Pos{I: uint32(len(src))}
	ch.Start(Pos{}, end, true, 1)
	allocs := testing.AllocsPerRun(200, func() {
		res, _ := ch.Plan(src, dst, lens)
		if res.Done {
			ch.Start(Pos{}, end, true, 1)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per chain", allocs)
	}
}

func TestWRID(t *testing.T) {
	for _, c := range []struct {
		seq  uint32
		kind int
		blk  uint32
	}{{0, KindData, 0}, {^uint32(0), KindPing, 0x0FFFFFFF}, {12345, KindMeta, 99}} {
		s, k, b := SplitWRID(WRID(c.seq, c.kind, c.blk))
		if s != c.seq || k != c.kind || b != c.blk {
			t.Fatalf("%+v round-trips to %d %d %d", c, s, k, b)
		}
	}
}
