package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// RatioMinBlock is the smallest block compared with the TCP yardstick: below
// it, per-block costs dominate and a bulk stream is not the right measure.
const RatioMinBlock = 256 << 10

// SMs describes how many GPU streaming multiprocessors a transfer keeps busy.
type SMs struct {
	Count *int   // nil: not known
	Label string // for the table
}

// SMsUsed derives the SM count from the kinds of memory a batch moves between.
// Host memory involves no GPU; for GPU memory the count depends on the path
// (GPUDirect RDMA uses none, staging may), which is not measured yet.
func SMsUsed(kinds ...b2bv1.MemoryKind) SMs {
	for _, k := range kinds {
		if k != b2bv1.MemoryKind_MEMORY_KIND_HOST {
			return SMs{Label: "n/a (GPU memory)"}
		}
	}
	zero := 0
	return SMs{Count: &zero, Label: "0 (host memory)"}
}

// Row is the result of one block size and op.
type Row struct {
	// Op is what the row's batches did: "write" (push) or "read" (pull);
	// empty in reports from before pulls (writes).
	Op              string    `json:"op"`
	BlockBytes      uint64    `json:"block_bytes"`
	Blocks          int       `json:"blocks"`
	BlocksRequested int       `json:"blocks_requested"`
	Capped          bool      `json:"capped"`
	PayloadBytes    uint64    `json:"payload_bytes"`
	Iterations      int       `json:"iterations"`
	MedianSeconds   float64   `json:"median_seconds"`
	P99Seconds      float64   `json:"p99_seconds"`
	MinSeconds      float64   `json:"min_seconds"`
	SampleSeconds   []float64 `json:"sample_seconds"`
	GBps            float64   `json:"gbps"`
	MblocksPerSec   float64   `json:"mblocks_per_s"`
	SMsUsed         *int      `json:"sms_used"`
	SMsUsedLabel    string    `json:"sms_used_label"`
	// DaemonCPUSeconds is utime+stime of the daemons over the timed batches;
	// nil where it cannot be read (a remote daemon).
	DaemonCPUSeconds *float64 `json:"daemon_cpu_seconds"`
	DaemonCPUScope   string   `json:"daemon_cpu_scope,omitempty"`
	Transport        string   `json:"transport"`
	// OtherCPUSeconds is CPU time that neither the daemons nor the bench used
	// on this host during the timed batches, and StealCPUSeconds what the
	// hypervisor took: when large, the timings are disturbed. nil where the
	// daemons' own share is unknown.
	OtherCPUSeconds *float64 `json:"other_cpu_seconds"`
	StealCPUSeconds *float64 `json:"steal_cpu_seconds"`
	// DataPathMedianSeconds is the daemon's own timing of the data path
	// (BatchTransferResponse.elapsed_ns), without the API call around it.
	DataPathMedianSeconds float64 `json:"data_path_median_seconds"`
	Segments              uint64  `json:"segments"`
	WorkRequests          uint64  `json:"work_requests"`
	// Verified: every block's CRC32C matched on both sides.
	Verified bool `json:"verified"`
	// GBpsMin and GBpsMax are the slowest and the fastest of the timed
	// batches (gbps is their median).
	GBpsMin float64 `json:"gbps_min"`
	GBpsMax float64 `json:"gbps_max"`
	// The TCP yardstick, interleaved with the timed batches of sizes from
	// RatioMinBlock up: one trial next to each batch (T B, B T, ...), moving the batch's
	// bytes (YardstickTrialBytes) from the same source region into the same
	// destination region over one kept-open connection. YardstickGBps is
	// the trials' median rate, and RatioVsYardstick the batches' median rate
	// over it: median with median, in the same run.
	YardstickGBps          *float64  `json:"yardstick_gbps,omitempty"`
	YardstickMinGBps       *float64  `json:"yardstick_min_gbps,omitempty"`
	YardstickMaxGBps       *float64  `json:"yardstick_max_gbps,omitempty"`
	YardstickSampleSeconds []float64 `json:"yardstick_sample_seconds,omitempty"`
	YardstickTrialBytes    uint64    `json:"yardstick_trial_bytes,omitempty"`
	RatioVsYardstick       *float64  `json:"ratio_vs_yardstick,omitempty"`
	PerftestGBps           *float64  `json:"perftest_gbps,omitempty"`
	RatioVsPerftest        *float64  `json:"ratio_vs_perftest,omitempty"`
	// PerftestRun names the ib_write_bw run ratio_vs_perftest is against.
	PerftestRun string `json:"perftest_run,omitempty"`
	Error       string `json:"error,omitempty"`
	// Mode is the mode the top-level timings (median_seconds, gbps, ...)
	// come from: "adhoc" (one BatchTransfer per batch) unless --mode
	// prepared alone.
	Mode string `json:"mode"`
	// DaemonPhases are the ad hoc batches' per-phase medians as the daemon
	// reports them (BatchTransferResponse.phases); nil when the daemon
	// reports none.
	DaemonPhases *PhaseOut `json:"phases"`
	// AdHoc and Prepared are each mode's results; nil where not run.
	AdHoc    *ModeOut `json:"adhoc,omitempty"`
	Prepared *ModeOut `json:"prepared,omitempty"`
	// PreparedNote says why a prepared run is missing (daemon without it).
	PreparedNote string `json:"prepared_note,omitempty"`
	// Phases is the wall time of each step of this size, to show where a
	// run's time goes.
	Phases Phases `json:"phase_seconds"`
}

