package bench

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/auth"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// CPU scopes: whose CPU time a row's daemon_cpu_seconds counts.
const (
	cpuScopeBoth = "both daemons"
	cpuScopeSrc  = "source daemon only"
)

// cleanupTimeout bounds releasing a size's regions, even after a cancel.
const cleanupTimeout = 30 * time.Second

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// verifySampleBlocks: how many source blocks the bench hashes itself, to
// check that the daemons' checksums really cover the data.
const verifySampleBlocks = 256

// endpoints are the two daemons a run talks to.
type endpoints struct {
	src, dst *client.Client
	dstPeer  string // the destination's peer address, as the source daemon dials it
	cpu      *CPUMeter
	pair     *embeddedPair // nil in two-host mode
	describe string        // one line for the header
	// ring is the source daemon's shared-memory ring (--path ring), nil
	// otherwise: the sweep's calls go through it.
	ring *client.Ring
}

// close stops what the run started: the daemons in embedded mode (checking
// they exit 0), the connections in two-host mode.
func (e *endpoints) close() error {
	if e.ring != nil {
		_ = e.ring.Close()
	}
	if e.pair != nil {
		if err := e.pair.stop(); err != nil {
			return fmt.Errorf("stopping the daemons: %w", err)
		}
		return nil
	}
	for _, c := range []*client.Client{e.src, e.dst} {
		if c != nil {
			_ = c.Close()
		}
	}
	return nil
}

// runner holds one run's state.
type runner struct {
	cfg      Config
	out      io.Writer // the table and notes
	errOut   io.Writer // progress
	report   *Report
	perftest Perftest
	// yard is the yardstick connection interleaved with the timed batches
	// of sizes from RatioMinBlock up; nil: none (--yardstick none).
	yard *YardstickLink
	// raw is the raw-copy yardstick (--yardstick raw), nil without it.
	raw *rawCopy
	// noPing is set once the daemon answered Ping with Unimplemented: the
	// timed calls are then made without interleaved Pings.
	noPing bool
	// noPrepare is set once the daemon answered PrepareTransfer with
	// Unimplemented: prepared mode is skipped from then on.
	noPrepare string
	bar       *progress
	table     *table
	cuda      gpudirect.Interface // --memory cuda: the bench's own view of the GPUs
}

// Run benchmarks b2bd as cfg says: the table goes to stdout, the progress
// bar to stderr (terminals only), results to cfg.JSONPath and cfg.PlotPath.
// The outputs are written even when the run fails, marked incomplete, so a
// failure leaves its evidence.
func Run(ctx context.Context, cfg Config, stdout, stderr io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if !cfg.AdHoc && cfg.PreparedUpTo == 0 {
		cfg.AdHoc = true
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano()) | 1
	}
	if cfg.Workload == WorkloadKV {
		return runKV(ctx, cfg, stdout, stderr)
	}
	if cfg.Workload == WorkloadControl {
		return runControl(ctx, cfg, stdout)
	}
	if cfg.Workload == WorkloadPaths {
		return runPaths(ctx, cfg, stdout)
	}
	host, _ := os.Hostname()
	mode := "embedded"
	if cfg.TwoHost() {
		mode = "two-host"
	}
	r := &runner{
		cfg: cfg, out: stdout, errOut: stderr,
		report: &Report{Mode: mode, Seed: cfg.Seed, Iterations: cfg.Iters, Host: HostOut{Hostname: host, CPUs: runtime.NumCPU()}, Rows: []Row{}},
	}
	start := time.Now()
	err := r.run(ctx)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("interrupted: %w", err)
	}
	if r.bar != nil {
		r.bar.clear()
	}
	r.report.Complete = err == nil
	if err != nil {
		r.report.Error = err.Error()
	}
	if cfg.NCUDir != "" && len(r.report.Rows) > 0 {
		// The daemons have exited by now, so ncu has written its verdict.
		if v, nerr := readNCU(cfg.NCUDir); nerr != nil {
			err = errors.Join(err, fmt.Errorf("--ncu: %w", nerr))
		} else {
			applyNCU(r.report.Rows, v)
			fmt.Fprintf(stdout, "ncu        %d kernels profiled in the daemons (%s); sms_used = %s\n", v.Kernels, strings.Join(v.Logs, ", "), r.report.Rows[0].SMsUsedLabel)
		}
	}
	r.report.Transport = overallTransport(r.report.Rows)
	if r.report.Transport == "" {
		r.report.Transport = cfg.Transport
	}
	if werr := r.writeOutputs(); werr != nil {
		err = errors.Join(err, werr)
	}
	fmt.Fprintf(stdout, "\ntotal time %s\n", time.Since(start).Round(100*time.Millisecond))
	return err
}

