package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// call is one batch of a mode, timed by the caller.
type call = func(ctx context.Context) (*b2bv1.BatchTransferResponse, error)

// opState is one op's batches in one mode.
type opState struct {
	mode    *ModeOut
	phases  phaseSamples
	pings   []time.Duration
	samples []time.Duration
	// raw are the raw-copy yardstick's trials next to this op's timed
	// batches (--yardstick raw, writes).
	raw  []time.Duration
	last *b2bv1.BatchTransferResponse
	// CPU seconds over the timed batches (each Ping and call).
	daemonCPU, otherCPU, stealCPU float64
	cpuOK, hostOK                 bool
}

// sizeRun is one block size's run, carried from phase to phase: set-up
// (layouts, fill, seeding), each mode's batches with their verification,
// and the rows reported.
type sizeRun struct {
	r                    *runner
	ctx                  context.Context
	eps                  *endpoints
	regions              *regionPair
	size                 uint64
	n                    int
	label                string
	ops                  []string
	rows                 []Row
	srcLayout, dstLayout Layout
	transfers            []client.Transfer
	hasRead              bool
	primaryName          string
	// wall is this size's wall time per step, the same in every op's row.
	wall Phases
	// phase is when the current step began (see lap).
	phase time.Time
	// Per op: the daemon's data-path timings of the primary mode, and its
	// batches, which the yardstick trials are compared with.
	dataPath    [][]time.Duration
	ourSamples  [][]time.Duration
	yardSamples []time.Duration
	lasts       []*b2bv1.BatchTransferResponse
}

// runSize runs one block size for every op of the run: warm-up, timed
// batches, verification. With both ops, write and read alternate in the same
// rounds (W R, R W, ..., the last round W R), so that whatever one leaves
// behind falls on both alike. It returns one row per op, filled as far as the
// run got, also on error.
func (r *runner) runSize(ctx context.Context, eps *endpoints, regions *regionPair, p SizePlan, index, count int) (rows []Row, err error) {
	s := &sizeRun{
		r: r, ctx: ctx, eps: eps, regions: regions,
		size: p.BlockBytes, n: p.Blocks,
		label: fmt.Sprintf("%s (%d/%d)", FormatBytes(p.BlockBytes), index+1, count),
		ops:   r.cfg.ops(),
	}
	s.primaryName = "adhoc"
	if !r.cfg.AdHoc {
		s.primaryName = "prepared"
	}
	s.dataPath = make([][]time.Duration, len(s.ops))
	s.ourSamples = make([][]time.Duration, len(s.ops))
	s.rows = make([]Row, len(s.ops))
	for k, op := range s.ops {
		s.rows[k] = Row{
			BlockBytes: s.size, Blocks: s.n, BlocksRequested: p.Requested, Capped: p.Capped,
			PayloadBytes: s.size * uint64(s.n), Iterations: r.cfg.Iters, Op: op,
		}
	}
	defer func() {
		rows = s.rows
		for k := range rows {
			rows[k].Phases = s.wall
			if err != nil {
				rows[k].Error = fmt.Sprintf("size %s: %v", FormatBytes(s.size), err)
			}
		}
		if err != nil {
			err = fmt.Errorf("size %s: %w", FormatBytes(s.size), err)
		}
	}()
	if err := s.setUp(); err != nil {
		return nil, err
	}
	if err := s.runModes(); err != nil {
		return nil, err
	}
	return nil, s.report()
}

// lap returns the seconds since the previous lap.
func (s *sizeRun) lap() float64 {
	now := time.Now()
	d := now.Sub(s.phase).Seconds()
	s.phase = now
	return d
}

