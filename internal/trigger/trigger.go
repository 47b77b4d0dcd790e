// Package trigger runs transfers when an application's progress counter
// reaches a value (docs/kv.md, "Layer streaming"). A counter is a 64-bit
// word in shared, host-pinned memory that a CUDA stream writes with a
// stream memory operation (cuStreamWriteValue64): no kernel, no SM. The
// daemon reads it with atomic 64-bit loads.
//
// A Watcher holds the armed triggers. Its goroutine exists only while a
// trigger is armed; it spins while a CPU is free and polls on a short
// period otherwise (Policy).
package trigger

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
)

// Counter is one progress word. Word must stay mapped while a trigger on
// it is armed (the daemon holds the region that contains it).
type Counter struct {
	Name string  // for messages, e.g. "r5+0"
	Word *uint64 // 8-byte aligned
}

// Load reads the counter with an atomic 64-bit load.
func (c Counter) Load() uint64 { return atomic.LoadUint64(c.Word) }

// Trigger is one armed "fire when the counter reaches Value".
type Trigger struct {
	w        *Watcher
	counter  Counter
	value    uint64
	deadline time.Time // zero: none
	armed    time.Time
	fire     func(seen time.Time)
	fail     func(error)
	state    int // guarded by w.mu
	g        *group
}

const (
	stateArmed = iota
	stateFired
	stateFailed
	stateCancelled
)

// group is the triggers of one counter, sorted by value (then arm order).
type group struct {
	counter Counter
	waiting []*Trigger
}

// Watcher watches the counters of its armed triggers.
type Watcher struct {
	policy Policy

	mu       sync.Mutex
	groups   []*group // a slice, not a map: the scan walks it every turn
	byWord   map[*uint64]*group
	n        int       // armed triggers
	nextDead time.Time // earliest deadline of an armed trigger; zero: none
	running  bool
	stopped  chan struct{} // closed when the latest goroutine has exited
	wake     chan struct{} // a new trigger: end a poll sleep early

	spins, polls atomic.Uint64 // scans of each kind, for tests and metrics
}

// New returns a watcher with policy p (zero fields take the defaults).
func New(p Policy) *Watcher {
	return &Watcher{policy: p.withDefaults(), byWord: map[*uint64]*group{}, wake: make(chan struct{}, 1)}
}

// Arm queues fire to run once c >= value, or fail (with an error wrapping
// context.DeadlineExceeded) once deadline passed first. Exactly one of fire
// and fail runs, on the watcher's goroutine, unless Cancel withdrew the
// trigger first. Both must return quickly (hand the work to another
// goroutine): a slow callback delays every other trigger. Triggers of one
// counter fire in value order; equal values in the order they were armed.
func (w *Watcher) Arm(c Counter, value uint64, deadline time.Time, fire func(seen time.Time), fail func(error)) (*Trigger, error) {
	if c.Word == nil {
		return nil, fmt.Errorf("%w: counter %q has no word", errs.ErrInvalidArgument, c.Name)
	}
	if fire == nil || fail == nil {
		return nil, fmt.Errorf("%w: trigger on counter %q needs both fire and fail", errs.ErrInvalidArgument, c.Name)
	}
	t := &Trigger{w: w, counter: c, value: value, deadline: deadline, armed: time.Now(), fire: fire, fail: fail}
	w.mu.Lock()
	g := w.byWord[c.Word]
	if g == nil {
		g = &group{counter: c}
		w.byWord[c.Word] = g
		w.groups = append(w.groups, g)
	}
	// Layers arm in increasing order, so this is usually an append.
	i := len(g.waiting)
	for i > 0 && g.waiting[i-1].value > value {
		i--
	}
	g.waiting = slices.Insert(g.waiting, i, t)
	t.g = g
	w.n++
	if !deadline.IsZero() && (w.nextDead.IsZero() || deadline.Before(w.nextDead)) {
		w.nextDead = deadline
	}
	if !w.running {
		w.running = true
		w.stopped = make(chan struct{})
		go w.run(w.stopped)
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return t, nil
}

// Cancel withdraws t. true: it was armed, and neither fire nor fail will
// run. false: it already fired or failed (its callback may be running).
func (t *Trigger) Cancel() bool {
	w := t.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if t.state != stateArmed {
		return false
	}
	t.state = stateCancelled
	w.remove(t)
	return true
}

// remove takes t out of its group; w.mu held.
func (w *Watcher) remove(t *Trigger) {
	g := t.g
	if i := slices.Index(g.waiting, t); i >= 0 {
		g.waiting = slices.Delete(g.waiting, i, i+1)
	}
	w.n--
	if len(g.waiting) == 0 {
		w.dropGroup(g)
	}
}

func (w *Watcher) dropGroup(g *group) {
	delete(w.byWord, g.counter.Word)
	if i := slices.Index(w.groups, g); i >= 0 {
		w.groups = slices.Delete(w.groups, i, i+1)
	}
}

// Armed is the number of armed triggers.
func (w *Watcher) Armed() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// Running reports whether the watcher's goroutine exists.
func (w *Watcher) Running() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.running
}