func (r *runner) run(ctx context.Context) (err error) {
	if r.cfg.Memory == "cuda" {
		if r.cuda, err = gpudirect.Load(); err != nil {
			return fmt.Errorf("--memory cuda: %w", err)
		}
		defer r.cuda.Close()
	}
	if r.cfg.PerftestPath != "" {
		if r.perftest, err = LoadPerftest(r.cfg.PerftestPath); err != nil {
			return err
		}
	}
	eps, err := connect(ctx, r.cfg)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := eps.close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()

	budget, err := r.memoryBudget(ctx, eps)
	if err != nil {
		return err
	}
	plans := PlanSizes(r.cfg.Sizes, r.cfg.Blocks, r.cfg.Full, budget)
	r.report.Memory = MemoryOut{MemAvailableBytes: budget.MemAvailable, UsableBytes: budget.Usable, RegionsHere: budget.RegionsHere, Limit: budget.Limit}
	steps := 1
	for _, p := range plans {
		modes := 0
		if r.cfg.AdHoc {
			modes++
		}
		if p.BlockBytes <= r.cfg.PreparedUpTo {
			modes++
		}
		steps += modes * len(r.cfg.ops()) * (r.cfg.Iters + 2) // warm-up, timed batches, verification
	}
	r.bar = newProgress(r.errOut, steps)
	r.printHeader(ctx, eps, budget, plans)

	// One region per side, registered once and reused by every size: pools
	// are registered once in real use too, and on a VM faulting in tens of
	// GiB per size would cost more than the measurements.
	r.bar.set("registering the regions")
	allocStart := time.Now()
	regions, err := r.allocate(ctx, eps, RegionBytesFor(plans), fmt.Sprintf("b2b-bench-%d-%d", os.Getpid(), r.cfg.Seed%1_000_000))
	if err != nil {
		return err
	}
	defer func() {
		if rerr := regions.release(ctx, eps); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}()
	r.report.AllocateSeconds = time.Since(allocStart).Seconds()
	r.printf("regions    %s on each side, registered in %.1f s\n", formatGiB(regions.bytes), r.report.AllocateSeconds)
	if err := r.warm(ctx, eps, regions); err != nil {
		return err
	}

	closeYard, err := r.measureYardsticks(ctx, eps, regions, plans)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := closeYard(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	r.bar.set("measuring the floor: empty Ping calls")
	floor, ok, err := MeasurePingFloor(ctx, eps.src.API(), r.cfg.PingCalls)
	if err != nil {
		return err
	}
	switch {
	case ok:
		secs := floor.Seconds()
		r.report.PingFloorSeconds, r.report.PingCalls = &secs, r.cfg.PingCalls
		r.printf("floor      empty Ping on the source daemon's connection: %s (median of %d calls)\n", formatMicros(secs), r.cfg.PingCalls)
	case r.cfg.PingCalls > 0:
		r.printf("floor      n/a: the daemon does not implement Ping\n")
	}
	r.bar.step("")
	r.printf("\n")

	r.table = &table{w: r.out, perftest: r.perftest.GBps != nil, prepared: r.cfg.PreparedUpTo > 0}
	r.bar.clear()
	r.table.header()
	anyCapped := false
	for i, p := range plans {
		rows, err := r.runSize(ctx, eps, regions, p, i, len(plans))
		r.report.Rows = append(r.report.Rows, rows...)
		r.bar.clear()
		for _, row := range rows {
			r.table.row(row)
		}
		r.bar.redraw()
		anyCapped = anyCapped || p.Capped
		if err != nil {
			return err
		}
	}
	if r.noPrepare != "" {
		r.printf("note: prepared mode skipped: %s\n", r.noPrepare)
	}
	if r.raw != nil {
		r.printf("\n")
		printRawCopy(r.out, r.report.Rows)
	}
	if r.cfg.Breakdown {
		r.printf("\n")
		printBreakdown(r.out, r.report.Rows, r.report.PingFloorSeconds)
	}
	if anyCapped {
		r.printf("* fewer blocks than requested, so that both regions fit in RAM (see 'capped' above; --full forces %d)\n", r.cfg.Blocks)
	}
	if warn := disturbanceWarning(r.report.Rows, runtime.NumCPU()); warn != "" {
		r.printf("%s\n", warn)
	}
	return nil
}

// disturbedShare: when other processes or the hypervisor took more than this
// share of the machine's CPU time during a size's timed batches, say so.
// disturbedFloor: but not below this many CPU seconds, since /proc counts in
// 10 ms ticks and a 20 ms window would otherwise look disturbed by one tick.
const (
	disturbedShare = 0.10
	disturbedFloor = 0.05
)

// disturbanceWarning names the sizes whose timings other load disturbed.
func disturbanceWarning(rows []Row, cpus int) string {
	var hit []string
	worst := 0.0
	for _, r := range rows {
		if r.OtherCPUSeconds == nil || r.Phases.Timed <= 0 {
			continue
		}
		lost := *r.OtherCPUSeconds + *r.StealCPUSeconds
		share := lost / (r.Phases.Timed * float64(cpus))
		if share > disturbedShare && lost > disturbedFloor {
			hit = append(hit, FormatBytes(r.BlockBytes))
			worst = max(worst, share)
		}
	}
	if len(hit) == 0 {
		return ""
	}
	return fmt.Sprintf("warning: other processes (or the hypervisor) used up to %.0f%% of this machine's CPU time during the timed batches of %s: those timings are disturbed (other_cpu_seconds in the JSON)",
		100*worst, strings.Join(hit, ", "))
}

// printf writes a line of the report without tearing the progress bar.
func (r *runner) printf(format string, args ...any) {
	r.bar.clear()
	fmt.Fprintf(r.out, format, args...)
	r.bar.redraw()
}

// connect starts the embedded daemons or dials the given ones.
func connect(ctx context.Context, cfg Config) (*endpoints, error) {
	if !cfg.TwoHost() {
		useRing := cfg.Workload == WorkloadSweep && cfg.Path == PathRing
		pair, err := startEmbedded(ctx, cfg.B2BD, cfg.DaemonArgs, cfg.NCUDir, cfg.Workload == WorkloadControl || useRing)
		if err != nil {
			return nil, fmt.Errorf("embedded daemons: %w", err)
		}
		e := &endpoints{
			src: pair.src.client, dst: pair.dst.client, dstPeer: pair.dst.peer, pair: pair,
			cpu:      NewCPUMeter(cpuScopeBoth, pair.pids()...),
			describe: fmt.Sprintf("embedded: two b2bd on 127.0.0.1 (%s, pids %d -> %d)", cfg.B2BD, pair.pids()[0], pair.pids()[1]),
		}
		if useRing {
			// An arena that holds the largest batch's request: 24 bytes a
			// block, rounded up to whole MiB.
			arena := min(max((uint64(cfg.Blocks)*24+1<<20)&^(1<<20-1), 1<<20), 128<<20)
			if e.ring, err = client.DialRingWith(filepath.Join(pair.stateDir, submitSocketName), client.RingOptions{ArenaBytes: arena}); err != nil {
				_ = e.close()
				return nil, fmt.Errorf("--path ring: %w", err)
			}
			e.describe += ", calls over the shared-memory ring"
		}
		return e, nil
	}
	e := &endpoints{dstPeer: cfg.DstPeer}
	var opts []grpc.DialOption
	if cfg.TLSCert != "" || cfg.TLSKey != "" || cfg.TLSCA != "" {
		t, err := auth.LoadPeerTLS(cfg.TLSCert, cfg.TLSKey, cfg.TLSCA)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(t.Client)))
	}
	dial := func(target string) (*client.Client, error) {
		if strings.HasPrefix(target, "/") || strings.HasPrefix(target, "unix:") {
			return client.Dial(target) // local socket: no TLS
		}
		return client.Dial(target, opts...)
	}
	var err error
	if e.src, err = dial(cfg.SrcAPI); err != nil {
		return nil, fmt.Errorf("source daemon: %w", err)
	}
	if e.dst, err = dial(cfg.DstAPI); err != nil {
		_ = e.close()
		return nil, fmt.Errorf("destination daemon: %w", err)
	}
	for _, d := range []struct {
		name, addr string
		c          *client.Client
	}{{"source", cfg.SrcAPI, e.src}, {"destination", cfg.DstAPI, e.dst}} {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := d.c.Status(sctx)
		cancel()
		if err != nil {
			_ = e.close()
			return nil, fmt.Errorf("%s daemon at %s does not answer: %w", d.name, d.addr, err)
		}
	}
	// The source daemon runs here; if its API is a Unix socket, the kernel
	// tells us its pid and /proc its CPU time. The destination's is remote.
	if path := unixSocketPath(cfg.SrcAPI); path != "" {
		if pid, err := unixSocketPeerPID(path); err == nil {
			m := NewCPUMeter(cpuScopeSrc, pid)
			if _, err := m.Seconds(); err == nil {
				e.cpu = m
			}
		}
	}
	e.describe = fmt.Sprintf("two-host: source %s -> destination %s (peer %s)", cfg.SrcAPI, cfg.DstAPI, cfg.DstPeer)
	return e, nil
}

