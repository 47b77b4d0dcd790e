package batch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/transport"
)

// Prepared transfers: a batch validated, merged, resolved and (where the
// connection is a transport.Preparer) built once, then submitted many times.
//
// A plan holds its source region from Prepare to Release, so deregistering
// the source fails with FailedPrecondition. It goes stale, and every later
// submit fails with FailedPrecondition saying to prepare it again, when its
// peer restarted (the peer's instance ID changed), or the destination no
// longer takes its key (re-registered, deregistered, or its export changed:
// the registry's Rekey revokes the old key, so the receiver refuses it
// before placing a byte). A broken connection is not staleness: the plan
// is prepared again on a fresh connection once, transparently, with the
// same retry rules as Run.

// DefaultMaxPlans is the default limit of plans per client identity.
const DefaultMaxPlans = 4096

// Owner is who holds a plan: the calling identity and its connection to
// the local API. Only the owner may submit or release a plan; plans of a
// connection that closed are released (ReleaseConn).
type Owner struct {
	Caller region.Caller
	Conn   uint64 // the client connection's ID; 0: unknown (never released with a connection)
}

// PlanInfo describes a prepared plan.
type PlanInfo struct {
	Handle        uint64 // never 0
	Blocks, Bytes uint64
	Kind          transport.Kind
	Segments      uint64 // after merging
	WorkRequests  uint64 // as the transport built them; 0 when it does not say
	Phases        Phases
}

// prepared is one plan in the table.
type prepared struct {
	handle   uint64
	owner    Owner
	p        *Plan
	instance uint64 // the peer's instance ID when prepared

	bind    atomic.Pointer[binding]
	stale   atomic.Pointer[staleness]
	rebind  chan struct{} // one slot: serialises re-preparing; a submit leaves at its deadline
	mu      sync.Mutex    // guards the rest
	active  int           // submits in flight
	dropped bool          // released: no new submits; freed when active is 0
}

type staleness struct{ err error }

// binding is a plan bound to one connection.
type binding struct {
	sess   transport.Session
	reg    transport.Registration
	remote transport.RemoteRegion
	prep   transport.Prepared // nil: the connection does not prepare; Conn.Write of the merged batch
	wrs    uint64             // the work requests prep built, when it says (a WorkRequests() uint64 method)
}

func (b *binding) write(ctx context.Context, p *Plan) (transport.Stats, error) {
	if b.prep != nil {
		return b.prep.Write(ctx)
	}
	return p.move(ctx, b.sess, b.reg, b.remote)
}

func (b *binding) close() {
	if b != nil && b.prep != nil {
		_ = b.prep.Close()
	}
}

// Plans is the table of prepared plans: it owns each plan from Prepare to
// Release and runs its submits through the service's attempt core.
type Plans struct {
	s       *Service // resolves, retries and notifies for the plans
	max     atomic.Int64
	mu      sync.RWMutex
	byID    map[uint64]*prepared
	perUser map[region.Caller]int
	closed  bool
}

// Plans is the service's table of prepared plans.
func (s *Service) Plans() *Plans { return s.plans }

// SetMax sets the limit of plans per client identity (<= 0: the default);
// block routes share it.
func (pt *Plans) SetMax(n int) {
	if n <= 0 {
		n = DefaultMaxPlans
	}
	pt.max.Store(int64(n))
}

// Len counts the plans held, for tests and Status.
func (pt *Plans) Len() int {
	pt.mu.RLock()
	defer pt.mu.RUnlock()
	return len(pt.byID)
}

// Prepare plans r once for o: it validates r, holds the source region,
// decodes and merges the descriptors, gets the data path, resolves the
// destination (afresh), checks the bounds, and has the connection build the
// batch's work when it can. The plan is o's until Release.
func (pt *Plans) Prepare(ctx context.Context, r Request, o Owner) (PlanInfo, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, pt.s.cfg.DefaultTimeout)
		defer cancel()
	}
	start := time.Now()
	info, err := pt.prepare(ctx, r, o)
	info.Phases.Total = time.Since(start)
	if err != nil {
		err = errs.ForCaller(ctx, err)
		pt.s.cfg.Log.Debug("prepare failed", "peer", r.Peer, "dst", r.Dst, "error", err)
	}
	return info, err
}

