package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/transport"
)

// blockRig is a block write of 8 segments of 512 B blocks (pool 64) from
// one source region into 4 destination regions (2 segments each): 4
// stretches, so 4 pipelined batches.
func blockRig(t testing.TB) (*pair, *transport.Blocks, [][]byte) {
	const segs, nd, pool, blk = 8, 4, 64, 512
	p := newPair(t, segs*pool*blk, 2)
	w := &transport.Blocks{Local: []transport.Registration{p.src}}
	var dbufs [][]byte
	for d := 0; d < nd; d++ {
		m := hostMem(t, segs/nd*pool*blk)
		reg, err := p.b.Register(m)
		if err != nil {
			t.Fatal(err)
		}
		p.in.mu.Lock()
		p.in.regs[reg.Key().Key] = m
		p.in.mu.Unlock()
		w.Remote = append(w.Remote, transport.RemoteRegion{Name: fmt.Sprintf("d%d", d), Size: m.Len, Key: reg.Key()})
		dbufs = append(dbufs, m.Host)
	}
	var ss, ds []layout.Segment
	for s := 0; s < segs; s++ {
		ss = append(ss, layout.Segment{Region: "s", Offset: uint64(s * pool * blk), BlockLen: blk, Stride: blk, NumBlocks: pool})
		ds = append(ds, layout.Segment{Region: fmt.Sprintf("d%d", s/(segs/nd)), Offset: uint64(s % (segs / nd) * pool * blk), BlockLen: blk, Stride: blk, NumBlocks: pool})
	}
	size := func(string) (uint64, error) { return p.srcMem.Len, nil }
	sl, err := layout.New("s", ss, size, layout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	dl, err := layout.New("d", ds, func(string) (uint64, error) { return segs / nd * pool * blk, nil }, layout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if w.Pair, err = layout.NewPair(sl, dl, layout.Limits{}); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(9, 9))
	for i := range p.srcMem.Host {
		p.srcMem.Host[i] = byte(r.Uint32())
	}
	var src, dst []uint32
	dp := r.Perm(pool)
	for i, x := range r.Perm(pool)[:pool/2] {
		src, dst = append(src, uint32(x)), append(dst, uint32(dp[i]))
	}
	var pl layout.Planner
	if w.IDs, err = pl.Validate(w.Pair, layout.Request{SrcIDs: layout.PackIDs(src), DstIDs: layout.PackIDs(dst)}); err != nil {
		t.Fatal(err)
	}
	// Validate's ids alias the packed bytes (kept alive by w.IDs).
	return p, w, dbufs
}

// TestWriteBlocksAllocatesNothing: the pipelined block path, expansion to
// acks, allocates nothing once its scratch has grown, and lands every run.
func TestWriteBlocksAllocatesNothing(t *testing.T) {
	p, w, dbufs := blockRig(t)
	bw := p.conn
	var sc transport.BlockScratch
	ctx := context.Background()
	if _, err := transport.PostBlocks(ctx, bw, transport.OpWrite, w, &sc); err != nil { // warm-up
		t.Fatal(err)
	}
	for _, r := range w.Pair.Expand(nil, w.IDs) {
		got := dbufs[r.DstRegion][r.DstOff : r.DstOff+r.Len]
		if !bytes.Equal(got, p.srcMem.Host[r.SrcOff:r.SrcOff+r.Len]) {
			t.Fatalf("run %+v did not land", r)
		}
	}
	post := transport.Request{Op: transport.OpWrite, Blocks: w, Scratch: &sc} // kept, as the batch layer keeps its own
	if a := testing.AllocsPerRun(50, func() {
		if _, err := bw.Post(ctx, &post); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Fatalf("%v allocations per block write", a)
	}
}

// TestWriteBlocksRefusal: a destination region the receiver no longer
// knows fails the block write with NotFound, names its stretch, leaves no
// pin behind, and fails the conn (later batches' acks may be unread).
func TestWriteBlocksRefusal(t *testing.T) {
	p, w, _ := blockRig(t)
	p.in.mu.Lock()
	delete(p.in.regs, w.Remote[2].Key.Key)
	p.in.mu.Unlock()
	var sc transport.BlockScratch
	_, err := transport.PostBlocks(context.Background(), p.conn, transport.OpWrite, w, &sc)
	if !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("err = %v, want NotFound", err)
	}
	var se *transport.StretchError
	if !errors.As(err, &se) || se.DstRegion != 2 {
		t.Fatalf("err = %v (%#v): want a StretchError naming destination region 2", err, se)
	}
	if p.conn.Err() == nil {
		t.Fatal("the conn carries on after a failed pipelined write")
	}
	p.conn.Close()
	for deadline := time.Now().Add(5 * time.Second); p.in.pins.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d pins held after the refused block write", p.in.pins.Load())
		}
	}
}