// memoryBudget reads what this host can hold. The regions' tmpfs is found
// by registering one page on the source daemon and looking at its file.
func (r *runner) memoryBudget(ctx context.Context, eps *endpoints) (MemoryBudget, error) {
	if r.cuda != nil {
		return gpuBudget(r.cuda, r.cfg.SrcDevice, r.cfg.DstDevice)
	}
	avail, err := ReadMemAvailable("/proc/meminfo")
	if err != nil {
		return MemoryBudget{}, err
	}
	regionsHere := 2
	if r.cfg.TwoHost() {
		regionsHere = 1
	}
	shmFree := uint64(0)
	probe, err := eps.src.API().RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
		Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: 4096}},
	})
	if err != nil {
		return MemoryBudget{}, fmt.Errorf("source daemon: register a probe region: %w", err)
	}
	if path := probe.GetRegion().GetShmPath(); path != "" {
		shmFree = filesystemFree(filepath.Dir(path))
	}
	if err := eps.src.Deregister(ctx, probe.GetRegion().GetId()); err != nil {
		return MemoryBudget{}, fmt.Errorf("source daemon: release the probe region: %w", err)
	}
	return NewBudget(avail, shmFree, regionsHere), nil
}

func (r *runner) printHeader(ctx context.Context, eps *endpoints, budget MemoryBudget, plans []SizePlan) {
	pairs := [][2]string{
		{"b2b-bench", fmt.Sprintf("%s; transport %s requested; %d timed batches per size after 1 warm-up; seed %d", eps.describe, r.cfg.Transport, r.cfg.Iters, r.cfg.Seed)},
		{"op", opsLabel(r.cfg.ops())},
	}
	if st, err := eps.src.Status(ctx); err == nil {
		var ts []string
		for _, t := range st.GetTransports() {
			name := transportName(t.GetKind())
			if t.GetAvailable() {
				ts = append(ts, name)
			} else {
				why := strings.TrimPrefix(t.GetDetail(), "unavailable: ")
				ts = append(ts, fmt.Sprintf("%s unavailable (%s)", name, why))
			}
		}
		pairs = append(pairs, [2]string{"source", fmt.Sprintf("b2bd %s on %s; transports: %s", st.GetVersion(), st.GetNodeName(), strings.Join(ts, ", "))})
	}
	mem := fmt.Sprintf("MemAvailable %s; regions may use %s (%s; %d per size on this host", formatGiB(budget.MemAvailable), formatGiB(budget.Usable), budget.Limit, budget.RegionsHere)
	if r.cfg.TwoHost() {
		mem += "; the destination host is assumed to hold its own"
	}
	pairs = append(pairs, [2]string{"memory", mem + ")"})
	var capped, over []string
	for _, p := range plans {
		if p.Capped {
			capped = append(capped, fmt.Sprintf("%s: %d blocks", FormatBytes(p.BlockBytes), p.Blocks))
		}
		if p.OverBudget {
			over = append(over, fmt.Sprintf("%s needs %s", FormatBytes(p.BlockBytes), formatGiB(SlotBytes(p.BlockBytes)*uint64(p.Blocks)*uint64(budget.RegionsHere))))
		}
	}
	if len(capped) > 0 {
		pairs = append(pairs, [2]string{"capped", strings.Join(capped, ", ") + fmt.Sprintf(" (below %d so that the regions fit in RAM; --full forces %d)", r.cfg.Blocks, r.cfg.Blocks)})
	}
	if len(over) > 0 {
		pairs = append(pairs, [2]string{"warning", "--full: " + strings.Join(over, ", ") + " of regions, over the " + formatGiB(budget.Usable) + " usable; expect allocation failures"})
	}
	if r.cfg.Iters < DefaultIters {
		pairs = append(pairs, [2]string{"note", fmt.Sprintf("--iters %d: fewer than %d timed batches, so p99 is the slowest of very few", r.cfg.Iters, DefaultIters)})
	}
	r.bar.clear()
	tabbed(r.out, pairs)
	r.bar.redraw()
}

