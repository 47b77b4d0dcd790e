package batch

import (
	"context"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/trigger"
)

// Triggered transfers (docs/kv.md, "Layer streaming"): a transfer started
// with After waits in the trigger watcher until its counter reaches the
// value, then posts. The counter is a word of a host region of the
// caller's, held (not deregistrable) while the transfer lives.

// Trigger is a transfer's `after`: the 64-bit counter at Offset of the
// caller's host region Region, and the Value it waits for.
type Trigger struct {
	Region string
	Offset uint64
	Value  uint64
}

// triggers arms triggered transfers: it holds each counter's region in
// the registry and waits in the watcher.
type triggers struct {
	reg *region.Registry
	w   *trigger.Watcher
}

// counter checks after and holds its counter's region; release lets go.
func (ts triggers) counter(after Trigger, who region.Caller) (trigger.Counter, func(), error) {
	id, off := after.Region, after.Offset
	if id == "" {
		return trigger.Counter{}, nil, fmt.Errorf("%w: after.counter_region_id is empty: give a host region of yours (host_alloc of one page)", errs.ErrInvalidArgument)
	}
	name := fmt.Sprintf("%s+%d", id, off)
	r, release, err := ts.reg.Hold(id, "after.counter_region_id", who, "a trigger on counter "+name)
	if err != nil {
		return trigger.Counter{}, nil, err
	}
	m := r.Mem
	switch {
	case m.Kind != memory.Host || m.Host == nil:
		err = fmt.Errorf("%w: after.counter_region_id %s is %s memory: a counter lives in host memory (host_alloc)", errs.ErrInvalidArgument, id, m.Kind)
	case off%8 != 0:
		err = fmt.Errorf("%w: after.counter_offset %d is not a multiple of 8", errs.ErrInvalidArgument, off)
	case m.Len < 8 || off > m.Len-8:
		err = fmt.Errorf("%w: after.counter_offset %d + 8 is past the end of region %s (%d bytes)", errs.ErrInvalidArgument, off, id, m.Len)
	}
	if err != nil {
		release()
		return trigger.Counter{}, nil, err
	}
	// The region is mapped at a page boundary, so the word is 8-aligned.
	return trigger.Counter{Name: name, Word: (*uint64)(unsafe.Pointer(&m.Host[off]))}, release, nil
}

// arm holds after's counter for who and returns the wrapper that gates a
// run on it (gated) and the release of the counter (idempotent), which
// the wrapped run calls when it ends; nil after: no gate, nothing held.
func (ts triggers) arm(after *Trigger, who region.Caller) (gate func(RunFunc) RunFunc, release func(), err error) {
	if after == nil {
		return func(run RunFunc) RunFunc { return run }, func() {}, nil
	}
	c, rel, err := ts.counter(*after, who)
	if err != nil {
		return nil, nil, err
	}
	release = sync.OnceFunc(rel)
	value := after.Value
	return func(run RunFunc) RunFunc { return ts.gated(c, value, release, run) }, release, nil
}

// gated wraps run so that its post waits for c to reach value, under the
// transfer's context (its deadline and Cancel): the run validates,
// resolves and plans first and waits at the gate (WithGate) just before
// it posts, so a fired trigger costs only the post. It reports the
// trigger's times. release (run at most once) lets go of the counter's
// region when the transfer ends.
func (ts triggers) gated(c trigger.Counter, value uint64, release func(), run RunFunc) RunFunc {
	return func(ctx context.Context) (Result, error) {
		defer release()
		var armed, seen time.Time
		res, err := run(WithGate(ctx, func(ctx context.Context) error {
			armed = time.Now()
			var err error
			seen, err = ts.w.Wait(ctx, c, value)
			return err // an error: nothing was posted
		}))
		if !seen.IsZero() {
			res.Phases.Armed, res.Phases.TriggerSeen = seen.Sub(armed), seen
		}
		return res, err
	}
}
