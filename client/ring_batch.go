package client

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/ring"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TransferRing runs t (a BatchTransfer) through r when r is not nil and
// carries it (its request fits r's arena), else through BatchTransfer over
// gRPC. Either way the daemon checks it with the same code, a refusal is
// the gRPC status BatchTransfer gives, and ctx's deadline is the
// transfer's. Over the ring a batch of 10,000 blocks skips gRPC's framing
// and protobuf's decoding of its descriptors.
func (c *Client) TransferRing(ctx context.Context, r *Ring, t Transfer) (RawResult, error) {
	if r != nil {
		// What the ring cannot carry goes to gRPC, whose answer to it (a
		// refusal included) is the daemon's.
		if out, ok := ringBatch(t); ok && out.Check() == nil && r.arena.fits(&arenaPayload{batch: &out}) {
			return r.batchContext(ctx, &out)
		}
	}
	resp, err := c.BatchTransfer(ctx, t)
	if err != nil {
		return RawResult{}, err
	}
	ph := resp.GetPhases()
	return RawResult{Blocks: resp.GetBlocks(), Bytes: resp.GetBytes(), Wire: time.Duration(ph.GetWireNs()), Total: time.Duration(ph.GetTotalNs()),
		Transport: resp.GetTransportName(), Posted: unixTime(int64(ph.GetPostedUnixNs())), Landed: unixTime(int64(ph.GetLandedUnixNs())),
		Segments: resp.GetSegments(), WorkRequests: resp.GetWorkRequests()}, nil
}

// StartTransfer posts t as a batch record and returns its tag for Wait (or
// Cancel). Every tag must be waited for. A transfer the ring cannot carry
// (see TransferRing) is refused here, with a gRPC status (InvalidArgument,
// or ResourceExhausted when it is larger than the ring's arena); send it
// with BatchTransfer.
func (r *Ring) StartTransfer(t Transfer) (uint64, error) {
	out, err := r.batchRecord(t)
	if err != nil {
		return 0, err
	}
	return r.postArena(ring.Request{Op: ring.OpBatch}, &arenaPayload{batch: &out})
}

// batchRecord is t's batch blob, or why the ring cannot carry it.
func (r *Ring) batchRecord(t Transfer) (ring.BatchOut, error) {
	// Refusals are gRPC statuses, as BatchTransfer's are.
	out, ok := ringBatch(t)
	if !ok {
		return out, status.Errorf(codes.InvalidArgument, "b2b client: a ring batch names its transport by TransportName only; Transport %v with TransportName %q: use BatchTransfer", t.Transport, t.TransportName)
	}
	if err := out.Check(); err != nil {
		return out, status.Error(grpcstatus.Code(err), "b2b client: "+err.Error())
	}
	if p := (&arenaPayload{batch: &out}); !r.arena.fits(p) {
		return out, status.Errorf(codes.ResourceExhausted, "b2b client: the batch's request takes %d bytes, over the ring's arena of %d bytes: use BatchTransfer", p.size(), len(r.arena.mem))
	}
	return out, nil
}

// batchContext posts out and waits for it under ctx: its deadline travels
// in the record, a cancel of ctx cancels it through the ring.
func (r *Ring) batchContext(ctx context.Context, out *ring.BatchOut) (RawResult, error) {
	ms, err := ringTimeoutMs(ctx)
	if err != nil {
		return RawResult{}, err
	}
	return r.postWaitArena(ctx, ring.Request{Op: ring.OpBatch, TimeoutMs: ms}, &arenaPayload{batch: out})
}

// ringBatch is t as a batch blob; false when its transport cannot be said
// by name alone (transportName), so that gRPC's answer to it stays the
// daemon's.
func ringBatch(t Transfer) (ring.BatchOut, bool) {
	name, ok := transportName(t)
	if !ok {
		return ring.BatchOut{}, false
	}
	return ring.BatchOut{Op: uint32(t.Op), Src: t.SrcRegion, Peer: t.Peer, Dst: t.DstRegion, Transport: name, Note: t.Notification,
		BlockLength: t.Blocks.BlockLength, SrcOffsets: t.Blocks.Src, DstOffsets: t.Blocks.Dst, Lengths: t.Blocks.Len}, true
}

// transportName is t's transport by name alone; false for an unknown
// Transport value, or one that TransportName contradicts.
func transportName(t Transfer) (string, bool) {
	name := t.TransportName
	if t.Transport != b2bv1.TransportKind_TRANSPORT_KIND_UNSPECIFIED {
		var byEnum string
		switch t.Transport {
		case b2bv1.TransportKind_TRANSPORT_KIND_TCP:
			byEnum = "tcp"
		case b2bv1.TransportKind_TRANSPORT_KIND_VERBS:
			byEnum = "verbs"
		case b2bv1.TransportKind_TRANSPORT_KIND_LOCAL:
			byEnum = "local"
		}
		if byEnum == "" || (name != "" && name != byEnum) {
			return "", false
		}
		name = byEnum
	}
	return name, true
}