// ModeOut is one mode's timed batches at one size.
type ModeOut struct {
	MedianSeconds float64   `json:"median_seconds"`
	P99Seconds    float64   `json:"p99_seconds"`
	MinSeconds    float64   `json:"min_seconds"`
	SampleSeconds []float64 `json:"sample_seconds"`
	GBps          float64   `json:"gbps"`
	MblocksPerSec float64   `json:"mblocks_per_s"`
	// Phases are the per-phase medians the daemon reported; nil if none.
	Phases *PhaseOut `json:"phases"`
	// PrepareSeconds and PreparePhases: the one PrepareTransfer (prepared only).
	PrepareSeconds *float64  `json:"prepare_seconds,omitempty"`
	PreparePhases  *PhaseOut `json:"prepare_phases,omitempty"`
	Verified       bool      `json:"verified"`
	// PingMedianSeconds is the median of the empty Pings made on the same
	// connection just before each timed call (the same-run floor);
	// CallOverFloor is the calls' median over it, and ControlOverFloor the
	// median of (call - wire - post) over it: the call's cost beyond moving
	// the payload (post over TCP is the CPU gathering it, which a NIC does by
	// DMA; over verbs it is the WR post), as internal/e2e's BenchmarkPrepared
	// takes its submit-wire-post/ping. nil where the daemon has no Ping (or
	// reports no phases, for ControlOverFloor).
	PingMedianSeconds *float64 `json:"ping_median_seconds,omitempty"`
	CallOverFloor     *float64 `json:"call_over_floor,omitempty"`
	ControlOverFloor  *float64 `json:"control_over_floor,omitempty"`
	// FirstSeconds is the mode's first (untimed warm-up) batch at this size,
	// and FirstPhases the daemon's phases of it; FirstOverMedian is it over
	// MedianSeconds (the steady state). The run's first row holds the first
	// batch on the region pair and transport: a one-off cost (a lazy
	// mapping, a connection, a staging buffer) shows there.
	FirstSeconds    float64   `json:"first_seconds"`
	FirstPhases     *PhaseOut `json:"first_phases,omitempty"`
	FirstOverMedian *float64  `json:"first_over_median,omitempty"`
	// RawCopyMedianSeconds is the median of the raw-copy yardstick's
	// trials next to this mode's timed writes (--yardstick raw: one
	// cuMemcpyBatchAsync of the same blocks from the bench), and
	// OverRawCopy this mode's median over it.
	RawCopyMedianSeconds *float64  `json:"raw_copy_median_seconds,omitempty"`
	RawCopySampleSeconds []float64 `json:"raw_copy_sample_seconds,omitempty"`
	OverRawCopy          *float64  `json:"over_raw_copy,omitempty"`
}

