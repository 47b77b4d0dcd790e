package trigger_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/trigger"
)

// policies runs each test under every way the watcher can wait.
var policies = []struct {
	name string
	p    trigger.Policy
}{
	{"spin", trigger.Policy{Spin: trigger.SpinAlways}},
	{"poll-nanosleep", trigger.Policy{Spin: trigger.SpinNever, Poll: 50 * time.Microsecond}},
	{"poll-timer", trigger.Policy{Spin: trigger.SpinNever, Poll: 100 * time.Microsecond, TimerSleep: true}},
	{"auto-busy", trigger.Policy{CPUFree: func(bool) bool { return false }}},
	{"auto-free", trigger.Policy{CPUFree: func(bool) bool { return true }}},
	{"auto-loadavg", trigger.Policy{}},
}

func newCounter(name string) (trigger.Counter, *uint64) {
	w := new(uint64)
	return trigger.Counter{Name: name, Word: w}, w
}

// fired is what a fire saw: its value and the counter when it was called
// (the moment a transfer would be posted).
type fired struct {
	id, value, counterAtFire uint64
}

type recorder struct {
	mu    sync.Mutex
	fires []fired
	fails []error
	ch    chan struct{} // one send per callback
}

func newRecorder() *recorder { return &recorder{ch: make(chan struct{}, 4096)} }

func (r *recorder) arm(t *testing.T, w *trigger.Watcher, c trigger.Counter, id, value uint64, deadline time.Time) *trigger.Trigger {
	t.Helper()
	tr, err := w.Arm(c, value, deadline, func(time.Time) {
		r.mu.Lock()
		r.fires = append(r.fires, fired{id, value, c.Load()})
		r.mu.Unlock()
		r.ch <- struct{}{}
	}, func(err error) {
		r.mu.Lock()
		r.fails = append(r.fails, err)
		r.mu.Unlock()
		r.ch <- struct{}{}
	})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// await waits for n callbacks.
func (r *recorder) await(t *testing.T, n int) {
	t.Helper()
	limit := time.After(20 * time.Second)
	for range n {
		select {
		case <-r.ch:
		case <-limit:
			t.Fatalf("callbacks did not come within 20 s (fires %v, fails %v)", r.snapshot(), r.fails)
		}
	}
}

func (r *recorder) snapshot() []fired {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.fires)
}

// settle returns once the watcher finished two whole scans after the
// call: anything due at the call has been fired by then.
func settle(t *testing.T, w *trigger.Watcher) {
	t.Helper()
	s0, p0 := w.Scans()
	limit := time.Now().Add(20 * time.Second)
	for {
		s, p := w.Scans()
		if s+p >= s0+p0+2 {
			return
		}
		if !w.Running() {
			return // nothing armed: nothing can fire
		}
		if time.Now().After(limit) {
			t.Fatal("the watcher did not scan twice within 20 s")
		}
		runtime.Gosched()
	}
}

// TestOrderLateCounter writes the counter late on purpose, one layer at a
// time: before layer L is written, nothing at L or above has fired (a
// layer's transfer is never posted before its value), and each fire saw
// the counter at its value or above.
func TestOrderLateCounter(t *testing.T) {
	const layers = 12
	for _, pc := range policies {
		t.Run(pc.name, func(t *testing.T) {
			w := trigger.New(pc.p)
			c, word := newCounter("layers")
			r := newRecorder()
			for l := uint64(1); l <= layers; l++ {
				r.arm(t, w, c, l, l, time.Time{})
			}
			for l := uint64(1); l <= layers; l++ {
				settle(t, w)
				for _, f := range r.snapshot() {
					if f.value >= l {
						t.Fatalf("layer %d fired while the counter was %d", f.value, l-1)
					}
				}
				atomic.StoreUint64(word, l)
				r.await(t, 1)
			}
			got := r.snapshot()
			for i, f := range got {
				if f.value != uint64(i+1) || f.counterAtFire < f.value {
					t.Fatalf("fire %d: %+v; want layer %d at a counter >= its value", i, f, i+1)
				}
			}
			if len(r.fails) != 0 {
				t.Fatalf("failures: %v", r.fails)
			}
		})
	}
}

