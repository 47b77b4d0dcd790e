package local

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/gpudirect/cudatest"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// gpuPair is two transports on one mock driver, with a GPU source on
// device srcDev and a GPU destination on dstDev.
type gpuPair struct {
	cu       *cudatest.Driver
	send     *Transport
	src, dst transport.Registration
	conn     transport.Conn
}

func newGPUPair(t *testing.T, devices, srcDev, dstDev int, size uint64, cfg Config) *gpuPair {
	t.Helper()
	devs := make([]cudatest.Device, devices)
	cu := cudatest.New(devs...)
	dir := t.TempDir()
	in := &fakeInbound{}
	rcfg, scfg := cfg, cfg
	rcfg.Dir, rcfg.Node, rcfg.CUDA = filepath.Join(dir, "recv"), "recv", cu
	scfg.Dir, scfg.Node, scfg.CUDA = filepath.Join(dir, "send"), "send", cu
	recv, err := New(rcfg, in, nil)
	if err != nil {
		t.Fatal(err)
	}
	send, err := New(scfg, &fakeInbound{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = send.Close(); _ = recv.Close() })
	alloc := func(dev int) memory.Memory {
		p, err := cu.MemAlloc(dev, size)
		if err != nil {
			t.Fatal(err)
		}
		return memory.Memory{Kind: memory.CUDA, Addr: p, Len: size, Device: dev, DmabufFD: -1}
	}
	g := &gpuPair{cu: cu, send: send}
	if g.dst, err = recv.Register(alloc(dstDev)); err != nil {
		t.Fatal(err)
	}
	in.add(g.dst)
	if g.src, err = send.Register(alloc(srcDev)); err != nil {
		t.Fatal(err)
	}
	peer := transport.Peer{Address: "local", Node: "recv", Advert: MarshalEndpoint(recv.Endpoint())}
	if g.conn, err = send.Connect(context.Background(), peer); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.conn.Close() })
	return g
}

func (g *gpuPair) bytes(t *testing.T, r transport.Registration) []byte {
	t.Helper()
	m := r.Memory()
	b, err := g.cu.DeviceBytes(m.Addr, m.Len)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestGPURoute: a same-device batch never issues a device-to-device copy
// (the driver runs those on SMs): it goes through pinned host staging,
// whose buffer was allocated when the region registered, not in the batch.
// A cross-device batch keeps its direct peer copies. Every block lands, and
// no destination gap is written.
func TestGPURoute(t *testing.T) {
	for _, tc := range []struct {
		name             string
		devices, sd, dd  int
		blocks           int
		size             uint64
		stage            int
		direct           bool
		wantSame, wantX  bool // same-device / cross-device copies expected
		wantStagedDetail bool
	}{
		{"same-128B", 1, 0, 0, 1000, 128, 0, false, false, false, true},
		{"same-straddle", 1, 0, 0, 40, 100 << 10, 1 << 20, false, false, false, true},
		{"same-huge", 1, 0, 0, 3, 3 << 20, 1 << 20, false, false, false, true},
		{"same-direct", 1, 0, 0, 100, 4096, 0, true, true, false, false},
		{"cross", 2, 0, 1, 500, 4096, 0, false, false, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			region := 2 * uint64(tc.blocks) * tc.size
			g := newGPUPair(t, tc.devices, tc.sd, tc.dd, region, Config{StageBytes: tc.stage, SameDeviceDirect: tc.direct})
			if d := g.send.Advertise().Detail; strings.Contains(d, "staged through pinned host memory") != tc.wantStagedDetail {
				t.Errorf("Status detail %q: want the staged route named: %v", d, tc.wantStagedDetail)
			}
			src, dst := g.bytes(t, g.src), g.bytes(t, g.dst)
			fill(src, 0x5a)
			fill(dst, 0xc3)
			want := append([]byte(nil), dst...)
			b := gapped(tc.blocks, tc.size)
			for i := range b.Len {
				copy(want[b.Dst[i]:b.Dst[i]+b.Len[i]], src[b.Src[i]:b.Src[i]+b.Len[i]])
			}
			allocs := g.cu.Calls("HostAlloc")
			for round := 0; round < 2; round++ {
				if _, err := transport.Write(context.Background(), g.conn, g.src, transport.RemoteRegion{Name: "d", Size: region, Key: g.dst.Key()}, b); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
			}
			if !bytes.Equal(dst, want) {
				t.Fatal("destination differs from the expected blocks and gaps")
			}
			if n := g.cu.Calls("HostAlloc") - allocs; n != 0 {
				t.Errorf("%d pinned allocations in the batch path; want them at registration", n)
			}
			k := g.cu.Copies()
			if (k.SameDevice > 0) != tc.wantSame || (k.CrossDevice > 0) != tc.wantX {
				t.Fatalf("copies %+v: want same-device copies %v, cross-device copies %v", k, tc.wantSame, tc.wantX)
			}
			if !tc.wantSame && !tc.wantX && (k.DeviceToHost == 0 || k.HostToDevice == 0) {
				t.Fatalf("copies %+v: want the two staging hops", k)
			}
		})
	}
}
