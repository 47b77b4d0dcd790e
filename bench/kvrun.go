package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// KVNonWirePhases names what non_wire_seconds sums, for the report.
const KVNonWirePhases = "decode + validate + resolve + plan + post (the daemon's phase timings); wire (waiting for the bytes and the acks) and notify (none sent) left out"

// KVReport is a --workload kv run, as written to --json.
type KVReport struct {
	Workload   string     `json:"workload"` // "kv"
	Transport  string     `json:"transport"`
	Mode       string     `json:"mode"` // "embedded" or "two-host"
	Seed       uint64     `json:"seed"`
	Iterations int        `json:"iterations"`
	Host       HostOut    `json:"host"`
	KV         KVShapeOut `json:"kv"`
	// NonWirePhases says what each row's non_wire_seconds sums.
	NonWirePhases string `json:"non_wire_phases"`
	// NonWireRatio is blocks' non_wire_seconds over descriptors' (medians),
	// and ControlRatio the same without post.
	// With both ops they are the writes'; the reads' are apart.
	NonWireRatio     *float64 `json:"non_wire_ratio_blocks_over_descriptors,omitempty"`
	ControlRatio     *float64 `json:"control_ratio_blocks_over_descriptors,omitempty"`
	ReadNonWireRatio *float64 `json:"read_non_wire_ratio_blocks_over_descriptors,omitempty"`
	// PullOverPush is, with --op both, the reads' non_wire_seconds over the
	// writes' (medians) in blocks mode (by block id), and
	// PullOverPushDescriptors the same in descriptors mode.
	// PullOverPushControl leaves post out (blocks mode): over tcp a pull's
	// post is its request frames' writes, which wait on the serving side.
	PullOverPush            *float64 `json:"non_wire_ratio_pull_over_push_blocks,omitempty"`
	PullOverPushControl     *float64 `json:"control_ratio_pull_over_push_blocks,omitempty"`
	PullOverPushDescriptors *float64 `json:"non_wire_ratio_pull_over_push_descriptors,omitempty"`
	Rows                    []KVRow  `json:"rows"`
	Complete                bool     `json:"complete"`
	Error                   string   `json:"error,omitempty"`
}

// KVShapeOut is the request's shape in the report.
type KVShapeOut struct {
	Segments   int    `json:"segments"`
	BlockBytes uint64 `json:"block_bytes"`
	PoolBlocks int    `json:"pool_blocks"`
	RequestIDs int    `json:"request_ids"`
	Regions    string `json:"regions"` // "segment" or "one"
	// SharedMemory: the blocks layout's per-segment regions are slices of
	// the descriptors' span region (one file), so both modes move the same
	// memory; per side.
	SrcSharedMemory bool   `json:"src_shared_memory"`
	DstSharedMemory bool   `json:"dst_shared_memory"`
	PoolBytes       uint64 `json:"pool_bytes"`
}

// KVRow is one mode's requests.
type KVRow struct {
	Workload   string    `json:"workload"` // "kv"
	Op         string    `json:"op"`       // "write" (push) or "read" (pull)
	Mode       string    `json:"mode"`     // "descriptors" or "blocks"
	Transport  string    `json:"transport"`
	Blocks     int       `json:"blocks"`
	BlockBytes uint64    `json:"block_bytes"`
	Bytes      uint64    `json:"bytes"`
	Iterations int       `json:"iterations"`
	Median     float64   `json:"median_seconds"`
	P99        float64   `json:"p99_seconds"`
	Min        float64   `json:"min_seconds"`
	Samples    []float64 `json:"sample_seconds"`
	GBps       float64   `json:"gbps"`
	// DataPathMedianSeconds is the daemon's elapsed_ns (its data path).
	DataPathMedianSeconds float64 `json:"data_path_median_seconds"`
	// Segments and WorkRequests are what the daemon reports it moved as
	// (merged runs; frames or work requests) in the last request.
	Segments     uint64 `json:"segments"`
	WorkRequests uint64 `json:"work_requests"`
	// DaemonCPUSeconds: both daemons' CPU time over the timed requests.
	DaemonCPUSeconds *float64 `json:"daemon_cpu_seconds"`
	DaemonCPUScope   string   `json:"daemon_cpu_scope,omitempty"`
	// Phases are the daemon's per-phase medians.
	Phases *PhaseOut `json:"phases"`
	// NonWireSeconds is the median of decode + validate + resolve + plan +
	// post per request; ControlSeconds the same without post.
	NonWireSeconds        float64   `json:"non_wire_seconds"`
	ControlSeconds        float64   `json:"control_seconds"`
	NonWireSampleSeconds  []float64 `json:"non_wire_sample_seconds"`
	FirstSeconds          float64   `json:"first_seconds"`
	FirstPhases           *PhaseOut `json:"first_phases,omitempty"`
	FirstNonWireSeconds   float64   `json:"first_non_wire_seconds"`
	VerifiedRequests      int       `json:"verified_requests"`
	Verified              bool      `json:"verified"`
	VerifySecondsPerCall  float64   `json:"verify_seconds_per_request"`
	FillSecondsPerRequest float64   `json:"fill_seconds_per_request"`
	Error                 string    `json:"error,omitempty"`
}

