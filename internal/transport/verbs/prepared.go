package verbs

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
	ibv "github.com/b2bd/b2bd/verbs"
)

// prepared is a batch planned once on one sending set: its WRs and SGEs,
// one share per QP, live in C memory (ibv.Plan). A submit rewinds each
// share to its QP's sequence number and posts it in chains within the
// credits (the C side patches wr_ids, the signaled flag of each chain's
// last WR and the immediate), so it plans nothing and allocates nothing.
type prepared struct {
	s      *qpSet
	reg    *registration
	dst    transport.RemoteRegion
	nq     int
	blocks uint64
	bytes  uint64
	sges   uint64
	host   bool

	// Guarded by the set's sem (every Write of the plan holds it): the C
	// plan and the MR its lkeys are stamped with.
	plan *ibv.Plan
	mr   *ibv.MR
	jobs []postJob // one per share
	wg   sync.WaitGroup

	mu       sync.Mutex
	inflight int
	closed   bool
}

// Prepare plans b from src into dst once (Conn.Prepare): the
// batch is validated, split across the set's QPs, and every WR and SGE of
// every share built in C memory, in one cgo call.
func (s *qpSet) Prepare(r *transport.Request) (transport.Prepared, error) {
	src, dst, b, err := transport.PreparedWrite(r)
	if err != nil {
		return nil, err
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	if !s.sender {
		return nil, fmt.Errorf("verbs: prepare: not a sending connection: %w", errs.ErrInvalidArgument)
	}
	reg, total, err := s.checkArgs("prepare", src, dst, b, false)
	if err != nil {
		return nil, err
	}
	ref := reg.use()
	if ref == nil {
		return nil, fmt.Errorf("verbs: prepare: source registration %s: %w", reg.unusable(), errs.ErrFailedPrecondition)
	}
	defer reg.done(ref)
	t := s.t
	cfg := &t.cfg
	cuts := make([]ibv.Pos, len(s.qps)+1)
	nq := 0
	if total > 0 {
		want := int((total + uint64(cfg.MinQPBytes) - 1) / uint64(cfg.MinQPBytes))
		nq = splitBatch(b.Len, total, min(len(s.qps), want), cuts)
	}
	params := planParams(t, ref.mr, reg.mem, dst)
	plan, err := ibv.NewPlan(&params, b.Src, b.Dst, b.Len, cuts[:nq+1])
	if err != nil {
		return nil, fmt.Errorf("verbs: prepare %d blocks to %s: %w", b.N(), s.peer, err)
	}
	_, sges, _ := plan.Totals()
	p := &prepared{s: s, reg: reg, dst: dst, nq: nq, blocks: uint64(b.N()), bytes: total, sges: uint64(sges),
		host: reg.mem.Kind == memory.Host, plan: plan, mr: ref.mr, jobs: make([]postJob, nq)}
	for k := range p.jobs {
		p.jobs[k].plan, p.jobs[k].k = plan, k
	}
	return p, nil
}

// planParams are the chain parameters of a batch from mr (over mem) into dst.
func planParams(t *Transport, mr *ibv.MR, mem memory.Memory, dst transport.RemoteRegion) ibv.ChainParams {
	cfg := &t.cfg
	p := ibv.ChainParams{
		SrcBase: mr.Addr(), DstBase: dst.Key.Addr, SrcLimit: mem.Len, DstLimit: dst.Size,
		LKey: mr.LKey(), RKey: uint32(dst.Key.Key), MaxWR: cfg.MaxChain, MaxSGE: t.maxSGE,
		MaxWRBytes: t.wrBytes, MaxChainBytes: uint64(cfg.ChainBytes), SignalEvery: cfg.SignalEvery,
	}
	if mem.Kind == memory.Host {
		p.InlineMax = t.inline // the CPU reads inline data: never for GPU memory
	}
	return p
}

// enter registers a Write; false once closed.
func (p *prepared) enter() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.inflight++
	return true
}

// leave ends a Write; the last one out of a closed plan frees it.
func (p *prepared) leave() {
	p.mu.Lock()
	p.inflight--
	free := p.closed && p.inflight == 0
	p.mu.Unlock()
	if free {
		p.plan.Close()
	}
}