// PhaseOut is where a call's time went inside the daemon (medians of each
// phase over the timed batches, seconds), and the part of the client's
// call the daemon did not see (gRPC, the client library, wake-ups).
type PhaseOut struct {
	Decode   float64 `json:"decode"`
	Validate float64 `json:"validate"`
	Resolve  float64 `json:"resolve"`
	Plan     float64 `json:"plan"`
	Post     float64 `json:"post"`
	Wire     float64 `json:"wire"`
	Notify   float64 `json:"notify"`
	Total    float64 `json:"total"` // the handler's whole time
	// Outside is the median of (call as the client timed it - total).
	Outside float64 `json:"outside"`
	// NonWire is Total - Wire (medians of the per-call differences): the
	// daemon's own work.
	NonWire float64 `json:"non_wire"`
	// CallLessWire is the median of (call - wire): everything but the wire,
	// as the client sees it (the CX7 projection's "ours").
	CallLessWire float64 `json:"call_less_wire"`
	// Control is the median of (call - wire - post): the call less moving
	// the payload.
	Control float64 `json:"control"`
}

// Phases are wall times in seconds.
type Phases struct {
	Fill   float64 `json:"fill"`
	WarmUp float64 `json:"warm_up"`
	Timed  float64 `json:"timed"`
	Verify float64 `json:"verify"`
	// Yardstick is the part of Timed spent in the interleaved yardstick
	// trials (and WarmUp's one).
	Yardstick float64 `json:"yardstick"`
}

// Report is the whole run, as written to --json.
type Report struct {
	Transport  string        `json:"transport"`
	Mode       string        `json:"mode"` // "embedded" or "two-host"
	Seed       uint64        `json:"seed"`
	Iterations int           `json:"iterations"`
	Yardstick  *YardstickOut `json:"yardstick,omitempty"`
	Memory     MemoryOut     `json:"memory"`
	Host       HostOut       `json:"host"`
	// AllocateSeconds is how long registering both regions took (once per run).
	AllocateSeconds float64 `json:"allocate_seconds"`
	// WarmSeconds is how long the warm-up after registering took, each op
	// (WarmTransfer); nil: skipped (--cold) or not implemented.
	WarmSeconds *float64 `json:"warm_seconds,omitempty"`
	// PingFloorSeconds is the median of PingCalls empty Ping calls on the
	// source daemon's connection (nil: not measured or not implemented).
	PingFloorSeconds *float64 `json:"ping_floor_seconds"`
	PingCalls        int      `json:"ping_calls"`
	// YardstickCached is the 4 MiB-buffer yardstick, measured once before the
	// sweep (best of its trials), for context; Yardstick describes the one
	// interleaved with each size's batches (the rows hold its rates and
	// ratio_vs_yardstick).
	YardstickCached *YardstickOut `json:"yardstick_cached,omitempty"`
	Rows            []Row         `json:"rows"`
	Complete        bool          `json:"complete"` // every planned size ran and verified
	Error           string        `json:"error,omitempty"`
}

// YardstickOut describes the TCP yardstick in the report.
type YardstickOut struct {
	Kind     string `json:"kind"`
	SrcBytes uint64 `json:"src_bytes"`
	DstBytes uint64 `json:"dst_bytes"`
	// GBps is the best trial and Bytes each trial's length (the one-off
	// cached yardstick); 0 for the interleaved one, whose rates and trial
	// lengths are per row.
	GBps  float64 `json:"gbps,omitempty"`
	Bytes uint64  `json:"bytes,omitempty"`
	// Trials: in all (one-off), or per size (interleaved: one per timed batch).
	Trials      int  `json:"trials"`
	Interleaved bool `json:"interleaved"`
}

// MemoryOut is the memory budget in the report.
type MemoryOut struct {
	MemAvailableBytes uint64 `json:"mem_available_bytes"`
	UsableBytes       uint64 `json:"usable_bytes"`
	RegionsHere       int    `json:"regions_on_this_host"`
	Limit             string `json:"limit"` // what set usable_bytes
}