// TestDeadline: a counter that never arrives fails its trigger with
// DeadlineExceeded, and fire never runs; one that did arrive still fires.
func TestDeadline(t *testing.T) {
	for _, pc := range policies {
		t.Run(pc.name, func(t *testing.T) {
			w := trigger.New(pc.p)
			c, word := newCounter("c")
			atomic.StoreUint64(word, 2)
			r := newRecorder()
			r.arm(t, w, c, 1, 2, time.Now().Add(time.Hour))
			r.arm(t, w, c, 2, 3, time.Now().Add(5*time.Millisecond))
			r.arm(t, w, c, 3, 7, time.Now().Add(10*time.Millisecond))
			r.await(t, 3)
			if got := r.snapshot(); len(got) != 1 || got[0].id != 1 {
				t.Fatalf("fires %+v; want only trigger 1 (value 2, counter 2)", got)
			}
			if len(r.fails) != 2 {
				t.Fatalf("fails %v; want 2", r.fails)
			}
			for _, err := range r.fails {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("fail %v is not DeadlineExceeded", err)
				}
			}
			<-w.Stopped()
		})
	}
}

// TestCancel: a cancelled trigger never fires, even when its value comes;
// a trigger that fired cannot be cancelled.
func TestCancel(t *testing.T) {
	for _, pc := range policies {
		t.Run(pc.name, func(t *testing.T) {
			w := trigger.New(pc.p)
			c, word := newCounter("c")
			r := newRecorder()
			gone := r.arm(t, w, c, 1, 4, time.Now().Add(time.Hour))
			r.arm(t, w, c, 2, 5, time.Time{}) // fires after 1 would have, in the same scan
			if !gone.Cancel() {
				t.Fatal("Cancel of an armed trigger returned false")
			}
			if gone.Cancel() {
				t.Fatal("second Cancel returned true")
			}
			atomic.StoreUint64(word, 5)
			r.await(t, 1)
			if got := r.snapshot(); len(got) != 1 || got[0].id != 2 {
				t.Fatalf("fires %+v; want only trigger 2", got)
			}
			late := r.arm(t, w, c, 3, 1, time.Time{})
			r.await(t, 1)
			if late.Cancel() {
				t.Fatal("Cancel after the fire returned true")
			}
		})
	}
}

// TestManyOnOneCounter arms triggers in random order with repeated values:
// they fire in value order, equal values in arm order.
func TestManyOnOneCounter(t *testing.T) {
	for _, pc := range policies {
		t.Run(pc.name, func(t *testing.T) {
			w := trigger.New(pc.p)
			c, word := newCounter("c")
			r := newRecorder()
			rng := rand.New(rand.NewPCG(1, 2))
			const n = 1000
			type armed struct{ id, value uint64 }
			var want []armed
			for id := uint64(0); id < n; id++ {
				v := 1 + rng.Uint64N(50)
				want = append(want, armed{id, v})
				r.arm(t, w, c, id, v, time.Time{})
			}
			slices.SortStableFunc(want, func(a, b armed) int { return int(a.value) - int(b.value) })
			atomic.StoreUint64(word, 25)
			settle(t, w)
			atomic.StoreUint64(word, 50)
			r.await(t, n)
			got := r.snapshot()
			for i, f := range got {
				if f.id != want[i].id || f.counterAtFire < f.value {
					t.Fatalf("fire %d: %+v; want trigger %d (value %d)", i, f, want[i].id, want[i].value)
				}
			}
		})
	}
}