// opsLabel says in the header what the batches do.
func opsLabel(ops []string) string {
	switch {
	case len(ops) > 1:
		return "write and read, interleaved in the same rounds (W R, R W, ...); a read pulls the destination daemon's blocks into the source daemon's region, which one untimed write per size seeds"
	case ops[0] == OpRead:
		return "read: the source daemon pulls the destination daemon's blocks into its region (one untimed write per size seeds them)"
	}
	return "write: the source daemon pushes its blocks into the destination daemon's region"
}

// preparedRun is a prepared mode's results and last responses, one per op.
type preparedRun struct {
	modes []*ModeOut
	lasts []*b2bv1.BatchTransferResponse
}

// runPrepared prepares each transfer once (one per op), runs the mode's
// batches as SubmitTransfer of the handles, and releases them. A daemon
// without PrepareTransfer gives errNoPrepare.
func (r *runner) runPrepared(ctx context.Context, eps *endpoints, ts []client.Transfer,
	run func(dos []func(ctx context.Context) (*b2bv1.BatchTransferResponse, error)) ([]*ModeOut, []*b2bv1.BatchTransferResponse, error),
) (out preparedRun, err error) {
	pctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	var handles []uint64
	defer func() {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer rcancel()
		for _, h := range handles {
			if _, rerr := eps.src.API().ReleaseTransfer(rctx, &b2bv1.ReleaseTransferRequest{Handle: h}); rerr != nil {
				err = errors.Join(err, fmt.Errorf("release the prepared transfer %d: %w", h, rerr))
			}
		}
	}()
	dos := make([]func(ctx context.Context) (*b2bv1.BatchTransferResponse, error), len(ts))
	prepSecs := make([]float64, len(ts))
	prepPhases := make([]*PhaseOut, len(ts))
	for k, t := range ts {
		req := &b2bv1.PrepareTransferRequest{
			SrcRegionId: t.SrcRegion, Peer: t.Peer, DstRegion: t.DstRegion, Transport: t.Transport, Op: t.Op,
			Descriptors: &b2bv1.Descriptors{
				SrcOffsets: client.Pack(t.Blocks.Src), DstOffsets: client.Pack(t.Blocks.Dst), BlockLength: t.Blocks.BlockLength,
			},
		}
		start := time.Now()
		resp, err := eps.src.API().PrepareTransfer(pctx, req)
		el := time.Since(start)
		if status.Code(err) == codes.Unimplemented {
			return preparedRun{}, fmt.Errorf("%w (%v)", errNoPrepare, status.Convert(err).Message())
		}
		if err != nil {
			return preparedRun{}, fmt.Errorf("prepare (%s): %w", opName(t.Op), err)
		}
		handles = append(handles, resp.GetHandle())
		prepSecs[k], prepPhases[k] = el.Seconds(), phaseOutOf(resp.GetPhases(), el)
		sub := &b2bv1.SubmitTransferRequest{Handle: resp.GetHandle()}
		dos[k] = func(ctx context.Context) (*b2bv1.BatchTransferResponse, error) {
			return eps.src.API().SubmitTransfer(ctx, sub)
		}
		if eps.ring != nil {
			plan := &client.Plan{Handle: resp.GetHandle()}
			dos[k] = func(ctx context.Context) (*b2bv1.BatchTransferResponse, error) {
				res, err := eps.ring.SubmitContext(ctx, plan)
				return ringResponse(t.Transport, res, err)
			}
		}
	}
	modes, lasts, rerr := run(dos)
	for k, mode := range modes {
		if mode != nil {
			secs := prepSecs[k]
			mode.PrepareSeconds, mode.PreparePhases = &secs, prepPhases[k]
		}
	}
	return preparedRun{modes: modes, lasts: lasts}, rerr
}

