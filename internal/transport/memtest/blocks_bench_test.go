package memtest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// fixedInbound pins from a fixed table without allocating.
type fixedInbound struct {
	transport.NoReads
	mem map[uint64]memory.Memory
}

func (in *fixedInbound) Pin(_ transport.Kind, key uint64) (memory.Memory, func(), error) {
	m, ok := in.mem[key]
	if !ok {
		return memory.Memory{}, nil, fmt.Errorf("no key %#x", key)
	}
	return m, noRelease, nil
}
func (in *fixedInbound) Landed(transport.Kind, uint64, uint64) {}

func noRelease() {}

// BenchmarkWriteBlocks is the blocks path's expansion and posting (copies
// here) for the request shape, scaled down in bytes: 160 segments
// in 160 regions, 512 random ids of 64 B blocks. It must report 0
// allocs/op: the data path allocates nothing in steady state.
//
//	go test -run XXX -bench WriteBlocks -benchmem ./internal/transport/memtest/
func BenchmarkWriteBlocks(b *testing.B) {
	const segs, pool, block, req = 160, 1024, 64, 512
	in := &fixedInbound{mem: map[uint64]memory.Memory{}}
	to := New(in)
	c := newConn(to)
	var ss, ds []layout.Segment
	w := transport.Blocks{}
	for s := 0; s < segs; s++ {
		name := fmt.Sprintf("r%d", s)
		ss = append(ss, layout.Segment{Region: name, BlockLen: block, Stride: block, NumBlocks: pool})
		ds = append(ds, layout.Segment{Region: name, BlockLen: block, Stride: block, NumBlocks: pool})
		sm := memory.Memory{Kind: memory.Host, Host: make([]byte, pool*block), Len: pool * block}
		reg, err := to.Register(sm)
		if err != nil {
			b.Fatal(err)
		}
		dm := memory.Memory{Kind: memory.Host, Host: make([]byte, pool*block), Len: pool * block}
		key := uint64(s + 1)
		in.mem[key] = dm
		w.Local = append(w.Local, reg)
		w.Remote = append(w.Remote, transport.RemoteRegion{Name: name, Size: dm.Len, Key: transport.RemoteKey{Key: key}})
	}
	size := func(string) (uint64, error) { return pool * block, nil }
	sl, _ := layout.New("src", ss, size, layout.Limits{})
	dl, _ := layout.New("dst", ds, size, layout.Limits{})
	pair, err := layout.NewPair(sl, dl, layout.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	w.Pair = pair
	rng := rand.New(rand.NewPCG(1, 2))
	var src, dst []uint32
	for _, p := range rng.Perm(pool)[:req] {
		src = append(src, uint32(p))
	}
	for _, p := range rng.Perm(pool)[:req] {
		dst = append(dst, uint32(p))
	}
	rq := layout.Request{SrcIDs: layout.PackIDs(src), DstIDs: layout.PackIDs(dst)}
	var pl layout.Planner
	var sc transport.BlockScratch
	ctx := context.Background()
	post := transport.Request{Op: transport.OpWrite, Blocks: &w, Scratch: &sc} // kept, as the batch layer keeps its own
	run := func() {
		ids, err := pl.Validate(pair, rq)
		if err != nil {
			b.Fatal(err)
		}
		w.IDs = ids
		if _, err := c.Post(ctx, &post); err != nil {
			b.Fatal(err)
		}
	}
	run() // grow the scratch
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		run()
	}
	b.ReportMetric(float64(segs*req)*float64(b.N)/b.Elapsed().Seconds()/1e6, "Mblocks/s")
}
