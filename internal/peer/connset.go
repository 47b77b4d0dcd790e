package peer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// DefaultConnsPerPeer is Limits.ConnsPerPeer's default (b2bd's
// --conns-per-peer).
const DefaultConnsPerPeer = 4

// connSet is a peer's data connections of one kind. Every kind carries one
// batch at a time on a connection (its frames, acks and mapping cache are
// the connection's), so a set of them lets batches to one peer run side by
// side: a small batch no longer waits for every byte of a large one, and 16
// concurrent 256 KiB writes went from p50 2.0 to 1.2 ms over tcp. A batch
// takes the connection with the fewest batches in flight (the next one in
// turn among equals); another is connected only when every one is busy and
// the set has room, and the reaper closes extra ones left idle (trim).
type connSet struct {
	conns []*trackedConn
	next  int // where the next pick's turn starts
	// dialing counts the extra connections being dialed (without st.mu),
	// which count toward the limit.
	dialing int
	// noDialUntil: an extra dial failed; none is tried before then.
	noDialUntil time.Time
}

// pick returns the connection for the next batch, and whether it is busy
// (every connection has a batch in flight). nil when the set is empty.
func (s *connSet) pick() (*trackedConn, bool) {
	n := len(s.conns)
	if n == 0 {
		return nil, false
	}
	var best *trackedConn
	for i := range n {
		c := s.conns[(s.next+i)%n]
		if best == nil || c.inflight.Load() < best.inflight.Load() {
			best = c
		}
	}
	s.next = (s.next + 1) % n
	// Picked now: not idle for trim, which may run before the batch posts.
	best.lastUse.Store(time.Now().UnixNano())
	return best, best.inflight.Load() > 0
}

// dropBroken closes and removes the connections that report an error.
func (s *connSet) dropBroken() {
	keep := s.conns[:0]
	for _, c := range s.conns {
		if c.Err() != nil {
			_ = c.Close()
			continue
		}
		keep = append(keep, c)
	}
	clear(s.conns[len(keep):])
	s.conns = keep
}

// remove closes c and takes it out of the set; false when c is not in it
// (another batch reported it first).
func (s *connSet) remove(c transport.Conn) bool {
	for i, x := range s.conns {
		if transport.Conn(x) == c {
			_ = x.Close()
			s.conns = slices.Delete(s.conns, i, i+1)
			return true
		}
	}
	return false
}

// errDialedAcrossReset: the connections an extra dial left were reset
// before it came back; Get tries afresh (a neighbour's failed batch must
// not fail this one).
var errDialedAcrossReset = fmt.Errorf("%w: the data connections were reset while another was dialed", errs.ErrUnavailable)

// errLockLost: conn let go of the peer's lock for an extra dial and could
// not take it back before the caller's context ended; the caller holds it
// no more.
var errLockLost = errors.New("the peer's lock was not taken back")

// extraConnIdle is how long a connection beyond a peer's first may sit
// unused (no batch, no live plan) before the reaper closes it: a burst's
// connections go with it, and an idle peer keeps one.
const extraConnIdle = 5 * time.Second

// extraDialTimeout bounds the dial of a connection beyond a peer's first;
// after one failed, none is tried for extraDialBackoff.
const (
	extraDialTimeout = time.Second
	extraDialBackoff = 5 * time.Second
)

// trim closes the connections beyond the first that were unused for idle
// at now.
func (s *connSet) trim(now time.Time, idle time.Duration) {
	for i := len(s.conns) - 1; i >= 1; i-- {
		c := s.conns[i]
		if c.inflight.Load() == 0 && c.plans.Load() == 0 && now.Sub(time.Unix(0, c.lastUse.Load())) >= idle {
			s.remove(c)
		}
	}
}

// closeAll closes every connection (children of the peer's state).
func (s *connSet) closeAll() {
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.conns = nil
}

// conn picks st's connection of kind for a batch, connecting one first when
// the set is empty, or when every one is busy and the set holds fewer than
// limit; reused says the connection existed before. The caller holds st.mu,
// which an extra connection's dial lets go of meanwhile (and an error
// errLockLost says it was not taken back); dial must not read st.
func (st *state) conn(ctx context.Context, kind transport.Kind, limit int, dial func(context.Context) (transport.Conn, error)) (c *trackedConn, reused bool, err error) {
	set := st.conns[kind]
	if set == nil {
		set = &connSet{}
		st.conns[kind] = set
	}
	set.dropBroken()
	c, busy := set.pick()
	if c != nil && (!busy || len(set.conns)+set.dialing >= limit || time.Now().Before(set.noDialUntil)) {
		return c, true, nil
	}
	if c != nil {
		// An extra connection, dialed without st.mu: the other batches'
		// Get take the connections there are meanwhile (a dial to a
		// loaded peer took 10-37 ms, and every batch to the peer waited
		// for it under the lock). Bounded, and on failure the batch
		// queues on a busy one (the peer may just be slow; the batch on
		// it says whether it is gone).
		hs := st.hs
		set.dialing++
		st.mu.Unlock()
		dctx, cancel := context.WithTimeout(ctx, extraDialTimeout)
		nc, err := dial(dctx)
		cancel()
		// The caller's again, under its deadline: the lock may be another
		// batch's, across a handshake with a frozen peer.
		if lerr := st.mu.LockContext(ctx); lerr != nil {
			if nc != nil {
				_ = nc.Close()
			}
			go func() { // the count, once the lock is free
				st.mu.Lock()
				set.dialing--
				st.mu.Unlock()
			}()
			return nil, false, fmt.Errorf("%w: %w", errLockLost, peerBusy(st.addr, lerr))
		}
		set.dialing--
		switch {
		case err != nil && ctx.Err() == nil: // the peer's failure, not the caller's cancel
			set.noDialUntil = time.Now().Add(extraDialBackoff)
		case err != nil:
		case st.conns[kind] == set && st.hs == hs:
			return set.add(st, nc), false, nil
		default: // the peer's connections were reset meanwhile
			_ = nc.Close()
		}
		if st.conns[kind] == set && slices.Contains(set.conns, c) {
			return c, true, nil
		}
		// c was reported broken, or the peer reset, while the lock was let
		// go: the batch is not at fault, and Get starts over.
		return nil, false, errDialedAcrossReset
	}
	nc, err := dial(ctx)
	if err != nil {
		delete(st.conns, kind)
		return nil, false, err
	}
	return set.add(st, nc), false, nil
}

// add tracks nc and puts it in the set.
func (s *connSet) add(st *state, nc transport.Conn) *trackedConn {
	t := track(nc, st)
	t.lastUse.Store(time.Now().UnixNano())
	s.conns = append(s.conns, t)
	return t
}
