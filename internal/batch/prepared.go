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

// plans is the table of prepared plans.
type plans struct {
	mu      sync.RWMutex
	byID    map[uint64]*prepared
	perUser map[region.Caller]int
	closed  bool
}

// SetMaxPlans sets the limit of plans per client identity (<= 0: the default).
func (s *Service) SetMaxPlans(n int) {
	if n <= 0 {
		n = DefaultMaxPlans
	}
	s.maxPlans.Store(int64(n))
}

// Plans counts the plans held, for tests and Status.
func (s *Service) Plans() int {
	s.plans.mu.RLock()
	defer s.plans.mu.RUnlock()
	return len(s.plans.byID)
}

// Prepare plans r once for o: it validates r, holds the source region,
// decodes and merges the descriptors, gets the data path, resolves the
// destination (afresh), checks the bounds, and has the connection build the
// batch's work when it can. The plan is o's until Release.
func (s *Service) Prepare(ctx context.Context, r Request, o Owner) (PlanInfo, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.DefaultTimeout)
		defer cancel()
	}
	start := time.Now()
	info, err := s.prepare1(ctx, r, o)
	info.Phases.Total = time.Since(start)
	if err != nil {
		err = errs.ForCaller(ctx, err)
		s.cfg.Log.Debug("prepare failed", "peer", r.Peer, "dst", r.Dst, "error", err)
	}
	return info, err
}

func (s *Service) prepare1(ctx context.Context, r Request, o Owner) (PlanInfo, error) {
	if err := s.reserve(o.Caller); err != nil {
		return PlanInfo{}, err
	}
	p, err := s.Plan(r)
	if err != nil {
		s.unreserve(o.Caller)
		return PlanInfo{}, err
	}
	pp := &prepared{owner: o, p: p, instance: s.cfg.Peers.Instance(p.peer), rebind: make(chan struct{}, 1)}
	ph := Phases{Validate: p.validate, Plan: p.merge}
	b, err := s.bind(ctx, pp, &ph, false)
	if err != nil {
		p.Close()
		s.unreserve(o.Caller)
		return PlanInfo{}, err
	}
	if pp.instance == 0 { // the handshake happened in bind
		pp.instance = s.cfg.Peers.Instance(p.peer)
	}
	pp.bind.Store(b)
	if err := s.insert(pp); err != nil {
		b.close()
		p.Close()
		s.unreserve(o.Caller)
		return PlanInfo{}, err
	}
	if err := ctx.Err(); err != nil {
		// The caller went away (its connection may have closed, and its
		// plans been released, before this one was in the table): it will
		// never learn the handle, so the plan goes now.
		_ = s.Release(o, pp.handle)
		return PlanInfo{}, fmt.Errorf("prepare: caller went away: %w", err)
	}
	return PlanInfo{Handle: pp.handle, Blocks: p.blocks, Bytes: p.bytes, Kind: b.sess.Kind,
		Segments: uint64(p.merged.N()), WorkRequests: b.wrs, Phases: ph}, nil
}

// reserve counts a plan against who's limit.
func (s *Service) reserve(who region.Caller) error {
	s.plans.mu.Lock()
	defer s.plans.mu.Unlock()
	if s.plans.closed {
		return fmt.Errorf("%w: daemon is shutting down", errs.ErrUnavailable)
	}
	if max := int(s.maxPlans.Load()); s.plans.perUser[who] >= max {
		return fmt.Errorf("%w: this client holds %d prepared plans, the limit (--max-plans) is %d: release some (ReleaseTransfer)", errs.ErrResourceExhausted, s.plans.perUser[who], max)
	}
	if s.plans.perUser == nil {
		s.plans.perUser = map[region.Caller]int{}
	}
	s.plans.perUser[who]++
	return nil
}

func (s *Service) unreserve(who region.Caller) {
	s.plans.mu.Lock()
	defer s.plans.mu.Unlock()
	s.unreserveLocked(who)
}

func (s *Service) unreserveLocked(who region.Caller) {
	if n := s.plans.perUser[who]; n > 1 {
		s.plans.perUser[who] = n - 1
	} else {
		delete(s.plans.perUser, who)
	}
}

// insert gives pp a fresh random handle and puts it in the table.
func (s *Service) insert(pp *prepared) error {
	s.plans.mu.Lock()
	defer s.plans.mu.Unlock()
	if s.plans.closed {
		return fmt.Errorf("%w: daemon is shutting down", errs.ErrUnavailable)
	}
	if s.plans.byID == nil {
		s.plans.byID = map[uint64]*prepared{}
	}
	for {
		h := rand.Uint64()
		if _, dup := s.plans.byID[h]; h != 0 && !dup {
			pp.handle = h
			s.plans.byID[h] = pp
			return nil
		}
	}
}

