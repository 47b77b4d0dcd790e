package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/callerdeadline"
	"github.com/b2bd/b2bd/internal/callid"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Plan is a prepared transfer: a batch the daemon validated, merged,
// resolved and built once, to submit many times. It holds its source region
// until Release, or until this client's connection closes.
type Plan struct {
	c *Client
	// Handle names the plan on the daemon (for this connection only).
	Handle uint64
	// Info is the daemon's answer to PrepareTransfer.
	Info *b2bv1.PrepareTransferResponse
}

// Prepare plans t once (PrepareTransfer).
func (c *Client) Prepare(ctx context.Context, t Transfer) (*Plan, error) {
	resp, err := c.api.PrepareTransfer(ctx, &b2bv1.PrepareTransferRequest{
		SrcRegionId: t.SrcRegion, Peer: t.Peer, DstRegion: t.DstRegion, Transport: t.Transport, TransportName: t.TransportName, Notification: t.Notification, Op: t.Op,
		Descriptors: &b2bv1.Descriptors{
			SrcOffsets: Pack(t.Blocks.Src), DstOffsets: Pack(t.Blocks.Dst), Lengths: Pack(t.Blocks.Len),
			BlockLength: t.Blocks.BlockLength,
		},
	})
	if err != nil {
		return nil, err
	}
	return &Plan{c: c, Handle: resp.GetHandle(), Info: resp}, nil
}

// Submit runs the plan (SubmitTransfer) and returns once every byte landed
// at the peer. A stale plan (its peer restarted, its destination was
// re-registered or re-exported) fails with FailedPrecondition: Prepare again.
func (p *Plan) Submit(ctx context.Context) (*b2bv1.BatchTransferResponse, error) {
	return p.c.api.SubmitTransfer(ctx, &b2bv1.SubmitTransferRequest{Handle: p.Handle})
}

// Release frees the plan (ReleaseTransfer); submits in flight finish first.
func (p *Plan) Release(ctx context.Context) error {
	_, err := p.c.api.ReleaseTransfer(ctx, &b2bv1.ReleaseTransferRequest{Handle: p.Handle})
	return err
}

// Ping calls the daemon's empty RPC: the floor of a call.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.api.Ping(ctx, &b2bv1.PingRequest{})
	return err
}

// StreamResult is one submit's outcome on a Stream.
type StreamResult struct {
	Tag  uint64
	Resp *b2bv1.BatchTransferResponse // set on success
	Err  error                        // a gRPC status error on failure
}

// Stream runs many submits on one SubmitStream call: Submit sends one and
// returns its tag at once; results arrive on Results in completion order.
// The daemon runs up to 64 submits of a stream at once and stops reading
// beyond that, so Submit blocks when the pipeline is that deep.
//
// Cancelling the stream's context (or Close) goes to the daemon as
// CancelCall for the stream's call id: the daemon stops every submit under
// way, and the stream ends with the daemon's Canceled (Err), which comes
// once no byte of a submit can land any more, so nothing of a cancelled
// pull lands in this process's memory after it. A daemon that cannot be
// told (too old, unreachable) or does not answer within
// callerdeadline.Grace has the stream cut at the client instead.
type Stream struct {
	c       *Client
	s       b2bv1.B2B_SubmitStreamClient
	id      string             // the call id CancelCall names
	cancel  context.CancelFunc // cuts the call at the client
	unhook  func() bool        // stops the context's cancel from reaching the daemon
	once    sync.Once          // the stop through the daemon, once
	results chan StreamResult
	sendMu  sync.Mutex
	tag     atomic.Uint64
	err     atomic.Pointer[error] // why the stream ended, once it did
	done    chan struct{}
	// sendClosed: CloseSend was called (guarded by sendMu).
	sendClosed bool
}

