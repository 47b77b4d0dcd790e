package client

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// MaxStartTransfers is the daemon's limit of requests per StartTransfers
// call; StartMany splits longer lists into calls of this many.
const MaxStartTransfers = 1024

// BatchStart is StartTransfer's request, for StartMany.
func BatchStart(t Transfer, timeout time.Duration, opts ...StartOption) *b2bv1.StartTransferRequest {
	return withOpts(&b2bv1.StartTransferRequest{Transfer: &b2bv1.StartTransferRequest_Batch{Batch: t.request()}, TimeoutMs: ms(timeout)}, opts)
}

// BlocksStart is StartBlocks's request, for StartMany.
func BlocksStart(b Blocks, timeout time.Duration, opts ...StartOption) *b2bv1.StartTransferRequest {
	return withOpts(&b2bv1.StartTransferRequest{Transfer: &b2bv1.StartTransferRequest_Blocks{Blocks: b.request()}, TimeoutMs: ms(timeout)}, opts)
}

// SubmitStart is StartSubmit's request, for StartMany.
func SubmitStart(handle uint64, timeout time.Duration, opts ...StartOption) *b2bv1.StartTransferRequest {
	return withOpts(&b2bv1.StartTransferRequest{Transfer: &b2bv1.StartTransferRequest_Submit{Submit: &b2bv1.SubmitTransferRequest{Handle: handle}}, TimeoutMs: ms(timeout)}, opts)
}

func withOpts(r *b2bv1.StartTransferRequest, opts []StartOption) *b2bv1.StartTransferRequest {
	for _, o := range opts {
		o(r)
	}
	return r
}

// Started is one request's answer in StartMany: a handle, or the error
// StartTransfer would have returned (a gRPC status whose message names
// the request's index).
type Started struct {
	Handle *TransferHandle
	Err    error
}

// StartMany starts every request in one StartTransfers call (one per
// MaxStartTransfers requests), each checked and started as StartTransfer
// would: a refused request gets its own Err and does not stop the others.
// The error is the call's own (the daemon unreachable, ctx ended): then
// the requests of that call were not started, or were cancelled.
func (c *Client) StartMany(ctx context.Context, reqs ...*b2bv1.StartTransferRequest) ([]Started, error) {
	out := make([]Started, 0, len(reqs))
	for at := 0; at < len(reqs); at += MaxStartTransfers {
		part := reqs[at:min(at+MaxStartTransfers, len(reqs))]
		resp, err := c.api.StartTransfers(ctx, &b2bv1.StartTransfersRequest{Requests: part})
		if err != nil {
			return nil, fmt.Errorf("start %d transfers (from %d): %w", len(part), at, err)
		}
		if len(resp.GetResults()) != len(part) {
			return nil, fmt.Errorf("start %d transfers: the daemon answered %d results", len(part), len(resp.GetResults()))
		}
		for _, r := range resp.GetResults() {
			if r.GetCode() != 0 {
				out = append(out, Started{Err: status.Error(codes.Code(r.GetCode()), r.GetMessage())})
				continue
			}
			out = append(out, Started{Handle: &TransferHandle{c: c, id: r.GetTransferId()}})
		}
	}
	return out, nil
}

// WaitMany waits in one call until every handle ended (anyOne false) or
// one did (anyOne true), or timeout passed (0: until then, or ctx ends),
// and returns each handle's outcome as Poll does (RUNNING: not ended),
// recording the ended ones in their handles. Handles that already ended
// are answered from what they hold (with anyOne, one of them satisfies
// the wait at once); one with a Wait call still running is RUNNING.
func (c *Client) WaitMany(ctx context.Context, hs []*TransferHandle, timeout time.Duration, anyOne bool) ([]*b2bv1.TransferOutcome, error) {
	out := make([]*b2bv1.TransferOutcome, len(hs))
	var ask []uint64
	var at []int
	endedAlready := false
	for i, h := range hs {
		switch {
		case !h.join(nil) && h.out == nil:
			out[i] = &b2bv1.TransferOutcome{TransferId: h.id, State: b2bv1.TransferState_TRANSFER_STATE_RUNNING}
		case h.out != nil:
			out[i], endedAlready = h.out, true
		default:
			ask, at = append(ask, h.id), append(at, i)
		}
	}
	if len(ask) == 0 || (anyOne && endedAlready) {
		return out, nil
	}
	resp, err := c.api.WaitTransfers(ctx, &b2bv1.WaitTransfersRequest{TransferIds: ask, TimeoutMs: ms(timeout), Any: anyOne})
	if err != nil {
		return nil, err
	}
	if len(resp.GetOutcomes()) != len(ask) {
		return nil, fmt.Errorf("wait for %d transfers: the daemon answered %d outcomes", len(ask), len(resp.GetOutcomes()))
	}
	for k, o := range resp.GetOutcomes() {
		i := at[k]
		out[i] = o
		if ended(o) {
			hs[i].out = o
		}
	}
	return out, nil
}
