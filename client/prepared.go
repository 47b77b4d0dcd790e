package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
		SrcRegionId: t.SrcRegion, Peer: t.Peer, DstRegion: t.DstRegion, Transport: t.Transport, Notification: t.Notification, Op: t.Op,
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
type Stream struct {
	s       b2bv1.B2B_SubmitStreamClient
	cancel  context.CancelFunc
	results chan StreamResult
	sendMu  sync.Mutex
	tag     atomic.Uint64
	err     atomic.Pointer[error] // why the stream ended, once it did
	done    chan struct{}
}

// OpenStream opens a SubmitStream. Cancel ctx, or CloseSend and drain
// Results, to end it.
func (c *Client) OpenStream(ctx context.Context) (*Stream, error) {
	ctx, cancel := context.WithCancel(ctx)
	s, err := c.api.SubmitStream(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	st := &Stream{s: s, cancel: cancel, results: make(chan StreamResult, 64), done: make(chan struct{})}
	go st.recv()
	return st, nil
}

func (st *Stream) recv() {
	defer close(st.done)
	defer close(st.results)
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

// Submit sends one submit of p and returns its tag.
func (st *Stream) Submit(p *Plan) (uint64, error) {
	tag := st.tag.Add(1)
	st.sendMu.Lock()
	err := st.s.Send(&b2bv1.SubmitStreamRequest{Tag: tag, Handle: p.Handle})
	st.sendMu.Unlock()
	if err != nil {
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
	return st.s.CloseSend()
}

// Err is why the stream ended early (nil while it runs or after a clean end).
func (st *Stream) Err() error {
	if e := st.err.Load(); e != nil {
		return *e
	}
	return nil
}

// Close ends the stream at once; safe to call twice. Submits in flight may
// still complete on the daemon, but their results are dropped.
func (st *Stream) Close() error {
	st.cancel()
	go func() { // unblock recv should the caller have stopped reading Results
		for range st.results {
		}
	}()
	<-st.done
	return nil
}