// kvMode accumulates one mode's requests.
type kvMode struct {
	row              KVRow
	calls, dataPath  []time.Duration
	nonWire, control []time.Duration
	phases           phaseSamples
	cpu              float64
	cpuOK            bool
	verify, fill     time.Duration
}

// runKV runs --workload kv: each request as descriptors and as block ids,
// interleaved per repeat, every block of every segment verified after each.
func runKV(ctx context.Context, cfg Config, stdout, stderr io.Writer) error {
	host, _ := os.Hostname()
	mode := "embedded"
	if cfg.TwoHost() {
		mode = "two-host"
	}
	s := cfg.KV
	regions := KVRegionsOne
	if s.PerSegmentRegions {
		regions = KVRegionsSegment
	}
	rep := &KVReport{
		Workload: WorkloadKV, Mode: mode, Seed: cfg.Seed, Iterations: cfg.Repeat, Host: HostOut{Hostname: host, CPUs: runtime.NumCPU()},
		KV:            KVShapeOut{Segments: s.Segments, BlockBytes: s.Block, PoolBlocks: s.Pool, RequestIDs: s.Request, Regions: regions, PoolBytes: s.PoolBytes()},
		NonWirePhases: KVNonWirePhases, Rows: []KVRow{},
	}
	start := time.Now()
	err := kvRun(ctx, cfg, rep, stdout)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("interrupted: %w", err)
	}
	rep.Complete = err == nil
	if err != nil {
		rep.Error = err.Error()
	}
	if rep.Transport == "" {
		rep.Transport = cfg.Transport
	}
	var wrote []string
	if cfg.JSONPath != "" {
		b, jerr := json.MarshalIndent(rep, "", "  ")
		if jerr == nil {
			jerr = writeFileAtomic(cfg.JSONPath, append(b, '\n'))
		}
		if jerr != nil {
			err = errors.Join(err, jerr)
		} else {
			wrote = append(wrote, cfg.JSONPath)
		}
	}
	if cfg.PlotPath != "" {
		fmt.Fprintf(stdout, "\nnote: --plot %s not drawn: --workload kv has no size sweep to plot\n", cfg.PlotPath)
	}
	if len(wrote) > 0 {
		fmt.Fprintf(stdout, "\nwrote %s\n", strings.Join(wrote, ", "))
	}
	fmt.Fprintf(stdout, "\ntotal time %s\n", time.Since(start).Round(100*time.Millisecond))
	_ = stderr
	return err
}

