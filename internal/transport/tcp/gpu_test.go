package tcp

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/b2bd/b2bd/gpudirect/cudatest"
	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/staging"
	"github.com/b2bd/b2bd/internal/transport"
)

// TestGPUToGPU stages GPU blocks through pinned buffers on both sides (on the
// gpudirect mock, which moves real bytes), in several rounds, and checks every
// block.
func TestGPUToGPU(t *testing.T) {
	m := cudatest.New()
	pool := &staging.Pool{CUDA: m, Size: 1 << 20} // small buffer: forces rounds
	defer pool.Close()
	const n, size, slot = 3000, 1000, 1024
	in := &keyed{regs: map[uint64]memory.Memory{}}
	a, err := New(Config{Listen: "127.0.0.1:0", MinShareBytes: 64 << 10, Staging: pool}, &keyed{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := New(Config{Listen: "127.0.0.1:0", Staging: pool}, in, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sp, _ := m.MemAlloc(0, n*slot)
	dp, _ := m.MemAlloc(0, n*slot)
	sb, _ := m.DeviceBytes(sp, n*slot)
	r := rand.New(rand.NewPCG(5, 6))
	for i := range sb {
		sb[i] = byte(r.Uint32())
	}
	srcMem := memory.Memory{Kind: memory.CUDA, Addr: sp, Len: n * slot, DmabufFD: -1}
	dstMem := memory.Memory{Kind: memory.CUDA, Addr: dp, Len: n * slot, DmabufFD: -1}
	src, err := a.Register(srcMem)
	if err != nil {
		t.Fatal(err)
	}
	dreg, err := b.Register(dstMem)
	if err != nil {
		t.Fatal(err)
	}
	in.regs[dreg.Key().Key] = dstMem
	c, err := a.Connect(context.Background(), transport.Peer{Advert: MarshalAdvert(b.Addr(), b.Token())})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bt := desc.Batch{Src: make([]uint64, n), Dst: make([]uint64, n), Len: make([]uint64, n)}
	perm := r.Perm(n)
	for i := range n {
		bt.Src[i], bt.Dst[i], bt.Len[i] = uint64(i)*slot, uint64(perm[i])*slot, size
	}
	st, err := transport.Write(context.Background(), c, src, transport.RemoteRegion{Size: n * slot, Key: dreg.Key()}, &bt)
	if err != nil {
		t.Fatal(err)
	}
	db, _ := m.DeviceBytes(dp, n*slot)
	for i := range n {
		if !bytes.Equal(sb[bt.Src[i]:bt.Src[i]+size], db[bt.Dst[i]:bt.Dst[i]+size]) {
			t.Fatalf("block %d differs", i)
		}
	}
	if st.Segments != n {
		t.Fatalf("stats %+v", st)
	}
}

// TestGPUWithoutDriver: without a CUDA driver GPU memory is refused clearly.
func TestGPUWithoutDriver(t *testing.T) {
	tr, err := New(Config{Listen: "127.0.0.1:0"}, &keyed{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	_, err = tr.Register(memory.Memory{Kind: memory.CUDA, Addr: 1 << 40, Len: 4096})
	if !errors.Is(err, errs.ErrFailedPrecondition) {
		t.Fatalf("err = %v", err)
	}
}

// TestGPUFirstBatchAllocatesNoStaging: pinned staging buffers are allocated
// when a GPU region registers, not by the first batch (cuMemHostAlloc of a
// 64 MiB buffer takes tens to hundreds of milliseconds: a first batch that
// allocated them took up to 1.4 s). Every batch, the first included, finds
// its buffers in the pools, on the sending and the receiving side.
func TestGPUFirstBatchAllocatesNoStaging(t *testing.T) {
	for _, streams := range []int{1, 4} {
		m := cudatest.New()
		srcPool := &staging.Pool{CUDA: m, Size: 1 << 20}
		defer srcPool.Close()
		dstPool := &staging.Pool{CUDA: m, Size: 1 << 20}
		defer dstPool.Close()
		const n, size, slot = 2000, 1000, 1024
		in := &keyed{regs: map[uint64]memory.Memory{}}
		a, err := New(Config{Listen: "127.0.0.1:0", Streams: streams, MinShareBytes: 64 << 10, Staging: srcPool}, &keyed{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := New(Config{Listen: "127.0.0.1:0", Streams: streams, MinShareBytes: 64 << 10, Staging: dstPool}, in, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		sp, _ := m.MemAlloc(0, n*slot)
		dp, _ := m.MemAlloc(0, n*slot)
		srcMem := memory.Memory{Kind: memory.CUDA, Addr: sp, Len: n * slot, DmabufFD: -1}
		dstMem := memory.Memory{Kind: memory.CUDA, Addr: dp, Len: n * slot, DmabufFD: -1}
		src, err := a.Register(srcMem)
		if err != nil {
			t.Fatal(err)
		}
		dreg, err := b.Register(dstMem)
		if err != nil {
			t.Fatal(err)
		}
		in.regs[dreg.Key().Key] = dstMem
		c, err := a.Connect(context.Background(), transport.Peer{Advert: MarshalAdvert(b.Addr(), b.Token())})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		bt := desc.Batch{Src: make([]uint64, n), Dst: make([]uint64, n), Len: make([]uint64, n)}
		for i := range n {
			bt.Src[i], bt.Dst[i], bt.Len[i] = uint64(i)*slot, uint64(n-1-i)*slot, size
		}
		before := [2]int64{srcPool.Allocations(), dstPool.Allocations()}
		if before[0] == 0 || before[1] == 0 {
			t.Fatalf("streams %d: registration reserved %v staging buffers (source, destination side), want some on each", streams, before)
		}
		for batch := 1; batch <= 2; batch++ {
			if _, err := transport.Write(context.Background(), c, src, transport.RemoteRegion{Size: n * slot, Key: dreg.Key()}, &bt); err != nil {
				t.Fatal(err)
			}
			if got := [2]int64{srcPool.Allocations(), dstPool.Allocations()}; got != before {
				t.Fatalf("streams %d: batch %d allocated staging buffers: %v after registration, %v after the batch (source, destination side)", streams, batch, before, got)
			}
		}
	}
}