func (pt *Plans) prepare(ctx context.Context, r Request, o Owner) (PlanInfo, error) {
	if err := pt.reserve(o.Caller); err != nil {
		return PlanInfo{}, err
	}
	p, err := pt.s.Plan(r)
	if err != nil {
		pt.unreserve(o.Caller)
		return PlanInfo{}, err
	}
	pp := &prepared{owner: o, p: p, instance: pt.s.paths.peers.Instance(p.peer), rebind: make(chan struct{}, 1)}
	ph := Phases{Validate: p.validate, Plan: p.merge}
	b, err := pt.bind(ctx, pp, &ph, false)
	if err != nil {
		p.Close()
		pt.unreserve(o.Caller)
		return PlanInfo{}, err
	}
	if pp.instance == 0 { // the handshake happened in bind
		pp.instance = pt.s.paths.peers.Instance(p.peer)
	}
	pp.bind.Store(b)
	if err := pt.insert(pp); err != nil {
		b.close()
		p.Close()
		pt.unreserve(o.Caller)
		return PlanInfo{}, err
	}
	if err := ctx.Err(); err != nil {
		// The caller went away (its connection may have closed, and its
		// plans been released, before this one was in the table): it will
		// never learn the handle, so the plan goes now.
		_ = pt.Release(o, pp.handle)
		return PlanInfo{}, fmt.Errorf("prepare: caller went away: %w", err)
	}
	return PlanInfo{Handle: pp.handle, Blocks: p.blocks, Bytes: p.bytes, Kind: b.sess.Kind,
		Segments: uint64(p.merged.N()), WorkRequests: b.wrs, Phases: ph}, nil
}

// reserve counts a plan against who's limit.
func (pt *Plans) reserve(who region.Caller) error {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if pt.closed {
		return fmt.Errorf("%w: daemon is shutting down", errs.ErrUnavailable)
	}
	if max := int(pt.max.Load()); pt.perUser[who] >= max {
		return fmt.Errorf("%w: this client holds %d prepared plans, the limit (--max-plans) is %d: release some (ReleaseTransfer)", errs.ErrResourceExhausted, pt.perUser[who], max)
	}
	if pt.perUser == nil {
		pt.perUser = map[region.Caller]int{}
	}
	pt.perUser[who]++
	return nil
}

func (pt *Plans) unreserve(who region.Caller) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	pt.unreserveLocked(who)
}

func (pt *Plans) unreserveLocked(who region.Caller) {
	if n := pt.perUser[who]; n > 1 {
		pt.perUser[who] = n - 1
	} else {
		delete(pt.perUser, who)
	}
}

// insert gives pp a fresh random handle and puts it in the table.
func (pt *Plans) insert(pp *prepared) error {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if pt.closed {
		return fmt.Errorf("%w: daemon is shutting down", errs.ErrUnavailable)
	}
	if pt.byID == nil {
		pt.byID = map[uint64]*prepared{}
	}
	for {
		h := rand.Uint64()
		if _, dup := pt.byID[h]; h != 0 && !dup {
			pp.handle = h
			pt.byID[h] = pp
			return nil
		}
	}
}

