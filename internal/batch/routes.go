package batch

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/region"
)

// Block routes: what a block request names besides its ids (local layout,
// peer, remote layout, transport, op), bound once over gRPC so that a
// fixed-size ring record can name it by handle. A route holds nothing but
// its names: each transfer on it runs TransferBlocks afresh, with every
// check TransferBlocks makes. Routes are owned and released like plans:
// by their owner, with the owner's connection, at most MaxPlans a caller.

// route is one bound route.
type route struct {
	owner Owner
	req   BlocksRequest // without ids and notification
}

// routes is the table of block routes.
type routes struct {
	mu      sync.Mutex
	byID    map[uint64]*route
	perUser map[region.Caller]int
}

// BindRoute checks r as TransferBlocks checks it (its ids and notification
// aside) and that its local layout is r.Caller's, and binds it for o.
func (s *Service) BindRoute(r BlocksRequest, o Owner) (uint64, error) {
	r.LocalIDs, r.RemoteIDs, r.Notification = nil, nil, nil
	if err := checkBlocks(r); err != nil {
		return 0, err
	}
	if _, err := s.layouts.Get(r.Local, "local_layout", r.Caller); err != nil {
		return 0, err
	}
	rt := &s.routes
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if max := int(s.maxPlans.Load()); rt.perUser[o.Caller] >= max {
		return 0, fmt.Errorf("%w: this client holds %d block routes, the limit (--max-plans) is %d: release some (ReleaseBlockRoute)",
			errs.ErrResourceExhausted, rt.perUser[o.Caller], max)
	}
	if rt.byID == nil {
		rt.byID, rt.perUser = map[uint64]*route{}, map[region.Caller]int{}
	}
	for {
		h := rand.Uint64()
		if _, dup := rt.byID[h]; h != 0 && !dup {
			rt.byID[h] = &route{owner: o, req: r}
			rt.perUser[o.Caller]++
			return h, nil
		}
	}
}

// routeNotFound is the refusal of a handle that is not the caller's route.
func routeNotFound(h uint64) error {
	return fmt.Errorf("%w: block route %d: no such route of this client (released, or its connection closed)", errs.ErrNotFound, h)
}

// ReleaseRoute frees o's route h. Someone else's handle is NotFound.
func (s *Service) ReleaseRoute(o Owner, h uint64) error {
	rt := &s.routes
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if x := rt.byID[h]; x == nil || x.owner != o {
		return routeNotFound(h)
	}
	s.dropRouteLocked(h)
	return nil
}

func (s *Service) dropRouteLocked(h uint64) {
	rt := &s.routes
	who := rt.byID[h].owner.Caller
	delete(rt.byID, h)
	if n := rt.perUser[who]; n > 1 {
		rt.perUser[who] = n - 1
	} else {
		delete(rt.perUser, who)
	}
}

// ReleaseRoutesConn frees every route bound over the client connection
// conn (its connection closed); it returns how many.
func (s *Service) ReleaseRoutesConn(conn uint64) int {
	if conn == 0 {
		return 0
	}
	rt := &s.routes
	rt.mu.Lock()
	defer rt.mu.Unlock()
	n := 0
	for h, x := range rt.byID {
		if x.owner.Conn == conn {
			s.dropRouteLocked(h)
			n++
		}
	}
	return n
}

// Routes counts the routes held, for tests.
func (s *Service) Routes() int {
	s.routes.mu.Lock()
	defer s.routes.mu.Unlock()
	return len(s.routes.byID)
}

// RouteBlocks runs TransferBlocks on who's route h (bound over any of
// who's connections) with the given packed ids.
func (s *Service) RouteBlocks(ctx context.Context, who region.Caller, h uint64, localIDs, remoteIDs []byte) (Result, error) {
	rt := &s.routes
	rt.mu.Lock()
	x := rt.byID[h]
	rt.mu.Unlock()
	if x == nil || x.owner.Caller != who {
		s.cfg.Counters.BatchesFailed.Add(1)
		return Result{}, routeNotFound(h)
	}
	r := x.req
	r.LocalIDs, r.RemoteIDs = localIDs, remoteIDs
	return s.TransferBlocks(ctx, r)
}