// TestSeveralCounters: each counter fires only its own triggers.
func TestSeveralCounters(t *testing.T) {
	for _, pc := range policies {
		t.Run(pc.name, func(t *testing.T) {
			w := trigger.New(pc.p)
			const counters, each = 8, 5
			r := newRecorder()
			words := make([]*uint64, counters)
			for k := range counters {
				c, word := newCounter(fmt.Sprintf("c%d", k))
				words[k] = word
				for v := uint64(1); v <= each; v++ {
					r.arm(t, w, c, uint64(k)*100+v, v, time.Time{})
				}
			}
			for k := counters - 1; k >= 0; k-- {
				atomic.StoreUint64(words[k], each)
				r.await(t, each)
				settle(t, w)
				for _, f := range r.snapshot() {
					if int(f.id/100) < k {
						t.Fatalf("trigger %d of counter %d fired while only counters %d.. were written", f.id, f.id/100, k)
					}
				}
			}
			if w.Armed() != 0 {
				t.Fatalf("%d still armed", w.Armed())
			}
		})
	}
}

// TestIdleWatcherGone: no goroutine while nothing is armed.
func TestIdleWatcherGone(t *testing.T) {
	for _, pc := range policies {
		t.Run(pc.name, func(t *testing.T) {
			before := runtime.NumGoroutine()
			w := trigger.New(pc.p)
			if w.Running() {
				t.Fatal("a new watcher runs")
			}
			c, word := newCounter("c")
			r := newRecorder()
			a := r.arm(t, w, c, 1, 1, time.Time{})
			r.arm(t, w, c, 2, 2, time.Time{})
			if !w.Running() {
				t.Fatal("no watcher while armed")
			}
			a.Cancel()
			atomic.StoreUint64(word, 2)
			r.await(t, 1)
			<-w.Stopped()
			if w.Running() {
				t.Fatal("the watcher still runs with nothing armed")
			}
			// Stopped closes as the watcher's goroutine returns, which it
			// may not have finished yet: wait for the count to settle, and
			// fail only on growth that stays.
			for end := time.Now().Add(10 * time.Second); ; {
				after := runtime.NumGoroutine()
				if after <= before {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("goroutines %d before, %d ten seconds after the watcher stopped", before, after)
				}
				time.Sleep(time.Millisecond) // a poll interval, not a synchronisation
			}
		})
	}
}

// TestWait covers the blocking form the daemon uses.
func TestWait(t *testing.T) {
	w := trigger.New(trigger.Policy{})
	c, word := newCounter("c")
	atomic.StoreUint64(word, 3)
	if _, err := w.Wait(context.Background(), c, 3); err != nil {
		t.Fatalf("Wait at the value: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if _, err := w.Wait(ctx, c, 4); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past the deadline: %v; want DeadlineExceeded", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, err := w.Wait(ctx2, c, 4); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait cancelled: %v; want Canceled", err)
	}
	<-w.Stopped()
	if w.Armed() != 0 {
		t.Fatalf("%d armed after the waits ended", w.Armed())
	}
	if _, err := w.Arm(trigger.Counter{Name: "nil"}, 1, time.Time{}, func(time.Time) {}, func(error) {}); err == nil {
		t.Fatal("Arm of a counter without a word succeeded")
	}
}

func TestParseLoadavg(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		okay bool
	}{
		{"0.52 0.58 0.59 3/1024 12345\n", 3, true},
		{"0.52 0.58 0.59 17/80 1", 17, true},
		{"0.52 0.58 0.59", 0, false},
		{"0.52 0.58 0.59 x/80 1", 0, false},
		{"0.52 0.58 0.59 -1/80 1", 0, false},
		{"", 0, false},
	} {
		n, ok := trigger.ParseLoadavg([]byte(tc.in))
		if ok != tc.okay || (ok && n != tc.n) {
			t.Errorf("ParseLoadavg(%q) = %d, %v; want %d, %v", tc.in, n, ok, tc.n, tc.okay)
		}
	}
}

func FuzzParseLoadavg(f *testing.F) {
	f.Add([]byte("0.52 0.58 0.59 3/1024 12345\n"))
	f.Add([]byte("1 2 3 /"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n, ok := trigger.ParseLoadavg(b); ok && n < 0 {
			t.Fatalf("negative count %d accepted", n)
		}
	})
}
