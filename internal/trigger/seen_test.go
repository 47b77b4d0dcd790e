package trigger

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestSeenNotBeforeTheWrite holds the watcher's lock while a scan waits
// for it, writes the counter, and lets the scan go: the fire's seen time
// must not predate the write (a scan that read the clock before the lock
// reported a time before it).
func TestSeenNotBeforeTheWrite(t *testing.T) {
	for _, p := range []Policy{{Spin: SpinAlways}, {Spin: SpinNever, Poll: 50 * time.Microsecond}} {
		w := New(p)
		word := new(uint64)
		seen := make(chan time.Time, 1)
		if _, err := w.Arm(Counter{Name: "c", Word: word}, 1, time.Time{}, func(at time.Time) { seen <- at }, func(err error) { t.Errorf("fail: %v", err) }); err != nil {
			t.Fatal(err)
		}
		w.mu.Lock()
		time.Sleep(5 * time.Millisecond) // lets the watcher reach the lock
		wrote := time.Now()
		atomic.StoreUint64(word, 1)
		w.mu.Unlock()
		select {
		case at := <-seen:
			if at.Before(wrote) {
				t.Errorf("policy %+v: seen %v before the write", p, wrote.Sub(at))
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("policy %+v: no fire 10 s after the write", p)
		}
		<-w.Stopped()
	}
}
