package client

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"
	"weak"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/callerdeadline"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// MaxStartTransfers is the daemon's limit of requests per StartTransfers
// call; StartMany splits longer lists into calls of this many.
const MaxStartTransfers = 1024

// BatchStart is StartTransfer's request, for StartMany. A negative timeout
// is refused as StartTransfer refuses it: StartMany answers the request
// InvalidArgument and does not send it.
func BatchStart(t Transfer, timeout time.Duration, opts ...StartOption) *b2bv1.StartTransferRequest {
	return startRequest(&b2bv1.StartTransferRequest{Transfer: &b2bv1.StartTransferRequest_Batch{Batch: t.request()}}, timeout, opts)
}

// BlocksStart is StartBlocks's request, for StartMany (a negative timeout:
// as BatchStart's).
func BlocksStart(b Blocks, timeout time.Duration, opts ...StartOption) *b2bv1.StartTransferRequest {
	return startRequest(&b2bv1.StartTransferRequest{Transfer: &b2bv1.StartTransferRequest_Blocks{Blocks: b.request()}}, timeout, opts)
}

// SubmitStart is StartSubmit's request, for StartMany (a negative timeout:
// as BatchStart's).
func SubmitStart(handle uint64, timeout time.Duration, opts ...StartOption) *b2bv1.StartTransferRequest {
	return startRequest(&b2bv1.StartTransferRequest{Transfer: &b2bv1.StartTransferRequest_Submit{Submit: &b2bv1.SubmitTransferRequest{Handle: handle}}}, timeout, opts)
}

// refusedStarts holds why the builders above refused a request (a
// negative timeout, which the request's unsigned timeout_ms cannot carry),
// by a weak pointer to it: StartMany answers that refusal in its place,
// and the entry goes with the request.
var refusedStarts sync.Map // weak.Pointer[b2bv1.StartTransferRequest] -> error

func startRequest(r *b2bv1.StartTransferRequest, timeout time.Duration, opts []StartOption) *b2bv1.StartTransferRequest {
	r.TimeoutMs = ms(timeout)
	if err := checkTimeout(timeout); err != nil {
		wp := weak.Make(r)
		refusedStarts.Store(wp, err)
		runtime.AddCleanup(r, func(wp weak.Pointer[b2bv1.StartTransferRequest]) { refusedStarts.Delete(wp) }, wp)
	}
	return withOpts(r, opts)
}

// refusedStart is the builders' refusal of r, nil when it has none.
func refusedStart(r *b2bv1.StartTransferRequest) error {
	if v, ok := refusedStarts.Load(weak.Make(r)); ok {
		return v.(error)
	}
	return nil
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
// The error is a call's own (the daemon unreachable, ctx ended, a call
// over the daemon's message limit): then no request of the list runs.
// That call's requests were not started, or were cancelled by the daemon,
// and those that earlier calls of a split list started are cancelled here
// (CancelTransfer), so that none runs without a handle to wait for it.
func (c *Client) StartMany(ctx context.Context, reqs ...*b2bv1.StartTransferRequest) ([]Started, error) {
	out := make([]Started, len(reqs))
	send := make([]int, 0, len(reqs)) // the caller's index of each request sent
	for i, r := range reqs {
		if err := refusedStart(r); err != nil {
			out[i] = Started{Err: status.Errorf(status.Code(err), "requests[%d]: %s", i, status.Convert(err).Message())}
			continue
		}
		send = append(send, i)
	}
	for at := 0; at < len(send); at += MaxStartTransfers {
		idx := send[at:min(at+MaxStartTransfers, len(send))]
		part := make([]*b2bv1.StartTransferRequest, len(idx))
		for k, i := range idx {
			part[k] = reqs[i]
		}
		resp, err := c.api.StartTransfers(ctx, &b2bv1.StartTransfersRequest{Requests: part})
		if err == nil && len(resp.GetResults()) != len(part) {
			err = fmt.Errorf("the daemon answered %d results", len(resp.GetResults()))
		}
		if resp != nil { // what it started (all of it when err is nil)
			for k, r := range resp.GetResults()[:min(len(idx), len(resp.GetResults()))] {
				out[idx[k]] = startedOf(c, r, k, idx[k])
			}
		}
		if err != nil {
			c.cancelStarted(ctx, out)
			return nil, fmt.Errorf("start %d transfers (from %d): %w", len(part), idx[0], err)
		}
	}
	return out, nil
}

// startedOf is result k of a StartTransfers call, the caller's request i.
func startedOf(c *Client, r *b2bv1.StartTransferResult, k, i int) Started {
	if r.GetCode() != 0 {
		return Started{Err: status.Error(codes.Code(r.GetCode()), callerIndex(r.GetMessage(), k, i))}
	}
	return Started{Handle: &TransferHandle{c: c, id: r.GetTransferId()}}
}

// cancelStarted cancels the transfers in ss (a split StartMany that failed
// part way), best effort, each within callerdeadline.Grace of ctx's end.
func (c *Client) cancelStarted(ctx context.Context, ss []Started) {
	for _, s := range ss {
		if s.Handle == nil {
			continue
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callerdeadline.Grace)
		_, _ = c.api.CancelTransfer(cctx, &b2bv1.CancelTransferRequest{TransferId: s.Handle.id})
		cancel()
	}
}

// callerIndex is msg, the daemon's refusal of request k of a call, naming
// the caller's index i instead: the daemon names its index in the call
// ("requests[k]: ..."), which is not the caller's past the first call of
// a split list, or when StartMany sent only some of the requests.
func callerIndex(msg string, k, i int) string {
	if k == i {
		return msg
	}
	if rest, ok := strings.CutPrefix(msg, fmt.Sprintf("requests[%d]", k)); ok {
		return fmt.Sprintf("requests[%d]", i) + rest
	}
	return msg
}

// WaitMany waits in one call until every handle ended (anyOne false) or
// one did (anyOne true), or timeout passed (0: until then, or ctx ends; a
// negative one is refused, InvalidArgument), and returns each handle's
// outcome as Poll does (RUNNING: not ended), recording the ended ones in
// their handles. Handles that already ended
// are answered from what they hold (with anyOne, one of them satisfies
// the wait at once); one with a Wait call still running is RUNNING.
func (c *Client) WaitMany(ctx context.Context, hs []*TransferHandle, timeout time.Duration, anyOne bool) ([]*b2bv1.TransferOutcome, error) {
	if timeout < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "wait timeout %v: want >= 0 (0: until the condition)", timeout)
	}
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
	if len(ask) == 0 {
		return out, nil
	}
	if anyOne && endedAlready {
		// Not asked: as far as the client knows they run (as Poll
		// answers a handle it did not ask about), never a nil outcome.
		for k, i := range at {
			out[i] = &b2bv1.TransferOutcome{TransferId: ask[k], State: b2bv1.TransferState_TRANSFER_STATE_RUNNING}
		}
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