// HostOut describes the machine.
type HostOut struct {
	Hostname string `json:"hostname"`
	CPUs     int    `json:"cpus"`
}

// transportName turns the wire enum into "tcp" or "verbs".
func transportName(k b2bv1.TransportKind) string {
	switch k {
	case b2bv1.TransportKind_TRANSPORT_KIND_TCP:
		return "tcp"
	case b2bv1.TransportKind_TRANSPORT_KIND_VERBS:
		return "verbs"
	case b2bv1.TransportKind_TRANSPORT_KIND_LOCAL:
		return "local"
	}
	return strings.ToLower(strings.TrimPrefix(k.String(), "TRANSPORT_KIND_"))
}

// transportKind is the request enum for --transport.
func transportKind(s string) b2bv1.TransportKind {
	switch s {
	case "tcp":
		return b2bv1.TransportKind_TRANSPORT_KIND_TCP
	case "verbs":
		return b2bv1.TransportKind_TRANSPORT_KIND_VERBS
	case "local":
		return b2bv1.TransportKind_TRANSPORT_KIND_LOCAL
	}
	return b2bv1.TransportKind_TRANSPORT_KIND_UNSPECIFIED
}

// overallTransport is the rows' transport, or "mixed".
func overallTransport(rows []Row) string {
	t := ""
	for _, r := range rows {
		switch {
		case r.Transport == "":
		case t == "":
			t = r.Transport
		case t != r.Transport:
			return "mixed"
		}
	}
	return t
}

// WriteJSON writes the report to path, indented, atomically (a reader never
// sees half a file).
func WriteJSON(path string, r *Report) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	return writeFileAtomic(path, append(b, '\n'))
}

func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// table prints rows as aligned columns, one row at a time so results show as
// each size finishes.
type table struct {
	w        io.Writer
	perftest bool
	prepared bool // a prepared column
}

func (t *table) columns() []string {
	c := []string{"block", "op", "blocks", "ad hoc"}
	if t.prepared {
		c = append(c, "prepared")
	}
	c = append(c, "1st batch", "1st x", "p99", "GB/s", "GB/s min-max", "Mblocks/s", "SMs used", "daemon CPU s", "transport", "TCP GB/s", "TCP min-max", "vs TCP")
	if t.perftest {
		c = append(c, "perftest GB/s", "vs perftest")
	}
	return append(c, "verified")
}

// widths are fixed so rows can be printed as they come.
var columnWidth = map[string]int{
	"block": 8, "op": 5, "blocks": 8, "ad hoc": 10, "prepared": 10, "1st batch": 10, "1st x": 7, "p99": 10, "GB/s": 7, "Mblocks/s": 9, "SMs used": 16,
	"daemon CPU s": 12, "transport": 9, "vs TCP": 6, "GB/s min-max": 12, "TCP GB/s": 8, "TCP min-max": 11, "perftest GB/s": 13, "vs perftest": 11, "verified": 8,
}

// rightAligned columns hold numbers.
var rightAligned = map[string]bool{
	"blocks": true, "ad hoc": true, "prepared": true, "1st batch": true, "1st x": true, "p99": true, "GB/s": true, "Mblocks/s": true, "daemon CPU s": true,
	"vs TCP": true, "GB/s min-max": true, "TCP GB/s": true, "TCP min-max": true, "perftest GB/s": true, "vs perftest": true,
}

func (t *table) line(cells map[string]string) {
	var b strings.Builder
	for i, c := range t.columns() {
		if i > 0 {
			b.WriteString("  ")
		}
		w := columnWidth[c]
		if rightAligned[c] {
			fmt.Fprintf(&b, "%*s", w, cells[c])
		} else {
			fmt.Fprintf(&b, "%-*s", w, cells[c])
		}
	}
	fmt.Fprintln(t.w, strings.TrimRight(b.String(), " "))
}

func (t *table) header() {
	cells := map[string]string{}
	for _, c := range t.columns() {
		cells[c] = c
	}
	t.line(cells)
}