// verify compares every block's CRC32C as the source and the destination
// daemons compute it, and recomputes a sample of source blocks here so a
// checksum that ignored the data could not pass.
func (r *runner) verify(ctx context.Context, eps *endpoints, regions *regionPair, srcLayout, dstLayout Layout) error {
	size := srcLayout.BlockBytes
	vctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	alg := b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C
	cs, err := eps.src.Checksum(vctx, regions.src.ID(), srcLayout.Offsets, nil, size, alg, true)
	if err != nil {
		return fmt.Errorf("source checksum: %w", err)
	}
	cd, err := eps.dst.Checksum(vctx, regions.dstID, dstLayout.Offsets, nil, size, alg, true)
	if err != nil {
		return fmt.Errorf("destination checksum: %w", err)
	}
	srcDigests, dstDigests := client.Unpack(cs.GetBlockDigests()), client.Unpack(cd.GetBlockDigests())
	if err := CompareDigests(srcDigests, dstDigests, len(srcLayout.Offsets)); err != nil {
		var m *MismatchError
		if errors.As(err, &m) {
			m.SrcOffset, m.DstOffset = srcLayout.Offsets[m.Block], dstLayout.Offsets[m.Block]
		}
		return err
	}
	rng := rand.New(rand.NewPCG(mix(r.cfg.Seed, size, 5), 0))
	block := make([]byte, size)
	for k := 0; k < min(verifySampleBlocks, len(srcDigests)); k++ {
		i := rng.IntN(len(srcDigests))
		off := srcLayout.Offsets[i]
		if err := regions.src.Read(off, block); err != nil {
			return fmt.Errorf("read source block %d: %w", i, err)
		}
		local := uint64(crc32.Checksum(block, castagnoli))
		if local != srcDigests[i] {
			return fmt.Errorf("block %d: the source daemon's CRC32C %#x differs from the bench's own %#x over the same bytes", i, srcDigests[i], local)
		}
	}
	return nil
}

