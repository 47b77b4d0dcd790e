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
	c, err := a.Connect(context.Background(), transport.Peer{TCP: transport.TCPEndpoint{Addr: b.Addr(), Token: b.Token()}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bt := desc.Batch{Src: make([]uint64, n), Dst: make([]uint64, n), Len: make([]uint64, n)}
	perm := r.Perm(n)
	for i := range n {
		bt.Src[i], bt.Dst[i], bt.Len[i] = uint64(i)*slot, uint64(perm[i])*slot, size
	}
	st, err := c.Write(context.Background(), src, transport.RemoteRegion{Size: n * slot, Key: dreg.Key()}, &bt)
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
