package client

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/notify"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TransferHandle is an async transfer of any kind (StartTransfer,
// StartBlocks, StartSubmit, After): its id, and calls to wait for, poll and
// cancel it. The daemon reports a transfer's outcome once; the handle keeps
// it, so Wait, Done and Result may be called again. An outcome the daemon
// handed over is never lost: a Wait whose ctx ends leaves its call running
// (its answer may be that outcome), and the next Wait, Done, Cancel or Poll
// of the handle takes its answer. A handle is not safe for concurrent use.
type TransferHandle struct {
	c       *Client
	id      uint64
	out     *b2bv1.TransferOutcome // nil: not ended yet (as far as we know)
	pending *pendingWait           // a Wait call its caller's ctx left running
}

// pendingWait is a WaitTransfer call running on after its caller's ctx
// ended; out and err are set before done is closed.
type pendingWait struct {
	done chan struct{}
	out  *b2bv1.TransferOutcome
	err  error
}

// join takes the answer of p if it came (or comes before ctx ends; a nil
// ctx does not wait): true when the call is over, and its outcome, if it
// ended the transfer, is in the handle.
func (t *TransferHandle) join(ctx context.Context) bool {
	p := t.pending
	if p == nil {
		return true
	}
	if ctx == nil {
		select {
		case <-p.done:
		default:
			return false
		}
	} else {
		select {
		case <-p.done:
		case <-ctx.Done():
			return false
		}
	}
	t.pending = nil
	if p.err == nil && ended(p.out) {
		t.out = p.out
	}
	return true
}

// ID is the daemon's id of the transfer (never 0).
func (t *TransferHandle) ID() uint64 { return t.id }

// StartTransfer starts a batch and returns at once; timeout bounds the
// transfer from its start (0: the daemon's default).
func (c *Client) StartTransfer(ctx context.Context, t Transfer, timeout time.Duration, opts ...StartOption) (*TransferHandle, error) {
	if err := checkTimeout(timeout); err != nil {
		return nil, err
	}
	return c.start(ctx, &b2bv1.StartTransferRequest{Transfer: &b2bv1.StartTransferRequest_Batch{Batch: t.request()}, TimeoutMs: ms(timeout)}, opts)
}

// StartBlocks starts a block transfer (TransferBlocks) and returns at once.
func (c *Client) StartBlocks(ctx context.Context, b Blocks, timeout time.Duration, opts ...StartOption) (*TransferHandle, error) {
	if err := checkTimeout(timeout); err != nil {
		return nil, err
	}
	return c.start(ctx, &b2bv1.StartTransferRequest{Transfer: &b2bv1.StartTransferRequest_Blocks{Blocks: b.request()}, TimeoutMs: ms(timeout)}, opts)
}

// StartSubmit starts a submit of prepared plan handle and returns at once.
func (c *Client) StartSubmit(ctx context.Context, handle uint64, timeout time.Duration, opts ...StartOption) (*TransferHandle, error) {
	if err := checkTimeout(timeout); err != nil {
		return nil, err
	}
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

// AfterNote queues the transfer until a key note naming key (1 to 64
// bytes) lands on noteRegion, one of this client's regions (docs/notes.md):
// a pull that waits for its source's "ready" starts in the daemon as the
// note lands, with no round trip through this process. The timeout runs
// while it waits (the daemon's default when none), and Cancel withdraws it.
func AfterNote(noteRegion string, key []byte) StartOption {
	return func(r *b2bv1.StartTransferRequest) {
		r.After = &b2bv1.TransferTrigger{NoteRegionId: noteRegion, NoteKey: key}
	}
}

// KeyNote is the notification of a key note naming keys (1 to 255, each 1
// to 64 bytes) before payload: sent with a transfer (or alone, by a block
// transfer of no block), it starts the transfers armed on its keys where
// it lands.
//
// A refusal (no key, more than 255, an empty key or one over 64 bytes) is
// InvalidArgument both ways: errors.Is(err, errs.ErrInvalidArgument) and
// status.Code(err), as the daemon's refusals read.
func KeyNote(keys [][]byte, payload []byte) ([]byte, error) {
	b, err := notify.AppendKeys(nil, keys, payload)
	if err != nil {
		return nil, coded{err}
	}
	return b, nil
}

// coded is a domain error (internal/errs) that also reads as the gRPC
// status of its class, for refusals the client makes itself.
type coded struct{ err error }

func (e coded) Error() string { return e.err.Error() }
func (e coded) Unwrap() error { return e.err }

// GRPCStatus is what status.Code and status.FromError read.
func (e coded) GRPCStatus() *status.Status { return status.New(grpcstatus.Code(e.err), e.err.Error()) }

// checkTimeout refuses a negative timeout (0 is the daemon's default), as
// the daemon refuses a bad field: before anything starts.
func checkTimeout(d time.Duration) error {
	if d < 0 {
		return status.Errorf(codes.InvalidArgument, "timeout %v: want >= 0 (0: the daemon's default)", d)
	}
	return nil
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
// or ctx does; a negative one is refused, InvalidArgument) and returns its
// outcome: state RUNNING when it has not ended. When ctx ends first, the call goes on (the daemon may be handing
// the outcome over): the next call on the handle takes its answer.
func (t *TransferHandle) Wait(ctx context.Context, timeout time.Duration) (*b2bv1.TransferOutcome, error) {
	if timeout < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "wait timeout %v: want >= 0 (0: until the transfer ends)", timeout)
	}
	if t.out == nil && t.pending != nil && !t.join(ctx) {
		return nil, ctx.Err()
	}
	if t.out != nil {
		return t.out, nil
	}
	p := &pendingWait{done: make(chan struct{})}
	req := &b2bv1.WaitTransferRequest{TransferId: t.id, TimeoutMs: ms(timeout)}
	// Not the caller's ctx: its end must not cut a call whose answer may
	// be the outcome the daemon reports once. The call ends with the
	// transfer, at timeout, or with the connection.
	go func(ctx context.Context) {
		p.out, p.err = t.c.api.WaitTransfer(ctx, req)
		close(p.done)
	}(context.WithoutCancel(ctx))
	t.pending = p
	if !t.join(ctx) {
		return nil, ctx.Err()
	}
	if p.err != nil {
		return nil, p.err
	}
	return p.out, nil
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
	t.join(nil)
	if t.out != nil {
		return t.out, nil
	}
	o, err := t.c.api.CancelTransfer(ctx, &b2bv1.CancelTransferRequest{TransferId: t.id})
	if status.Code(err) == codes.NotFound && t.pending != nil {
		// A Wait of ours left running may have taken the outcome first.
		if t.join(ctx) && t.out != nil {
			return t.out, nil
		}
	}
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
// answered from what they hold; one with a Wait call still running is
// RUNNING without asking (that call's answer is its outcome).
func (c *Client) Poll(ctx context.Context, hs []*TransferHandle) ([]*b2bv1.TransferOutcome, error) {
	out := make([]*b2bv1.TransferOutcome, len(hs))
	var ask []uint64
	var at []int
	for i, h := range hs {
		if !h.join(nil) && h.out == nil {
			out[i] = &b2bv1.TransferOutcome{TransferId: h.id, State: b2bv1.TransferState_TRANSFER_STATE_RUNNING}
			continue
		}
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