// bind gets a data path for pp's plan, resolves its destination afresh,
// checks the bounds and builds the work. again: pp was bound before, and
// a destination whose key or size changed since makes it stale.
func (pt *Plans) bind(ctx context.Context, pp *prepared, ph *Phases, again bool) (*binding, error) {
	p := pp.p
	t0 := time.Now()
	pt.s.paths.forget(p.peer, p.dst, p.op)
	// A plan holds nothing on the peer: each submit is pinned there from
	// its first frame, and a destination deregistered between submits
	// makes the plan stale.
	sess, remote, reg, _, _, err := pt.s.paths.dst(ctx, p, false)
	if again {
		// Instance is 0 while the peer is unknown: a handshake that failed
		// (a paused peer, a submit's short deadline) or a peer reaped while
		// idle forgets it. That is no restart: only another ID is.
		if err := pp.restarted(pt.s.paths.peers.Instance(p.peer)); err != nil {
			return nil, err
		}
	}
	if err != nil {
		if again {
			return nil, pp.gone(err)
		}
		return nil, err
	}
	if again && pp.moved(sess, remote) {
		// The manager may not have handshaken since the peer restarted: its
		// control channel reconnects by itself, and the connection Get
		// handed out may be one the restart killed that nothing noticed
		// yet. A fresh handshake tells a restart from a re-registration.
		pt.s.paths.peers.Broken(p.peer, sess)
		sess, remote, reg, _, _, err = pt.s.paths.dst(ctx, p, false)
		if err := pp.restarted(pt.s.paths.peers.Instance(p.peer)); err != nil {
			return nil, err
		}
		if err != nil {
			return nil, pp.gone(err)
		}
		if pp.moved(sess, remote) {
			return nil, pp.markStale(fmt.Errorf("dst_region %q on peer %s was re-registered or its export changed", p.dst, p.peer))
		}
	}
	if err := p.checkRemote(remote.Size); err != nil {
		return nil, err
	}
	if err := pt.s.checkSelfOverlap(p.peer, p.dst, p.src, &p.batch, p.op); err != nil {
		return nil, err
	}
	t1 := time.Now()
	ph.Resolve += t1.Sub(t0)
	b := &binding{sess: sess, reg: reg, remote: remote}
	if pr := sess.Conn; sess.Caps.Prepared && p.op == OpWrite {
		// A pull's plan is the validated, merged batch and its binding:
		// each submit reads it (no transport builds read work ahead yet).
		if again {
			b.prep, err = pp.prepareWithin(ctx, pr, reg, remote)
		} else {
			b.prep, err = transport.Prepare(pr, reg, remote, &p.merged)
		}
		if err != nil {
			if sess.Conn.Err() != nil {
				pt.s.paths.peers.Broken(p.peer, sess)
			}
			return nil, fmt.Errorf("prepare batch of %d blocks to %s/%s over %s: %w", p.blocks, p.peer, p.dst, sess.Kind, err)
		}
		ph.Plan += time.Since(t1)
		if w, ok := b.prep.(interface{ WorkRequests() uint64 }); ok {
			b.wrs = w.WorkRequests()
		}
	}
	return b, nil
}

// prepareWithin is pr.Prepare of pp's batch for a submit, answering by
// ctx's end: Prepare takes no context, and a transport's warm-up there
// waits on the peer up to its own bound (the same-host path's, 30 s, when
// the peer is stopped), far past a submit's deadline. A Prepare that ends
// after ctx is closed then; until it ends it counts as a submit in flight,
// so the plan and its source stay.
func (pp *prepared) prepareWithin(ctx context.Context, pr transport.Conn, reg transport.Registration, remote transport.RemoteRegion) (transport.Prepared, error) {
	type result struct {
		p   transport.Prepared
		err error
	}
	done := make(chan result, 1)
	pp.mu.Lock()
	pp.active++
	pp.mu.Unlock()
	go func() {
		p, err := transport.Prepare(pr, reg, remote, &pp.p.merged)
		done <- result{p, err}
	}()
	select {
	case r := <-done:
		pp.done()
		return r.p, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.p != nil {
				_ = r.p.Close()
			}
			pp.done()
		}()
		return nil, fmt.Errorf("%w before the transport prepared it again: %w", ctx.Err(), transport.ErrNotSent)
	}
}

// moved says whether the destination resolved as remote over sess is not
// the one pp is bound to: another key or size (re-registered, or its
// export changed), or another kind of data path.
func (pp *prepared) moved(sess transport.Session, remote transport.RemoteRegion) bool {
	old := pp.bind.Load()
	return remote.Key != old.remote.Key || remote.Size != old.remote.Size || sess.Kind != old.sess.Kind
}

// gone is err, a re-bind's failure to get or resolve the destination,
// marking pp stale when the peer said it has no such destination.
func (pp *prepared) gone(err error) error {
	if errors.Is(err, errs.ErrNotFound) {
		return pp.markStale(fmt.Errorf("dst_region %q is gone from peer %s (deregistered or no longer exported): %w", pp.p.dst, pp.p.peer, err))
	}
	return err
}

// restarted marks pp stale when inst, the peer's instance ID now, names
// another start of the peer than the one pp was prepared under; 0 (the
// peer is not known at the moment) says nothing. The message is the one
// clients match ("its peer P restarted; prepare it again").
func (pp *prepared) restarted(inst uint64) error {
	if pp.instance == 0 || inst == 0 || inst == pp.instance {
		return nil
	}
	return pp.markStale(fmt.Errorf("its peer %s restarted", pp.p.peer))
}

// markStale records why pp is stale and returns the error every submit of
// it gets from now on.
func (pp *prepared) markStale(why error) error {
	st := &staleness{err: fmt.Errorf("%w: plan %d is stale: %w; prepare it again", errs.ErrFailedPrecondition, pp.handle, why)}
	if !pp.stale.CompareAndSwap(nil, st) {
		st = pp.stale.Load()
	}
	return st.err
}