// streamRig is a block request over one region pair of 16 segments of
// 4 KiB blocks (pool 256), with a sender of 3 streams and 16 KiB frames:
// runs of consecutive ids merge into runs longer than a frame (cut), a
// share spans several frames and groups, and the stretch's shares are
// dealt over every stream. The same request is a write (ours to the
// peer's) or a pull (the peer's into ours).
func streamRig(t testing.TB) (p *pair, pr *layout.Pair, ids layout.IDs, runs []layout.Run) {
	const segs, pool, blk = 16, 256, 4096
	p = newPairCfg(t, segs*pool*blk, Config{Listen: "127.0.0.1:0", Streams: 3, MinShareBytes: 64 << 10, FrameBytes: 16 << 10})
	var ls []layout.Segment
	for s := 0; s < segs; s++ {
		ls = append(ls, layout.Segment{Region: "r", Offset: uint64(s * pool * blk), BlockLen: blk, Stride: blk, NumBlocks: pool})
	}
	l, err := layout.New("l", ls, func(string) (uint64, error) { return p.srcMem.Len, nil }, layout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if pr, err = layout.NewPair(l, l, layout.Limits{}); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(4, 4))
	for i := range p.srcMem.Host {
		p.srcMem.Host[i] = byte(r.Uint32())
	}
	var src, dst []uint32
	for i := uint32(0); i < 20; i++ { // 80 KiB runs: cut over 5 frames
		src, dst = append(src, 100+i), append(dst, 200+i)
	}
	dp := r.Perm(100)
	for i, x := range r.Perm(100) {
		src, dst = append(src, uint32(x)), append(dst, uint32(dp[i]))
	}
	var pl layout.Planner
	if ids, err = pl.Validate(pr, layout.Request{SrcIDs: layout.PackIDs(src), DstIDs: layout.PackIDs(dst)}); err != nil {
		t.Fatal(err)
	}
	return p, pr, ids, pr.Expand(nil, ids)
}