// MismatchError names the first block whose digests differ.
type MismatchError struct {
	Block                int
	SrcDigest, DstDigest uint64
	SrcOffset, DstOffset uint64
	Mismatched, Blocks   int
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("block %d (source offset %d, destination offset %d) differs: source CRC32C %#x, destination %#x; %d of %d blocks differ",
		e.Block, e.SrcOffset, e.DstOffset, e.SrcDigest, e.DstDigest, e.Mismatched, e.Blocks)
}

// CompareDigests checks two per-block digest lists of want blocks, block by
// block, and reports the first difference and how many differ.
func CompareDigests(src, dst []uint64, want int) error {
	if len(src) != want {
		return fmt.Errorf("the source daemon returned %d block digests for %d blocks", len(src), want)
	}
	if len(dst) != want {
		return fmt.Errorf("the destination daemon returned %d block digests for %d blocks", len(dst), want)
	}
	var first *MismatchError
	for i := range src {
		if src[i] == dst[i] {
			continue
		}
		if first == nil {
			first = &MismatchError{Block: i, SrcDigest: src[i], DstDigest: dst[i], Blocks: want}
		}
		first.Mismatched++
	}
	if first != nil {
		return first
	}
	return nil
}

// writeOutputs writes --json and --plot.
func (r *runner) writeOutputs() error {
	var errs []error
	var wrote []string
	if r.cfg.JSONPath != "" {
		if err := WriteJSON(r.cfg.JSONPath, r.report); err != nil {
			errs = append(errs, err)
		} else {
			wrote = append(wrote, r.cfg.JSONPath)
		}
	}
	if r.cfg.PlotPath != "" {
		if err := WriteSVGFile(r.cfg.PlotPath, r.report); err != nil {
			errs = append(errs, fmt.Errorf("plot: %w", err))
		} else {
			wrote = append(wrote, r.cfg.PlotPath)
		}
	}
	if len(wrote) > 0 {
		fmt.Fprintf(r.out, "\nwrote %s\n", strings.Join(wrote, ", "))
	}
	return errors.Join(errs...)
}