// Scans returns how many scans ran spinning and polling.
func (w *Watcher) Scans() (spins, polls uint64) { return w.spins.Load(), w.polls.Load() }

// due is one callback to run outside the lock.
type due struct {
	t    *Trigger
	seen time.Time
	err  error
}

// scan fires and fails what is due, and reports whether triggers remain
// armed. When none do it marks the goroutine gone, under the same lock
// that Arm checks, so no trigger is ever left without a watcher.
func (w *Watcher) scan(out []due) ([]due, bool) {
	out = out[:0]
	w.mu.Lock()
	for gi := 0; gi < len(w.groups); {
		g := w.groups[gi]
		v := g.counter.Load()
		k := 0
		for k < len(g.waiting) && g.waiting[k].value <= v {
			t := g.waiting[k]
			t.state = stateFired
			out = append(out, due{t: t})
			k++
		}
		if k > 0 {
			g.waiting = slices.Delete(g.waiting, 0, k)
			w.n -= k
		}
		if len(g.waiting) == 0 {
			w.dropGroup(g)
			continue
		}
		gi++
	}
	// The clock is read after every load, so a trigger is never seen
	// before the write that fired it (a time taken before the loads could
	// be, by as long as the scan waited for the lock or the CPU).
	now := time.Now()
	for i := range out {
		out[i].seen = now
	}
	if !w.nextDead.IsZero() && !now.Before(w.nextDead) {
		out = w.expire(now, out)
	}
	more := w.n > 0
	if !more {
		w.running = false // run returns and closes its stopped channel
	}
	w.mu.Unlock()
	for i := range out {
		d := &out[i]
		if d.err != nil {
			d.t.fail(d.err)
		} else {
			d.t.fire(d.seen)
		}
		d.t = nil
	}
	return out, more
}

// expire fails the triggers whose deadline passed and recomputes
// nextDead; w.mu held. A counter that reached its value in the same scan
// has fired already: the value wins over the deadline.
func (w *Watcher) expire(now time.Time, out []due) []due {
	w.nextDead = time.Time{}
	for gi := 0; gi < len(w.groups); {
		g := w.groups[gi]
		kept := g.waiting[:0]
		for _, t := range g.waiting {
			if !t.deadline.IsZero() && !now.Before(t.deadline) {
				t.state = stateFailed
				w.n--
				out = append(out, due{t: t, err: fmt.Errorf("%w: counter %s is at %d, short of %d, after %s armed",
					context.DeadlineExceeded, g.counter.Name, g.counter.Load(), t.value, now.Sub(t.armed).Round(time.Microsecond))})
				continue
			}
			if !t.deadline.IsZero() && (w.nextDead.IsZero() || t.deadline.Before(w.nextDead)) {
				w.nextDead = t.deadline
			}
			kept = append(kept, t)
		}
		clear(g.waiting[len(kept):])
		g.waiting = kept
		if len(kept) == 0 {
			w.dropGroup(g)
			continue
		}
		gi++
	}
	return out
}

// Wait arms a trigger and blocks until it fires (nil, and when the watcher
// saw the value), ctx ends (ctx's error; the trigger is withdrawn), or
// deadline (ctx's deadline, if any) passes (an error wrapping
// context.DeadlineExceeded). A nil error is the only case in which the
// caller may go on and post.
func (w *Watcher) Wait(ctx context.Context, c Counter, value uint64) (time.Time, error) {
	type result struct {
		seen time.Time
		err  error
	}
	ch := make(chan result, 1)
	deadline, _ := ctx.Deadline()
	t, err := w.Arm(c, value, deadline,
		func(seen time.Time) { ch <- result{seen: seen} },
		func(err error) { ch <- result{err: err} })
	if err != nil {
		return time.Time{}, err
	}
	select {
	case r := <-ch:
		return r.seen, r.err
	case <-ctx.Done():
		t.Cancel()
		// Even if it fired in between, ctx ended first: nothing may post.
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return time.Time{}, fmt.Errorf("%w: counter %s is at %d, short of %d", context.DeadlineExceeded, c.Name, c.Load(), value)
		}
		return time.Time{}, fmt.Errorf("waiting for counter %s to reach %d: %w", c.Name, value, ctx.Err())
	}
}
