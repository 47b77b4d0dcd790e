package batch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/notify"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/transport"
)

// BlocksRequest is one TransferBlocks call as the caller gave it.
type BlocksRequest struct {
	Local        string        // the local layout's name
	Caller       region.Caller // who asks: the layout must be theirs
	Peer         string
	Remote       string // the peer's layout export name
	LocalIDs     []byte // packed little-endian uint32
	RemoteIDs    []byte
	Transport    transport.Kind
	BadTransport error
	Notification []byte
	// Op: OpRead copies block RemoteIDs[i] of the peer's layout into block
	// LocalIDs[i] of the local one; LocalIDs must then be unique and
	// RemoteIDs may repeat.
	Op    Op
	BadOp error
}

// blockScratch is a request's reusable memory: its runs and the descriptor
// arrays each (source region, destination region) stretch is written from.
type blockScratch struct {
	bs       transport.BlockScratch
	blk      transport.Blocks  // the request as the Conn takes it
	req      transport.Request // kept here, so posting it allocates nothing
	srcs     []transport.Registration
	dsts     []transport.RemoteRegion
	rsrcs    []transport.RemoteRegion // a pull's: the peer's regions
	rdsts    []transport.Registration // a pull's: ours
	regions  []*region.Region
	releases []func()
}

// blockXfer is one block request in flight: the request, its local
// layout, the regions it holds and the memory its attempts reuse. Pooled,
// so that a request allocates none of it.
type blockXfer struct {
	s  *Service
	r  BlocksRequest
	e  *Entry
	ph Phases
	sc blockScratch
}

var blockXfers = sync.Pool{New: func() any { return new(blockXfer) }}

// done lets go of x's regions and returns it to the pool, keeping only
// its scratch memory.
func (x *blockXfer) done() {
	sc := &x.sc
	for _, rel := range sc.releases {
		rel()
	}
	clear(sc.regions)
	sc.regions, sc.releases = sc.regions[:0], sc.releases[:0]
	x.s, x.r, x.e, x.ph = nil, BlocksRequest{}, nil, Phases{}
	blockXfers.Put(x)
}

// Layouts is the service's layout registry.
func (s *Service) Layouts() *Layouts { return s.layouts }

// TransferBlocks moves block LocalIDs[i] of every segment of the local
// layout to block RemoteIDs[i] of the peer's layout, under the caller's
// deadline (else DefaultTimeout). It returns once every byte of every
// segment landed and was acknowledged, and the notification (to watchers of
// the remote layout's first region) was delivered.
func (s *Service) TransferBlocks(ctx context.Context, r BlocksRequest) (Result, error) {
	return s.bounded(ctx, func(ctx context.Context) (Result, error) { return s.transferBlocks(ctx, r) }, "block transfer failed", "peer", r.Peer, "remote_layout", r.Remote)
}

func (s *Service) transferBlocks(ctx context.Context, r BlocksRequest) (Result, error) {
	ctx, cancel := early(ctx, r.Op)
	defer cancel()
	if err := checkBlocks(r); err != nil {
		return Result{}, err
	}
	t0 := time.Now()
	e, err := s.layouts.Get(r.Local, "local_layout", r.Caller)
	if err != nil {
		return Result{}, err
	}
	x := blockXfers.Get().(*blockXfer)
	defer x.done()
	x.s, x.r, x.e = s, r, e
	sc := &x.sc
	// Hold the sources for the transfer: a region whose client went away
	// is unpublished even though the layout still holds its memory.
	for i, g := range e.Layout.Regions() {
		reg, rel, err := s.cfg.Registry.Acquire(g.Name, "region_id", r.Caller)
		if err != nil {
			return Result{}, fmt.Errorf("%w: local_layout %q: segment %d's region %s is no longer usable (deregistered, or its client went away): %v",
				errs.ErrFailedPrecondition, r.Local, firstSegmentOf(e.Layout, uint32(i)), g.Name, err)
		}
		sc.regions, sc.releases = append(sc.regions, reg), append(sc.releases, rel)
	}
	x.ph.Validate = time.Since(t0)

	var res Result
	pol := retryPolicy{peer: r.Peer, fresh: "a retry on a fresh connection"}
	stale := func(error) error {
		s.paths.forgetLayout(r)
		return nil
	}
	err = s.retry(ctx, pol, stale, func(ctx context.Context, _ bool) (ran, error) {
		var err error
		var rn ran
		res, rn, err = x.attempt(ctx)
		return rn, err
	})
	if err != nil {
		return Result{}, err
	}
	return res, nil
}