// setUp lays out the blocks, fills the source with this size's data and,
// for reads, seeds the peer's region.
func (s *sizeRun) setUp() error {
	r, ctx, eps, regions, size, n, rows, ops := s.r, s.ctx, s.eps, s.regions, s.size, s.n, s.rows, s.ops
	label := s.label
	if n < 1 {
		return fmt.Errorf("not even one block fits in the %s usable for regions", formatGiB(r.report.Memory.UsableBytes))
	}
	s.srcLayout = NewLayout(n, size, rand.New(rand.NewPCG(mix(r.cfg.Seed, size, 1), 0)))
	s.dstLayout = NewLayout(n, size, rand.New(rand.NewPCG(mix(r.cfg.Seed, size, 2), 0)))
	srcLayout, dstLayout := s.srcLayout, s.dstLayout
	for _, l := range []Layout{srcLayout, dstLayout} {
		if err := l.Check(); err != nil {
			return err
		}
	}

	if srcLayout.RegionBytes > regions.bytes || dstLayout.RegionBytes > regions.bytes {
		return fmt.Errorf("layout of %d bytes exceeds the %d-byte regions", max(srcLayout.RegionBytes, dstLayout.RegionBytes), regions.bytes)
	}
	s.phase = time.Now()
	sms := SMsUsed(regions.src.Kind(), regions.dstKind)
	for k := range rows {
		rows[k].SMsUsed, rows[k].SMsUsedLabel = sms.Count, sms.Label
	}

	// Fresh data per size: what an earlier size left in the destination
	// cannot match it.
	r.bar.set(label + ": filling the source with random data")
	if err := regions.src.Fill(srcLayout.RegionBytes, mix(r.cfg.Seed, size, 3)); err != nil {
		return fmt.Errorf("fill the source: %w", err)
	}
	s.transfers = make([]client.Transfer, len(ops))
	for k, op := range ops {
		s.transfers[k] = client.Transfer{
			SrcRegion: regions.src.ID(), Peer: eps.dstPeer, DstRegion: regions.dstExport, Transport: transportKind(r.cfg.Transport),
			Blocks: client.Descriptors{Src: srcLayout.Offsets, Dst: dstLayout.Offsets, BlockLength: size}, Op: opKind(op),
		}
	}
	s.hasRead = slices.Contains(ops, OpRead)
	if s.hasRead {
		// A read's source is the peer's region: one untimed push gives it
		// this size's random blocks, so that what a read brings is known
		// data at the peer's offsets, not zeros.
		r.bar.set(label + ": seeding the peer's region for the reads (one untimed write)")
		seed := s.transfers[0]
		seed.Op = opKind(OpWrite)
		sctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
		_, err := eps.src.BatchTransfer(sctx, seed)
		cancel()
		if err != nil {
			return fmt.Errorf("seeding the peer's region for the reads (one write): %w", err)
		}
	}
	s.wall.Fill = s.lap()
	return nil
}

// modeRun is one mode's batches of one size: a warm-up round, the timed
// rounds and the verification, each round running every op once (dos[k] is
// op k's call).
type modeRun struct {
	*sizeRun
	name     string
	dos      []call
	meterCPU bool
	withYard bool
	states   []*opState
}

// trialFirst says whether a round's trial comes before its first batch.
// One yardstick trial of the batch's bytes, from and into the memory
// the batch uses, next to each round's first op's batch, in mirrored
// order (... T B, B T, T B), so that whatever one leaves behind (a
// trial's aftermath measurably slows the daemons' next call on this
// 2-core machine) falls on both sides alike. The last round's trial
// comes first: a trial after it would overwrite the blocks verified
// next. Rounds with several ops mirror their order the same way.
func (m *modeRun) trialFirst(iter int) bool { return (m.r.cfg.Iters-iter)%2 == 0 }

// trial runs one yardstick trial next to a batch.
func (m *modeRun) trial(iter int) error {
	r, ctx, rows, name := m.r, m.ctx, m.rows, m.name
	el, err := r.yard.Trial(ctx, rows[0].PayloadBytes)
	if err != nil {
		return fmt.Errorf("%s batch %d: yardstick trial: %w", name, iter, err)
	}
	m.wall.Yardstick += el.Seconds()
	if iter > 0 {
		m.yardSamples = append(m.yardSamples, el)
	}
	return nil
}

