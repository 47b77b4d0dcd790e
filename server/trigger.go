package server

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"github.com/b2bd/b2bd/internal/batch"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/trigger"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Triggered transfers (docs/kv.md, "Layer streaming"): a transfer started
// with `after` waits in the trigger watcher until its counter reaches the
// value, then runs. The counter is a word of a host region of the
// caller's, held (not deregistrable) while the transfer lives.

// counterOf checks after and holds its counter's region; release lets go.
func (s *Server) counterOf(after *b2bv1.TransferTrigger, who region.Caller) (trigger.Counter, func(), error) {
	id, off := after.GetCounterRegionId(), after.GetCounterOffset()
	if id == "" {
		return trigger.Counter{}, nil, fmt.Errorf("%w: after.counter_region_id is empty: give a host region of yours (host_alloc of one page)", errs.ErrInvalidArgument)
	}
	name := fmt.Sprintf("%s+%d", id, off)
	r, release, err := s.cfg.Registry.Hold(id, "after.counter_region_id", who, "a trigger on counter "+name)
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

// gated wraps run so that it waits for c to reach value first, under the
// transfer's context (its deadline and CancelTransfer), then runs it and
// reports the trigger's times. release (run at most once) lets go of the
// counter's region when the transfer ends.
func (s *Server) gated(c trigger.Counter, value uint64, release func(), run batch.RunFunc) batch.RunFunc {
	return func(ctx context.Context) (batch.Result, error) {
		defer release()
		armed := time.Now()
		seen, err := s.triggers.Wait(ctx, c, value)
		if err != nil {
			return batch.Result{}, err // nothing was posted
		}
		res, err := run(ctx)
		res.Phases.Armed, res.Phases.TriggerSeen = seen.Sub(armed), seen
		return res, err
	}
}
