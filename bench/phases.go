package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// phaseSamples collects the daemon's phase timings of a mode's timed calls.
type phaseSamples struct {
	decode, validate, resolve, plan, post, wire, notify, total, outside, nonWire, notWire, control []time.Duration
}

// add records one call: the daemon's phases (nil or all zero: the daemon
// reports none, and the call is not counted) and the call as the client
// timed it.
func (p *phaseSamples) add(ph *b2bv1.PhaseTimings, call time.Duration) {
	if ph.GetTotalNs() == 0 {
		return
	}
	ns := func(v uint64) time.Duration { return time.Duration(v) }
	p.decode = append(p.decode, ns(ph.GetDecodeNs()))
	p.validate = append(p.validate, ns(ph.GetValidateNs()))
	p.resolve = append(p.resolve, ns(ph.GetResolveNs()))
	p.plan = append(p.plan, ns(ph.GetPlanNs()))
	p.post = append(p.post, ns(ph.GetPostNs()))
	p.wire = append(p.wire, ns(ph.GetWireNs()))
	p.notify = append(p.notify, ns(ph.GetNotifyNs()))
	p.total = append(p.total, ns(ph.GetTotalNs()))
	p.outside = append(p.outside, max(0, call-ns(ph.GetTotalNs())))
	p.nonWire = append(p.nonWire, max(0, ns(ph.GetTotalNs())-ns(ph.GetWireNs())))
	p.notWire = append(p.notWire, max(0, call-ns(ph.GetWireNs())))
	// As internal/e2e's BenchmarkPrepared: not clamped.
	p.control = append(p.control, call-ns(ph.GetWireNs())-ns(ph.GetPostNs()))
}

// out is each phase's median, or nil when no call reported phases.
func (p *phaseSamples) out() *PhaseOut {
	if len(p.total) == 0 {
		return nil
	}
	m := func(s []time.Duration) float64 { return Summarize(s).Median.Seconds() }
	return &PhaseOut{
		Decode: m(p.decode), Validate: m(p.validate), Resolve: m(p.resolve), Plan: m(p.plan), Post: m(p.post),
		Wire: m(p.wire), Notify: m(p.notify), Total: m(p.total), Outside: m(p.outside), NonWire: m(p.nonWire),
		CallLessWire: m(p.notWire), Control: m(p.control),
	}
}

// phaseOutOf is one call's phases (a PrepareTransfer's), or nil if none.
func phaseOutOf(ph *b2bv1.PhaseTimings, call time.Duration) *PhaseOut {
	var p phaseSamples
	p.add(ph, call)
	return p.out()
}

// pingWarmUp calls are made and dropped before the floor is timed.
const pingWarmUp = 10

// MeasurePingFloor times calls empty Ping calls on api one after another
// and returns their median: the fixed cost of any call on this connection.
// A daemon without Ping gives (0, false, nil).
func MeasurePingFloor(ctx context.Context, api b2bv1.B2BClient, calls int) (time.Duration, bool, error) {
	if calls <= 0 {
		return 0, false, nil
	}
	samples := make([]time.Duration, 0, calls)
	for i := -pingWarmUp; i < calls; i++ {
		start := time.Now()
		_, err := api.Ping(ctx, &b2bv1.PingRequest{})
		el := time.Since(start)
		if status.Code(err) == codes.Unimplemented {
			return 0, false, nil
		}
		if err != nil {
			return 0, false, fmt.Errorf("ping floor: call %d: %w", i+pingWarmUp+1, err)
		}
		if i >= 0 {
			samples = append(samples, el)
		}
	}
	return Summarize(samples).Median, true, nil
}

// errNoPrepare marks a daemon that does not implement PrepareTransfer.
var errNoPrepare = errors.New("the daemon does not implement PrepareTransfer")