// OpenStream opens a SubmitStream. Cancel ctx (see Stream), or CloseSend
// and drain Results, to end it.
func (c *Client) OpenStream(ctx context.Context) (*Stream, error) {
	// The call keeps ctx's deadline (the daemon is sent it and answers at
	// it) but not its cancel, which goes through the daemon (stop).
	call, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if d, ok := ctx.Deadline(); ok {
		var cancelD context.CancelFunc
		call, cancelD = context.WithDeadline(call, d)
		cancelC := cancel
		cancel = func() { cancelD(); cancelC() }
	}
	id := callid.New()
	s, err := c.api.SubmitStream(metadata.AppendToOutgoingContext(call, callid.Key, id))
	if err != nil {
		cancel()
		return nil, err
	}
	st := &Stream{c: c, s: s, id: id, cancel: cancel, results: make(chan StreamResult, 64), done: make(chan struct{})}
	st.unhook = context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return // the daemon (or, past callerdeadline.Max, gRPC) answers at the deadline
		}
		st.once.Do(st.stop)
	})
	go st.recv()
	return st, nil
}

// stop has the daemon stop the stream (CancelCall) and waits, up to
// callerdeadline.Grace, for the stream's end, the daemon's answer; failing
// that it cuts the call here.
func (st *Stream) stop() {
	select {
	case <-st.done:
		return // ended already: nothing to stop
	default:
	}
	cctx, cancel := context.WithTimeout(context.Background(), callerdeadline.Grace)
	defer cancel()
	if _, err := st.c.api.CancelCall(cctx, &b2bv1.CancelCallRequest{CallId: st.id}); err != nil {
		st.cancel()
		return
	}
	select {
	case <-st.done:
	case <-cctx.Done():
		st.cancel()
	}
}

func (st *Stream) recv() {
	defer close(st.done)
	defer close(st.results)
	defer st.cancel() // the call ended: free its context
	defer st.unhook()
	for {
		resp, err := st.s.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				st.err.CompareAndSwap(nil, &err)
			}
			return
		}
		r := StreamResult{Tag: resp.GetTag()}
		if resp.GetCode() != 0 {
			r.Err = status.Error(codes.Code(resp.GetCode()), resp.GetMessage())
		} else {
			r.Resp = resp.GetResult()
		}
		st.results <- r
	}
}

// Submit sends one submit of p and returns its tag. After CloseSend, or
// once the stream ended, it is refused FailedPrecondition (with the
// stream's own error when it ended early).
func (st *Stream) Submit(p *Plan) (uint64, error) {
	tag := st.tag.Add(1)
	st.sendMu.Lock()
	if st.sendClosed {
		st.sendMu.Unlock()
		return 0, status.Error(codes.FailedPrecondition, "b2b client: submit on a stream after its CloseSend: open another stream")
	}
	err := st.s.Send(&b2bv1.SubmitStreamRequest{Tag: tag, Handle: p.Handle})
	st.sendMu.Unlock()
	if err != nil {
		// io.EOF: the stream ended (closed, cancelled, or the daemon ended
		// it); its status is what recv saw.
		if errors.Is(err, io.EOF) {
			<-st.done
			if e := st.Err(); e != nil {
				return 0, fmt.Errorf("b2b client: submit on a stream that ended: %w", e)
			}
			return 0, status.Error(codes.FailedPrecondition, "b2b client: submit on a stream that ended (closed): open another stream")
		}
		return 0, fmt.Errorf("b2b client: submit on stream: %w", err)
	}
	return tag, nil
}

// Results delivers each submit's outcome; it is closed when the stream ends.
func (st *Stream) Results() <-chan StreamResult { return st.results }

// CloseSend says no more submits follow; Results closes once the daemon
// answered the ones sent.
func (st *Stream) CloseSend() error {
	st.sendMu.Lock()
	defer st.sendMu.Unlock()
	st.sendClosed = true
	return st.s.CloseSend()
}

// Err is why the stream ended early (nil while it runs or after a clean end).
func (st *Stream) Err() error {
	if e := st.err.Load(); e != nil {
		return *e
	}
	return nil
}

// Close ends the stream through the daemon (as cancelling its context
// does) and returns once it ended; safe to call twice. Results not read
// yet are dropped.
func (st *Stream) Close() error {
	go func() { // unblock recv should the caller have stopped reading Results
		for range st.results {
		}
	}()
	st.once.Do(st.stop)
	<-st.done
	return nil
}