// notFound is the error for a handle that o does not hold.
func notFound(h uint64) error {
	return fmt.Errorf("%w: plan %d: no such prepared transfer for this client (released, never prepared, or another client's)", errs.ErrNotFound, h)
}

// acquire finds o's plan h and counts a submit in flight on it; anyConn:
// a plan of o.Caller made on any connection.
func (pt *Plans) acquire(h uint64, o Owner, anyConn bool) (*prepared, bool) {
	pt.mu.RLock()
	pp := pt.byID[h]
	pt.mu.RUnlock()
	if pp == nil || pp.owner.Caller != o.Caller || !anyConn && pp.owner.Conn != o.Conn {
		return nil, false
	}
	pp.mu.Lock()
	defer pp.mu.Unlock()
	if pp.dropped {
		return nil, false
	}
	pp.active++
	return pp, true
}

// done ends a submit of pp, freeing it when it was released meanwhile.
func (pp *prepared) done() {
	pp.mu.Lock()
	pp.active--
	free := pp.dropped && pp.active == 0
	pp.mu.Unlock()
	if free {
		pp.free()
	}
}

func (pp *prepared) free() {
	pp.bind.Swap(nil).close()
	pp.p.Close()
}

// Submit runs o's plan h and returns once every byte landed, the receiver
// acknowledged the batch and its notification (if any) was delivered, like
// Run. It allocates nothing on success when ctx has a deadline (without one
// it runs under DefaultTimeout).
func (pt *Plans) Submit(ctx context.Context, o Owner, h uint64) (Result, error) {
	return pt.submitAs(ctx, o, h, false)
}

// SubmitByCaller is Submit for a plan that who made on any of its
// connections: the raw submit socket, which is a connection of its own,
// uses the plans its caller prepared over gRPC.
func (pt *Plans) SubmitByCaller(ctx context.Context, who region.Caller, h uint64) (Result, error) {
	return pt.submitAs(ctx, Owner{Caller: who}, h, true)
}

func (pt *Plans) submitAs(ctx context.Context, o Owner, h uint64, anyConn bool) (Result, error) {
	start := time.Now()
	pp, ok := pt.acquire(h, o, anyConn)
	if !ok {
		pt.s.cfg.Counters.BatchesFailed.Add(1)
		return Result{}, notFound(h)
	}
	defer pp.done()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, pt.s.cfg.DefaultTimeout)
		defer cancel()
	}
	sctx, scancel := early(ctx, pp.p.op)
	res, err := pt.submit(sctx, pp)
	scancel()
	res.Phases.Total = time.Since(start)
	if err != nil {
		err = errs.ForCaller(ctx, err)
		pt.s.cfg.Counters.BatchesFailed.Add(1)
		pt.s.cfg.Log.Debug("submit failed", "plan", h, "peer", pp.p.peer, "dst", pp.p.dst, "error", err)
	}
	return res, err
}

func (pt *Plans) submit(ctx context.Context, pp *prepared) (Result, error) {
	p := pp.p
	if st := pp.stale.Load(); st != nil {
		return Result{}, st.err
	}
	if err := pp.restarted(pt.s.paths.peers.Instance(p.peer)); err != nil {
		return Result{}, err
	}
	var (
		ph    Phases
		st    transport.Stats
		start time.Time
	)
	b := pp.bind.Load()
	if b == nil { // freed under us: only at shutdown
		return Result{}, fmt.Errorf("%w: plan %d was released", errs.ErrNotFound, pp.handle)
	}
	// The plan's binding is its resolution, made once: a key the receiver
	// refuses is no cache to drop but a plan to prepare again.
	pol := retryPolicy{peer: p.peer, fresh: "preparing again on a fresh connection"}
	stale := func(err error) error {
		return pp.markStale(fmt.Errorf("dst_region %q on peer %s refused its key (re-registered, deregistered or its export changed): %w", p.dst, p.peer, err))
	}
	err := pt.s.retry(ctx, pol, stale, func(ctx context.Context, rerun bool) (ran, error) {
		if rerun {
			// Every run again follows a connection that broke (under the
			// last write, before it, or under a re-bind): prepare on a
			// fresh one, made by this submit or a concurrent one.
			nb, err := pt.rebound(ctx, pp, b, &ph)
			if st := pp.stale.Load(); st != nil {
				return ran{}, st.err
			}
			if err != nil {
				return ran{}, err
			}
			b = nb
		}
		if err := b.sess.Conn.Err(); err != nil {
			// The connection broke since the last submit: nothing of this
			// one was sent. The policy tells the manager, as a failed
			// write tells it, so that it handshakes afresh: a peer that
			// restarted meanwhile is known by its new instance ID, not
			// mistaken for a re-registered destination when the control
			// channel reconnected by itself.
			return ran{sess: b.sess, posted: true}, fmt.Errorf("%w: connection broke before the submit: %w", transport.ErrNotSent, err)
		}
		if err := passGate(ctx); err != nil {
			return ran{}, err
		}
		var err error
		start = time.Now()
		st, err = b.write(ctx, p)
		ph.write(st, start)
		if err != nil {
			return ran{sess: b.sess, posted: true, cached: true}, p.writeFailed(b.sess.Kind, err)
		}
		return ran{}, nil
	})
	if err != nil {
		if st := pp.stale.Load(); st != nil && errors.Is(err, st.err) {
			return Result{}, st.err // the news that matters: prepare again
		}
		return Result{}, err
	}
	return pt.s.landed(ctx, p, b.sess.Kind, st, start, ph)
}

