//go:build cgo && linux

package verbs

import (
	"errors"
	"fmt"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

func mustPlan(t testing.TB, p ChainParams, src, dst, lens []uint64, cuts []Pos) *Plan {
	t.Helper()
	pl, err := NewPlan(&p, src, dst, lens, cuts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pl.Close() })
	return pl
}

// checkPlan compares every share of pl with what the ad hoc chain planner
// builds for the same range in one unbounded chain (same WRs, SGEs,
// addresses, lengths, keys, inline flags), checks the static signaled
// pattern, the list links, and that the share maps exactly its bytes.
func checkPlan(t testing.TB, pl *Plan, p ChainParams, src, dst, lens []uint64, cuts []Pos) {
	t.Helper()
	if pl.Shares() != len(cuts)-1 {
		t.Fatalf("%d shares, want %d", pl.Shares(), len(cuts)-1)
	}
	k := max(p.SignalEvery, 1)
	var totWR, totSGE int
	var totBytes uint64
	for q := 0; q < pl.Shares(); q++ {
		wrs, sges, bytes := pl.ShareSize(q)
		totWR, totSGE, totBytes = totWR+wrs, totSGE+sges, totBytes+bytes
		ref := p
		// Room for exactly the plan's WRs: a reference that needs more does
		// not finish.
		ref.MaxWR, ref.MaxChainBytes = max(wrs, 1), 0
		ch := mustChain(t, max(wrs, 1), max(p.MaxSGE, 1))
		ch.Setup(&ref)
		ch.Start(cuts[q], cuts[q+1], false, 0)
		res, err := ch.Plan(src, dst, lens)
		if err != nil {
			t.Fatal(err)
		}
		if !res.Done {
			t.Fatalf("reference planner did not finish share %d", q)
		}
		if res.WRs != wrs || res.SGEs != sges || res.Bytes != bytes {
			t.Fatalf("share %d: %d WRs %d SGEs %d bytes, reference %d %d %d", q, wrs, sges, bytes, res.WRs, res.SGEs, res.Bytes)
		}
		var got []run
		for j := 0; j < wrs; j++ {
			w, r := pl.WR(q, j), ch.WR(j)
			_, kind, blk := SplitWRID(w.WRID)
			_, _, rblk := SplitWRID(r.WRID)
			if kind != KindData || blk != rblk {
				t.Fatalf("share %d WR %d: kind %d block %d, want data block %d", q, j, kind, blk, rblk)
			}
			if w.RemoteAddr != r.RemoteAddr || w.RKey != p.RKey || w.Inline != r.Inline || fmt.Sprint(w.SGEs) != fmt.Sprint(r.SGEs) {
				t.Fatalf("share %d WR %d:\n got %+v\nwant %+v", q, j, w, r)
			}
			wantSig := (j+1)%k == 0 || j == wrs-1
			if w.Signaled != wantSig {
				t.Fatalf("share %d WR %d/%d signaled=%v, want %v (K=%d)", q, j, wrs, w.Signaled, wantSig, k)
			}
			wantOp := WRWrite
			if j == wrs-1 {
				wantOp = WRWriteWithImm
			}
			if w.Opcode != wantOp {
				t.Fatalf("share %d WR %d opcode %d, want %d", q, j, w.Opcode, wantOp)
			}
			if (j < wrs-1) != pl.WRNext(q, j) {
				t.Fatalf("share %d WR %d: list link broken (last=%v)", q, j, j == wrs-1)
			}
			off := w.RemoteAddr - p.DstBase
			for _, s := range w.SGEs {
				if s.LKey != p.LKey {
					t.Fatalf("share %d WR %d SGE lkey %#x", q, j, s.LKey)
				}
				got = append(got, run{off, s.Addr - p.SrcBase, uint64(s.Len)})
				off += uint64(s.Len)
			}
		}
		if want := expected(src, dst, lens, cuts[q], cuts[q+1]); fmt.Sprint(coalesce(got)) != fmt.Sprint(want) {
			t.Fatalf("share %d maps\n got %v\nwant %v", q, coalesce(got), want)
		}
	}
	if w, s, b := pl.Totals(); w != totWR || s != totSGE || b != totBytes {
		t.Fatalf("totals %d %d %d, shares sum to %d %d %d", w, s, b, totWR, totSGE, totBytes)
	}
}

