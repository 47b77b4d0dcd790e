package local

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"

	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/transport"
)

// TestWriteBlocksChunked: a stretch of 4,800 runs (16 segments x 300
// scattered ids) is expanded and copied in chunks, lands every run and,
// once warm, allocates nothing.
func TestWriteBlocksChunked(t *testing.T) {
	const segs, pool, blk = 16, 512, 256
	p := newPair(t, segs*pool*blk)
	var ls []layout.Segment
	for s := 0; s < segs; s++ {
		ls = append(ls, layout.Segment{Region: "r", Offset: uint64(s * pool * blk), BlockLen: blk, Stride: 2 * blk, NumBlocks: pool / 2})
	}
	l, err := layout.New("l", ls, func(string) (uint64, error) { return segs * pool * blk, nil }, layout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := layout.NewPair(l, l, layout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	src := p.src.Memory().Host
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	var sids, dids []uint32
	dp := rng.Perm(pool / 2)
	for i, x := range rng.Perm(pool / 2)[:200] {
		sids, dids = append(sids, uint32(x)), append(dids, uint32(dp[i]))
	}
	var pl layout.Planner
	ids, err := pl.Validate(pr, layout.Request{SrcIDs: layout.PackIDs(sids), DstIDs: layout.PackIDs(dids)})
	if err != nil {
		t.Fatal(err)
	}
	runs := pr.Expand(nil, ids)
	if len(runs) <= blockChunk {
		t.Fatalf("%d runs do not cross a chunk of %d", len(runs), blockChunk)
	}
	w := &transport.Blocks{Pair: pr, IDs: ids, Local: []transport.Registration{p.src},
		Remote: []transport.RemoteRegion{{Name: "d", Size: uint64(segs * pool * blk), Key: p.dst.Key()}}}
	bw := p.conn
	var sc transport.BlockScratch
	ctx := context.Background()
	st, err := transport.PostBlocks(ctx, bw, transport.OpWrite, w, &sc)
	if err != nil {
		t.Fatal(err)
	}
	if st.Segments != uint64(len(runs)) {
		t.Fatalf("%d blocks reported, want %d", st.Segments, len(runs))
	}
	dst := p.dst.Memory().Host
	for _, r := range runs {
		if !bytes.Equal(dst[r.DstOff:r.DstOff+r.Len], src[r.SrcOff:r.SrcOff+r.Len]) {
			t.Fatalf("run %+v did not land", r)
		}
	}
	post := transport.Request{Op: transport.OpWrite, Blocks: w, Scratch: &sc} // kept, as the batch layer keeps its own
	if a := testing.AllocsPerRun(20, func() {
		if _, err := bw.Post(ctx, &post); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Fatalf("%v allocations per chunked block write", a)
	}
}
