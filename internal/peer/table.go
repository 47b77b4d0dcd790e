package peer

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// peerTable is the set of peers kept, within Limits: it hands out counted
// uses of a peer's state and reaps the peers left idle, so that its
// bookkeeping (the cap, the idle clock, the reaper goroutine) sits apart
// from connecting to them.
type peerTable struct {
	log hclog.Logger
	// idleNanos and maxPeers are Limits, settable while running.
	idleNanos atomic.Int64
	maxPeers  atomic.Int64
	maxConns  atomic.Int64 // Limits.ConnsPerPeer

	mu     sync.Mutex
	closed bool
	peers  map[string]*state
	// reapStop is the running reaper's stop channel, nil when none runs:
	// a reaper runs only while peers are kept, so a daemon with none holds
	// no goroutine for them.
	reapStop chan struct{}
}

// setLimits is Manager.SetLimits.
func (t *peerTable) setLimits(l Limits) {
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.MaxPeers <= 0 {
		l.MaxPeers = DefaultMaxPeers
	}
	if l.ConnsPerPeer <= 0 {
		l.ConnsPerPeer = DefaultConnsPerPeer
	}
	t.idleNanos.Store(int64(l.IdleTimeout))
	t.maxPeers.Store(int64(l.MaxPeers))
	t.maxConns.Store(int64(l.ConnsPerPeer))
}

func (t *peerTable) connsPerPeer() int { return int(t.maxConns.Load()) }

func (t *peerTable) idleTimeout() time.Duration { return time.Duration(t.idleNanos.Load()) }

// acquire finds addr's state, creating it when create is set, and counts a
// use of it (st.done ends it); nil, nil when there is none to find.
func (t *peerTable) acquire(addr string, create bool) (*state, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, fmt.Errorf("%w: daemon is shutting down", errs.ErrUnavailable)
	}
	st := t.peers[addr]
	if st == nil {
		if !create {
			return nil, nil
		}
		if max := t.maxPeers.Load(); int64(len(t.peers)) >= max {
			return nil, fmt.Errorf("%w: peer %s: this daemon keeps connections to %d peers, the limit (--max-peers) is %d; a peer is dropped after --peer-idle-timeout (%s) unused",
				errs.ErrResourceExhausted, addr, len(t.peers), max, t.idleTimeout())
		}
		st = &state{addr: addr, conns: map[transport.Kind]*connSet{}, resolved: map[string]cacheEntry[Resolved]{}, layouts: map[string]cacheEntry[*transport.LayoutResolution]{}}
		t.peers[addr] = st
		if t.reapStop == nil {
			t.reapStop = make(chan struct{})
			go t.reapLoop(t.reapStop)
		}
	}
	st.busy.Add(1)
	return st, nil
}

// lookup is addr's state, nil when none is kept; it counts no use, so the
// caller touches only what needs no connection (the instance, the caches).
func (t *peerTable) lookup(addr string) *state {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.peers[addr]
}

// dropUnused forgets st, whose Get failed, when nothing else uses it: a
// peer that never answered keeps no connection, goroutine or redial behind
// it. The caller holds st.mu and one use of st.
func (t *peerTable) dropUnused(st *state) {
	if st.hs != nil || len(st.conns) > 0 {
		return
	}
	t.mu.Lock()
	drop := st.busy.Load() == 1 && t.peers[st.addr] == st
	if drop {
		delete(t.peers, st.addr)
		t.stopReaperIfEmpty()
	}
	t.mu.Unlock()
	if drop {
		st.closeLocked(false)
	}
}

// stopReaperIfEmpty ends the reaper once no peer is kept; the next new
// peer starts another. The caller holds t.mu.
func (t *peerTable) stopReaperIfEmpty() {
	if len(t.peers) == 0 && t.reapStop != nil {
		close(t.reapStop)
		t.reapStop = nil
	}
}

// reapLoop closes idle peers until stop is closed: no peer is left, or the
// manager closed. It checks every eighth of the idle timeout, so a peer
// goes between 1 and 1.125 timeouts after its last use.
func (t *peerTable) reapLoop(stop chan struct{}) {
	for {
		idle := t.idleTimeout()
		tm := time.NewTimer(min(max(idle/8, 10*time.Millisecond), 10*time.Second))
		select {
		case <-stop:
			tm.Stop()
			return
		case <-tm.C:
		}
		t.reap(time.Now(), idle)
	}
}

// reap closes and forgets every peer idle for idle or longer at now.
func (t *peerTable) reap(now time.Time, idle time.Duration) {
	var gone, kept []*state
	t.mu.Lock()
	for addr, st := range t.peers {
		if st.busy.Load() == 0 && now.Sub(time.Unix(0, st.lastUse.Load())) >= idle && st.mu.TryLock() {
			delete(t.peers, addr)
			gone = append(gone, st)
		} else {
			kept = append(kept, st)
		}
	}
	t.stopReaperIfEmpty()
	t.mu.Unlock()
	for _, st := range kept {
		if st.mu.TryLock() { // busy with a handshake or a dial: next round
			for _, set := range st.conns {
				set.trim(now, min(idle, extraConnIdle))
			}
			st.mu.Unlock()
		}
	}
	for _, st := range gone {
		if st.up {
			t.log.Info("peer idle: its connections are closed until the next batch", "peer", st.addr, "idle_timeout", idle)
		}
		st.closeLocked(false)
		st.mu.Unlock()
	}
}

// connected is Manager.Connected.
func (t *peerTable) connected() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, st := range t.peers {
		if st.mu.TryLock() {
			if len(st.conns) > 0 {
				n++
			}
			st.mu.Unlock()
		}
	}
	return n
}

// count is how many peers are kept now.
func (t *peerTable) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.peers)
}

// close refuses new uses and closes every peer kept, waiting for each.
func (t *peerTable) close() {
	t.mu.Lock()
	t.closed = true
	peers := t.peers
	t.peers = map[string]*state{}
	t.stopReaperIfEmpty()
	t.mu.Unlock()
	for _, st := range peers {
		st.mu.Lock()
		st.closeLocked(true)
		st.mu.Unlock()
	}
}
