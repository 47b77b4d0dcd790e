package client

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TransferHandle is an async transfer (StartTransfer): its id, and calls to
// wait for, poll and cancel it. The daemon reports a transfer's outcome
// once; the handle keeps it, so Wait, Done and Result may be called again.
// A handle is not safe for concurrent use.
type TransferHandle struct {
	c   *Client
	id  uint64
	out *b2bv1.TransferOutcome // nil: not ended yet (as far as we know)
}

// ID is the daemon's id of the transfer (never 0).
func (t *TransferHandle) ID() uint64 { return t.id }

// StartTransfer starts a batch and returns at once; timeout bounds the
// transfer from its start (0: the daemon's default).
func (c *Client) StartTransfer(ctx context.Context, t Transfer, timeout time.Duration, opts ...StartOption) (*TransferHandle, error) {
	return c.start(ctx, &b2bv1.StartTransferRequest{Transfer: &b2bv1.StartTransferRequest_Batch{Batch: t.request()}, TimeoutMs: ms(timeout)}, opts)
}

// StartBlocks starts a block transfer (TransferBlocks) and returns at once.
func (c *Client) StartBlocks(ctx context.Context, b Blocks, timeout time.Duration, opts ...StartOption) (*TransferHandle, error) {
	return c.start(ctx, &b2bv1.StartTransferRequest{Transfer: &b2bv1.StartTransferRequest_Blocks{Blocks: b.request()}, TimeoutMs: ms(timeout)}, opts)
}

// StartSubmit starts a submit of prepared plan handle and returns at once.
func (c *Client) StartSubmit(ctx context.Context, handle uint64, timeout time.Duration, opts ...StartOption) (*TransferHandle, error) {
	return c.start(ctx, &b2bv1.StartTransferRequest{Transfer: &b2bv1.StartTransferRequest_Submit{Submit: &b2bv1.SubmitTransferRequest{Handle: handle}}, TimeoutMs: ms(timeout)}, opts)
}

// StartOption changes how a transfer starts.
type StartOption func(*b2bv1.StartTransferRequest)

// After queues the transfer until the 64-bit counter at offset (a multiple
// of 8) in host region counterRegion, one of this client's, reaches value.
// Nothing is posted before; the timeout runs while it waits, and Cancel
// withdraws it (docs/kv.md, "Layer streaming").
func After(counterRegion string, offset, value uint64) StartOption {
	return func(r *b2bv1.StartTransferRequest) {
		r.After = &b2bv1.TransferTrigger{CounterRegionId: counterRegion, CounterOffset: offset, Value: value}
	}
}

func ms(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64(max(d.Milliseconds(), 1))
}

func (c *Client) start(ctx context.Context, req *b2bv1.StartTransferRequest, opts []StartOption) (*TransferHandle, error) {
	for _, o := range opts {
		o(req)
	}
	resp, err := c.api.StartTransfer(ctx, req)
	if err != nil {
		return nil, err
	}
	return &TransferHandle{c: c, id: resp.GetTransferId()}, nil
}

// Handle is a handle for a transfer started elsewhere on this connection.
func (c *Client) Handle(id uint64) *TransferHandle { return &TransferHandle{c: c, id: id} }

func ended(o *b2bv1.TransferOutcome) bool {
	return o.GetState() != b2bv1.TransferState_TRANSFER_STATE_RUNNING && o.GetState() != b2bv1.TransferState_TRANSFER_STATE_UNSPECIFIED
}

// Wait waits until the transfer ended or timeout passed (0: until it ends,
// or ctx does) and returns its outcome: state RUNNING when it has not
// ended.
func (t *TransferHandle) Wait(ctx context.Context, timeout time.Duration) (*b2bv1.TransferOutcome, error) {
	if t.out != nil {
		return t.out, nil
	}
	o, err := t.c.api.WaitTransfer(ctx, &b2bv1.WaitTransferRequest{TransferId: t.id, TimeoutMs: ms(timeout)})
	if err != nil {
		return nil, err
	}
	if ended(o) {
		t.out = o
	}
	return o, nil
}

// Done polls the transfer: true once it ended (Result then says how).
func (t *TransferHandle) Done(ctx context.Context) (bool, error) {
	if t.out != nil {
		return true, nil
	}
	os, err := t.c.Poll(ctx, []*TransferHandle{t})
	if err != nil {
		return false, err
	}
	return ended(os[0]), nil
}

// Cancel stops the transfer and returns once no byte of it lands any more,
// with its outcome (CANCELLED, or what it came to if it had ended).
func (t *TransferHandle) Cancel(ctx context.Context) (*b2bv1.TransferOutcome, error) {
	if t.out != nil {
		return t.out, nil
	}
	o, err := t.c.api.CancelTransfer(ctx, &b2bv1.CancelTransferRequest{TransferId: t.id})
	if err != nil {
		return nil, err
	}
	t.out = o
	return o, nil
}

// Result is the ended transfer's response, or its error as a gRPC status
// (CANCELLED: codes.Canceled unless the daemon said otherwise); nil, nil
// while it runs (as far as the handle knows).
func (t *TransferHandle) Result() (*b2bv1.BatchTransferResponse, error) {
	if t.out == nil {
		return nil, nil
	}
	if t.out.GetState() == b2bv1.TransferState_TRANSFER_STATE_DONE {
		return t.out.GetResult(), nil
	}
	code := codes.Code(t.out.GetCode())
	if code == codes.OK {
		code = codes.Unknown
	}
	return nil, status.Error(code, t.out.GetMessage())
}

// Poll asks for the outcome of each handle at once (one call, no waiting)
// and records the ended ones in their handles. Handles already ended are
// answered from what they hold.
func (c *Client) Poll(ctx context.Context, hs []*TransferHandle) ([]*b2bv1.TransferOutcome, error) {
	out := make([]*b2bv1.TransferOutcome, len(hs))
	var ask []uint64
	var at []int
	for i, h := range hs {
		if h.out != nil {
			out[i] = h.out
			continue
		}
		ask, at = append(ask, h.id), append(at, i)
	}
	if len(ask) == 0 {
		return out, nil
	}
	resp, err := c.api.PollTransfers(ctx, &b2bv1.PollTransfersRequest{TransferIds: ask})
	if err != nil {
		return nil, err
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

// WatchTransfers streams the outcome of each of this connection's client's
// transfers as it ends; each is reported once, there or to Wait/Poll.
func (c *Client) WatchTransfers(ctx context.Context) (b2bv1.B2B_WatchTransfersClient, error) {
	return c.api.WatchTransfers(ctx, &b2bv1.WatchTransfersRequest{})
}
