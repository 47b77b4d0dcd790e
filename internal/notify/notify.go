// Package notify fans out batch notifications to the local watchers of a
// region. A slow watcher never stalls the data path: its queue is bounded,
// and what it missed is counted and reported with its next notification.
package notify

import (
	"errors"
	"runtime"
	"sync"
)

// ErrUnconfirmed marks the failure of a notification that left for its
// peer but got no answer (the caller's deadline or cancel, or the
// connection's end, came first): the peer may still deliver it, as a frozen
// daemon does once it is continued. A note the peer refused, or one that
// never left, is not marked.
var ErrUnconfirmed = errors.New("it left for the peer, and may have been or may yet be delivered")

// Notification is a batch's notification as its destination's watchers get
// it (the wire type, b2bv1.Notification, is made from it at the RPC layer).
type Notification struct {
	Region       string // the export name the batch was sent to
	Sender       string // the sending daemon's node name
	Notification []byte
	Blocks       uint64
	Bytes        uint64
	Dropped      uint64 // notifications this watcher missed before this one
}

// QueueLen is how many notifications a watcher may fall behind.
const QueueLen = 1024

// Hub holds the watchers by region ID.
type Hub struct {
	mu       sync.Mutex
	watchers map[string]map[*Watcher]struct{}
	keys     keyWaits // transfers armed on key notes (keys.go)
}

// Watcher receives one region's notifications, until Done is closed
// (End: the region can no longer be notified; Err says why) or it is
// unsubscribed.
type Watcher struct {
	C       chan Notification
	region  string
	mu      sync.Mutex
	dropped uint64
	done    chan struct{}
	err     error // set before done is closed
}

// Done is closed when the watcher's region can no longer be notified.
func (w *Watcher) Done() <-chan struct{} { return w.done }

// Err is why Done was closed; nil before.
func (w *Watcher) Err() error {
	select {
	case <-w.done:
		return w.err
	default:
		return nil
	}
}

// Subscribe starts watching regionID; call Unsubscribe when done.
func (h *Hub) Subscribe(regionID string) *Watcher {
	w := &Watcher{C: make(chan Notification, QueueLen), region: regionID, done: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.watchers == nil {
		h.watchers = map[string]map[*Watcher]struct{}{}
	}
	if h.watchers[regionID] == nil {
		h.watchers[regionID] = map[*Watcher]struct{}{}
	}
	h.watchers[regionID][w] = struct{}{}
	return w
}

// Unsubscribe stops w.
func (h *Hub) Unsubscribe(w *Watcher) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.watchers[w.region], w)
	if len(h.watchers[w.region]) == 0 {
		delete(h.watchers, w.region)
	}
}

// End ends every watcher of regionID with why (the region was released,
// or is no longer exported): each sees Done closed, after what was queued
// for it. Later watchers of the same ID are not affected.
func (h *Hub) End(regionID string, why error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watchers[regionID] {
		w.err = why
		close(w.done)
	}
	delete(h.watchers, regionID)
}

// Publish queues n for every watcher of regionID and returns how many got
// it; a key note also fires the transfers armed on its keys (keys.go).
func (h *Hub) Publish(regionID string, n Notification) int {
	if keys, _, ok := ParseKeys(n.Notification); ok && h.signal(regionID, keys) {
		// The armed transfers' goroutines are runnable now, queued on
		// this P; yielding runs them here at once instead of when the
		// caller (a Notify handler, with its answer to send) blocks, or
		// when an idle thread wakes to steal them: 0.2-0.3 ms between a
		// key and its post on an idle 16-core host.
		runtime.Gosched()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delivered := 0
	for w := range h.watchers[regionID] {
		w.mu.Lock()
		m := n
		m.Dropped = w.dropped
		select {
		case w.C <- m:
			w.dropped = 0
			delivered++
		default:
			w.dropped++
		}
		w.mu.Unlock()
	}
	return delivered
}