// cutsEven cuts n blocks into nq ranges at block boundaries (some empty).
func cutsEven(n, nq int) []Pos {
	c := make([]Pos, nq+1)
	for q := 0; q <= nq; q++ {
		c[q] = Pos{I: uint32(n * q / nq)}
	}
	return c
}

func TestPlanBuildTable(t *testing.T) {
	rs, rd, rl, rsize := randomBatch(500, 128, 7)
	adj := func(n int, sz uint64) (s, d, l []uint64) {
		for i := 0; i < n; i++ {
			s, d, l = append(s, uint64(i)*sz), append(d, uint64(i)*sz), append(l, sz)
		}
		return
	}
	as, ad, al := adj(100, 4096)
	// gather: contiguous destinations, sources every other slot.
	var gs, gd, gl []uint64
	for i := 0; i < 50; i++ {
		gs, gd, gl = append(gs, uint64(i)*1024), append(gd, uint64(i)*512), append(gl, 512)
	}
	big := []uint64{0, 3 << 20}
	bigL := []uint64{3 << 20, 1 << 20}
	cases := []struct {
		name           string
		src, dst, lens []uint64
		cuts           []Pos
		edit           func(*ChainParams)
		wantWR         int
	}{
		{"random 128 B, 4 shares", rs, rd, rl, cutsEven(500, 4), nil, 500},
		{"random, signal every 1", rs, rd, rl, cutsEven(500, 3), func(p *ChainParams) { p.SignalEvery = 1 }, 500},
		{"random, inline", rs, rd, rl, cutsEven(500, 2), func(p *ChainParams) { p.InlineMax = 256 }, 500},
		{"adjacent merge", as, ad, al, cutsEven(100, 1), nil, 1},
		{"adjacent, wr cap 64 KiB", as, ad, al, cutsEven(100, 2), func(p *ChainParams) { p.MaxWRBytes = 64 << 10 }, 8},
		{"gather 4 SGEs", gs, gd, gl, cutsEven(50, 1), nil, 13},
		{"big blocks cut mid-block", big, []uint64{0, 3 << 20}, bigL, []Pos{{}, {I: 0, Off: 2 << 20}, {I: 1, Off: 4096}, {I: 2}}, nil, 5},
		{"no shares", nil, nil, nil, []Pos{{}}, nil, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := baseParams()
			p.SrcLimit, p.DstLimit = max(rsize, 8<<20), max(rsize, 8<<20)
			if tc.edit != nil {
				tc.edit(&p)
			}
			pl := mustPlan(t, p, tc.src, tc.dst, tc.lens, tc.cuts)
			checkPlan(t, pl, p, tc.src, tc.dst, tc.lens, tc.cuts)
			if w, _, _ := pl.Totals(); w != tc.wantWR {
				t.Fatalf("%d WRs, want %d", w, tc.wantWR)
			}
		})
	}
}