// checkBlocks checks the fields of r other than its ids: TransferBlocks
// and Routes.Bind refuse alike.
func checkBlocks(r BlocksRequest) error {
	switch {
	case r.Local == "":
		return fmt.Errorf("%w: local_layout is empty", errs.ErrInvalidArgument)
	case r.Peer == "":
		return fmt.Errorf("%w: peer is empty: give the destination daemon's peer address, host:port", errs.ErrInvalidArgument)
	case r.Remote == "":
		return fmt.Errorf("%w: remote_layout is empty: give the peer's layout export name", errs.ErrInvalidArgument)
	case layout.CheckExportName("remote_layout", r.Remote) != nil:
		return layout.CheckExportName("remote_layout", r.Remote)
	case len(r.Notification) > MaxNotification:
		return fmt.Errorf("%w: notification is %d bytes, over the limit of %d", errs.ErrInvalidArgument, len(r.Notification), MaxNotification)
	case r.BadTransport != nil:
		return r.BadTransport
	case r.BadOp != nil:
		return r.BadOp
	}
	return nil
}

// attempt resolves, validates, expands and writes once, telling the
// retry policy how it failed.
func (x *blockXfer) attempt(ctx context.Context) (res Result, _ ran, err error) {
	s, e, sc, r, ph := x.s, x.e, &x.sc, &x.r, &x.ph
	t0 := time.Now()
	sess, err := s.paths.session(ctx, r.Peer, r.Transport, transport.Need{Op: r.Op.ops()})
	if err != nil {
		return res, ran{}, err
	}
	g := gateOf(ctx)
	rl, cached, err := s.paths.layout(ctx, sess, *r)
	if err != nil {
		return res, ran{sess: sess}, err
	}
	if g != nil {
		var fp uint64
		for _, rr := range rl.Regions {
			fp = keysPrint(fp, rr.Keys[sess.Kind].Key)
		}
		if !g.bind(fp, rl.BoundAt) {
			return res, ran{}, fmt.Errorf("%w: remote_layout %q on %s was re-registered after the transfer was armed and its trigger fired: not sent to the new registration", errs.ErrFailedPrecondition, r.Remote, r.Peer)
		}
	}
	t1 := time.Now()
	ph.Resolve += t1.Sub(t0)
	if len(r.LocalIDs) == 0 && len(r.RemoteIDs) == 0 && r.Notification != nil {
		// A note alone (docs/notes.md): no block moves, the peer's
		// watchers get the notification; a mailbox needs no data path.
		// Armed, it goes once its trigger fired, as a write would post.
		if err := passGate(ctx); err != nil {
			return res, ran{}, err
		}
		t1 = time.Now()
		res, err = x.moved(ctx, rl, sess, transport.Stats{}, t1, 0, 0)
		return res, ran{}, err
	}
	var pair *layout.Pair
	if r.Op == OpRead {
		pair, err = e.readPair(rl.Layout)
	} else {
		pair, err = e.pair(rl.Layout)
	}
	if err != nil {
		return res, ran{cached: cached, suspect: staleGeometry(err, r.Op)}, fmt.Errorf("local_layout %q and remote_layout %q: %w", r.Local, r.Remote, err)
	}
	w := layout.Planners.Get().(*layout.Planner)
	lreq := layout.Request{SrcIDs: r.LocalIDs, DstIDs: r.RemoteIDs, SrcField: "local_ids", DstField: "remote_ids"}
	if r.Op == OpRead { // the local layout is the destination: its ids must be unique
		lreq = layout.Request{SrcIDs: r.RemoteIDs, DstIDs: r.LocalIDs, SrcField: "remote_ids", DstField: "local_ids"}
	}
	ids, err := w.Validate(pair, lreq)
	if err != nil {
		layout.Planners.Put(w)
		return res, ran{cached: cached, suspect: staleGeometry(err, r.Op)}, err
	}
	if err := s.checkSelfBlocks(r, sc.regions, rl, pair, ids); err != nil {
		layout.Planners.Put(w)
		return res, ran{}, err
	}
	t2 := time.Now()
	ph.Validate += t2.Sub(t1)
	defer layout.Planners.Put(w) // ids alias its scratch: no use after the write
	blocks := uint64(ids.N()) * uint64(e.Layout.NumSegments())
	var total uint64
	for g := 0; g < pair.NumGroups(); g++ {
		_, _, bl := pair.Group(g)
		total += bl * uint64(ids.N())
	}
	if sess.Recheck && blocks > 0 && len(sc.regions) > 0 && len(rl.Regions) > 0 {
		sess = x.rechoose(ctx, sess, rl, total/blocks)
	}
	if r.Op == OpRead {
		return x.read(ctx, sess, rl, pair, ids, cached, blocks, total, t2)
	}
	// The transport's view of the request: each source region's
	// registration and each destination region's key with this kind.
	sc.srcs, sc.dsts = sc.srcs[:0], sc.dsts[:0]
	for _, reg := range sc.regions {
		rg, ok := reg.Registration(sess.Kind)
		if !ok {
			return res, ran{}, fmt.Errorf("%w: local_layout %q: region %s (%s memory) is not registered with transport %s", errs.ErrFailedPrecondition, r.Local, reg.ID, reg.Mem.Kind, sess.Kind)
		}
		sc.srcs = append(sc.srcs, rg)
	}
	for _, rr := range rl.Regions {
		key, ok := rr.Keys[sess.Kind]
		if !ok {
			return res, ran{}, fmt.Errorf("%w: remote_layout %q: the peer's region %q is not registered with transport %s", errs.ErrFailedPrecondition, r.Remote, rr.Name, sess.Kind)
		}
		sc.dsts = append(sc.dsts, transport.RemoteRegion{Name: rr.Name, Size: rr.Size, Key: key.Key, Devices: key.Devices})
	}
	ph.Plan += time.Since(t2)

	// Every stretch in one go (where the kind's Caps.Blocks says so, else
	// concurrent writes): every byte acknowledged before success.
	if err := passGate(ctx); err != nil {
		return res, ran{}, err
	}
	wstart := time.Now()
	sc.blk = transport.Blocks{Pair: pair, IDs: ids, Local: sc.srcs, Remote: sc.dsts}
	sc.req = transport.Request{Op: transport.OpWrite, Blocks: &sc.blk, Scratch: &sc.bs}
	st, werr := sess.Conn.Post(ctx, &sc.req)
	sc.blk, sc.req = transport.Blocks{}, transport.Request{}
	clear(sc.srcs)
	if werr != nil {
		where := ""
		var se *transport.StretchError
		if errors.As(werr, &se) && int(se.Group) < pair.NumGroups() && int(se.SrcRegion) < len(sc.regions) && int(se.DstRegion) < len(rl.Regions) {
			first, nseg, _ := pair.Group(int(se.Group))
			where = fmt.Sprintf(" segments %d..%d (region %s) to", first, first+nseg-1, sc.regions[se.SrcRegion].ID)
			where2 := fmt.Sprintf(" (region %q)", rl.Regions[se.DstRegion].Name)
			werr = fmt.Errorf("local_layout %q%s remote_layout %q on %s%s over %s: %w", r.Local, where, r.Remote, r.Peer, where2, sess.Kind, werr)
		} else {
			werr = fmt.Errorf("local_layout %q to remote_layout %q on %s over %s: %w", r.Local, r.Remote, r.Peer, sess.Kind, werr)
		}
		return res, ran{sess: sess, posted: true, cached: cached}, werr
	}
	res, err = x.moved(ctx, rl, sess, st, wstart, blocks, total)
	return res, ran{}, err
}

