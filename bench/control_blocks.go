package bench

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/b2bd/b2bd/client"
)

// The control workload's "blocks" rows: a block-id transfer of one block of
// a ControlBlockSegments-segment layout, TransferBlocks over gRPC against
// the same ids on a bound route over the ring.
const (
	ControlBlockSegments = 64
	ControlBlocksCalls   = 1000
	controlLayoutBlocks  = 4
)

// controlBlocks registers a layout of ControlBlockSegments segments of
// ControlBlockBytes blocks over src and one over dst (exported as export),
// times the two paths interleaved, checks that the bytes landed, and adds
// the rows.
func controlBlocks(ctx context.Context, cfg Config, eps *endpoints, ring *client.Ring, src, dst *client.HostRegion, export string,
	add func(op string, blocks int, grpcS, ringS []time.Duration)) error {
	const segs, bl = ControlBlockSegments, ControlBlockBytes
	if need := uint64(segs * controlLayoutBlocks * bl); uint64(len(src.Bytes)) < need || uint64(len(dst.Bytes)) < need {
		return fmt.Errorf("blocks: regions of %d and %d bytes, want %d", len(src.Bytes), len(dst.Bytes), need)
	}
	layout := func(region string) []client.Segment {
		out := make([]client.Segment, segs)
		for s := range out {
			out[s] = client.Segment{RegionID: region, Offset: uint64(s * bl), BlockLen: bl, Stride: segs * bl}
		}
		return out
	}
	name := fmt.Sprintf("b2b-bench-control-blocks-%d", os.Getpid())
	if _, err := eps.src.RegisterLayout(ctx, client.Layout{Name: name, Segments: layout(src.Id), NumBlocks: controlLayoutBlocks}); err != nil {
		return fmt.Errorf("blocks: register the source layout: %w", err)
	}
	defer eps.src.DeregisterLayout(context.WithoutCancel(ctx), name)
	if _, err := eps.dst.RegisterLayout(ctx, client.Layout{Name: name, Segments: layout(dst.Id), NumBlocks: controlLayoutBlocks, Export: name}); err != nil {
		return fmt.Errorf("blocks: register the destination layout: %w", err)
	}
	defer eps.dst.DeregisterLayout(context.WithoutCancel(ctx), name)
	b := client.Blocks{LocalLayout: name, Peer: eps.dstPeer, RemoteLayout: name, LocalIDs: []uint32{1}, RemoteIDs: []uint32{2}}
	rt, err := eps.src.BindRoute(ctx, b)
	if err != nil {
		return fmt.Errorf("blocks: %w", err)
	}
	defer rt.Release(context.WithoutCancel(ctx))
	r := rand.New(rand.NewPCG(cfg.Seed, segs))
	fresh := func() {
		for i := range src.Bytes[:segs*controlLayoutBlocks*bl] {
			src.Bytes[i] = byte(r.Uint32())
		}
	}
	landed := func(what string) error { // block 1 of every segment is block 2 there
		from, to := uint64(1*segs*bl), uint64(2*segs*bl)
		if !bytes.Equal(src.Bytes[from:from+segs*bl], dst.Bytes[to:to+segs*bl]) {
			return fmt.Errorf("blocks over %s: the destination block differs from the source", what)
		}
		return nil
	}
	fresh()
	gs, rs, err := interleave(ControlBlocksCalls, func() error { _, err := eps.src.TransferBlocks(ctx, b); return err },
		func() error { _, err := ring.BlocksContext(ctx, rt, b.LocalIDs, b.RemoteIDs); return err })
	if err == nil {
		err = landed("both paths")
	}
	if err == nil { // and the ring alone moves fresh bytes
		fresh()
		_, err = ring.BlocksContext(ctx, rt, b.LocalIDs, b.RemoteIDs)
	}
	if err == nil {
		err = landed("the ring")
	}
	if err != nil {
		return fmt.Errorf("blocks: %w", err)
	}
	add("blocks", segs, gs, rs)
	return nil
}