// TestPlanPatch posts shares in sub-ranges without a QP: wr_ids carry the
// running sequence numbers, each sub-range's last WR is signaled only while
// posted (the static pattern is restored), the immediate is the tag, and a
// second submit re-patches them all.
func TestPlanPatch(t *testing.T) {
	src, dst, lens, size := randomBatch(1000, 128, 3)
	p := baseParams()
	p.SrcLimit, p.DstLimit = size, size
	cuts := cutsEven(1000, 3)
	pl := mustPlan(t, p, src, dst, lens, cuts)
	for submit, tag := range []uint32{0x1234, 0xfffffffe} {
		for q := 0; q < pl.Shares(); q++ {
			seq0 := uint32(1000*q) + uint32(submit)*7 + 0xfffffff0 // wraps
			pl.Start(q, seq0)
			n, _, _ := pl.ShareSize(q)
			posted := 0
			for step := 1; pl.Left(q) > 0; step = step%37 + 5 {
				got, _, err := pl.Patch(q, step, 0, tag)
				if err != nil {
					t.Fatal(err)
				}
				if got != min(step, n-posted) {
					t.Fatalf("patched %d, want %d", got, min(step, n-posted))
				}
				posted += got
				if pl.Seq(q) != seq0+uint32(posted) {
					t.Fatalf("seq %d, want %d", pl.Seq(q), seq0+uint32(posted))
				}
			}
			for j := 0; j < n; j++ {
				w := pl.WR(q, j)
				seq, kind, _ := SplitWRID(w.WRID)
				if seq != seq0+uint32(j)+1 || kind != KindData {
					t.Fatalf("submit %d share %d WR %d: seq %d kind %d, want %d", submit, q, j, seq, kind, seq0+uint32(j)+1)
				}
				if w.Signaled != ((j+1)%p.SignalEvery == 0 || j == n-1) {
					t.Fatalf("WR %d signaled=%v after the post (not restored)", j, w.Signaled)
				}
				if (j < n-1) != pl.WRNext(q, j) {
					t.Fatalf("WR %d link not restored", j)
				}
			}
			if last := pl.WR(q, n-1); last.Opcode != WRWriteWithImm || last.Imm != tag {
				t.Fatalf("share %d last WR opcode %d imm %#x, want imm %#x", q, last.Opcode, last.Imm, tag)
			}
		}
	}
	// A byte cap ends a sub-range once reached (128 B WRs: 3 per 300 B).
	pl.Start(0, 0)
	if got, b, _ := pl.Patch(0, 100, 300, 1); got != 3 || b != 384 {
		t.Fatalf("byte-capped post took %d WRs / %d bytes, want 3 / 384", got, b)
	}
	if _, _, err := pl.Patch(7, 1, 0, 1); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("share out of range: %v", err)
	}
}

func TestPlanRestamp(t *testing.T) {
	src, dst, lens, size := randomBatch(300, 256, 4)
	p := baseParams()
	p.SrcLimit, p.DstLimit = size, size
	cuts := cutsEven(300, 2)
	pl := mustPlan(t, p, src, dst, lens, cuts)
	p2 := p
	p2.LKey, p2.SrcBase = 0xabcdef, p.SrcBase+0x7000
	pl.Restamp(p2.LKey, p2.SrcBase)
	if pl.LKey() != p2.LKey {
		t.Fatalf("lkey %#x", pl.LKey())
	}
	checkPlan(t, pl, p2, src, dst, lens, cuts)
}

