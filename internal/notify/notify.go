// Package notify fans out batch notifications to the local watchers of a
// region. A slow watcher never stalls the data path: its queue is bounded,
// and what it missed is counted and reported with its next notification.
package notify

import (
	"sync"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// QueueLen is how many notifications a watcher may fall behind.
const QueueLen = 1024

// Hub holds the watchers by region ID.
type Hub struct {
	mu       sync.Mutex
	watchers map[string]map[*Watcher]struct{}
}

// Watcher receives one region's notifications.
type Watcher struct {
	C       chan *b2bv1.Notification
	region  string
	mu      sync.Mutex
	dropped uint64
}

// Subscribe starts watching regionID; call Unsubscribe when done.
func (h *Hub) Subscribe(regionID string) *Watcher {
	w := &Watcher{C: make(chan *b2bv1.Notification, QueueLen), region: regionID}
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

// Publish queues n for every watcher of regionID and returns how many got it.
func (h *Hub) Publish(regionID string, n *b2bv1.Notification) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	delivered := 0
	for w := range h.watchers[regionID] {
		w.mu.Lock()
		m := n
		if w.dropped > 0 {
			m = &b2bv1.Notification{Region: n.Region, Sender: n.Sender, Notification: n.Notification,
				Blocks: n.Blocks, Bytes: n.Bytes, Dropped: w.dropped}
		}
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
