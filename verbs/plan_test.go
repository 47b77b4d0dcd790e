//go:build cgo && linux

package verbs

import (
	"errors"
	"fmt"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

// The planner's tests: one table run through both of its entry points (ad
// hoc chains, Plan; prepared plans, NewPlan) for both opcodes, and the
// helpers that check every structural invariant of what they build. The
// planner is pure C over arrays: these need cgo, not a device.

// run is a piece of the byte mapping: n bytes from src go to dst (batch
// offsets, whichever side is local).
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

// side is one region as a WR sees it.
type side struct{ base, limit uint64 }

// sidesOf is the local (SGE) and remote (remote_addr) side of p: the source
// is local for a WRITE, remote for a READ.
func sidesOf(p ChainParams) (local, remote side) {
	if p.Op == WRRead {
		return side{p.DstBase, p.DstLimit}, side{p.SrcBase, p.SrcLimit}
	}
	return side{p.SrcBase, p.SrcLimit}, side{p.DstBase, p.DstLimit}
}

// checkWR checks what every planned WR must be and appends the bytes it
// moves to got: its SGEs inside the local region with the lkey, its remote
// range inside the remote region with the rkey, no more than MaxSGE SGEs or
// MaxWRBytes bytes, inline only for a small WRITE. It returns the WR's
// payload bytes.
func checkWR(t testing.TB, what string, w WRInfo, p ChainParams, got *[]run) uint64 {
	t.Helper()
	local, remote := sidesOf(p)
	if len(w.SGEs) == 0 || len(w.SGEs) > p.MaxSGE {
		t.Fatalf("%s has %d SGEs (max %d)", what, len(w.SGEs), p.MaxSGE)
	}
	if w.RKey != p.RKey {
		t.Fatalf("%s rkey %#x", what, w.RKey)
	}
	if w.RemoteAddr < remote.base {
		t.Fatalf("%s remote %#x below region", what, w.RemoteAddr)
	}
	r := w.RemoteAddr - remote.base
	var wb uint64
	for _, s := range w.SGEs {
		if s.LKey != p.LKey || s.Len == 0 {
			t.Fatalf("%s bad SGE %+v", what, s)
		}
		if s.Addr < local.base || s.Addr-local.base+uint64(s.Len) > local.limit {
			t.Fatalf("%s SGE %+v outside local region", what, s)
		}
		l := s.Addr - local.base
		if p.Op == WRRead {
			*got = append(*got, run{dst: l, src: r + wb, n: uint64(s.Len)})
		} else {
			*got = append(*got, run{dst: r + wb, src: l, n: uint64(s.Len)})
		}
		wb += uint64(s.Len)
	}
	if r+wb > remote.limit {
		t.Fatalf("%s covers remote [%d,%d) outside a region of %d", what, r, r+wb, remote.limit)
	}
	if p.MaxWRBytes > 0 && wb > p.MaxWRBytes {
		t.Fatalf("%s carries %d > max %d", what, wb, p.MaxWRBytes)
	}
	wantInline := p.Op == WRWrite && p.InlineMax > 0 && wb <= uint64(p.InlineMax)
	if w.Inline != wantInline {
		t.Fatalf("%s inline=%v for a %d-byte op %d (max %d)", what, w.Inline, wb, p.Op, p.InlineMax)
	}
	return wb
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

// planAll plans a range to its end in chains, checking every structural
// invariant, and returns the chains and the mapping their WRs carry.
func planAll(t testing.TB, ch *Chain, c planCase, src, dst, lens []uint64) (planOut, []run, error) {
	t.Helper()
	ch.Setup(&c.p)
	ch.SetSeq(0)
	ch.Start(c.from, c.to, c.immLast, c.imm)
	var out planOut
	var got []run
	var seq uint32
	k := max(c.p.SignalEvery, 1)
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
			if gs != seq || kind != DataKind(c.p.Op) {
				t.Fatalf("WR %d: wr_id seq %d kind %d, want seq %d data", j, gs, kind, seq)
			}
			if int(blk) >= len(src) {
				t.Fatalf("WR %d: wr_id names block %d of %d", j, blk, len(src))
			}
			if c.p.MaxChainBytes > 0 && j > 0 && chainBytes >= c.p.MaxChainBytes {
				t.Fatalf("chain continues past %d bytes", c.p.MaxChainBytes)
			}
			chainBytes += checkWR(t, fmt.Sprintf("WR %d", j), w, c.p, &got)
			wantSig := (j+1)%k == 0 || j == res.WRs-1
			if w.Signaled != wantSig {
				t.Fatalf("WR %d/%d signaled=%v, want %v (K=%d)", j, res.WRs, w.Signaled, wantSig, k)
			}
			wantOp, wantImm := c.p.Op, uint32(0)
			if res.Done && j == res.WRs-1 && c.immLast {
				wantOp, wantImm = WRWriteWithImm, c.imm
			}
			if w.Opcode != wantOp || w.Imm != wantImm {
				t.Fatalf("WR %d opcode %d imm %#x, want %d %#x", j, w.Opcode, w.Imm, wantOp, wantImm)
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

func mustPlan(t testing.TB, p ChainParams, src, dst, lens []uint64, cuts []Pos) *Plan {
	t.Helper()
	pl, err := NewPlan(&p, src, dst, lens, cuts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pl.Close() })
	return pl
}

func baseParams() ChainParams {
	return ChainParams{SrcBase: 0x10000, DstBase: 0x900000, SrcLimit: 1 << 30, DstLimit: 1 << 30,
		LKey: 0x11, RKey: 0x22, MaxWR: 64, MaxSGE: 4, MaxWRBytes: 1 << 20, SignalEvery: 16}
}

// checkPlan checks every share of pl: the same WRs (SGEs, addresses,
// lengths, keys, inline flags, first blocks) as one unbounded ad hoc chain
// over the share's range, the static signaled pattern, the opcodes (a
// WRITE share's last WR WRITE_WITH_IMM), the list links, and that the share
// maps exactly its bytes.
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
			what := fmt.Sprintf("share %d WR %d", q, j)
			_, kind, blk := SplitWRID(w.WRID)
			_, _, rblk := SplitWRID(r.WRID)
			if kind != DataKind(p.Op) || blk != rblk {
				t.Fatalf("%s: kind %d block %d, want data block %d", what, kind, blk, rblk)
			}
			if w.RemoteAddr != r.RemoteAddr || w.Inline != r.Inline || fmt.Sprint(w.SGEs) != fmt.Sprint(r.SGEs) {
				t.Fatalf("%s:\n got %+v\nwant %+v", what, w, r)
			}
			checkWR(t, what, w, p, &got)
			wantSig := (j+1)%k == 0 || j == wrs-1
			if w.Signaled != wantSig {
				t.Fatalf("%s/%d signaled=%v, want %v (K=%d)", what, wrs, w.Signaled, wantSig, k)
			}
			wantOp := p.Op
			if j == wrs-1 && p.Op == WRWrite {
				wantOp = WRWriteWithImm
			}
			if w.Opcode != wantOp {
				t.Fatalf("%s opcode %d, want %d", what, w.Opcode, wantOp)
			}
			if (j < wrs-1) != pl.WRNext(q, j) {
				t.Fatalf("%s: list link broken (last=%v)", what, j == wrs-1)
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

var ops = []struct {
	name string
	op   WROpcode
}{{"write", WRWrite}, {"read", WRRead}}

// TestPlannerTable runs each batch through both entry points of the one
// planner, for WRITE and for READ. A case's ranges (cuts, or the whole
// batch) are planned as ad hoc chains, range by range as the transport's
// QPs do, and as one prepared plan of one share per range; both must carry
// the counts wanted for that op, map exactly the batch's bytes, and agree
// WR for WR (checkPlan). READ mirrors WRITE: a remote-contiguous run
// scatters into local SGEs as a WRITE's gathers from them, so swapping a
// batch's sides swaps the two ops' counts.
func TestPlannerTable(t *testing.T) {
	type batch struct{ src, dst, lens []uint64 }
	type want struct{ wrs, sges, chains int }
	seqBlocks := func(n int, sz, srcStride, dstStride uint64) batch {
		var b batch
		for i := 0; i < n; i++ {
			b.src = append(b.src, uint64(i)*srcStride)
			b.dst = append(b.dst, uint64(i)*dstStride)
			b.lens = append(b.lens, sz)
		}
		return b
	}
	random := func(n int, sz uint64, seed int64) batch {
		s, d, l, _ := randomBatch(n, sz, seed)
		return batch{s, d, l}
	}
	tenK := []Pos{{0, 0}, {3, 500}, {6, 0}, {10, 0}}
	tests := []struct {
		name        string
		b           batch
		cuts        []Pos // nil: the whole batch, one range
		mod         func(*ChainParams)
		write, read want
	}{
		{"adjacent both sides merge into one WR", seqBlocks(10, 128, 128, 128), nil, nil, want{1, 1, 1}, want{1, 1, 1}},
		{"dst contiguous, src scattered: WRITE gathers by max_sge", seqBlocks(10, 128, 4096, 128), nil, nil, want{3, 10, 1}, want{10, 10, 1}},
		{"src contiguous, dst scattered: READ scatters by max_sge", seqBlocks(10, 128, 128, 4096), nil, nil, want{10, 10, 1}, want{3, 10, 1}},
		{"scattered both: one WR per block", seqBlocks(10, 128, 4096, 4096), nil, nil, want{10, 10, 1}, want{10, 10, 1}},
		{"scattered, chain of 4", seqBlocks(10, 128, 4096, 4096), nil, func(p *ChainParams) { p.MaxWR = 4 }, want{10, 10, 3}, want{10, 10, 3}},
		{"big block cut by max_wr_bytes", seqBlocks(1, 5000, 0, 0), nil, func(p *ChainParams) { p.MaxWRBytes = 2048 }, want{3, 3, 1}, want{3, 3, 1}},
		{"merge stops at max_wr_bytes, never splits small blocks", seqBlocks(10, 1000, 1000, 1000), nil, func(p *ChainParams) { p.MaxWRBytes = 4000 }, want{3, 3, 1}, want{3, 3, 1}},
		{"size-aware chain: stop at chain bytes", seqBlocks(8, 1<<16, 1<<17, 1<<17), nil, func(p *ChainParams) { p.MaxChainBytes = 1 << 17 }, want{8, 8, 4}, want{8, 8, 4}},
		{"one SGE: gather and scatter disabled", seqBlocks(6, 64, 4096, 64), nil, func(p *ChainParams) { p.MaxSGE = 1 }, want{6, 6, 1}, want{6, 6, 1}},
		{"inline small WRITEs, never READs", seqBlocks(4, 64, 4096, 4096), nil, func(p *ChainParams) { p.InlineMax = 64 }, want{4, 4, 1}, want{4, 4, 1}},
		{"zero-length blocks skipped", batch{[]uint64{0, 100, 200}, []uint64{0, 5000, 128}, []uint64{128, 0, 64}}, nil, nil, want{1, 2, 1}, want{2, 2, 1}},
		{"empty batch", batch{}, nil, nil, want{0, 0, 1}, want{0, 0, 1}},
		{"three ranges cut mid-block", seqBlocks(10, 1000, 1000, 1000), tenK, nil, want{3, 3, 3}, want{3, 3, 3}},
		{"random 128 B, 4 ranges", random(500, 128, 7), cutsEven(500, 4), nil, want{500, 500, 4 * 2}, want{500, 500, 4 * 2}},
		{"random, signal every 1, inline", random(500, 128, 7), cutsEven(500, 3), func(p *ChainParams) { p.SignalEvery, p.InlineMax = 1, 256 }, want{500, 500, 3 * 3}, want{500, 500, 3 * 3}},
		{"adjacent 4 KiB, wr cap 64 KiB, 2 ranges", seqBlocks(100, 4096, 4096, 4096), cutsEven(100, 2), func(p *ChainParams) { p.MaxWRBytes = 64 << 10 }, want{8, 8, 2}, want{8, 8, 2}},
		{"big blocks cut mid-block", batch{[]uint64{0, 3 << 20}, []uint64{0, 3 << 20}, []uint64{3 << 20, 1 << 20}},
			[]Pos{{}, {I: 0, Off: 2 << 20}, {I: 1, Off: 4096}, {I: 2}}, nil, want{5, 5, 3}, want{5, 5, 3}},
	}
	for _, tc := range tests {
		for _, op := range ops {
			t.Run(op.name+"/"+tc.name, func(t *testing.T) {
				p := baseParams()
				p.Op = op.op
				if tc.mod != nil {
					tc.mod(&p)
				}
				w := tc.write
				if op.op == WRRead {
					w = tc.read
				}
				n := uint32(len(tc.b.src))
				cuts := tc.cuts
				if cuts == nil {
					cuts = []Pos{{}, {I: n}}
				}
				var got chainTotals
				var union []run
				for q := 0; q+1 < len(cuts); q++ {
					ch := mustChain(t, 64, 8)
					c := planCase{p: p, from: cuts[q], to: cuts[q+1], immLast: op.op == WRWrite, imm: 0xABCD0000 + uint32(q)}
					out, m, err := planAll(t, ch, c, tc.b.src, tc.b.dst, tc.b.lens)
					if err != nil {
						t.Fatal(err)
					}
					if want := expected(tc.b.src, tc.b.dst, tc.b.lens, c.from, c.to); fmt.Sprint(m) != fmt.Sprint(want) {
						t.Fatalf("range %d maps\n got %v\nwant %v", q, m, want)
					}
					union = append(union, m...)
					for _, r := range out.chains {
						got.wrs, got.sges = got.wrs+r.WRs, got.sges+r.SGEs
					}
					got.chains += len(out.chains)
				}
				if got.wrs != w.wrs || got.sges != w.sges || got.chains != w.chains {
					t.Fatalf("chains: got %d WRs, %d SGEs, %d chains; want %d, %d, %d", got.wrs, got.sges, got.chains, w.wrs, w.sges, w.chains)
				}
				if want := expected(tc.b.src, tc.b.dst, tc.b.lens, Pos{}, Pos{I: n}); fmt.Sprint(coalesce(union)) != fmt.Sprint(want) {
					t.Fatalf("the ranges together map\n got %v\nwant %v", coalesce(union), want)
				}
				pl := mustPlan(t, p, tc.b.src, tc.b.dst, tc.b.lens, cuts)
				checkPlan(t, pl, p, tc.b.src, tc.b.dst, tc.b.lens, cuts)
				if wrs, sges, _ := pl.Totals(); wrs != w.wrs || sges != w.sges {
					t.Fatalf("prepared: %d WRs, %d SGEs; want %d, %d", wrs, sges, w.wrs, w.sges)
				}
			})
		}
	}
}

type chainTotals struct{ wrs, sges, chains int }

// TestPlanOpRefused: an opcode other than WRITE or READ, and a READ asked to
// carry an immediate (there is no READ with immediate), are refused by both
// entry points, naming the op; nothing is planned.
func TestPlanOpRefused(t *testing.T) {
	src, dst, lens := []uint64{0}, []uint64{0}, []uint64{64}
	for _, tc := range []struct {
		name    string
		op      WROpcode
		immLast bool
	}{
		{"send", WRSend, false},
		{"write with imm as the op", WRWriteWithImm, false},
		{"read with immediate", WRRead, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := baseParams()
			p.Op = tc.op
			ch := mustChain(t, 8, 4)
			ch.Setup(&p)
			ch.Start(Pos{}, Pos{I: 1}, tc.immLast, 1)
			res, err := ch.Plan(src, dst, lens)
			if !errors.Is(err, errs.ErrInvalidArgument) || !contains(err.Error(), fmt.Sprintf("op %d", tc.op)) || res.WRs != 0 {
				t.Fatalf("chain: %d WRs, %v; want ErrInvalidArgument naming op %d", res.WRs, err, tc.op)
			}
			if cur := ch.Cursor(); cur != (Pos{}) {
				t.Fatalf("cursor moved to %+v", cur)
			}
			if tc.immLast {
				return // a prepared plan has no immediate to refuse
			}
			if _, err := NewPlan(&p, src, dst, lens, []Pos{{}, {I: 1}}); !errors.Is(err, errs.ErrInvalidArgument) || !contains(err.Error(), fmt.Sprintf("op %d", tc.op)) {
				t.Fatalf("plan: %v; want ErrInvalidArgument naming op %d", err, tc.op)
			}
		})
	}
}