// Close frees the plan, at once or when the Write in flight ends; safe
// twice.
func (p *prepared) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	free := p.inflight == 0
	p.mu.Unlock()
	if free {
		p.plan.Close()
	}
	return nil
}

// Write posts the prepared batch; see transport.Prepared. Like qpSet.Write
// it is serialised on the set, holds the source MR for the batch, and
// allocates nothing.
func (p *prepared) Write(ctx context.Context) (st transport.Stats, err error) {
	if !p.enter() {
		return st, fmt.Errorf("verbs: prepared write: plan released: %w", errs.ErrFailedPrecondition)
	}
	defer p.leave()
	s := p.s
	if err := s.Err(); err != nil {
		return st, err
	}
	waited, err := s.acquireWrite(ctx, "prepared write")
	if err != nil {
		return st, err
	}
	defer s.releaseWrite()
	defer func() { st.Post += waited }()
	ref := p.reg.use()
	if ref == nil {
		return st, fmt.Errorf("verbs: prepared write: source registration %s: %w", p.reg.unusable(), errs.ErrFailedPrecondition)
	}
	defer p.reg.done(ref)
	if ref.mr != p.mr {
		// The source was rekeyed since the plan was stamped: re-stamp every
		// SGE with the current MR (held above), never post the retired one.
		t0 := time.Now()
		p.plan.Restamp(ref.mr.LKey(), ref.mr.Addr())
		p.mr = ref.mr
		st.Post += time.Since(t0)
	}
	return s.writePrepared(ctx, p, st)
}

func (s *qpSet) writePrepared(ctx context.Context, p *prepared, st transport.Stats) (transport.Stats, error) {
	t := s.t
	cfg := &t.cfg
	s.tag = nextTag(s.tag)
	tag := s.tag
	s.batchBytes = p.bytes
	nq := p.nq
	first := s.rot % len(s.qps)
	s.rot++
	if err := s.postMeta(ctx, &st, first, message{tag: tag, nqp: uint32(nq), rkey: uint32(p.dst.Key.Key), blocks: p.blocks, bytes: p.bytes}); err != nil {
		return st, err
	}
	st.Segments = p.sges
	minPost := max(1, cfg.MaxChain/4)
	for k := 0; k < nq; k++ {
		q := s.qps[(first+k)%len(s.qps)]
		p.plan.Start(k, q.posted)
		j := &p.jobs[k]
		// Chains as the ad hoc path's: MaxChain WRs or ChainBytes at most,
		// within the credits. (Chains of up to every free credit, 512,
		// patch faster without a NIC, 18-20 against 27-41 µs per 10,000
		// WRs, but were slower in the one Soft-RoCE run that compared them, 454
		// against 364 ms per batch
		// of 10,000 x 128 B, where rxe does the send work inside
		// ibv_post_send; capped at MaxChain, the next run gave 292 against
		// 306 ms.)
		j.q, j.tag, j.maxWR, j.maxBytes, j.minPost = q, tag, cfg.MaxChain, uint64(cfg.ChainBytes), minPost
		j.ctx = ctx
		j.watch = nil
	}
	// As postChains: a share still inside a post call past the deadline
	// is stopped from outside it.
	if s.armPostCut(ctx) {
		defer s.postCut.Stop()
		for k := range p.jobs {
			p.jobs[k].watch = s
		}
	}
	for pending := nq; pending > 0; {
		t0 := time.Now()
		wrs, err := t.posters.run(p.jobs, &p.wg)
		st.Post += time.Since(t0)
		st.WorkRequests += uint64(wrs)
		// Every job ran to the end of its credits: seq is exact even after
		// a failed post.
		pending = 0
		for k := range p.jobs {
			p.jobs[k].q.posted = p.plan.Seq(k)
			if p.plan.Left(k) > 0 {
				pending++
			}
		}
		if err != nil && s.cutEarly.Load() { // failed on the cut's stopped QPs, past ctx's deadline
			<-ctx.Done()
			return st, s.abandon(ctx, tag)
		}
		if err != nil {
			err = fmt.Errorf("verbs: prepared batch %d to %s: %w", tag, s.peer, err)
			s.fail(err, true)
			return st, err
		}
		if pending > 0 && ctx.Err() != nil { // see write
			return st, s.abandon(ctx, tag)
		}
		if wrs == 0 && pending > 0 {
			if err := s.waitCredit(ctx, tag); err != nil {
				return st, err
			}
		}
	}
	for k := range p.jobs {
		p.jobs[k].ctx, p.jobs[k].watch = nil, nil // not kept past the Write
	}
	return st, s.awaitAck(ctx, tag, &p.dst)
}

