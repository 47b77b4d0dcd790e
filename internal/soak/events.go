package soak

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// events carries out the chaos loop's requests on this worker's regions.
func (w *worker) events(ctx context.Context, ev uint32) {
	if ev&eventNarrow != 0 {
		w.narrow()
	}
	if ev&eventLayout != 0 && w.ready {
		w.relayout()
	}
	if ev&eventTruncate != 0 && w.ready {
		w.truncate()
	}
}

// truncate cuts the source region's file to nothing and pushes from it:
// the answer must be an error (the bytes are gone); then the worker sets
// up afresh.
func (w *worker) truncate() {
	st := w.s.stats
	st.truncations.Add(1)
	// Our own mapping of the file faults from now on: settle what is
	// quarantined there first, then never touch it again.
	w.checkQuarantine(true)
	so, do, n, ok := w.descBlocks(false)
	if !ok {
		return
	}
	if err := os.Truncate(w.srcPath, 0); err != nil {
		w.log.Warn("truncate", "err", err)
		return
	}
	w.ready = false // set up afresh after this
	x := &xfer{kind: "truncated_push", n: n}
	t := client.Transfer{SrcRegion: w.src.Id, Peer: w.peer, DstRegion: w.export, Transport: w.transport,
		Blocks: client.Descriptors{Src: so, Dst: do, BlockLength: n}}
	ctx, cancel := context.WithTimeout(context.Background(), callLimit)
	defer cancel()
	c := w.begin(time.Now().Add(callLimit))
	_, err := w.ca.BatchTransfer(ctx, t)
	if err == nil && w.kills.Load() == c.kills {
		st.falseSuccess.Add(1)
		st.violation("false_success", x.kind, w.id, "a push from a source file truncated to 0 answered OK (%s)", w.route())
		return
	}
	x.chkMem, x.chkOffs = w.dst.Bytes, do
	w.finish(c, x, err)
}

// relayout replaces both layouts with ones of another shape.
func (w *worker) relayout() {
	w.s.stats.relayouts.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*callLimit)
	defer cancel()
	if err := w.ca.DeregisterLayout(ctx, w.layA); err != nil {
		w.ready = false
		return
	}
	if err := w.cb.DeregisterLayout(ctx, w.layB); err != nil {
		w.ready = false
		return
	}
	if err := w.registerLayouts(ctx); err != nil {
		w.log.Debug("relayout", "err", err)
		w.ready = false
	}
}

// narrow re-exports the destination to no writer and no reader, pushes and
// pulls through it (both must be refused), then widens it again and plans
// the prepared transfer anew (a re-export makes plans stale).
func (w *worker) narrow() {
	if !w.ready {
		return
	}
	st := w.s.stats
	st.narrows.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*callLimit)
	defer cancel()
	api := w.cb.API()
	if _, err := api.ExportRegion(ctx, &b2bv1.ExportRegionRequest{RegionId: w.dst.Id, ExportName: w.export, ExportTo: []string{"soak-nobody"}}); err != nil {
		w.ready = false
		return
	}
	for _, read := range []bool{false, true} {
		so, do, n, ok := w.descBlocks(read)
		if !ok {
			break
		}
		t := client.Transfer{SrcRegion: w.src.Id, Peer: w.peer, DstRegion: w.export, Transport: w.transport,
			Blocks: client.Descriptors{Src: so, Dst: do, BlockLength: n}}
		x := &xfer{kind: "narrowed_push", n: n, refusal: true, patMem: w.src.Bytes, patOffs: so, chkMem: w.dst.Bytes, chkOffs: do}
		if read {
			t.Op = opRead
			x.kind, x.patMem, x.patOffs, x.chkMem, x.chkOffs = "narrowed_pull", w.dst.Bytes, do, w.src.Bytes, so
		}
		w.syncCall(x, func(ctx context.Context) error { _, err := w.ca.BatchTransfer(ctx, t); return err })
	}
	if _, err := api.ExportRegion(ctx, &b2bv1.ExportRegionRequest{RegionId: w.dst.Id, ExportName: w.export, Readers: []string{"*"}}); err != nil {
		w.ready = false
		return
	}
	if w.plan != nil {
		_ = w.plan.Release(ctx)
	}
	if err := w.prepare(ctx); err != nil {
		w.log.Debug("prepare after narrow", "err", fmt.Sprint(err))
		w.ready = false
	}
}
