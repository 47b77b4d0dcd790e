package server

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/batch"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/region"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// StreamInFlight bounds the submits one SubmitStream runs at once; with that
// many in flight the stream reads no more requests until one ends
// (backpressure through HTTP/2 flow control).
const StreamInFlight = 64

// StatsHandler is the local API server's stats.Handler (grpc.StatsHandler):
// it gives each client connection an ID and joins it to its client (leases.go),
// frees that connection's prepared plans when it closes, and the client's
// leased regions when its last connection closes, and stamps each call's
// first moment so handlers can report the time spent receiving and decoding
// the request.
func (s *Server) StatsHandler() stats.Handler { return &statsHandler{s: s} }

type statsHandler struct {
	s    *Server
	next atomic.Uint64
}

type connKey struct{}

// connCtx carries a client connection's ID; Value returns the *connCtx
// itself (no allocation per lookup).
type connCtx struct {
	context.Context
	id     uint64
	client *region.Client // the client the connection belongs to (leases.go)
}

func (c *connCtx) Value(k any) any {
	if k == (connKey{}) {
		return c
	}
	return c.Context.Value(k)
}

type beginKey struct{}

// beginCtx carries when a call began (its headers arrived).
type beginCtx struct {
	context.Context
	at time.Time
}

func (c *beginCtx) Value(k any) any {
	if k == (beginKey{}) {
		return c
	}
	return c.Context.Value(k)
}

func (h *statsHandler) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return &connCtx{Context: ctx, id: h.next.Add(1), client: h.s.join(ctx)}
}

func (h *statsHandler) HandleConn(ctx context.Context, cs stats.ConnStats) {
	if _, ok := cs.(*stats.ConnEnd); !ok {
		return
	}
	c, ok := ctx.Value(connKey{}).(*connCtx)
	if !ok {
		return
	}
	if n := h.s.batches.Plans().ReleaseConn(c.id); n > 0 {
		h.s.cfg.Log.Debug("client connection closed; its prepared plans are released", "plans", n)
	}
	if n := h.s.batches.Routes().ReleaseConn(c.id); n > 0 {
		h.s.cfg.Log.Debug("client connection closed; its block routes are released", "routes", n)
	}
	// After the plans: a plan holds its source, which would keep a leased
	// region of this client draining.
	h.s.leave(c.client)
}

func (h *statsHandler) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return &beginCtx{Context: ctx, at: time.Now()}
}

func (h *statsHandler) HandleRPC(context.Context, stats.RPCStats) {}

// connID is the client connection's ID, 0 without the stats handler.
func connID(ctx context.Context) uint64 {
	if c, ok := ctx.Value(connKey{}).(*connCtx); ok {
		return c.id
	}
	return 0
}

// begun is when the call began; entry (the handler's first moment) without
// the stats handler.
func begun(ctx context.Context, entry time.Time) time.Time {
	if c, ok := ctx.Value(beginKey{}).(*beginCtx); ok {
		return c.at
	}
	return entry
}

// owner is who holds the plans made on this call's connection.
func owner(ctx context.Context) batch.Owner {
	return batch.Owner{Caller: caller(ctx), Conn: connID(ctx)}
}

func (l *local) PrepareTransfer(ctx context.Context, req *b2bv1.PrepareTransferRequest) (*b2bv1.PrepareTransferResponse, error) {
	entry := time.Now()
	info, err := l.s.batches.Plans().Prepare(ctx, prepareRequest(req, caller(ctx)), owner(ctx))
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	stamp(&info.Phases, begun(ctx, entry), entry)
	return prepareResponse(info), nil
}

func (l *local) WarmTransfer(ctx context.Context, req *b2bv1.WarmTransferRequest) (*b2bv1.WarmTransferResponse, error) {
	r := batch.Request{Src: req.GetSrcRegionId(), Caller: caller(ctx), Peer: req.GetPeer(), Dst: req.GetDstRegion()}
	r.Transport, r.BadTransport = kindOf(b2bv1.TransportKind_TRANSPORT_KIND_UNSPECIFIED, req.GetTransportName())
	r.Op, r.BadOp = opOf(req.GetOp())
	res, err := l.s.batches.Warm(ctx, r)
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	return &b2bv1.WarmTransferResponse{TransportName: string(res.Kind), ElapsedNs: uint64(res.Elapsed.Nanoseconds())}, nil
}

