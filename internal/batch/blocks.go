package batch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/notify"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/transport"
)

// LayoutPeers is what block transfers need of the peer manager beyond
// Peers: resolving a peer's exported layout, cached like regions.
type LayoutPeers interface {
	ResolveLayout(ctx context.Context, addr, name string) (*transport.LayoutResolution, bool, error)
	ForgetLayout(addr, name string)
}

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
}

// blockScratch is a request's reusable memory: its runs and the descriptor
// arrays each (source region, destination region) stretch is written from.
type blockScratch struct {
	runs          []layout.Run
	src, dst, len []uint64
	regions       []*region.Region
	releases      []func()
}

var blockScratches = sync.Pool{New: func() any { return new(blockScratch) }}

// stretch is a maximal sequence of runs (segment-major) sharing one
// (source region, destination region) pair: one Conn.Write.
type stretch struct {
	from, to       int // runs[from:to]
	srcReg, dstReg uint32
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
	switch {
	case r.Local == "":
		return Result{}, fmt.Errorf("%w: local_layout is empty", errs.ErrInvalidArgument)
	case r.Peer == "":
		return Result{}, fmt.Errorf("%w: peer is empty: give the destination daemon's peer address, host:port", errs.ErrInvalidArgument)
	case r.Remote == "":
		return Result{}, fmt.Errorf("%w: remote_layout is empty: give the peer's layout export name", errs.ErrInvalidArgument)
	case len(r.Notification) > MaxNotification:
		return Result{}, fmt.Errorf("%w: notification is %d bytes, over the limit of %d", errs.ErrInvalidArgument, len(r.Notification), MaxNotification)
	case r.BadTransport != nil:
		return Result{}, r.BadTransport
	}
	lp, ok := s.cfg.Peers.(LayoutPeers)
	if !ok {
		return Result{}, fmt.Errorf("%w: this daemon's peer manager resolves no layouts", errs.ErrUnimplemented)
	}
	var ph Phases
	t0 := time.Now()
	e, err := s.layouts.Get(r.Local, "local_layout", r.Caller)
	if err != nil {
		return Result{}, err
	}
	sc := blockScratches.Get().(*blockScratch)
	defer func() {
		for _, rel := range sc.releases {
			rel()
		}
		clear(sc.regions)
		sc.regions, sc.releases = sc.regions[:0], sc.releases[:0]
		blockScratches.Put(sc)
	}()
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
	ph.Validate = time.Since(t0)

	var firstErr error
	for attempt := 0; ; attempt++ {
		res, cached, retry, err := s.blocksAttempt(ctx, lp, e, sc, r, &ph)
		if err == nil {
			return res, nil
		}
		if retry && attempt == 0 && (cached || firstErr == nil) {
			firstErr = err
			continue
		}
		if firstErr != nil {
			return Result{}, fmt.Errorf("%w (after one retry; the first attempt failed: %v)", err, firstErr)
		}
		return Result{}, err
	}
}