// batch runs op k's batch of round iter, metered, and checks what the daemon
// reports it moved.
func (m *modeRun) batch(k, iter int) (time.Duration, *b2bv1.BatchTransferResponse, error) {
	r, ctx, eps, regions, size, n, rows, ops := m.r, m.ctx, m.eps, m.regions, m.size, m.n, m.rows, m.ops
	name, states, dos, withYard, hasRead := m.name, m.states, m.dos, m.withYard, m.hasRead
	srcLayout, dstLayout, last := m.srcLayout, m.dstLayout, r.cfg.Iters
	trialFirst, trial := m.trialFirst, m.trial
	op, st := ops[k], states[k]
	what := fmt.Sprintf("%s %s batch %d", name, op, iter)
	if withYard && k == 0 && trialFirst(iter) {
		if err := trial(iter); err != nil {
			return 0, nil, err
		}
	}
	withRaw := r.raw != nil && op == OpWrite
	if withRaw && trialFirst(iter) {
		if err := m.rawTrial(st, iter); err != nil {
			return 0, nil, err
		}
	}
	if iter == last && hasRead {
		// The verified batch: fresh data over the whole local
		// layout, which neither side holds yet, so only a batch
		// that moved every byte of every block can pass. (A write
		// pushes it; a read overwrites it with the peer's.)
		fstart := time.Now()
		if err := regions.src.Fill(srcLayout.RegionBytes, mix(r.cfg.Seed, size, 6, uint64(k), uint64(len(name)))); err != nil {
			return 0, nil, fmt.Errorf("%s: refill the local region: %w", what, err)
		}
		m.wall.Fill += time.Since(fstart).Seconds()
		m.phase = m.phase.Add(time.Since(fstart))
	} else if err := regions.src.Stamp(srcLayout.Offsets, size, mix(r.cfg.Seed, size, 4, uint64(iter), uint64(len(name)), uint64(k))); err != nil {
		// A write's stamp is new data to carry; a read's is what
		// the read must overwrite.
		return 0, nil, fmt.Errorf("stamp the local blocks: %w", err)
	}
	bctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	var cpuBefore, cpuAfter float64
	var hostBefore, hostAfter HostCPU
	metered := st.cpuOK && iter > 0
	if metered {
		var cerr, herr error
		cpuBefore, cerr = eps.cpu.Seconds()
		hostBefore, herr = ReadHostCPU()
		st.cpuOK, st.hostOK = cerr == nil, st.hostOK && herr == nil
	}
	if !r.noPing {
		// An empty call on the same connection just before: the
		// same-run floor this call is compared with.
		pstart := time.Now()
		_, perr := eps.src.API().Ping(bctx, &b2bv1.PingRequest{})
		pel := time.Since(pstart)
		switch {
		case status.Code(perr) == codes.Unimplemented:
			r.noPing = true
		case perr != nil:
			return 0, nil, fmt.Errorf("%s: the Ping before it: %w", what, perr)
		case iter > 0:
			st.pings = append(st.pings, pel)
		}
	}
	start := time.Now()
	resp, err := dos[k](bctx)
	elapsed := time.Since(start)
	if err != nil {
		return 0, nil, fmt.Errorf("%s of %d blocks: %w", what, n, err)
	}
	if metered && st.cpuOK {
		var cerr, herr error
		cpuAfter, cerr = eps.cpu.Seconds()
		hostAfter, herr = ReadHostCPU()
		st.cpuOK, st.hostOK = cerr == nil, st.hostOK && herr == nil
		if st.cpuOK {
			v := cpuAfter - cpuBefore
			st.daemonCPU += v
			if st.hostOK {
				st.otherCPU += max(0, (hostAfter.Busy-hostBefore.Busy)-v-(hostAfter.Self-hostBefore.Self))
				st.stealCPU += hostAfter.Steal - hostBefore.Steal
			}
		}
	}
	if resp.GetBlocks() != uint64(n) || resp.GetBytes() != rows[k].PayloadBytes {
		return 0, nil, fmt.Errorf("%s: the daemon reports %d blocks and %d bytes moved, want %d and %d", what, resp.GetBlocks(), resp.GetBytes(), n, rows[k].PayloadBytes)
	}
	if r.cfg.afterBatch != nil {
		if err := r.cfg.afterBatch(ctx, eps, regions, op, iter, srcLayout, dstLayout); err != nil {
			return 0, nil, fmt.Errorf("%s: test hook: %w", what, err)
		}
	}
	if withYard && k == 0 && !trialFirst(iter) {
		if err := trial(iter); err != nil {
			return 0, nil, err
		}
	}
	if withRaw && !trialFirst(iter) {
		if err := m.rawTrial(st, iter); err != nil {
			return 0, nil, err
		}
	}
	return elapsed, resp, nil
}