// rechoose is paths.rechoose for a block request: its route is from the
// first local region to the first remote one (a layout's regions share a
// memory kind in practice), and the other kind is taken only when every
// region of both layouts is registered with it.
func (x *blockXfer) rechoose(ctx context.Context, sess transport.Session, rl *transport.LayoutResolution, blockBytes uint64) transport.Session {
	r := &x.r
	need := transport.Need{Op: r.Op.ops(), Route: transport.RouteOf(x.sc.regions[0].Mem, rl.Regions[0], r.Op == OpRead), BlockBytes: blockBytes}
	s2 := x.s.paths.rechoose(ctx, r.Peer, sess, need)
	if s2.Kind == sess.Kind {
		return sess
	}
	for _, reg := range x.sc.regions {
		if _, ok := reg.Registration(s2.Kind); !ok {
			return sess
		}
	}
	for _, rr := range rl.Regions {
		if _, ok := rr.Keys[s2.Kind]; !ok {
			return sess
		}
	}
	return s2
}

// staleGeometry says whether err, a refusal by the remote layout's geometry
// (an id of its side out of range, incompatible layouts), may be a cached
// resolution's: the peer may have re-registered the layout under the same
// export name since. The retry policy then drops the entry, so that the
// one retry resolves afresh and the error reported is the peer's current
// layout's.
func staleGeometry(err error, op Op) bool {
	var ge *layout.GeometryError
	if !errors.As(err, &ge) {
		return false
	}
	if op == OpRead {
		return ge.Src // the peer's layout is the source of a pull
	}
	return ge.Dst
}

