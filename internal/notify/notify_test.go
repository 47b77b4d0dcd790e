package notify

import (
	"errors"
	"testing"
)

// TestHubEnd: End ends every watcher of one region, with its reason, after
// what was queued for it; another region's watchers, and a later watcher
// of the same ID, go on; Unsubscribe after End is harmless.
func TestHubEnd(t *testing.T) {
	var h Hub
	a1, a2, b := h.Subscribe("a"), h.Subscribe("a"), h.Subscribe("b")
	if n := h.Publish("a", Notification{Notification: []byte("before")}); n != 2 {
		t.Fatalf("published to %d watchers of a, want 2", n)
	}
	why := errors.New("released")
	h.End("a", why)
	for i, w := range []*Watcher{a1, a2} {
		select {
		case <-w.Done():
		default:
			t.Fatalf("watcher %d of a not ended", i)
		}
		if !errors.Is(w.Err(), why) {
			t.Fatalf("watcher %d of a: Err %v, want %v", i, w.Err(), why)
		}
		if n := <-w.C; string(n.Notification) != "before" {
			t.Fatalf("watcher %d of a lost what was queued before the end: %q", i, n.Notification)
		}
	}
	if b.Err() != nil {
		t.Fatalf("a watcher of b ended: %v", b.Err())
	}
	if n := h.Publish("a", Notification{}); n != 0 {
		t.Fatalf("published to %d ended watchers", n)
	}
	later := h.Subscribe("a")
	if n := h.Publish("a", Notification{}); n != 1 || later.Err() != nil {
		t.Fatalf("a later watcher of a: published to %d, Err %v", n, later.Err())
	}
	h.Unsubscribe(a1)
	h.Unsubscribe(a2)
	if n := h.Publish("a", Notification{}); n != 1 {
		t.Fatalf("unsubscribing ended watchers dropped the later one: published to %d", n)
	}
	if n := h.Publish("b", Notification{}); n != 1 {
		t.Fatalf("published to %d watchers of b, want 1", n)
	}
}
