package batch

import (
	"context"
	"fmt"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// WarmResult is what a warm-up did.
type WarmResult struct {
	Kind    transport.Kind // the data path it made ready
	Elapsed time.Duration
}

// warmDescriptor stands in for a batch's descriptors: a warm-up checks
// what a batch between the two regions would check (its first byte lies
// in both) and moves nothing.
var warmDescriptor = desc.Packed{SrcOffsets: make([]byte, 8), DstOffsets: make([]byte, 8), BlockLength: 1}

// Warm makes ready what the first batch of r's op between r.Src and the
// peer's r.Dst would otherwise build (r's descriptors and notification
// are not used): the connection to the peer, the resolution of the
// destination and the data path's own state for it (Request.Warm: the
// same-host kind maps the destination, 75 ms for a 20 GiB GPU pool). It
// checks r as Transfer does and answers as a batch would; it may be
// repeated, and costs a round trip once warm. An engine calls it when it
// learns of a peer's region, as at its handshake.
func (s *Service) Warm(ctx context.Context, r Request) (WarmResult, error) {
	if r.Descriptors != nil {
		return WarmResult{}, fmt.Errorf("%w: a warm-up takes no descriptors", errs.ErrInvalidArgument)
	}
	r.Descriptors, r.Notification = &warmDescriptor, nil
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.DefaultTimeout)
		defer cancel()
	}
	start := time.Now()
	p, err := s.Plan(r)
	if err != nil {
		return WarmResult{}, err
	}
	defer p.Close()
	op := transport.OpWrite
	if p.op == OpRead {
		op = transport.OpRead
	}
	var kind transport.Kind
	pol := retryPolicy{peer: p.peer, fresh: "a retry on a fresh connection"}
	stale := func(error) error {
		s.paths.forget(p.peer, p.dst, p.op)
		return nil
	}
	err = s.retry(ctx, pol, stale, func(ctx context.Context, _ bool) (ran, error) {
		sess, remote, reg, cached, held, err := s.paths.dst(ctx, p, true)
		if err != nil {
			return ran{sess: sess}, err
		}
		defer held()
		if err := p.checkRemote(remote.Size); err != nil {
			return ran{cached: cached, suspect: true}, err
		}
		if _, err := sess.Conn.Post(ctx, &transport.Request{Op: op, Local: reg, Remote: remote, Warm: true}); err != nil {
			return ran{sess: sess, cached: cached}, fmt.Errorf("warm-up of %s/%s over %s: %w", p.peer, p.dst, sess.Kind, err)
		}
		kind = sess.Kind
		return ran{}, nil
	})
	if err != nil {
		return WarmResult{}, errs.ForCaller(ctx, err)
	}
	return WarmResult{Kind: kind, Elapsed: time.Since(start)}, nil
}
