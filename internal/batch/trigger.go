package batch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/notify"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/trigger"
)

// Triggered transfers (docs/kv.md, "Layer streaming"): a transfer started
// with After waits in the trigger watcher until its counter reaches the
// value, then posts. The counter is a word of a host region of the
// caller's, held (not deregistrable) while the transfer lives.

// Trigger is a transfer's `after`: the 64-bit counter at Offset of the
// caller's host region Region, and the Value it waits for; or, with
// NoteRegion set instead, a key note (internal/notify, keys.go) naming
// NoteKey landing on the caller's region NoteRegion.
type Trigger struct {
	Region string
	Offset uint64
	Value  uint64

	NoteRegion string
	NoteKey    []byte
}

// triggers arms triggered transfers: it holds each counter's region in
// the registry and waits in the watcher, or for a key note in notes.
type triggers struct {
	reg   *region.Registry
	w     *trigger.Watcher
	notes *notify.Hub
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
	if after.NoteRegion != "" || len(after.NoteKey) > 0 {
		return ts.armNote(after, who)
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
	return gatedOn(func(ctx context.Context) (time.Time, error) { return ts.w.Wait(ctx, c, value) }, release, run)
}

// gatedOn wraps run so that its post waits for wait (which returns when
// it saw its trigger), and reports the trigger's times; release runs as
// the run ends.
func gatedOn(wait func(context.Context) (time.Time, error), release func(), run RunFunc) RunFunc {
	return func(ctx context.Context) (Result, error) {
		defer release()
		var armed, seen time.Time
		res, err := run(WithGate(ctx, func(ctx context.Context) error {
			armed = time.Now()
			var err error
			seen, err = wait(ctx)
			return err // an error: nothing was posted
		}))
		if !seen.IsZero() {
			res.Phases.Armed, res.Phases.TriggerSeen = max(0, seen.Sub(armed)), seen
		}
		return res, err
	}
}

// armNote is arm for a key-note trigger: the note's region is held (it
// must be the caller's) while the transfer lives.
func (ts triggers) armNote(after *Trigger, who region.Caller) (gate func(RunFunc) RunFunc, release func(), err error) {
	switch {
	case after.Region != "" || after.Offset != 0 || after.Value != 0:
		return nil, nil, fmt.Errorf("%w: after names both a counter (counter_region_id %q) and a note (note_region_id %q): give one", errs.ErrInvalidArgument, after.Region, after.NoteRegion)
	case after.NoteRegion == "":
		return nil, nil, fmt.Errorf("%w: after.note_region_id is empty: give the region of yours that the key note lands on", errs.ErrInvalidArgument)
	case len(after.NoteKey) == 0 || len(after.NoteKey) > notify.MaxKeyLen:
		return nil, nil, fmt.Errorf("%w: after.note_key is %d bytes: want 1 to %d", errs.ErrInvalidArgument, len(after.NoteKey), notify.MaxKeyLen)
	case ts.notes == nil:
		return nil, nil, fmt.Errorf("%w: after.note_region_id: this daemon delivers no notes", errs.ErrFailedPrecondition)
	}
	r, rel, err := ts.reg.Hold(after.NoteRegion, "after.note_region_id", who, fmt.Sprintf("a trigger on key notes to %s", after.NoteRegion))
	if err != nil {
		return nil, nil, err
	}
	release = sync.OnceFunc(rel)
	id, key := r.ID, append([]byte(nil), after.NoteKey...)
	wait := func(ctx context.Context) (time.Time, error) {
		at, err := ts.notes.WaitKey(ctx, id, key)
		if err != nil {
			// Name what it waited for, as a counter's wait does: the
			// context's bare error says neither the key nor the region.
			if errors.Is(err, context.DeadlineExceeded) {
				return at, fmt.Errorf("%w: no key note naming after.note_key %q landed on after.note_region_id %s before the transfer's deadline (nothing was posted)", context.DeadlineExceeded, key, id)
			}
			return at, fmt.Errorf("waiting for a key note naming after.note_key %q on after.note_region_id %s: %w", key, id, err)
		}
		return at, nil
	}
	return func(run RunFunc) RunFunc { return gatedOn(wait, release, run) }, release, nil
}

// Arm checks after (nil: no trigger) for who and holds what it waits on:
// gate wraps a run so that it waits there just before it posts; release
// (idempotent, also run by the gated run as it ends) lets go. For callers
// that run transfers themselves (the ring); Start arms its own.
func (s *Service) Arm(after *Trigger, who region.Caller) (gate func(RunFunc) RunFunc, release func(), err error) {
	return s.triggers.arm(after, who)
}
