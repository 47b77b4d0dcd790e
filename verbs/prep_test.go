//go:build cgo && linux

package verbs

import (
	"errors"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

// TestPlanPatch posts shares in sub-ranges without a QP: wr_ids carry the
// running sequence numbers, each sub-range's last WR is signaled only while
// posted (the static pattern is restored), the immediate is the tag, and a
// second submit re-patches them all. A READ share's last WR stays a plain
// READ and carries no immediate.
func TestPlanPatch(t *testing.T) {
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) { testPlanPatch(t, op.op) })
	}
}

func testPlanPatch(t *testing.T, op WROpcode) {
	src, dst, lens, size := randomBatch(1000, 128, 3)
	p := baseParams()
	p.Op = op
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
				if seq != seq0+uint32(j)+1 || kind != DataKind(p.Op) {
					t.Fatalf("submit %d share %d WR %d: seq %d kind %d, want %d", submit, q, j, seq, kind, seq0+uint32(j)+1)
				}
				if w.Signaled != ((j+1)%p.SignalEvery == 0 || j == n-1) {
					t.Fatalf("WR %d signaled=%v after the post (not restored)", j, w.Signaled)
				}
				if (j < n-1) != pl.WRNext(q, j) {
					t.Fatalf("WR %d link not restored", j)
				}
			}
			wantOp, wantImm := WRWriteWithImm, tag
			if op == WRRead {
				wantOp, wantImm = WRRead, 0
			}
			if last := pl.WR(q, n-1); last.Opcode != wantOp || last.Imm != wantImm {
				t.Fatalf("share %d last WR opcode %d imm %#x, want %d %#x", q, last.Opcode, last.Imm, wantOp, wantImm)
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

// TestPlanRestamp: a new local MR (the source of a WRITE plan, the
// destination of a READ plan) restamps every SGE's lkey and address.
func TestPlanRestamp(t *testing.T) {
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			src, dst, lens, size := randomBatch(300, 256, 4)
			p := baseParams()
			p.Op = op.op
			p.SrcLimit, p.DstLimit = size, size
			cuts := cutsEven(300, 2)
			pl := mustPlan(t, p, src, dst, lens, cuts)
			p2 := p
			p2.LKey = 0xabcdef
			local := &p2.SrcBase
			if op.op == WRRead {
				local = &p2.DstBase
			}
			*local += 0x7000
			pl.Restamp(p2.LKey, *local)
			if pl.LKey() != p2.LKey {
				t.Fatalf("lkey %#x", pl.LKey())
			}
			checkPlan(t, pl, p2, src, dst, lens, cuts)
		})
	}
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

// FuzzPlanBuild: for arbitrary block lists, cuts, limits and either op, the
// prepared plan matches the ad hoc chains share by share (see checkPlan),
// or refuses out-of-range blocks and bad cuts with ErrInvalidArgument.
func FuzzPlanBuild(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, uint8(4), uint16(0), uint8(3), uint8(2), uint8(0))
	f.Add([]byte{0, 0, 0, 0, 255, 255, 0, 1}, uint8(1), uint16(7), uint8(1), uint8(1), uint8(3))
	f.Add(make([]byte, 64), uint8(30), uint16(300), uint8(16), uint8(5), uint8(0x85))
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, uint8(4), uint16(0), uint8(3), uint8(0x82), uint8(0))
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
		if nq&0x80 != 0 {
			p.Op = WRRead
		}
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
