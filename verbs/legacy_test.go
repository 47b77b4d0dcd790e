//go:build cgo && linux

package verbs

import (
	"fmt"
	"math/rand"
	"regexp"
	"testing"
)

// TEMPORARY: the merged planner (plan.c) against the two it replaces
// (legacy.c), WR for WR. Deleted with legacy.c once it passes.

// fuzzBatch decodes blocks as FuzzPlan and FuzzPlanBuild do.
func fuzzBatch(data []byte, maxBlocks int) (src, dst, lens []uint64) {
	var s, d uint64
	for k := 0; k+2 < len(data) && len(src) < maxBlocks; k += 3 {
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
	return
}

type diffCase struct {
	name           string
	p              ChainParams
	src, dst, lens []uint64
	cuts           []Pos
	immLast        bool
}

func diffCases() []diffCase {
	var cs []diffCase
	// The existing tables' batches.
	seqBlocks := func(n int, sz, ss, ds uint64) (s, d, l []uint64) {
		for i := 0; i < n; i++ {
			s, d, l = append(s, uint64(i)*ss), append(d, uint64(i)*ds), append(l, sz)
		}
		return
	}
	type b3 struct{ s, d, l []uint64 }
	mk := func(s, d, l []uint64) b3 { return b3{s, d, l} }
	rs, rd, rl, _ := randomBatch(500, 128, 7)
	var gs, gd, gl []uint64
	for i := 0; i < 50; i++ {
		gs, gd, gl = append(gs, uint64(i)*1024), append(gd, uint64(i)*512), append(gl, 512)
	}
	tables := []b3{
		mk(seqBlocks(10, 128, 128, 128)), mk(seqBlocks(10, 128, 4096, 128)), mk(seqBlocks(10, 128, 4096, 4096)),
		mk(seqBlocks(1, 5000, 0, 0)), mk(seqBlocks(10, 1000, 1000, 1000)), mk(seqBlocks(8, 1<<16, 1<<17, 1<<17)),
		mk(seqBlocks(6, 64, 4096, 64)), mk(seqBlocks(100, 4096, 4096, 4096)),
		{[]uint64{0, 100, 200}, []uint64{0, 5000, 128}, []uint64{128, 0, 64}},
		{rs, rd, rl}, {gs, gd, gl},
		{[]uint64{0, 3 << 20}, []uint64{0, 3 << 20}, []uint64{3 << 20, 1 << 20}},
		{nil, nil, nil},
		{[]uint64{0, 1<<20 - 10}, []uint64{4096, 0}, []uint64{64, 64}}, // out of range
	}
	mods := []func(*ChainParams){
		nil,
		func(p *ChainParams) { p.MaxWR = 4 },
		func(p *ChainParams) { p.MaxWRBytes = 2048 },
		func(p *ChainParams) { p.MaxWRBytes = 4000 },
		func(p *ChainParams) { p.MaxChainBytes = 1 << 17 },
		func(p *ChainParams) { p.MaxSGE = 1 },
		func(p *ChainParams) { p.InlineMax = 256; p.SignalEvery = 1 },
		func(p *ChainParams) { p.MaxWRBytes = 64 << 10; p.SignalEvery = 3 },
	}
	for ti, b := range tables {
		for mi, m := range mods {
			p := baseParams()
			p.SrcLimit, p.DstLimit = 8<<20, 8<<20
			if ti == len(tables)-1 {
				p.SrcLimit, p.DstLimit = 1<<20, 1<<20
			}
			if m != nil {
				m(&p)
			}
			n := len(b.s)
			for _, nq := range []int{1, 3} {
				cuts := cutsEven(n, nq)
				if n == 0 {
					cuts = []Pos{{}, {}}
				}
				cs = append(cs, diffCase{fmt.Sprintf("table %d mod %d nq %d", ti, mi, nq), p, b.s, b.d, b.l, cuts, mi%2 == 0})
			}
		}
	}
	// The mid-block cuts of the prepared table.
	cs = append(cs, diffCase{"big blocks cut mid-block", baseParams(), tables[11].s, tables[11].d, tables[11].l,
		[]Pos{{}, {I: 0, Off: 2 << 20}, {I: 1, Off: 4096}, {I: 2}}, true})
	// Random batches decoded as the fuzz tests do, with random limits and cuts.
	r := rand.New(rand.NewSource(22))
	for k := 0; k < 3000; k++ {
		data := make([]byte, r.Intn(600))
		r.Read(data)
		src, dst, lens := fuzzBatch(data, 400)
		p := baseParams()
		p.SrcBase, p.DstBase = 0x1000, 0x2000
		p.SrcLimit, p.DstLimit = 1<<16, 1<<16
		p.MaxSGE = r.Intn(8) + 1
		p.MaxWR = r.Intn(32) + 1
		p.MaxWRBytes = uint64(r.Intn(512))
		p.SignalEvery = r.Intn(8) + 1
		p.MaxChainBytes = uint64(r.Intn(1024))
		p.InlineMax = r.Intn(4) * 16
		n := len(src)
		nq := r.Intn(6) + 1
		cuts := []Pos{{}}
		for q := 1; q < nq && n > 0; q++ {
			i := n * q / nq
			c := Pos{I: uint32(i)}
			if r.Intn(2) == 0 && i < n {
				c.Off = lens[i] * uint64(r.Intn(8)) / 8
			}
			cuts = append(cuts, c)
		}
		cuts = append(cuts, Pos{I: uint32(n)})
		cs = append(cs, diffCase{fmt.Sprintf("random %d", k), p, src, dst, lens, cuts, r.Intn(2) == 0})
	}
	return cs
}

var blockRE = regexp.MustCompile(`block (\d+)`)

func TestMergedPlannerMatchesLegacy(t *testing.T) {
	var chainsCompared, wrsCompared, plansCompared, errorsCompared int
	for _, c := range diffCases() {
		// Ad hoc chains: every share's range planned chain by chain.
		capWR := max(c.p.MaxWR, 1)
		nu, old := mustChain(t, capWR, 8), mustChain(t, capWR, 8)
		for q := 0; q+1 < len(c.cuts); q++ {
			for _, ch := range []*Chain{nu, old} {
				ch.Setup(&c.p)
				ch.SetSeq(uint32(q) * 1000)
				ch.Start(c.cuts[q], c.cuts[q+1], c.immLast, 0xC0DE0000+uint32(q))
			}
			for guard := 0; ; guard++ {
				if guard > 1<<16 {
					t.Fatalf("%s: no end", c.name)
				}
				rn, en := nu.Plan(c.src, c.dst, c.lens)
				ro, eo := old.planLegacy(c.src, c.dst, c.lens)
				if fmt.Sprint(en) != fmt.Sprint(eo) || rn != ro || nu.Cursor() != old.Cursor() || nu.Seq() != old.Seq() {
					t.Fatalf("%s share %d: merged %+v %v at %+v, legacy %+v %v at %+v", c.name, q, rn, en, nu.Cursor(), ro, eo, old.Cursor())
				}
				if en != nil {
					errorsCompared++
					break
				}
				chainsCompared++
				for j := 0; j < rn.WRs; j++ {
					if a, b := nu.WR(j), old.WR(j); fmt.Sprintf("%+v", a) != fmt.Sprintf("%+v", b) {
						t.Fatalf("%s share %d WR %d:\n merged %+v\n legacy %+v", c.name, q, j, a, b)
					}
					wrsCompared++
				}
				if rn.Done {
					break
				}
			}
		}
		// Prepared plans: built, compared, patched in sub-ranges, compared.
		pn, en := NewPlan(&c.p, c.src, c.dst, c.lens, c.cuts)
		po, eo := newPlanLegacy(&c.p, c.src, c.dst, c.lens, c.cuts)
		if (en == nil) != (eo == nil) {
			t.Fatalf("%s: NewPlan merged %v, legacy %v", c.name, en, eo)
		}
		if en != nil {
			if fmt.Sprint(blockRE.FindStringSubmatch(en.Error())) != fmt.Sprint(blockRE.FindStringSubmatch(eo.Error())) {
				t.Fatalf("%s: NewPlan merged %v, legacy %v", c.name, en, eo)
			}
			errorsCompared++
			continue
		}
		plansCompared++
		comparePlans(t, c.name+" built", pn, po)
		for q := 0; q < pn.Shares(); q++ {
			pn.Start(q, uint32(q)<<20)
			po.Start(q, uint32(q)<<20)
			for step := 1; pn.Left(q) > 0 || po.Left(q) > 0; step = step%13 + 2 {
				a, ab, ae := pn.Patch(q, step, c.p.MaxChainBytes, 0xBEEF)
				b, bb, be := po.Patch(q, step, c.p.MaxChainBytes, 0xBEEF)
				if a != b || ab != bb || ae != nil || be != nil {
					t.Fatalf("%s share %d: patch merged %d %d %v, legacy %d %d %v", c.name, q, a, ab, ae, b, bb, be)
				}
			}
		}
		comparePlans(t, c.name+" patched", pn, po)
		pn.Close()
		po.Close()
	}
	t.Logf("compared %d chains (%d WRs), %d prepared plans, %d errors", chainsCompared, wrsCompared, plansCompared, errorsCompared)
	if chainsCompared < 1000 || plansCompared < 1000 || errorsCompared == 0 {
		t.Fatalf("too little compared: %d chains, %d plans, %d errors", chainsCompared, plansCompared, errorsCompared)
	}
}

func comparePlans(t *testing.T, name string, pn, po *Plan) {
	t.Helper()
	if pn.Shares() != po.Shares() || pn.LKey() != po.LKey() {
		t.Fatalf("%s: shares %d/%d lkey %#x/%#x", name, pn.Shares(), po.Shares(), pn.LKey(), po.LKey())
	}
	if a, b, c := pn.Totals(); fmt.Sprint(a, b, c) != fmt.Sprint(po.Totals()) {
		t.Fatalf("%s: totals %d %d %d, legacy %v", name, a, b, c, fmt.Sprint(po.Totals()))
	}
	for q := 0; q < pn.Shares(); q++ {
		a, b, c := pn.ShareSize(q)
		if fmt.Sprint(a, b, c) != fmt.Sprint(po.ShareSize(q)) || pn.Seq(q) != po.Seq(q) || pn.Left(q) != po.Left(q) {
			t.Fatalf("%s share %d: size %d %d %d seq %d, legacy %v seq %d", name, q, a, b, c, pn.Seq(q), fmt.Sprint(po.ShareSize(q)), po.Seq(q))
		}
		for j := 0; j < a; j++ {
			if x, y := pn.WR(q, j), po.WR(q, j); fmt.Sprintf("%+v", x) != fmt.Sprintf("%+v", y) || pn.WRNext(q, j) != po.WRNext(q, j) {
				t.Fatalf("%s share %d WR %d:\n merged %+v\n legacy %+v", name, q, j, x, y)
			}
		}
	}
}