// postJob posts one share of a prepared batch, chain after chain, while
// its QP has credits. The QP's posted count is written back by the caller
// from the plan's sequence number once every job ended.
type postJob struct {
	plan     *ibv.Plan
	k        int
	q        *qpState        // nil: patch only (benchmarks)
	ctx      context.Context // checked before every chain but the first
	watch    *qpSet          // non-nil: its post calls are bracketed for the post watch
	tag      uint32
	maxWR    int
	maxBytes uint64
	minPost  int

	wrs int
	err error
	wg  *sync.WaitGroup
}

func (j *postJob) runnable() bool {
	left := j.plan.Left(j.k)
	if left == 0 {
		return false
	}
	return j.q == nil || j.q.avail() >= min(j.minPost, left)
}

func (j *postJob) run() {
	j.wrs, j.err = 0, nil
	for j.runnable() {
		// rxe does the send work inside ibv_post_send and never runs out of
		// credits, so without this a share is posted to its end whatever
		// the deadline; the caller abandons the batch when ctx ended.
		if j.wrs > 0 && j.ctx != nil && j.ctx.Err() != nil {
			return
		}
		n := j.maxWR
		var posted int
		var err error
		if j.q == nil {
			posted, _, err = j.plan.Patch(j.k, n, j.maxBytes, j.tag)
		} else {
			n = min(n, j.q.avail())
			if j.watch != nil {
				j.watch.enterPost()
			}
			posted, _, err = j.q.qp.PostPlan(j.plan, j.k, n, j.maxBytes, j.tag)
			if j.watch != nil {
				j.watch.leavePost()
			}
			j.q.posted = j.plan.Seq(j.k)
		}
		j.wrs += posted
		if err != nil {
			j.err = err
			return
		}
	}
}

// posters is a pool of goroutines locked to OS threads that post the
// shares of prepared batches in parallel, one cgo call per chain each.
// With n threads, the caller posts one share and n-1 workers the others.
type posters struct {
	n    int
	jobs chan *postJob
	stop chan struct{}
	wg   sync.WaitGroup
}

// newPosters starts n-1 workers (none when n <= 1).
func newPosters(n int) *posters {
	pp := &posters{n: max(n, 1), jobs: make(chan *postJob, maxQPsPerConn), stop: make(chan struct{})}
	for k := 1; k < pp.n; k++ {
		pp.wg.Add(1)
		go pp.loop()
	}
	return pp
}

func (pp *posters) loop() {
	defer pp.wg.Done()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for {
		select {
		case j := <-pp.jobs:
			j.run()
			j.wg.Done()
		case <-pp.stop:
			return
		}
	}
}

// close stops the workers; safe twice and on nil.
func (pp *posters) close() {
	if pp == nil || pp.stop == nil {
		return
	}
	select {
	case <-pp.stop:
	default:
		close(pp.stop)
	}
	pp.wg.Wait()
}

// run runs every runnable job once (each posts its share while credits
// last), in parallel when there are workers, and returns the WRs posted and
// the first error. The caller's goroutine runs the first runnable job.
func (pp *posters) run(jobs []postJob, wg *sync.WaitGroup) (int, error) {
	var mine *postJob
	for k := range jobs {
		j := &jobs[k]
		j.wrs, j.err, j.wg = 0, nil, nil
		if !j.runnable() {
			continue
		}
		if mine == nil || pp == nil || pp.n <= 1 {
			if mine == nil {
				mine = j
				continue
			}
			j.run()
			continue
		}
		j.wg = wg
		wg.Add(1)
		select {
		case pp.jobs <- j:
		default: // the queue is full: post it here
			j.wg = nil
			wg.Done()
			j.run()
		}
	}
	if mine != nil {
		mine.run()
	}
	wg.Wait()
	wrs := 0
	var err error
	for k := range jobs {
		wrs += jobs[k].wrs
		if err == nil {
			err = jobs[k].err
		}
	}
	return wrs, err
}