func (t *table) row(r Row) {
	blocks := fmt.Sprint(r.Blocks)
	if r.Capped {
		blocks += "*"
	}
	cells := map[string]string{
		"block":        FormatBytes(r.BlockBytes),
		"op":           r.opOrWrite(),
		"blocks":       blocks,
		"ad hoc":       "-",
		"prepared":     "-",
		"p99":          formatSeconds(r.P99Seconds),
		"GB/s":         fmt.Sprintf("%.3f", r.GBps),
		"Mblocks/s":    fmt.Sprintf("%.3f", r.MblocksPerSec),
		"SMs used":     r.SMsUsedLabel,
		"transport":    r.Transport,
		"vs TCP":       "-",
		"verified":     "no",
		"TCP GB/s":     "-",
		"TCP min-max":  "-",
		"GB/s min-max": "-",
	}
	switch {
	case r.AdHoc != nil:
		cells["ad hoc"] = formatSeconds(r.AdHoc.MedianSeconds)
	case r.Mode != "prepared" && r.MedianSeconds > 0: // a row from before the modes
		cells["ad hoc"] = formatSeconds(r.MedianSeconds)
	}
	if r.Prepared != nil {
		cells["prepared"] = formatSeconds(r.Prepared.MedianSeconds)
	}
	cells["1st batch"], cells["1st x"] = "-", "-"
	if m := r.primaryMode(); m != nil && m.FirstSeconds > 0 {
		cells["1st batch"] = formatSeconds(m.FirstSeconds)
		if m.FirstOverMedian != nil {
			cells["1st x"] = fmt.Sprintf("%.2fx", *m.FirstOverMedian)
		}
	}
	cells["daemon CPU s"] = "n/a"
	if r.DaemonCPUSeconds != nil {
		cells["daemon CPU s"] = fmt.Sprintf("%.2f", *r.DaemonCPUSeconds)
		if r.DaemonCPUScope != "" && r.DaemonCPUScope != cpuScopeBoth {
			cells["daemon CPU s"] += " (src)"
		}
	}
	if r.RatioVsYardstick != nil {
		cells["vs TCP"] = fmt.Sprintf("%.2fx", *r.RatioVsYardstick)
	}
	if r.GBpsMax > 0 {
		cells["GB/s min-max"] = fmt.Sprintf("%.2f-%.2f", r.GBpsMin, r.GBpsMax)
	}
	if r.YardstickGBps != nil {
		cells["TCP GB/s"] = fmt.Sprintf("%.3f", *r.YardstickGBps)
	}
	if r.YardstickMinGBps != nil && r.YardstickMaxGBps != nil {
		cells["TCP min-max"] = fmt.Sprintf("%.2f-%.2f", *r.YardstickMinGBps, *r.YardstickMaxGBps)
	}
	cells["perftest GB/s"], cells["vs perftest"] = "-", "-"
	if r.PerftestGBps != nil {
		cells["perftest GB/s"] = fmt.Sprintf("%.2f", *r.PerftestGBps)
	}
	if r.RatioVsPerftest != nil {
		cells["vs perftest"] = fmt.Sprintf("%.2fx", *r.RatioVsPerftest)
	}
	if r.Verified {
		cells["verified"] = "yes"
	}
	if r.MedianSeconds == 0 {
		for _, c := range []string{"p99", "GB/s", "Mblocks/s", "GB/s min-max"} {
			cells[c] = "-"
		}
	}
	t.line(cells)
}

// opOrWrite is the row's op; rows from before pulls are writes.
func (r Row) opOrWrite() string {
	if r.Op == "" {
		return OpWrite
	}
	return r.Op
}

// primaryMode is the mode the row's top-level timings come from, or nil.
func (r Row) primaryMode() *ModeOut {
	if r.Mode == "prepared" {
		return r.Prepared
	}
	return r.AdHoc
}