// bind gets a data path for pp's plan, resolves its destination afresh,
// checks the bounds and builds the work. again: pp was bound before, and
// a destination whose key or size changed since makes it stale.
func (s *Service) bind(ctx context.Context, pp *prepared, ph *Phases, again bool) (*binding, error) {
	p := pp.p
	t0 := time.Now()
	s.forget(p.peer, p.dst, p.op)
	// A plan holds nothing on the peer: each submit is pinned there from
	// its first frame, and a destination deregistered between submits
	// makes the plan stale.
	sess, remote, reg, _, _, err := s.prepare(ctx, p, false)
	if again {
		// Instance is 0 while the peer is unknown: a handshake that failed
		// (a paused peer, a submit's short deadline) or a peer reaped while
		// idle forgets it. That is no restart: only another ID is.
		if err := pp.restarted(s.cfg.Peers.Instance(p.peer)); err != nil {
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
		s.cfg.Peers.Broken(p.peer, sess)
		sess, remote, reg, _, _, err = s.prepare(ctx, p, false)
		if err := pp.restarted(s.cfg.Peers.Instance(p.peer)); err != nil {
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
				s.cfg.Peers.Broken(p.peer, sess)
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
func (s *Service) acquire(h uint64, o Owner, anyConn bool) (*prepared, bool) {
	s.plans.mu.RLock()
	pp := s.plans.byID[h]
	s.plans.mu.RUnlock()
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
func (s *Service) Submit(ctx context.Context, o Owner, h uint64) (Result, error) {
	return s.submitAs(ctx, o, h, false)
}

// SubmitByCaller is Submit for a plan that who made on any of its
// connections: the raw submit socket, which is a connection of its own,
// uses the plans its caller prepared over gRPC.
func (s *Service) SubmitByCaller(ctx context.Context, who region.Caller, h uint64) (Result, error) {
	return s.submitAs(ctx, Owner{Caller: who}, h, true)
}

func (s *Service) submitAs(ctx context.Context, o Owner, h uint64, anyConn bool) (Result, error) {
	start := time.Now()
	pp, ok := s.acquire(h, o, anyConn)
	if !ok {
		s.cfg.Counters.BatchesFailed.Add(1)
		return Result{}, notFound(h)
	}
	defer pp.done()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.DefaultTimeout)
		defer cancel()
	}
	sctx, scancel := early(ctx, pp.p.op)
	res, err := s.submit(sctx, pp)
	scancel()
	res.Phases.Total = time.Since(start)
	if err != nil {
		err = errs.ForCaller(ctx, err)
		s.cfg.Counters.BatchesFailed.Add(1)
		s.cfg.Log.Debug("submit failed", "plan", h, "peer", pp.p.peer, "dst", pp.p.dst, "error", err)
	}
	return res, err
}

func (s *Service) submit(ctx context.Context, pp *prepared) (Result, error) {
	p := pp.p
	if st := pp.stale.Load(); st != nil {
		return Result{}, st.err
	}
	if err := pp.restarted(s.cfg.Peers.Instance(p.peer)); err != nil {
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
	err := s.retry(ctx, pol, stale, func(ctx context.Context, rerun bool) (ran, error) {
		if rerun {
			// Every run again follows a connection that broke (under the
			// last write, before it, or under a re-bind): prepare on a
			// fresh one, made by this submit or a concurrent one.
			nb, err := s.rebound(ctx, pp, b, &ph)
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
	return s.landed(ctx, p, b.sess.Kind, st, start, ph)
}

// rebound returns pp's binding on a fresh connection, made by this submit
// or by a concurrent one that found old broken too.
func (s *Service) rebound(ctx context.Context, pp *prepared, old *binding, ph *Phases) (*binding, error) {
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
	nb, err := s.bind(ctx, pp, ph, true)
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
func (s *Service) Release(o Owner, h uint64) error {
	s.plans.mu.Lock()
	pp := s.plans.byID[h]
	if pp == nil || pp.owner != o {
		s.plans.mu.Unlock()
		return notFound(h)
	}
	s.dropLocked(pp)
	s.plans.mu.Unlock()
	pp.drop()
	return nil
}

// dropLocked takes pp out of the table; the caller then calls pp.drop.
func (s *Service) dropLocked(pp *prepared) {
	delete(s.plans.byID, pp.handle)
	s.unreserveLocked(pp.owner.Caller)
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
func (s *Service) ReleaseConn(conn uint64) int {
	if conn == 0 {
		return 0
	}
	return s.releaseIf(func(o Owner) bool { return o.Conn == conn })
}

// ReleaseOwner frees every plan o holds.
func (s *Service) ReleaseOwner(o Owner) int {
	return s.releaseIf(func(x Owner) bool { return x == o })
}

// Close frees every plan and refuses new ones (daemon shutdown).
func (s *Service) Close() {
	// First: a running transfer may hold a plan or a layout's regions.
	s.async.Close()
	s.plans.mu.Lock()
	s.plans.closed = true
	s.plans.mu.Unlock()
	s.releaseIf(func(Owner) bool { return true })
	s.layouts.Close()
}

func (s *Service) releaseIf(match func(Owner) bool) int {
	var drop []*prepared
	s.plans.mu.Lock()
	for _, pp := range s.plans.byID {
		if match(pp.owner) {
			s.dropLocked(pp)
			drop = append(drop, pp)
		}
	}
	s.plans.mu.Unlock()
	for _, pp := range drop {
		pp.drop()
	}
	return len(drop)
}