// rawTrial runs one raw-copy trial (rawcopy.go) of the batch's own blocks
// next to a write batch, in the yardstick's mirrored order; it copies what
// the batch copies, so the verification after the last round holds.
func (m *modeRun) rawTrial(st *opState, iter int) error {
	el, err := m.r.raw.trial(m.srcLayout.Offsets, m.dstLayout.Offsets, m.size)
	if err != nil {
		return fmt.Errorf("%s batch %d: %w", m.name, iter, err)
	}
	m.wall.Yardstick += el.Seconds()
	if iter > 0 {
		st.raw = append(st.raw, el)
	}
	return nil
}

// runMode runs a mode's warm-up round, timed rounds and verification.
func (s *sizeRun) runMode(name string, dos []call, meterCPU bool) ([]*opState, error) {
	m := &modeRun{sizeRun: s, name: name, dos: dos, meterCPU: meterCPU}
	m.states = make([]*opState, len(s.ops))
	for k := range m.states {
		m.states[k] = &opState{mode: &ModeOut{}, cpuOK: meterCPU, hostOK: meterCPU}
	}
	m.withYard = s.r.yard != nil && s.size >= RatioMinBlock && name == s.primaryName
	err := m.rounds()
	if err != nil {
		return m.states, err
	}
	m.summarize()
	return m.states, nil
}

// rounds runs the warm-up round and the timed rounds, verifying after the
// last.
func (m *modeRun) rounds() error {
	r, ctx, eps, regions, ops, label := m.r, m.ctx, m.eps, m.regions, m.ops, m.label
	name, states, last, dataPath := m.name, m.states, r.cfg.Iters, m.dataPath
	srcLayout, dstLayout, trialFirst, batch := m.srcLayout, m.dstLayout, m.trialFirst, m.batch
	for iter := 0; iter <= last; iter++ {
		for j := range ops {
			k := j
			if !trialFirst(iter) {
				k = len(ops) - 1 - j
			}
			st := states[k]
			if iter == 0 {
				r.bar.step(fmt.Sprintf("%s: %s %s warm-up batch", label, name, ops[k]))
			} else {
				r.bar.step(fmt.Sprintf("%s: %s %s batch %d/%d", label, name, ops[k], iter, r.cfg.Iters))
			}
			el, resp, err := batch(k, iter)
			if err != nil {
				if iter == 0 {
					err = fmt.Errorf("warm-up: %w", err)
				}
				return err
			}
			if iter == 0 {
				st.mode.FirstSeconds, st.mode.FirstPhases = el.Seconds(), phaseOutOf(resp.GetPhases(), el)
			} else {
				st.samples = append(st.samples, el)
				st.phases.add(resp.GetPhases(), el)
				if name == m.primaryName {
					dataPath[k] = append(dataPath[k], time.Duration(resp.GetElapsedNs()))
				}
				st.last = resp
			}
			if iter == last {
				m.wall.Timed += m.lap()
				r.bar.step(fmt.Sprintf("%s: verifying every block on both sides (%s %s)", label, name, ops[k]))
				if err := r.verify(ctx, eps, regions, srcLayout, dstLayout); err != nil {
					return fmt.Errorf("%s %s: verification failed: %w", name, ops[k], err)
				}
				m.wall.Verify += m.lap()
				st.mode.Verified = true
			}
		}
		if iter == 0 {
			m.wall.WarmUp += m.lap()
		}
	}
	return nil
}