// moved ends a block request whose every byte moved, from wstart: it
// delivers the notification to the remote layout's owner (after a pull
// too, so it knows it may reuse the blocks) and counts the request.
func (x *blockXfer) moved(ctx context.Context, rl *transport.LayoutResolution, sess transport.Session,
	st transport.Stats, wstart time.Time, blocks, total uint64) (Result, error) {
	s, r, ph := x.s, &x.r, &x.ph
	elapsed := time.Since(wstart)
	ph.write(st, wstart)
	if r.Notification != nil {
		tn := time.Now()
		err := s.paths.peers.Notify(ctx, r.Peer, notify.Notification{Region: rl.Regions[0].Name, Sender: s.cfg.NodeName,
			Notification: r.Notification, Blocks: st.Segments, Bytes: total})
		ph.Notify = time.Since(tn)
		if err != nil {
			verb := "landed at"
			if r.Op == OpRead {
				verb = "were pulled from"
			}
			return Result{}, fmt.Errorf("blocks %s %s/%s, but the notification was %s: %w", verb, r.Peer, r.Remote, noteFate(err), err)
		}
	}
	s.count(r.Op, total)
	return Result{Blocks: blocks, Bytes: total, Kind: sess.Kind, Stats: st, Elapsed: elapsed, Phases: *ph}, nil
}

// read is attempt's pull: pair's sources are the peer's regions and its
// destinations ours. Every stretch in one go (transport.BlockReader where
// the kind has one, else concurrent Reads): every byte in place before
// success.
func (x *blockXfer) read(ctx context.Context, sess transport.Session,
	rl *transport.LayoutResolution, pair *layout.Pair, ids layout.IDs, cached bool, blocks, total uint64, t2 time.Time) (res Result, _ ran, err error) {
	sc, r, ph := &x.sc, &x.r, &x.ph
	sc.rsrcs, sc.rdsts = sc.rsrcs[:0], sc.rdsts[:0]
	for _, rr := range rl.Regions {
		key, ok := rr.Keys[sess.Kind]
		if !ok {
			return res, ran{}, fmt.Errorf("%w: remote_layout %q: the peer's region %q is not registered with transport %s", errs.ErrFailedPrecondition, r.Remote, rr.Name, sess.Kind)
		}
		sc.rsrcs = append(sc.rsrcs, transport.RemoteRegion{Name: rr.Name, Size: rr.Size, Key: key.Key, Devices: key.Devices})
	}
	for _, reg := range sc.regions {
		rg, ok := reg.Registration(sess.Kind)
		if !ok {
			return res, ran{}, fmt.Errorf("%w: local_layout %q: region %s (%s memory) is not registered with transport %s", errs.ErrFailedPrecondition, r.Local, reg.ID, reg.Mem.Kind, sess.Kind)
		}
		sc.rdsts = append(sc.rdsts, rg)
	}
	ph.Plan += time.Since(t2)
	if err := passGate(ctx); err != nil {
		return res, ran{}, err
	}
	wstart := time.Now()
	sc.blk = transport.Blocks{Pair: pair, IDs: ids, Local: sc.rdsts, Remote: sc.rsrcs}
	sc.req = transport.Request{Op: transport.OpRead, Blocks: &sc.blk, Scratch: &sc.bs}
	st, werr := sess.Conn.Post(ctx, &sc.req)
	sc.blk, sc.req = transport.Blocks{}, transport.Request{}
	clear(sc.rdsts)
	if werr != nil {
		var se *transport.StretchError
		if errors.As(werr, &se) && int(se.Group) < pair.NumGroups() && int(se.SrcRegion) < len(rl.Regions) && int(se.DstRegion) < len(sc.regions) {
			first, nseg, _ := pair.Group(int(se.Group))
			werr = fmt.Errorf("read of remote_layout %q on %s (region %q) into local_layout %q segments %d..%d (region %s) over %s: %w",
				r.Remote, r.Peer, rl.Regions[se.SrcRegion].Name, r.Local, first, first+nseg-1, sc.regions[se.DstRegion].ID, sess.Kind, werr)
		} else {
			werr = fmt.Errorf("read of remote_layout %q on %s into local_layout %q over %s: %w", r.Remote, r.Peer, r.Local, sess.Kind, werr)
		}
		return res, ran{sess: sess, posted: true, cached: cached}, werr
	}
	res, err = x.moved(ctx, rl, sess, st, wstart, blocks, total)
	return res, ran{}, err
}

// firstSegmentOf is the first segment of l in region index ri.
func firstSegmentOf(l *layout.Layout, ri uint32) int {
	for i := 0; i < l.NumSegments(); i++ {
		if l.Template(i).Region == ri {
			return i
		}
	}
	return -1
}