// printBreakdown writes, per size and mode, the daemon's per-phase medians
// in microseconds: where a call's time goes. "outside" is the client's call
// less the daemon's handler time (gRPC both ways, the client, wake-ups);
// "non-wire" is the daemon's time less waiting for the wire and the ack;
// "ping" the median of the empty Pings interleaved with the timed calls,
// "x floor" the call over it and "ctl x floor" the median of (call - wire -
// post) over it. Without interleaved Pings, "x floor" falls back to the
// run's floor measured before the sweep.
func printBreakdown(w io.Writer, rows []Row, floor *float64) {
	fmt.Fprintln(w, "breakdown  per-phase medians in us (the daemon's own timings; 'outside' = call - daemon total; 'ping' = median of the empty Pings made just before each timed call;")
	fmt.Fprintln(w, "           'x floor' = call / ping; 'ctl x floor' = median of (call - wire - post) / ping, post being TCP's payload gather (a NIC's DMA) or the verbs post;")
	fmt.Fprintln(w, "           '<mode> 1st' = that mode's first (warm-up) batch at the size, one call, not a median)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "block\tmode\tcall\tping\toutside\tdecode\tvalidate\tresolve\tplan\tpost\twire\tnotify\tdaemon total\tnon-wire\tx floor\tctl x floor\t")
	us := func(s float64) string { return fmt.Sprintf("%.1f", s*1e6) }
	opt := func(v *float64, f func(float64) string) string {
		if v == nil {
			return "-"
		}
		return f(*v)
	}
	x2 := func(v float64) string { return fmt.Sprintf("%.2f", v) }
	for _, r := range rows {
		for _, m := range []struct {
			name string
			out  *ModeOut
		}{{"adhoc", r.AdHoc}, {"prepared", r.Prepared}} {
			if m.out == nil {
				continue
			}
			if r.Op == OpRead {
				m.name += " read"
			}
			xf := opt(m.out.CallOverFloor, x2)
			if m.out.CallOverFloor == nil && floor != nil && *floor > 0 {
				xf = fmt.Sprintf("%.2f (run floor)", m.out.MedianSeconds / *floor)
			}
			ping, ctl := opt(m.out.PingMedianSeconds, us), opt(m.out.ControlOverFloor, x2)
			p := m.out.Phases
			if p == nil {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t-\t-\t-\t-\t-\t-\t-\t-\t-\t-\t%s\t%s\t\n", FormatBytes(r.BlockBytes), m.name, us(m.out.MedianSeconds), ping, xf, ctl)
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", FormatBytes(r.BlockBytes), m.name,
				us(m.out.MedianSeconds), ping, us(p.Outside), us(p.Decode), us(p.Validate), us(p.Resolve), us(p.Plan), us(p.Post),
				us(p.Wire), us(p.Notify), us(p.Total), us(p.NonWire), xf, ctl)
			// The warm-up batch, not a median: a one-off cost shows here.
			if f := m.out.FirstPhases; f != nil {
				fmt.Fprintf(tw, "%s\t%s 1st\t%s\t-\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t-\t-\t\n", FormatBytes(r.BlockBytes), m.name,
					us(m.out.FirstSeconds), us(f.Outside), us(f.Decode), us(f.Validate), us(f.Resolve), us(f.Plan), us(f.Post),
					us(f.Wire), us(f.Notify), us(f.Total), us(f.NonWire))
			}
		}
	}
	_ = tw.Flush()
	if len(rows) > 0 && rows[0].AdHoc != nil && rows[0].AdHoc.Phases == nil {
		fmt.Fprintln(w, "(the daemon reports no phase timings: '-')")
	}
}

// formatMicros writes seconds as microseconds.
func formatMicros(s float64) string { return fmt.Sprintf("%.1f us", s*1e6) }

// formatSeconds picks ms or s so the column stays readable from 100 us to 10 s.
func formatSeconds(s float64) string {
	if s < 1 {
		return fmt.Sprintf("%.3f ms", s*1e3)
	}
	return fmt.Sprintf("%.3f s", s)
}

// tabbed writes aligned key/value lines (the run's header).
func tabbed(w io.Writer, pairs [][2]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, p := range pairs {
		fmt.Fprintf(tw, "%s\t%s\n", p[0], p[1])
	}
	_ = tw.Flush()
}
