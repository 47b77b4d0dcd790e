package bench

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

func TestCX7Wire(t *testing.T) {
	m := DefaultCX7
	for _, tc := range []struct {
		name       string
		bytes, wrs uint64
		want       float64
		bound      string
	}{
		// 10,000 x 128 B: 1.28 MB is 26 us of bandwidth, 10,000 WRITEs at
		// 64 M/s 156 us: op rate, plus 5.8 us of round trips.
		{"10k x 128 B", 1_280_000, 10_000, 10_000/64e6 + 5.8e-6, "op rate"},
		// 10,000 x 2 MiB: 21 GB at 49.1 GB/s is 0.427 s.
		{"10k x 2 MiB", 10_000 << 21, 10_000, float64(uint64(10_000)<<21)/(392.6/8*1e9) + 5.8e-6, "bandwidth"},
	} {
		got, bound := m.Wire(tc.bytes, tc.wrs)
		if math.Abs(got-tc.want) > 1e-9 || bound != tc.bound {
			t.Errorf("%s: %g s (%s), want %g s (%s)", tc.name, got, bound, tc.want, tc.bound)
		}
	}
}

func TestProject(t *testing.T) {
	row := sampleRow(128) // 10,000 blocks, median 10 ms
	row.Segments, row.Mode = 10000, "adhoc"
	// ours = non-wire phases + the floor, less TCP's post (its payload gather).
	row.AdHoc = &ModeOut{MedianSeconds: 2.4e-3, Phases: &PhaseOut{Wire: 0.4e-3, Total: 2.2e-3, NonWire: 1.8e-3, Post: 0.05e-3}}
	row.Prepared = &ModeOut{MedianSeconds: 0.5e-3, Phases: &PhaseOut{Wire: 0.4e-3, Total: 0.45e-3, NonWire: 0.1e-3, Post: 0.05e-3}}
	legacy := sampleRow(1 << 20) // a report from before the modes: no phases
	legacy.DataPathMedianSeconds = 0.008
	floor := 0.25e-3
	rep := &Report{Transport: "tcp", PingFloorSeconds: &floor, Rows: []Row{row, legacy}}
	rows := Project(rep, DefaultCX7)
	if len(rows) != 2 {
		t.Fatalf("%d rows", len(rows))
	}
	p := rows[0]
	wire, _ := DefaultCX7.Wire(1_280_000, 10000)
	if math.Abs(*p.OursAdHoc-2.0e-3) > 1e-12 || math.Abs(*p.OursPrepared-0.3e-3) > 1e-12 || p.Wire != wire {
		t.Fatalf("ours %g / %g, wire %g", *p.OursAdHoc, *p.OursPrepared, p.Wire)
	}
	if math.Abs(*p.SharePrepare-0.3e-3/(0.3e-3+wire)) > 1e-12 || math.Abs(*p.TotalAdHoc-(2.0e-3+wire)) > 1e-12 {
		t.Fatalf("share %g total %g", *p.SharePrepare, *p.TotalAdHoc)
	}
	if l := rows[1]; l.OursPrepared != nil || math.Abs(*l.OursAdHoc-0.002) > 1e-12 || !strings.Contains(l.OursFrom, "no phases") {
		t.Fatalf("legacy row %+v", l)
	}
	var b bytes.Buffer
	WriteProjection(&b, &Report{Transport: "tcp", PingFloorSeconds: &floor, Rows: []Row{row}}, DefaultCX7)
	for _, want := range []string{"| 128 B | 10000 | 10000 | 2000 us | 300 us |", "op rate", "non-wire phases", "less TCP's post"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("projection lacks %q:\n%s", want, b.String())
		}
	}
}

func TestPhaseSamples(t *testing.T) {
	var p phaseSamples
	if p.out() != nil {
		t.Fatal("no calls, yet phases")
	}
	p.add(nil, time.Millisecond) // a daemon that reports none: not counted
	p.add(&b2bv1.PhaseTimings{}, time.Millisecond)
	if p.out() != nil {
		t.Fatal("calls without phases counted")
	}
	for i, call := range []time.Duration{1000, 3000, 2000} { // ns
		w := uint64(100 * (i + 1))
		p.add(&b2bv1.PhaseTimings{DecodeNs: 10, WireNs: w, TotalNs: w + 50}, call)
	}
	got := p.out()
	want := PhaseOut{Decode: 10e-9, Wire: 200e-9, Total: 250e-9, Outside: 1650e-9, NonWire: 50e-9, CallLessWire: 1700e-9}
	// Outside: calls 1000, 3000, 2000 less totals 150, 250, 350 = 850, 2750, 1650.
	// CallLessWire: calls less wires 100, 200, 300 = 900, 2800, 1700.
	if math.Abs(got.Decode-want.Decode) > 1e-15 || math.Abs(got.Wire-want.Wire) > 1e-15 || math.Abs(got.Total-want.Total) > 1e-15 ||
		math.Abs(got.Outside-want.Outside) > 1e-15 || math.Abs(got.NonWire-want.NonWire) > 1e-15 || math.Abs(got.CallLessWire-want.CallLessWire) > 1e-15 {
		t.Fatalf("phases %+v, want %+v", *got, want)
	}
}