// summarize turns each op's samples into its mode's figures and its row's
// CPU seconds.
func (m *modeRun) summarize() {
	eps, n, rows, name, states, meterCPU := m.eps, m.n, m.rows, m.name, m.states, m.meterCPU
	ourSamples := m.ourSamples
	for k, st := range states {
		mode, samples := st.mode, st.samples
		sum := Summarize(samples)
		mode.MedianSeconds, mode.P99Seconds, mode.MinSeconds = sum.Median.Seconds(), sum.P99.Seconds(), sum.Min.Seconds()
		for _, s := range samples {
			mode.SampleSeconds = append(mode.SampleSeconds, s.Seconds())
		}
		mode.GBps, mode.MblocksPerSec = GBps(rows[k].PayloadBytes, sum.Median), MblocksPerSec(n, sum.Median)
		if sum.Median > 0 {
			v := mode.FirstSeconds / sum.Median.Seconds()
			mode.FirstOverMedian = &v
		}
		mode.Phases = st.phases.out()
		if len(st.raw) > 0 {
			raw := Summarize(st.raw).Median
			secs := raw.Seconds()
			mode.RawCopyMedianSeconds = &secs
			for _, s := range st.raw {
				mode.RawCopySampleSeconds = append(mode.RawCopySampleSeconds, s.Seconds())
			}
			if raw > 0 {
				v := sum.Median.Seconds() / secs
				mode.OverRawCopy = &v
			}
		}
		if len(st.pings) > 0 {
			pm := Summarize(st.pings).Median.Seconds()
			mode.PingMedianSeconds = &pm
			if v, ok := OverFloor(samples, st.pings); ok {
				mode.CallOverFloor = &v
			}
			if v, ok := OverFloor(st.phases.control, st.pings); ok {
				mode.ControlOverFloor = &v
			}
		}
		if name == m.primaryName {
			ourSamples[k] = samples
		}
		if meterCPU && st.cpuOK {
			cpu := st.daemonCPU
			rows[k].DaemonCPUSeconds, rows[k].DaemonCPUScope = &cpu, eps.cpu.Scope
			if st.hostOK {
				other, steal := st.otherCPU, st.stealCPU
				rows[k].OtherCPUSeconds, rows[k].StealCPUSeconds = &other, &steal
			}
		}
	}
}

