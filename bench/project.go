package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// CX7Model is the wire of one ConnectX-7 400G port, from the public figures
// in the project's notes (shared/notes/anchors.md):
//   - ib_write_bw reached 392.6 Gb/s from host memory (391.5 Gb/s reading
//     H100 HBM) on CX7 400G RoCE (NVIDIA/nccl#2409): the payload rate;
//   - a bare RDMA round trip took 2.9 us (same source);
//   - no public CX7 message rate for small WRITEs was found. The op rate is
//     therefore an assumption: 64 M WRITEs/s, i.e. 10,000 WRITEs in about
//     0.16 ms (0.1-0.2 ms), reachable only with doorbell-batched
//     chains on several QPs. The pessimistic bound beside it is UCCL's
//     serial figure, 128 WRITEs of 256 B in 54 us per batch on a 400G NIC
//     (PR 941): less one round trip, 2.5 M WRITEs/s.
type CX7Model struct {
	PayloadGBps   float64 // bytes of payload per ns
	RTTSeconds    float64
	OpsPerSec     float64 // the assumed op rate the projection uses
	SlowOpsPerSec float64 // the pessimistic bound, shown beside it
}

// DefaultCX7 is the model with the figures above.
var DefaultCX7 = CX7Model{PayloadGBps: 392.6 / 8, RTTSeconds: 2.9e-6, OpsPerSec: 64e6, SlowOpsPerSec: 128 / (54e-6 - 2.9e-6)}

// Wire is the modelled time for a batch of wrs WRITEs carrying bytes: the
// slower of bandwidth and op rate, plus two round trips (the last WRITE's
// completion, and the destination daemon's acknowledgement). bound says
// which limit set it.
func (m CX7Model) Wire(bytes uint64, wrs uint64) (seconds float64, bound string) {
	bw := float64(bytes) / (m.PayloadGBps * 1e9)
	ops := float64(wrs) / m.OpsPerSec
	t, bound := bw, "bandwidth"
	if ops > bw {
		t, bound = ops, "op rate"
	}
	return t + 2*m.RTTSeconds, bound
}

// ProjectionRow is one size of the CX7 projection.
type ProjectionRow struct {
	BlockBytes uint64
	Blocks     int
	WRs        uint64 // WRITEs the batch needs (its segments after merging)
	// Ours is the daemon's and the API's time outside the wire, measured:
	// the median of call - the daemon's wire phase; nil where that mode did
	// not run.
	OursAdHoc, OursPrepared *float64
	// OursFrom says how Ours was derived.
	OursFrom     string
	Wire         float64
	WireBound    string
	WireSlow     float64 // at SlowOpsPerSec
	TotalAdHoc   *float64
	TotalPrep    *float64
	ShareAdHoc   *float64
	SharePrepare *float64
}

// ours is a mode's measured time that a CX7 would not remove: the daemon's
// own non-wire phases (decode, validate, resolve, plan, post, notify: the
// medians of total - wire) plus the run's empty-call floor (the call's own
// fixed cost). Over TCP the post phase is the CPU gathering the payload into
// staging, which a NIC does itself over verbs, so it is left out; the
// client's and the scheduler's time beyond the floor (large on a loaded
// 2-CPU machine) is a property of the test machine, not of the design. For
// a daemon that reports no phases: the call less its data path time.
func ours(m *ModeOut, row Row, rep *Report) (*float64, string) {
	if m == nil || m.MedianSeconds <= 0 {
		return nil, ""
	}
	if m.Phases != nil {
		v := m.Phases.NonWire
		from := "the daemon's non-wire phases (medians of total - wire)"
		if rep.PingFloorSeconds != nil {
			v += *rep.PingFloorSeconds
			from += " + the empty-call floor"
		}
		if rep.Transport == "tcp" {
			v -= m.Phases.Post
			from += ", less TCP's post (the CPU gathering payload a NIC reads itself over verbs)"
		}
		v = max(v, 0)
		return &v, from
	}
	v := max(0, m.MedianSeconds-row.DataPathMedianSeconds)
	return &v, "call - data path (no phases reported)"
}