// TestBlocksStreamedFrames: a streamed write and a streamed pull land
// every run, cut into frames and dealt over every stream, and allocate
// nothing once warm.
func TestBlocksStreamedFrames(t *testing.T) {
	p, pr, ids, runs := streamRig(t)
	c := p.conn.(*conn)
	ctx := context.Background()
	var sc transport.BlockScratch
	w := &transport.Blocks{Pair: pr, IDs: ids, Local: []transport.Registration{p.src}, Remote: []transport.RemoteRegion{p.dst}}
	st, err := transport.PostBlocks(ctx, c, transport.OpWrite, w, &sc)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		if !bytes.Equal(p.dstMem.Host[r.DstOff:r.DstOff+r.Len], p.srcMem.Host[r.SrcOff:r.SrcOff+r.Len]) {
			t.Fatalf("write: run %+v did not land", r)
		}
	}
	if st.Segments != uint64(len(runs)) || st.WorkRequests <= uint64(len(c.streams)) {
		t.Fatalf("write stats %+v: want %d blocks in more frames than the %d streams", st, len(runs), len(c.streams))
	}
	if n := len(c.blocks.shares); n != len(c.streams) {
		t.Fatalf("the stretch was dealt in %d shares, want one per stream (%d)", n, len(c.streams))
	}
	// The pull: the peer's region (p.dst, read token = its key) into a
	// fresh region of ours.
	ours, err := p.a.Register(hostMem(t, int(p.srcMem.Len)))
	if err != nil {
		t.Fatal(err)
	}
	rd := &transport.Blocks{Pair: pr, IDs: ids, Remote: []transport.RemoteRegion{p.dst}, Local: []transport.Registration{ours}}
	copy(p.dstMem.Host, p.srcMem.Host) // the peer's region holds the source now
	if _, err := transport.PostBlocks(ctx, c, transport.OpRead, rd, &sc); err != nil {
		t.Fatal(err)
	}
	got := ours.Memory().Host
	for _, r := range runs {
		if !bytes.Equal(got[r.DstOff:r.DstOff+r.Len], p.dstMem.Host[r.SrcOff:r.SrcOff+r.Len]) {
			t.Fatalf("pull: run %+v did not land", r)
		}
	}
	postWrite := transport.Request{Op: transport.OpWrite, Blocks: w, Scratch: &sc} // kept, as the batch layer keeps its own
	if a := testing.AllocsPerRun(20, func() {
		if _, err := c.Post(ctx, &postWrite); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Fatalf("%v allocations per streamed write", a)
	}
	postRead := transport.Request{Op: transport.OpRead, Blocks: rd, Scratch: &sc} // kept, as the batch layer keeps its own
	if a := testing.AllocsPerRun(20, func() {
		if _, err := c.Post(ctx, &postRead); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Fatalf("%v allocations per streamed pull", a)
	}
}

// TestBlocksRegionSmallerThanLayout: a destination smaller than the
// layout's extent, with ids inside it, still lands (every run checked the
// slow way); with an id outside it, the write is refused with
// InvalidArgument naming the stretch before any byte leaves.
func TestBlocksRegionSmallerThanLayout(t *testing.T) {
	p, w, dbufs := blockRig(t)
	w.Remote[3].Size -= 10 * 512 // its second segment's blocks 54..63 are outside
	var sc transport.BlockScratch
	var pl layout.Planner
	var err error
	w.IDs, err = pl.Validate(w.Pair, layout.Request{SrcIDs: layout.PackIDs([]uint32{1, 2}), DstIDs: layout.PackIDs([]uint32{3, 4})})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := transport.PostBlocks(context.Background(), p.conn, transport.OpWrite, w, &sc); err != nil {
		t.Fatalf("ids inside the smaller region: %v", err)
	}
	before := p.in.pinCalls.Load()
	w.IDs, err = pl.Validate(w.Pair, layout.Request{SrcIDs: layout.PackIDs([]uint32{1, 2}), DstIDs: layout.PackIDs([]uint32{3, 63})})
	if err != nil {
		t.Fatal(err)
	}
	_, err = transport.PostBlocks(context.Background(), p.conn, transport.OpWrite, w, &sc)
	var se *transport.StretchError
	if !errors.Is(err, errs.ErrInvalidArgument) || !errors.As(err, &se) || se.DstRegion != 3 {
		t.Fatalf("err = %v, want InvalidArgument naming destination region 3", err)
	}
	if n := p.in.pinCalls.Load() - before; n != 0 {
		t.Fatalf("the receiver pinned %d batches of a refused request", n)
	}
	_ = dbufs
}

// BenchmarkBlocksPushPull: one KV request (160 segments in one region,
// 256 random ids into other random ids, 8 KiB blocks: 40,960 blocks,
// 320 MiB) pushed with WriteBlocks and pulled with ReadBlocks over
// loopback, 4 streams. Reported: each one's plan and post (the
// transport's part of the daemon's non-wire time) per request, and pull's
// over push's (the target: within 1.2x).
func BenchmarkBlocksPushPull(b *testing.B) {
	const segs, pool, blk, n = 160, 256, 8192, 256
	p := newPairCfg(b, segs*pool*blk, Config{Listen: "127.0.0.1:0", Streams: 4})
	var ls []layout.Segment
	for s := 0; s < segs; s++ {
		ls = append(ls, layout.Segment{Region: "r", Offset: uint64(s * pool * blk), BlockLen: blk, Stride: blk, NumBlocks: pool})
	}
	l, err := layout.New("l", ls, func(string) (uint64, error) { return p.srcMem.Len, nil }, layout.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	pr, err := layout.NewPair(l, l, layout.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	var src, dst []uint32
	dp := r.Perm(pool)
	for i, x := range r.Perm(pool)[:n] {
		src, dst = append(src, uint32(x)), append(dst, uint32(dp[i]))
	}
	var pl layout.Planner
	ids, err := pl.Validate(pr, layout.Request{SrcIDs: layout.PackIDs(src), DstIDs: layout.PackIDs(dst)})
	if err != nil {
		b.Fatal(err)
	}
	c := p.conn.(*conn)
	w := &transport.Blocks{Pair: pr, IDs: ids, Local: []transport.Registration{p.src}, Remote: []transport.RemoteRegion{p.dst}}
	rd := &transport.Blocks{Pair: pr, IDs: ids, Remote: []transport.RemoteRegion{p.dst}, Local: []transport.Registration{p.src}}
	ctx := context.Background()
	var sc transport.BlockScratch
	var push, pull []time.Duration
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		st, err := transport.PostBlocks(ctx, c, transport.OpWrite, w, &sc)
		if err != nil {
			b.Fatal(err)
		}
		push = append(push, st.Plan+st.Post)
		if st, err = transport.PostBlocks(ctx, c, transport.OpRead, rd, &sc); err != nil {
			b.Fatal(err)
		}
		pull = append(pull, st.Plan+st.Post)
	}
	med := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2]) / 1e6
	}
	mp, ml := med(push), med(pull)
	b.ReportMetric(mp, "push-ms")
	b.ReportMetric(ml, "pull-ms")
	b.ReportMetric(ml/mp, "pull/push")
}
