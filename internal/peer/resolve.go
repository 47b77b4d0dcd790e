package peer

import (
	"context"
	"fmt"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// A peer's resolutions (export name -> size and keys, layout name ->
// geometry and keys) are cached per peer, under the peer's cacheMu, and
// dropped whenever the peer may have changed.
// clearCache drops every cached resolution of the peer.
func (st *state) clearCache() {
	st.cacheMu.Lock()
	clear(st.resolved)
	clear(st.layouts)
	st.cacheGen++
	st.cacheMu.Unlock()
}

// cacheEntry is a resolution (ResolveRegion's or ResolveLayout's) and when it
// was made.
type cacheEntry[T any] struct {
	r  T
	at time.Time
}

// Resolved is a peer's export name resolved: its size and its key with each
// transport it is registered with.
type Resolved = transport.Resolution

// resolveTTL bounds how long a region resolution is reused: within it a
// batch pays no resolve round trip; after it an un-exported or
// re-permissioned region is noticed even on transports whose keys the
// receiver cannot revoke (rkeys).
const resolveTTL = time.Second

// layoutTTL: a layout resolution is kept until it fails (0: no age limit).
// A layout's geometry changes only by deregistering it, which rekeys its
// regions (batch.Layouts.Deregister), so a stale resolution's key is
// refused (ForgetLayout) or breaks the connection (its cache is dropped);
// a restarted peer drops it at the handshake. A request then pays no
// resolve round trip however far apart requests come.
const layoutTTL = 0

// cacheKey is name's entry in a peer's resolution caches for access a:
// a write resolution under the name itself, a read one apart (export
// names cannot hold a NUL: layout.CheckExportName, checked before any
// lookup), since each carries its own key.
func cacheKey(name string, a transport.Access) string {
	if a == transport.AccessRead {
		return name + "\x00read"
	}
	return name
}

// accessProto is a as the Peer service names it.
func accessProto(a transport.Access) b2bv1.Access {
	if a == transport.AccessRead {
		return b2bv1.Access_ACCESS_READ
	}
	return b2bv1.Access_ACCESS_WRITE
}

// Resolve returns the peer's export name resolved to its size and keys
// for access a (AccessWrite or AccessRead: the peer hands out only the key
// its grant for a allows, cached apart), from the cache when it can;
// cached says which, so a caller whose batch is refused for a stale key
// knows a fresh resolution may help.
func (m *Manager) Resolve(ctx context.Context, addr string, s Session, name string, a transport.Access) (r Resolved, cached bool, err error) {
	if err := layout.CheckExportName("export name", name); err != nil {
		return r, false, err // its cache key could alias another name's
	}
	return resolveCached(ctx, &m.kept, addr, cacheKey(name, a), resolveTTL, func(st *state) map[string]cacheEntry[Resolved] { return st.resolved },
		func(ctl b2bv1.PeerClient) (Resolved, error) {
			resp, err := ctl.ResolveRegion(ctx, &b2bv1.ResolveRegionRequest{Name: name, Access: accessProto(a)})
			if err != nil {
				return r, fromRPC(ctx, err)
			}
			return resolvedFromProto(resp), nil
		})
}

// ResolveLayout returns the peer's exported layout resolved for access a
// (its segments, validated, and its regions' keys), from the cache when it
// can, like Resolve: a restarted peer (new handshake), a broken connection
// or ForgetLayout (a refused key) drop it; it has no age limit (layoutTTL).
func (m *Manager) ResolveLayout(ctx context.Context, addr, name string, a transport.Access) (r *transport.LayoutResolution, cached bool, err error) {
	if err := layout.CheckExportName("layout export name", name); err != nil {
		return nil, false, err
	}
	return resolveCached(ctx, &m.kept, addr, cacheKey(name, a), layoutTTL, func(st *state) map[string]cacheEntry[*transport.LayoutResolution] { return st.layouts },
		func(ctl b2bv1.PeerClient) (*transport.LayoutResolution, error) {
			resp, err := ctl.ResolveLayout(ctx, &b2bv1.ResolveLayoutRequest{Name: name, Access: accessProto(a)})
			if err != nil {
				return nil, fromRPC(ctx, err)
			}
			r, err := layoutFromProto(resp)
			if err != nil {
				return nil, fmt.Errorf("peer %s answered a layout b2bd cannot use: %w", addr, err)
			}
			return r, nil
		})
}

// resolveCached answers name from the peer's cache (of) while the entry is
// younger than ttl (0: any age), else asks the peer (fetch) and caches it.
func resolveCached[T any](ctx context.Context, kept *peerTable, addr, name string, ttl time.Duration, of func(*state) map[string]cacheEntry[T], fetch func(b2bv1.PeerClient) (T, error)) (r T, hit bool, err error) {
	st, err := kept.acquire(addr, false)
	if st == nil {
		if err == nil {
			err = fmt.Errorf("%w: peer %s is not connected", errs.ErrUnavailable, addr)
		}
		return r, false, err
	}
	defer st.done()
	if err := st.mu.LockContext(ctx); err != nil {
		return r, false, peerBusy(addr, err)
	}
	st.cacheMu.Lock()
	c, ok := of(st)[name]
	gen := st.cacheGen
	st.cacheMu.Unlock()
	ctl := st.client
	st.mu.Unlock()
	if ok && (ttl == 0 || time.Since(c.at) < ttl) {
		return c.r, true, nil
	}
	if ctl == nil {
		return r, false, fmt.Errorf("%w: peer %s is not connected", errs.ErrUnavailable, addr)
	}
	if r, err = fetch(ctl); err != nil {
		return r, false, err
	}
	st.cacheMu.Lock()
	if st.cacheGen == gen { // else the peer may have changed since: leave it uncached
		of(st)[name] = cacheEntry[T]{r: r, at: time.Now()}
	}
	st.cacheMu.Unlock()
	return r, false, nil
}

// ForgetLayout drops a cached layout resolution for access a.
func (m *Manager) ForgetLayout(addr, name string, a transport.Access) {
	if st := m.kept.lookup(addr); st != nil {
		st.cacheMu.Lock()
		delete(st.layouts, cacheKey(name, a))
		st.cacheMu.Unlock()
	}
}

// Forget drops a cached resolution for access a.
func (m *Manager) Forget(addr, name string, a transport.Access) {
	if st := m.kept.lookup(addr); st != nil {
		st.cacheMu.Lock()
		delete(st.resolved, cacheKey(name, a))
		st.cacheMu.Unlock()
	}
}