// runModes runs the ad-hoc mode, the prepared one, or both.
func (s *sizeRun) runModes() error {
	r, ctx, eps, size, ops, rows, transfers := s.r, s.ctx, s.eps, s.size, s.ops, s.rows, s.transfers
	s.lasts = make([]*b2bv1.BatchTransferResponse, len(ops))
	lasts := s.lasts
	if r.cfg.AdHoc {
		dos := make([]call, len(ops))
		for k := range ops {
			t := transfers[k]
			dos[k] = func(ctx context.Context) (*b2bv1.BatchTransferResponse, error) { return eps.src.BatchTransfer(ctx, t) }
			if eps.ring != nil {
				dos[k] = func(ctx context.Context) (*b2bv1.BatchTransferResponse, error) {
					res, err := eps.src.TransferRing(ctx, eps.ring, t)
					return ringResponse(t.Transport, res, err)
				}
			}
		}
		states, err := s.runMode("adhoc", dos, true)
		for k, st := range states {
			rows[k].AdHoc, lasts[k] = st.mode, st.last
		}
		if err != nil {
			return err
		}
	}
	if size <= r.cfg.PreparedUpTo && r.noPrepare == "" {
		prep, err := r.runPrepared(ctx, eps, transfers, func(dos []call) ([]*ModeOut, []*b2bv1.BatchTransferResponse, error) {
			states, err := s.runMode("prepared", dos, !r.cfg.AdHoc)
			modes, lasts := make([]*ModeOut, len(states)), make([]*b2bv1.BatchTransferResponse, len(states))
			for k, st := range states {
				modes[k], lasts[k] = st.mode, st.last
			}
			return modes, lasts, err
		})
		switch {
		case errors.Is(err, errNoPrepare):
			r.noPrepare = err.Error()
		default:
			for k := range prep.modes {
				rows[k].Prepared = prep.modes[k]
				if lasts[k] == nil {
					lasts[k] = prep.lasts[k]
				}
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// report fills each op's row from the primary mode, the yardstick and
// perftest.
func (s *sizeRun) report() error {
	r, size, rows, lasts := s.r, s.size, s.rows, s.lasts
	dataPath, ourSamples, yardSamples := s.dataPath, s.ourSamples, s.yardSamples
	for k := range rows {
		row := &rows[k]
		if size <= r.cfg.PreparedUpTo && r.noPrepare != "" {
			row.PreparedNote = r.noPrepare
		}
		primary, mode := row.AdHoc, "adhoc"
		if primary == nil {
			primary, mode = row.Prepared, "prepared"
		}
		if primary == nil {
			return errors.New("no mode ran")
		}
		row.Mode = mode
		row.MedianSeconds, row.P99Seconds, row.MinSeconds = primary.MedianSeconds, primary.P99Seconds, primary.MinSeconds
		row.SampleSeconds, row.GBps, row.MblocksPerSec = primary.SampleSeconds, primary.GBps, primary.MblocksPerSec
		row.DaemonPhases = primary.Phases
		row.DataPathMedianSeconds = Summarize(dataPath[k]).Median.Seconds()
		row.Transport = transportName(lasts[k].GetTransport())
		row.Segments, row.WorkRequests = lasts[k].GetSegments(), lasts[k].GetWorkRequests()
		ours := RatesOf(row.PayloadBytes, ourSamples[k])
		row.GBpsMin, row.GBpsMax = ours.Min, ours.Max
		if ratio, ok := MedianRatio(ourSamples[k], yardSamples); ok {
			y := RatesOf(row.PayloadBytes, yardSamples)
			row.YardstickGBps, row.YardstickMinGBps, row.YardstickMaxGBps = &y.Median, &y.Min, &y.Max
			row.RatioVsYardstick, row.YardstickTrialBytes = &ratio, row.PayloadBytes
			row.YardstickSampleSeconds = nil
			for _, s := range yardSamples {
				row.YardstickSampleSeconds = append(row.YardstickSampleSeconds, s.Seconds())
			}
		}
		// --perftest holds ib_write_bw rates: writes only.
		if v, ok := r.perftest.GBps[size]; ok && row.Op == OpWrite {
			pv, ratio := v, row.GBps/v
			row.PerftestGBps, row.RatioVsPerftest, row.PerftestRun = &pv, &ratio, r.perftest.Run
		}
		row.Verified = (row.AdHoc == nil || row.AdHoc.Verified) && (row.Prepared == nil || row.Prepared.Verified)
	}
	return nil
}

// ringResponse is a ring call's outcome as the RPC's answer, for the
// sweep's bookkeeping: a completion carries blocks, bytes, the wire phase
// and the daemon's total, not the other phases.
// The transport is the one the completion names, else the one asked for.
func ringResponse(kind b2bv1.TransportKind, res client.RawResult, err error) (*b2bv1.BatchTransferResponse, error) {
	if err != nil {
		return nil, err
	}
	if res.Transport != "" {
		kind = transportKind(res.Transport)
	}
	return &b2bv1.BatchTransferResponse{Blocks: res.Blocks, Bytes: res.Bytes, ElapsedNs: uint64(max(res.Wire, 0)), Transport: kind,
		Phases: &b2bv1.PhaseTimings{WireNs: uint64(max(res.Wire, 0)), TotalNs: uint64(max(res.Total, 0))}}, nil
}