func kvRun(ctx context.Context, cfg Config, rep *KVReport, out io.Writer) (err error) {
	s := cfg.KV
	eps, err := connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := eps.close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	pairs := [][2]string{{"b2b-bench", fmt.Sprintf("--workload kv; %s; transport %s requested; %d timed requests per mode after 1 warm-up, modes interleaved; seed %d",
		eps.describe, cfg.Transport, cfg.Repeat, cfg.Seed)}}
	if st, err := eps.src.Status(ctx); err == nil {
		pairs = append(pairs, [2]string{"source", fmt.Sprintf("b2bd %s on %s", st.GetVersion(), st.GetNodeName())})
	}
	pairs = append(pairs,
		[2]string{"request", fmt.Sprintf("%d segments x %d ids (of a pool of %d blocks per segment, drawn without repeats, local and remote apart, fresh per repeat) = %d blocks of %s = %s",
			s.Segments, s.Request, s.Pool, s.Blocks(), FormatBytes(s.Block), formatGiB(uint64(s.Blocks())*s.Block))},
		[2]string{"regions", s.RegionsLabel()},
		[2]string{"modes", "descriptors: one BatchTransfer per request from one region spanning the pool into one destination export (segment-major offsets); blocks: one TransferBlocks by id between the two registered layouts"})
	tabbed(out, pairs)

	tag := fmt.Sprintf("b2b-bench-kv-%d-%d", os.Getpid(), cfg.Seed%1_000_000)
	pools := &kvPools{shape: s}
	astart := time.Now()
	var readers []string // the remote side's readers: every peer, when reads are measured
	if slices.Contains(cfg.ops(), OpRead) {
		readers = []string{"*"}
	}
	if pools.src, err = allocKVSide(ctx, eps.src, s, "kv-src", "", nil, true); err != nil {
		return fmt.Errorf("source pool: %w", err)
	}
	defer func() {
		if rerr := pools.src.release(ctx); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	if pools.dst, err = allocKVSide(ctx, eps.dst, s, "kv-dst", tag, readers, false); err != nil {
		return fmt.Errorf("destination pool: %w", err)
	}
	defer func() {
		if rerr := pools.dst.release(ctx); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	if err := pools.src.registerLayout(ctx, s, tag+"-src", "", nil); err != nil {
		return fmt.Errorf("source: %w", err)
	}
	if err := pools.dst.registerLayout(ctx, s, tag+"-dst", tag+"-layout", readers); err != nil {
		return fmt.Errorf("destination: %w", err)
	}
	rep.KV.SrcSharedMemory, rep.KV.DstSharedMemory = pools.src.aliased, pools.dst.aliased
	shared := func(p *kvSide) string {
		switch {
		case !s.PerSegmentRegions:
			return "the same region"
		case p.aliased:
			return "the same memory (the segments' regions are slices of the span's file)"
		}
		return "separate memory (the daemon is remote: no shared file)"
	}
	fmt.Fprintf(out, "%-11s%s\n", "pools", fmt.Sprintf("%s per side, registered in %.1f s; both modes move source: %s; destination: %s",
		formatGiB(s.PoolBytes()), time.Since(astart).Seconds(), shared(pools.src), shared(pools.dst)))

	// One mode per op and kind of request: writes first, descriptors
	// before blocks; each repeat runs them all, in mirrored order.
	var modes []*kvMode
	for _, op := range cfg.ops() {
		modes = append(modes, &kvMode{row: KVRow{Op: op, Mode: KVModeDescriptors}}, &kvMode{row: KVRow{Op: op, Mode: KVModeBlocks}})
	}
	kind := transportKind(cfg.Transport)
	for iter := 0; iter <= cfg.Repeat; iter++ {
		q, err := NewKVRequest(s.Pool, s.Request, mix(cfg.Seed, 7, uint64(iter)))
		if err != nil {
			return err
		}
		order := slices.Clone(modes)
		if iter%2 == 1 {
			slices.Reverse(order)
		}
		for mi, m := range order {
			err := kvRequest(ctx, cfg, eps, pools, m, q, iter, mix(cfg.Seed, 8, uint64(iter), uint64(mi), uint64(len(m.row.Mode)), uint64(len(m.row.Op))), kind)
			if err != nil {
				m.row.Error = err.Error()
				rep.Rows = kvRows(cfg, modes...)
				return fmt.Errorf("%s %s request %d: %w", m.row.Op, m.row.Mode, iter, err)
			}
		}
	}
	rep.Rows = kvRows(cfg, modes...)
	rep.Transport = rep.Rows[0].Transport
	ratio := func(num, den float64) *float64 {
		if den <= 0 {
			return nil
		}
		v := num / den
		return &v
	}
	// Rows: per op, descriptors then blocks.
	d, b := rep.Rows[0], rep.Rows[1]
	rep.NonWireRatio, rep.ControlRatio = ratio(b.NonWireSeconds, d.NonWireSeconds), ratio(b.ControlSeconds, d.ControlSeconds)
	if len(rep.Rows) == 4 {
		rd, rb := rep.Rows[2], rep.Rows[3]
		rep.ReadNonWireRatio = ratio(rb.NonWireSeconds, rd.NonWireSeconds)
		rep.PullOverPush = ratio(rb.NonWireSeconds, b.NonWireSeconds)
		rep.PullOverPushControl = ratio(rb.ControlSeconds, b.ControlSeconds)
		rep.PullOverPushDescriptors = ratio(rd.NonWireSeconds, d.NonWireSeconds)
	}
	fmt.Fprintln(out)
	printKV(out, rep)
	return nil
}

// kvRequest fills, moves and verifies one request in one mode; iteration 0
// is the warm-up (recorded as first_*, not in the medians).
func kvRequest(ctx context.Context, cfg Config, eps *endpoints, pools *kvPools, m *kvMode, q KVRequest, iter int, seed uint64, kind b2bv1.TransportKind) error {
	s := pools.shape
	read := m.row.Op == OpRead
	f0 := time.Now()
	want := fillKV(pools.src, s, m.row.Mode, q, seed)
	call := func(op string) func(ctx context.Context) (*b2bv1.BatchTransferResponse, error) {
		switch m.row.Mode {
		case KVModeDescriptors:
			src, dst := q.Descriptors(s)
			t := client.Transfer{SrcRegion: pools.src.span.GetId(), Peer: eps.dstPeer, DstRegion: pools.dst.spanExport, Transport: kind,
				Blocks: client.Descriptors{Src: src, Dst: dst, BlockLength: s.Block}, Op: opKind(op)}
			return func(ctx context.Context) (*b2bv1.BatchTransferResponse, error) { return eps.src.BatchTransfer(ctx, t) }
		default:
			b := client.Blocks{LocalLayout: pools.src.layout, Peer: eps.dstPeer, RemoteLayout: pools.dst.export, LocalIDs: q.Local, RemoteIDs: q.Remote,
				Transport: kind, Op: opKind(op)}
			return func(ctx context.Context) (*b2bv1.BatchTransferResponse, error) { return eps.src.TransferBlocks(ctx, b) }
		}
	}
	if read {
		// A read's source is the remote pool: one untimed push of this
		// request's blocks puts known data at the remote ids; then the
		// local blocks are overwritten with other data, which the read
		// must replace.
		sctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		_, err := call(OpWrite)(sctx)
		cancel()
		if err != nil {
			return fmt.Errorf("seeding the remote blocks for the read (one write): %w", err)
		}
		fillKV(pools.src, s, m.row.Mode, q, ^seed)
	}
	fill := time.Since(f0)
	do := call(m.row.Op)
	bctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	var cpu0 float64
	cpuErr := errors.New("no meter")
	if eps.cpu != nil {
		cpu0, cpuErr = eps.cpu.Seconds()
	}
	start := time.Now()
	resp, err := do(bctx)
	el := time.Since(start)
	if err != nil {
		return err
	}
	if cpuErr == nil && iter > 0 {
		if cpu1, err := eps.cpu.Seconds(); err == nil {
			m.cpu += cpu1 - cpu0
			m.cpuOK = true
		}
	}
	wantBytes := uint64(s.Blocks()) * s.Block
	if resp.GetBlocks() != uint64(s.Blocks()) || resp.GetBytes() != wantBytes {
		return fmt.Errorf("the daemon reports %d blocks and %d bytes moved, want %d and %d", resp.GetBlocks(), resp.GetBytes(), s.Blocks(), wantBytes)
	}
	if cfg.kvAfterRequest != nil {
		if err := cfg.kvAfterRequest(ctx, eps, pools, m.row.Mode, q); err != nil {
			return err
		}
	}
	v0 := time.Now()
	dstSide := pools.dst
	if read {
		dstSide = pools.src
	}
	if err := verifyKVSide(ctx, dstSide, s, m.row.Mode, q, want, cfg.Timeout, read); err != nil {
		return fmt.Errorf("verification failed: %w", err)
	}
	m.row.VerifiedRequests++
	ph := resp.GetPhases()
	if iter == 0 {
		m.row.FirstSeconds, m.row.FirstPhases = el.Seconds(), phaseOutOf(ph, el)
		m.row.FirstNonWireSeconds = kvNonWire(ph).Seconds()
		return nil
	}
	m.verify += time.Since(v0)
	m.fill += fill
	m.calls = append(m.calls, el)
	m.dataPath = append(m.dataPath, time.Duration(resp.GetElapsedNs()))
	m.phases.add(ph, el)
	if ph.GetTotalNs() > 0 {
		m.nonWire = append(m.nonWire, kvNonWire(ph))
		m.control = append(m.control, kvControl(ph))
	}
	m.row.Transport = transportName(resp.GetTransport())
	m.row.Segments, m.row.WorkRequests = resp.GetSegments(), resp.GetWorkRequests()
	return nil
}

// kvRows turns the modes' samples into rows (per op, descriptors first).
func kvRows(cfg Config, modes ...*kvMode) []KVRow {
	s := cfg.KV
	var rows []KVRow
	for _, m := range modes {
		r := m.row
		r.Workload, r.Blocks, r.BlockBytes, r.Bytes, r.Iterations = WorkloadKV, s.Blocks(), s.Block, uint64(s.Blocks())*s.Block, len(m.calls)
		if len(m.calls) > 0 {
			sum := Summarize(m.calls)
			r.Median, r.P99, r.Min = sum.Median.Seconds(), sum.P99.Seconds(), sum.Min.Seconds()
			r.GBps = GBps(r.Bytes, sum.Median)
			for _, c := range m.calls {
				r.Samples = append(r.Samples, c.Seconds())
			}
			r.DataPathMedianSeconds = Summarize(m.dataPath).Median.Seconds()
			r.FillSecondsPerRequest = m.fill.Seconds() / float64(len(m.calls))
			r.VerifySecondsPerCall = m.verify.Seconds() / float64(len(m.calls))
		}
		if len(m.nonWire) > 0 {
			r.NonWireSeconds = Summarize(m.nonWire).Median.Seconds()
			r.ControlSeconds = Summarize(m.control).Median.Seconds()
			for _, d := range m.nonWire {
				r.NonWireSampleSeconds = append(r.NonWireSampleSeconds, d.Seconds())
			}
		}
		r.Phases = m.phases.out()
		if m.cpuOK {
			c := m.cpu
			r.DaemonCPUSeconds, r.DaemonCPUScope = &c, cpuScopeBoth
		}
		r.Verified = r.Error == "" && r.VerifiedRequests == cfg.Repeat+1
		rows = append(rows, r)
	}
	return rows
}

// printKV writes the two modes' table, the daemon's phases and the ratio.
func printKV(w io.Writer, rep *KVReport) {
	ms := func(s float64) string { return fmt.Sprintf("%.3f", s*1e3) }
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "op\tmode\tblocks\tcall ms\tp99 ms\tGB/s\tdecode\tvalidate\tresolve\tplan\tpost\twire\tnon-wire ms\tw/o post\t1st non-wire\tmerged runs\ttransport\tverified\t")
	for _, r := range rep.Rows {
		p := r.Phases
		if p == nil {
			p = &PhaseOut{}
		}
		verified := "no"
		if r.Verified {
			verified = fmt.Sprintf("yes (%d/%d)", r.VerifiedRequests, rep.Iterations+1)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%.3f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t\n", kvOp(r), r.Mode, r.Blocks, ms(r.Median), ms(r.P99), r.GBps,
			ms(p.Decode), ms(p.Validate), ms(p.Resolve), ms(p.Plan), ms(p.Post), ms(p.Wire), ms(r.NonWireSeconds), ms(r.ControlSeconds), ms(r.FirstNonWireSeconds),
			r.Segments, r.Transport, verified)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "           phases: the daemon's medians in ms over the timed requests; non-wire = median of %s\n", KVNonWirePhases)
	fmt.Fprintln(w, "           'w/o post' leaves post out too: over tcp and local, post is the CPU moving the payload (a NIC's DMA over verbs), which both modes pay")
	if rep.NonWireRatio != nil {
		fmt.Fprintf(w, "ratio      blocks / descriptors, the daemon's non-wire time (%s): %.3fx", kvOp(rep.Rows[0]), *rep.NonWireRatio)
		if rep.ControlRatio != nil {
			fmt.Fprintf(w, " (without post: %.3fx)", *rep.ControlRatio)
		}
		fmt.Fprintf(w, " for %d blocks of %s\n", rep.Rows[0].Blocks, FormatBytes(rep.KV.BlockBytes))
	}
	if rep.ReadNonWireRatio != nil {
		fmt.Fprintf(w, "ratio      blocks / descriptors, the daemon's non-wire time (read): %.3fx\n", *rep.ReadNonWireRatio)
	}
	if rep.PullOverPush != nil {
		fmt.Fprintf(w, "ratio      pull / push by block id (blocks mode), the daemon's non-wire time, same run: %.3fx", *rep.PullOverPush)
		if rep.PullOverPushControl != nil {
			fmt.Fprintf(w, " (without post: %.3fx)", *rep.PullOverPushControl)
		}
		if rep.PullOverPushDescriptors != nil {
			fmt.Fprintf(w, "; descriptors: %.3fx", *rep.PullOverPushDescriptors)
		}
		fmt.Fprintln(w)
	}
}

// kvOp is a row's op; rows from before pulls are writes.
func kvOp(r KVRow) string {
	if r.Op == "" {
		return OpWrite
	}
	return r.Op
}
