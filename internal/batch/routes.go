package batch

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

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

// Routes is the table of block routes; a transfer on a route runs as
// TransferBlocks.
type Routes struct {
	s       *Service      // checks the local layout and runs the transfers
	max     *atomic.Int64 // the plans' limit (--max-plans), shared
	mu      sync.Mutex
	byID    map[uint64]*route
	perUser map[region.Caller]int
}

// Routes is the service's table of block routes.
func (s *Service) Routes() *Routes { return s.routes }

// Bind checks r as TransferBlocks checks it (its ids and notification
// aside) and that its local layout is r.Caller's, and binds it for o.
func (rt *Routes) Bind(r BlocksRequest, o Owner) (uint64, error) {
	r.LocalIDs, r.RemoteIDs, r.Notification = nil, nil, nil
	if err := checkBlocks(r); err != nil {
		return 0, err
	}
	if _, err := rt.s.layouts.Get(r.Local, "local_layout", r.Caller); err != nil {
		return 0, err
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if max := int(rt.max.Load()); rt.perUser[o.Caller] >= max {
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

// Release frees o's route h. Someone else's handle is NotFound.
func (rt *Routes) Release(o Owner, h uint64) error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if x := rt.byID[h]; x == nil || x.owner != o {
		return routeNotFound(h)
	}
	rt.dropLocked(h)
	return nil
}

func (rt *Routes) dropLocked(h uint64) {
	who := rt.byID[h].owner.Caller
	delete(rt.byID, h)
	if n := rt.perUser[who]; n > 1 {
		rt.perUser[who] = n - 1
	} else {
		delete(rt.perUser, who)
	}
}

// ReleaseConn frees every route bound over the client connection
// conn (its connection closed); it returns how many.
func (rt *Routes) ReleaseConn(conn uint64) int {
	if conn == 0 {
		return 0
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	n := 0
	for h, x := range rt.byID {
		if x.owner.Conn == conn {
			rt.dropLocked(h)
			n++
		}
	}
	return n
}

// Len counts the routes held, for tests.
func (rt *Routes) Len() int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return len(rt.byID)
}

// Transfer runs TransferBlocks on who's route h (bound over any of
// who's connections) with the given packed ids.
func (rt *Routes) Transfer(ctx context.Context, who region.Caller, h uint64, localIDs, remoteIDs []byte) (Result, error) {
	return rt.TransferNote(ctx, who, h, localIDs, remoteIDs, nil)
}

// TransferNote is Transfer with TransferBlocks' notification (nil: none).
func (rt *Routes) TransferNote(ctx context.Context, who region.Caller, h uint64, localIDs, remoteIDs, note []byte) (Result, error) {
	rt.mu.Lock()
	x := rt.byID[h]
	rt.mu.Unlock()
	if x == nil || x.owner.Caller != who {
		rt.s.cfg.Counters.BatchesFailed.Add(1)
		return Result{}, routeNotFound(h)
	}
	r := x.req
	r.LocalIDs, r.RemoteIDs, r.Notification = localIDs, remoteIDs, note
	return rt.s.TransferBlocks(ctx, r)
}
