package verbs

// GPUDirect RDMA test: it needs a real RDMA NIC (ConnectX-7, say) and a GPU
// on the same host, so it runs only when B2B_RDMA_DEV names the device and
// B2B_GPU_RDMA=1 says the host has both; everywhere else it is skipped. On a
// ConnectX-7 host with a GPU:
//
//	B2B_RDMA_DEV=mlx5_0 B2B_GPU_RDMA=1 go test -run TestHWGPUDirect -v ./internal/transport/verbs/
//
// It registers daemon-style GPU memory (cuMemAlloc + dma-buf export) with
// ibv_reg_dmabuf_mr, moves scattered blocks GPU -> GPU over two QP sets on the
// device with the NIC reading and writing HBM directly, and checks every block
// by copying both regions back with the copy engines. It reports which
// registration path each side took.

import (
	"bytes"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/staging"
	"github.com/b2bd/b2bd/internal/transport"
)

func TestHWGPUDirect(t *testing.T) {
	dev := hwDevice(t)
	if os.Getenv("B2B_GPU_RDMA") != "1" {
		t.Skip("B2B_GPU_RDMA=1 not set: this host is not declared to have a GPU beside the RDMA NIC")
	}
	cuda, err := gpudirect.Load()
	if err != nil {
		t.Fatalf("B2B_GPU_RDMA=1 but CUDA is unusable: %v", err)
	}
	defer cuda.Close()
	regions := staging.Regions{CUDA: cuda}
	const size = 64 << 20
	alloc := func() (memory.Memory, func() error) {
		m, _, free, err := regions.Alloc(0, size)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("GPU region at %#x: dma-buf fd %d (offset %d)", m.Addr, m.DmabufFD, m.DmabufOffset)
		return m, free
	}
	sm, freeS := alloc()
	defer freeS()
	dm, freeD := alloc()
	defer freeD()

	// Random source data, written with the copy engines.
	host, err := cuda.HostAlloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	defer cuda.HostFree(0, host)
	r := rand.New(rand.NewPCG(3, 4))
	for i := range host {
		host[i] = byte(r.Uint32())
	}
	st, err := cuda.StreamCreate(0)
	if err != nil {
		t.Fatal(err)
	}
	defer cuda.StreamDestroy(st)
	copyTo := func(dst, src uintptr) {
		if err := cuda.MemcpyHtoDAsync(st, dst, src, size); err != nil {
			t.Fatal(err)
		}
		if err := cuda.StreamSynchronize(st); err != nil {
			t.Fatal(err)
		}
	}
	copyTo(sm.Addr, uintptr(unsafePointer(host)))

	cfg := testConfig(dev)
	in := &inbound{}
	in.unpin = func() {}
	a, err := New(cfg, nil, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := New(cfg, in, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	src, err := a.Register(sm)
	if err != nil {
		t.Fatalf("register the source GPU region: %v", err)
	}
	defer src.Close()
	dst, err := b.Register(dm)
	if err != nil {
		t.Fatalf("register the destination GPU region: %v", err)
	}
	defer dst.Close()
	t.Logf("registration paths: source %s, destination %s", regPath(src), regPath(dst))

	p := &pair{a: a, b: b, in: in}
	p.connect(t)
	const n, block = 10000, 4096
	bt := desc.Batch{Src: make([]uint64, n), Dst: make([]uint64, n), Len: make([]uint64, n)}
	for i, j := range r.Perm(n) {
		bt.Src[i], bt.Dst[i], bt.Len[i] = uint64(i)*(block+64), uint64(j)*(block+64), block
	}
	if _, err := transport.Write(t.Context(), p.conn, src, transport.RemoteRegion{Name: "gpu", Size: size, Key: dst.Key()}, &bt); err != nil {
		t.Fatalf("GPU to GPU over %s: %v", dev, err)
	}
	got := make([]byte, size)
	out, err := cuda.HostAlloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	defer cuda.HostFree(0, out)
	if err := cuda.MemcpyDtoHAsync(st, uintptr(unsafePointer(out)), dm.Addr, size); err != nil {
		t.Fatal(err)
	}
	if err := cuda.StreamSynchronize(st); err != nil {
		t.Fatal(err)
	}
	copy(got, out)
	for i := range n {
		if !bytes.Equal(host[bt.Src[i]:bt.Src[i]+block], got[bt.Dst[i]:bt.Dst[i]+block]) {
			t.Fatalf("block %d differs after GPUDirect RDMA", i)
		}
	}
	t.Logf("%d x %d B GPU -> GPU over %s: every block verified", n, block, dev)
}

// regPath names how a registration reached the NIC.
func regPath(r transport.Registration) string { return r.(*registration).Path() }