func (l *local) SubmitTransfer(ctx context.Context, req *b2bv1.SubmitTransferRequest) (*b2bv1.BatchTransferResponse, error) {
	entry := time.Now()
	res, err := l.s.batches.Plans().Submit(ctx, owner(ctx), req.GetHandle())
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	stamp(&res.Phases, begun(ctx, entry), entry)
	return transferResponse(res), nil
}

func (l *local) ReleaseTransfer(ctx context.Context, req *b2bv1.ReleaseTransferRequest) (*b2bv1.ReleaseTransferResponse, error) {
	if err := l.s.batches.Plans().Release(owner(ctx), req.GetHandle()); err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	return &b2bv1.ReleaseTransferResponse{}, nil
}

var pong = &b2bv1.PingResponse{}

// Ping does nothing: the floor of a call.
func (l *local) Ping(context.Context, *b2bv1.PingRequest) (*b2bv1.PingResponse, error) {
	return pong, nil
}

// SubmitStream runs submits as they arrive, at most StreamInFlight at once,
// and answers each with its tag as it ends. A failed submit is answered
// with its code and message; the stream goes on. When the stream's context
// ends (its caller's CancelCall, deadline or cancel) no further submit
// starts, and the stream answers once every submit under way stopped.
func (l *local) SubmitStream(stream b2bv1.B2B_SubmitStreamServer) error {
	ss := &submitStream{l: l, stream: stream, ctx: stream.Context(), slots: make(chan struct{}, StreamInFlight)}
	// Requests are read apart, so that the context's end ends the stream
	// while no request comes (Recv waits on the client alone).
	read := make(chan error, 1)
	go func() { read <- ss.read() }()
	var err error
	select {
	case err = <-read:
	case <-ss.ctx.Done():
		err = status.FromContextError(ss.ctx.Err()).Err()
	}
	ss.mu.Lock()
	ss.stopped = true // no submit starts after this
	ss.mu.Unlock()
	ss.wg.Wait()
	if err != nil {
		return err
	}
	ss.sendMu.Lock()
	defer ss.sendMu.Unlock()
	return ss.sendErr
}

// submitStream is one SubmitStream call.
type submitStream struct {
	l      *local
	stream b2bv1.B2B_SubmitStreamServer
	ctx    context.Context
	slots  chan struct{}
	wg     sync.WaitGroup

	mu      sync.Mutex // guards stopped against wg.Add
	stopped bool

	sendMu  sync.Mutex
	sendErr error
}

// read starts a submit per request until the client's end (nil), the
// stream's failure or its context's end, or the stream stopped.
func (ss *submitStream) read() error {
	o := owner(ss.ctx)
	for {
		req, err := ss.stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case ss.slots <- struct{}{}:
		case <-ss.ctx.Done():
			return status.FromContextError(ss.ctx.Err()).Err()
		}
		ss.mu.Lock()
		if ss.stopped {
			ss.mu.Unlock()
			return nil
		}
		ss.wg.Add(1)
		ss.mu.Unlock()
		go ss.submit(o, req.GetTag(), req.GetHandle())
	}
}

// submit runs one submit and answers it.
func (ss *submitStream) submit(o batch.Owner, tag, handle uint64) {
	defer ss.wg.Done()
	entry := time.Now()
	res, err := ss.l.s.batches.Plans().Submit(ss.ctx, o, handle)
	resp := &b2bv1.SubmitStreamResponse{Tag: tag}
	if err != nil {
		err = grpcstatus.ToStatus(err)
		st := status.Convert(err)
		resp.Code, resp.Message = uint32(st.Code()), st.Message()
	} else {
		stamp(&res.Phases, entry, entry)
		resp.Result = transferResponse(res)
	}
	if obs := ss.l.s.observeSubmit; obs != nil {
		obs(resp.Result, err, time.Since(entry).Seconds())
	}
	<-ss.slots
	ss.sendMu.Lock()
	if ss.sendErr == nil {
		ss.sendErr = ss.stream.Send(resp)
	}
	ss.sendMu.Unlock()
}

// stamp sets the phases the RPC layer measures: receive and decode (from
// the call's first moment to the handler's), and the total.
func stamp(ph *batch.Phases, begin, entry time.Time) {
	ph.Decode += entry.Sub(begin)
	ph.Total = time.Since(begin)
}
