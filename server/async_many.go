package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/b2bd/b2bd/internal/batch"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Batched async calls: an engine step starts, and polls or waits for, all
// of its requests' transfers in one round trip each.

// MaxStartTransfers bounds the requests of one StartTransfers call.
const MaxStartTransfers = 1024

// startManyLimit checks the count of a StartTransfers call.
func startManyLimit(n int) error {
	if n > MaxStartTransfers {
		return fmt.Errorf("%w: requests has %d transfers, over the limit of %d: split the call", errs.ErrInvalidArgument, n, MaxStartTransfers)
	}
	return nil
}

// StartTransfers starts each request as StartTransfer does, each with its
// own answer: the requests are independent transfers, so one refused
// request (a bad id list, a layout gone) must not cost the others their
// start. All-or-nothing is not offered: a start past its checks may
// already be posting, and undoing it means cancelling bytes in flight.
func (l *local) StartTransfers(ctx context.Context, req *b2bv1.StartTransfersRequest) (*b2bv1.StartTransfersResponse, error) {
	rs := req.GetRequests()
	if err := startManyLimit(len(rs)); err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	resp := &b2bv1.StartTransfersResponse{Results: make([]*b2bv1.StartTransferResult, len(rs))}
	started := make([]uint64, 0, len(rs))
	for i, r := range rs {
		if err := ctx.Err(); err != nil {
			// Nobody will learn the ids started so far: stop them.
			l.cancelAll(ctx, started)
			return nil, grpcstatus.ToStatus(fmt.Errorf("start transfers: the call ended after %d of %d requests (those are cancelled): %w", i, len(rs), err))
		}
		id, err := l.start(ctx, r)
		if err != nil {
			resp.Results[i] = &b2bv1.StartTransferResult{Code: uint32(grpcstatus.Code(err)), Message: fmt.Sprintf("requests[%d]: %v", i, err)}
			continue
		}
		started = append(started, id)
		resp.Results[i] = &b2bv1.StartTransferResult{TransferId: id}
	}
	return resp, nil
}

// cancelAll cancels ids of the caller's client and waits until they stopped.
func (l *local) cancelAll(ctx context.Context, ids []uint64) {
	t, client := l.s.batches.Transfers(), clientID(ctx)
	for _, id := range ids {
		// The outcome is taken and dropped: the caller never had the id.
		_, _ = t.Cancel(context.WithoutCancel(ctx), client, id)
	}
}

// WaitTransfers: a poll first (it checks every id, refusing the call as
// PollTransfers does, and takes those already ended); then one Wait per
// id still running, all under one context that ends at the condition.
func (l *local) WaitTransfers(ctx context.Context, req *b2bv1.WaitTransfersRequest) (*b2bv1.PollTransfersResponse, error) {
	timeout, err := timeoutMs("timeout_ms", req.GetTimeoutMs())
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	os, err := l.waitMany(ctx, clientID(ctx), req.GetTransferIds(), timeout, req.GetAny())
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	resp := &b2bv1.PollTransfersResponse{Outcomes: make([]*b2bv1.TransferOutcome, len(os))}
	for i, o := range os {
		resp.Outcomes[i] = o
	}
	return resp, nil
}

func (l *local) waitMany(ctx context.Context, client uint64, ids []uint64, timeout time.Duration, anyOne bool) ([]*b2bv1.TransferOutcome, error) {
	t := l.s.batches.Transfers()
	polled, err := t.Poll(client, ids)
	if err != nil {
		return nil, err
	}
	out := make([]*b2bv1.TransferOutcome, len(ids))
	var running []int
	for i, o := range polled {
		out[i] = outcomeProto(o)
		if o.State == batch.Running {
			running = append(running, i)
		}
	}
	if len(running) == 0 || (anyOne && len(running) < len(ids)) {
		return out, nil
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, i := range running {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			o, err := t.Wait(wctx, client, ids[i], timeout)
			switch {
			case err == nil:
				mu.Lock()
				out[i] = outcomeProto(o)
				mu.Unlock()
				if anyOne && o.State != batch.Running {
					stop()
				}
			case wctx.Err() != nil:
				// Stopped by the condition or the caller: a Wait that
				// returns so takes no outcome; it stays RUNNING here.
			default:
				// Reported elsewhere meanwhile (a watcher, another Wait).
				mu.Lock()
				out[i] = &b2bv1.TransferOutcome{TransferId: ids[i], Code: uint32(grpcstatus.Code(err)), Message: err.Error()}
				mu.Unlock()
			}
		}(i)
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("wait for %d transfers: %w", len(ids), err)
	}
	return out, nil
}