// blocksAttempt resolves, validates, expands and writes once. retry says a
// fresh resolution or connection may help (a refused, possibly stale key; a
// connection that broke under the writes).
func (s *Service) blocksAttempt(ctx context.Context, lp LayoutPeers, e *Entry, sc *blockScratch, r BlocksRequest, ph *Phases) (res Result, cached, retry bool, err error) {
	t0 := time.Now()
	sess, err := s.cfg.Peers.Get(ctx, r.Peer, r.Transport)
	if err != nil {
		return res, false, false, err
	}
	rl, cached, err := lp.ResolveLayout(ctx, r.Peer, r.Remote)
	if err != nil {
		if !isRequestError(err) {
			s.cfg.Peers.Broken(r.Peer, sess)
		}
		return res, false, false, fmt.Errorf("peer %s: resolve remote_layout %q: %w", r.Peer, r.Remote, err)
	}
	t1 := time.Now()
	ph.Resolve += t1.Sub(t0)
	pair, err := e.pair(rl.Layout)
	if err != nil {
		return res, cached, false, fmt.Errorf("local_layout %q and remote_layout %q: %w", r.Local, r.Remote, err)
	}
	w := layout.Planners.Get().(*layout.Planner)
	ids, err := w.Validate(pair, layout.Request{SrcIDs: r.LocalIDs, DstIDs: r.RemoteIDs, SrcField: "local_ids", DstField: "remote_ids"})
	if err != nil {
		layout.Planners.Put(w)
		return res, cached, false, err
	}
	t2 := time.Now()
	ph.Validate += t2.Sub(t1)
	sc.runs = pair.Expand(sc.runs[:0], ids)
	blocks := uint64(ids.N()) * uint64(e.Layout.NumSegments())
	layout.Planners.Put(w) // ids alias its scratch: no use after this
	n := len(sc.runs)
	if cap(sc.src) < n {
		sc.src, sc.dst, sc.len = make([]uint64, n), make([]uint64, n), make([]uint64, n)
	}
	src, dst, ln := sc.src[:n], sc.dst[:n], sc.len[:n]
	var total uint64
	for i := range sc.runs {
		run := &sc.runs[i]
		src[i], dst[i], ln[i] = run.SrcOff, run.DstOff, run.Len
		total += run.Len
	}
	ph.Plan += time.Since(t2)

	// One Write per stretch, in order: every byte acknowledged before the
	// next, and before success.
	wstart := time.Now()
	var st transport.Stats
	for from := 0; from < n; {
		sr, dr := sc.runs[from].SrcRegion, sc.runs[from].DstRegion
		to := from + 1
		for to < n && sc.runs[to].SrcRegion == sr && sc.runs[to].DstRegion == dr {
			to++
		}
		if err := ctx.Err(); err != nil {
			return res, cached, false, err
		}
		b := desc.Batch{Src: src[from:to], Dst: dst[from:to], Len: ln[from:to]}
		ws, werr := s.writeStretch(ctx, sess, sc.regions[sr], rl.Regions[dr], &b)
		st.Segments += ws.Segments
		st.WorkRequests += ws.WorkRequests
		st.Plan += ws.Plan
		st.Post += ws.Post
		if werr != nil {
			broke := sess.Conn.Err() != nil
			if broke {
				s.cfg.Peers.Broken(r.Peer, sess)
			}
			stale := cached && errors.Is(werr, errs.ErrNotFound)
			if stale {
				lp.ForgetLayout(r.Peer, r.Remote)
			}
			g := sc.runs[from].Group
			first, nseg, _ := pair.Group(int(g))
			werr = fmt.Errorf("local_layout %q segments %d..%d (region %s) to remote_layout %q on %s (region %q) over %s: %w",
				r.Local, first, first+nseg-1, sc.regions[sr].ID, r.Remote, r.Peer, rl.Regions[dr].Name, sess.Kind, werr)
			retry = stale || (broke && ctx.Err() == nil && !memguard.IsFault(werr))
			return res, cached, retry, werr
		}
		from = to
	}
	elapsed := time.Since(wstart)
	ph.write(st, wstart)
	if r.Notification != nil {
		tn := time.Now()
		err := s.cfg.Peers.Notify(ctx, r.Peer, notify.Notification{Region: rl.Regions[0].Name, Sender: s.cfg.NodeName,
			Notification: r.Notification, Blocks: uint64(n), Bytes: total})
		ph.Notify = time.Since(tn)
		if err != nil {
			return res, false, false, fmt.Errorf("blocks landed at %s/%s, but the notification was not delivered: %w", r.Peer, r.Remote, err)
		}
	}
	s.cfg.Counters.BatchesSent.Add(1)
	s.cfg.Counters.BytesSent.Add(total)
	return Result{Blocks: blocks, Bytes: total, Kind: sess.Kind, Stats: st, Elapsed: elapsed, Phases: *ph}, cached, false, nil
}

// writeStretch writes one stretch from src into the remote region rr.
func (s *Service) writeStretch(ctx context.Context, sess transport.Session, src *region.Region, rr transport.Resolution, b *desc.Batch) (transport.Stats, error) {
	reg, ok := src.Registration(sess.Kind)
	if !ok {
		return transport.Stats{}, fmt.Errorf("%w: region %s (%s memory) is not registered with transport %s", errs.ErrFailedPrecondition, src.ID, src.Mem.Kind, sess.Kind)
	}
	key, ok := rr.Keys[sess.Kind]
	if !ok {
		return transport.Stats{}, fmt.Errorf("%w: the peer's region %q is not registered with transport %s", errs.ErrFailedPrecondition, rr.Name, sess.Kind)
	}
	return sess.Conn.Write(ctx, reg, transport.RemoteRegion{Name: rr.Name, Size: rr.Size, Key: key.Key, Devices: key.Devices}, b)
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