// Project turns a bench report into the CX7 projection.
func Project(rep *Report, m CX7Model) []ProjectionRow {
	var out []ProjectionRow
	for _, r := range rep.Rows {
		if r.MedianSeconds <= 0 || r.Op == OpRead { // the model is of writes
			continue
		}
		adhoc := r.AdHoc
		if adhoc == nil && r.Mode != "prepared" {
			// A report from before the modes: the top-level timings are ad hoc.
			adhoc = &ModeOut{MedianSeconds: r.MedianSeconds, Phases: r.DaemonPhases}
		}
		wrs := r.Segments
		if wrs == 0 {
			wrs = uint64(r.Blocks)
		}
		p := ProjectionRow{BlockBytes: r.BlockBytes, Blocks: r.Blocks, WRs: wrs}
		var fromA, fromP string
		p.OursAdHoc, fromA = ours(adhoc, r, rep)
		p.OursPrepared, fromP = ours(r.Prepared, r, rep)
		p.OursFrom = fromA
		if fromP != "" && fromP != fromA {
			p.OursFrom = strings.Trim(fromA+"; prepared: "+fromP, "; ")
		}
		p.Wire, p.WireBound = m.Wire(r.PayloadBytes, wrs)
		slow := m
		slow.OpsPerSec = m.SlowOpsPerSec
		p.WireSlow, _ = slow.Wire(r.PayloadBytes, wrs)
		total := func(o *float64) (*float64, *float64) {
			if o == nil {
				return nil, nil
			}
			t := *o + p.Wire
			s := *o / t
			return &t, &s
		}
		p.TotalAdHoc, p.ShareAdHoc = total(p.OursAdHoc)
		p.TotalPrep, p.SharePrepare = total(p.OursPrepared)
		out = append(out, p)
	}
	return out
}

// WriteProjection writes the projection as a markdown table.
func WriteProjection(w io.Writer, rep *Report, m CX7Model) {
	rows := Project(rep, m)
	fmt.Fprintf(w, "ConnectX-7 projection from a %s run on %s (%d CPUs, transport %s): our time measured, the wire modelled\n",
		rep.Mode, rep.Host.Hostname, rep.Host.CPUs, rep.Transport)
	fmt.Fprintf(w, "(%.1f GB/s payload, %.1f us round trip, %.0f M WRITEs/s assumed; wire = max(bytes/bandwidth, WRs/op rate) + 2 round trips;\n",
		m.PayloadGBps, m.RTTSeconds*1e6, m.OpsPerSec/1e6)
	fmt.Fprintf(w, "'wire at %.1f M/s' is the same at UCCL's serial rate, a pessimistic bound).\n\n", m.SlowOpsPerSec/1e6)
	fmt.Fprintf(w, "| block | blocks | WRs | ours, ad hoc | ours, prepared | wire (model) | bound | wire at %.1f M/s | total, ad hoc | total, prepared | our share, ad hoc | our share, prepared |\n", m.SlowOpsPerSec/1e6)
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
	us := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprintf("%.0f us", *v*1e6)
	}
	pct := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprintf("%.0f%%", *v*100)
	}
	froms := map[string]bool{}
	for _, p := range rows {
		wire, slow := p.Wire, p.WireSlow
		fmt.Fprintf(w, "| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", FormatBytes(p.BlockBytes), p.Blocks, p.WRs,
			us(p.OursAdHoc), us(p.OursPrepared), us(&wire), p.WireBound, us(&slow), us(p.TotalAdHoc), us(p.TotalPrep), pct(p.ShareAdHoc), pct(p.SharePrepare))
		if p.OursFrom != "" {
			froms[p.OursFrom] = true
		}
	}
	for f := range froms {
		fmt.Fprintf(w, "\nours = %s.\n", f)
	}
}

// ProjectCX7File reads a bench JSON and writes its projection.
func ProjectCX7File(path string, w io.Writer) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--project-cx7: %w", err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("--project-cx7 %s: not a bench JSON: %w", path, err)
	}
	if len(rep.Rows) == 0 {
		return fmt.Errorf("--project-cx7 %s: no rows", path)
	}
	WriteProjection(w, &rep, DefaultCX7)
	return nil
}