func TestPlanBuildErrors(t *testing.T) {
	p := baseParams()
	p.SrcLimit, p.DstLimit = 4096, 4096
	s, d, l := []uint64{0, 100}, []uint64{0, 4000}, []uint64{10, 200}
	tests := []struct {
		name string
		cuts []Pos
		want string
	}{
		{"block outside", []Pos{{}, {I: 2}}, "block 1"},
		{"cuts not at the end", []Pos{{}, {I: 1}}, "cuts"},
		{"cuts backwards", []Pos{{}, {I: 1}, {I: 0, Off: 5}, {I: 2}}, "cuts"},
		{"cut past a block", []Pos{{}, {I: 0, Off: 11}, {I: 2}}, "cuts"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dd := d
			if tc.want != "block 1" {
				dd = []uint64{0, 100}
			}
			_, err := NewPlan(&p, s, dd, l, tc.cuts)
			if !errors.Is(err, errs.ErrInvalidArgument) || !contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrInvalidArgument naming %q", err, tc.want)
			}
		})
	}
	if _, err := NewPlan(&p, s, d, l[:1], []Pos{{}, {I: 2}}); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("ragged arrays: %v", err)
	}
	var pl *Plan
	if err := pl.Close(); err != nil {
		t.Fatal(err)
	}
	pl2 := mustPlan(t, p, []uint64{0}, []uint64{0}, []uint64{8}, []Pos{{}, {I: 1}})
	pl2.Close()
	pl2.Close()
	if _, _, err := pl2.Patch(0, 1, 0, 1); !errors.Is(err, ErrClosed) {
		t.Fatalf("patch after close: %v", err)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// FuzzPlanBuild: for arbitrary block lists, cuts and limits, the prepared
// plan builder matches the chain planner share by share (see checkPlan),
// or refuses out-of-range blocks and bad cuts with ErrInvalidArgument.
func FuzzPlanBuild(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, uint8(4), uint16(0), uint8(3), uint8(2), uint8(0))
	f.Add([]byte{0, 0, 0, 0, 255, 255, 0, 1}, uint8(1), uint16(7), uint8(1), uint8(1), uint8(3))
	f.Add(make([]byte, 64), uint8(30), uint16(300), uint8(16), uint8(5), uint8(0x85))
	f.Fuzz(func(t *testing.T, data []byte, maxSGE uint8, maxWRBytes uint16, sig uint8, nq uint8, cut uint8) {
		const limit = 1 << 16
		var src, dst, lens []uint64
		var s, d uint64
		for k := 0; k+2 < len(data) && len(src) < 300; k += 3 {
			n := uint64(data[k] % 97)
			ss := uint64(data[k+1]&0x7) * uint64(data[k+1]>>3)
			ds := uint64(data[k+2]&0x7) * uint64(data[k+2]>>3)
			if data[k+1]&0x80 != 0 && s >= 200 {
				s -= 200
			}
			s, d = s+ss, d+ds
			src, dst, lens = append(src, s), append(dst, d), append(lens, n)
			s, d = s+n, d+n
		}
		p := baseParams()
		p.SrcBase, p.DstBase = 0x1000, 0x2000
		p.SrcLimit, p.DstLimit = limit, limit
		p.MaxSGE = int(maxSGE%8) + 1
		p.MaxWRBytes = uint64(maxWRBytes % 512)
		p.SignalEvery = int(sig%8) + 1
		p.InlineMax = int(cut % 4 * 16)
		n := uint32(len(src))
		shares := int(nq%6) + 1
		cuts := []Pos{{}}
		for q := 1; q < shares && n > 0; q++ {
			i := uint32(int(n) * q / shares)
			c := Pos{I: i}
			if cut&0x80 != 0 && i < n {
				c.Off = lens[i] * uint64(cut&0x7) / 8
			}
			if cut&0x40 != 0 && q == 1 && n > 1 { // deliberately bad: backwards
				c = Pos{I: n - 1, Off: lens[n-1]}
			}
			cuts = append(cuts, c)
		}
		cuts = append(cuts, Pos{I: n})
		pl, err := NewPlan(&p, src, dst, lens, cuts)
		outOfRange := false
		for i := range src {
			if src[i]+lens[i] > limit || dst[i]+lens[i] > limit {
				outOfRange = true
			}
		}
		ordered := true
		for q := 1; q < len(cuts); q++ {
			a, b := cuts[q-1], cuts[q]
			if b.I < a.I || (b.I == a.I && b.Off < a.Off) {
				ordered = false
			}
		}
		if err != nil {
			if (!outOfRange && ordered) || !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("unexpected error %v (out of range %v, ordered %v, cuts %v)", err, outOfRange, ordered, cuts)
			}
			return
		}
		defer pl.Close()
		if outOfRange || !ordered {
			t.Fatalf("accepted out of range %v / unordered cuts %v", outOfRange, cuts)
		}
		checkPlan(t, pl, p, src, dst, lens, cuts)
	})
}

func BenchmarkPlanBuild(b *testing.B) {
	src, dst, lens, size := randomBatch(10000, 128, 1)
	p := baseParams()
	p.SrcLimit, p.DstLimit = size, size
	cuts := cutsEven(10000, 4)
	b.ReportAllocs()
	for b.Loop() {
		pl, err := NewPlan(&p, src, dst, lens, cuts)
		if err != nil {
			b.Fatal(err)
		}
		pl.Close()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/10000, "ns/WR")
}