// rebound returns pp's binding on a fresh connection, made by this submit
// or by a concurrent one that found old broken too.
func (pt *Plans) rebound(ctx context.Context, pp *prepared, old *binding, ph *Phases) (*binding, error) {
	// Another submit may be re-preparing against a stopped peer: this one
	// waits no longer than its own deadline (nothing of it was sent).
	select {
	case pp.rebind <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("plan %d: %w while another submit prepared it again on a fresh connection: %w", pp.handle, ctx.Err(), transport.ErrNotSent)
	}
	defer func() { <-pp.rebind }()
	if st := pp.stale.Load(); st != nil {
		return nil, st.err
	}
	if cur := pp.bind.Load(); cur != old {
		if cur == nil {
			return nil, fmt.Errorf("%w: plan %d was released", errs.ErrNotFound, pp.handle)
		}
		return cur, nil
	}
	nb, err := pt.bind(ctx, pp, ph, true)
	if err != nil {
		return nil, err
	}
	if !pp.bind.CompareAndSwap(old, nb) { // freed meanwhile
		nb.close()
		return nil, fmt.Errorf("%w: plan %d was released", errs.ErrNotFound, pp.handle)
	}
	old.close() // a Prepared is freed once its writes in flight end
	return nb, nil
}

// Release frees o's plan h; a plan with submits in flight is freed when
// they end. Someone else's handle is NotFound.
func (pt *Plans) Release(o Owner, h uint64) error {
	pt.mu.Lock()
	pp := pt.byID[h]
	if pp == nil || pp.owner != o {
		pt.mu.Unlock()
		return notFound(h)
	}
	pt.dropLocked(pp)
	pt.mu.Unlock()
	pp.drop()
	return nil
}

// dropLocked takes pp out of the table; the caller then calls pp.drop.
func (pt *Plans) dropLocked(pp *prepared) {
	delete(pt.byID, pp.handle)
	pt.unreserveLocked(pp.owner.Caller)
}

// drop marks pp released and frees it unless submits are in flight.
func (pp *prepared) drop() {
	pp.mu.Lock()
	pp.dropped = true
	free := pp.active == 0
	pp.mu.Unlock()
	if free {
		pp.free()
	}
}

// ReleaseConn frees every plan made over the client connection conn (its
// connection closed); it returns how many.
func (pt *Plans) ReleaseConn(conn uint64) int {
	if conn == 0 {
		return 0
	}
	return pt.releaseIf(func(o Owner) bool { return o.Conn == conn })
}

// ReleaseOwner frees every plan o holds.
func (pt *Plans) ReleaseOwner(o Owner) int {
	return pt.releaseIf(func(x Owner) bool { return x == o })
}

// close frees every plan and refuses new ones (daemon shutdown).
func (pt *Plans) close() {
	pt.mu.Lock()
	pt.closed = true
	pt.mu.Unlock()
	pt.releaseIf(func(Owner) bool { return true })
}

func (pt *Plans) releaseIf(match func(Owner) bool) int {
	var drop []*prepared
	pt.mu.Lock()
	for _, pp := range pt.byID {
		if match(pp.owner) {
			pt.dropLocked(pp)
			drop = append(drop, pp)
		}
	}
	pt.mu.Unlock()
	for _, pp := range drop {
		pp.drop()
	}
	return len(drop)
}
