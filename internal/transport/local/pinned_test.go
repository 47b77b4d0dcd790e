package local

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/gpudirect/cudatest"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// lockedBuffer is a log sink for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestHostGPUBatchesPinned: a host<->GPU batch over the same-host path
// copies from and to host memory registered with the CUDA driver (pageable
// memory is staged by the driver on the compute engine, i.e. the SMs, and is
// slow). The registration is made once per mapping (Warm or the
// first batch, not per batch), and undone before the memory is unmapped.
// Where the driver refuses it, batches still work from pageable memory, and
// Status and the log (once) say so.
func TestHostGPUBatchesPinned(t *testing.T) {
	// Blocks over toHostMaxBlock: GPU -> host takes the direct path (smaller
	// ones are staged: tohost.go).
	const blocks, bs = 200, 2 * toHostMaxBlock
	const region = 2 * blocks * bs
	for _, tc := range []struct {
		name       string
		hostSrc    bool // host -> GPU; else GPU -> host
		warm       bool
		failPin    bool
		wantPinned bool
	}{
		{"h2d", true, false, false, true},
		{"h2d warm", true, true, false, true},
		{"d2h", false, false, false, true},
		{"d2h warm", false, true, false, true},
		{"h2d refused", true, false, true, false},
		{"d2h refused", false, false, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cu := cudatest.New()
			cu.SetPageableHost(true) // as the real driver: pageable memory works, slowly
			dir := t.TempDir()
			in := &fakeInbound{}
			var logs lockedBuffer
			log := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug})
			recv, err := New(Config{Dir: filepath.Join(dir, "recv"), Node: "recv", CUDA: cu}, in, nil)
			if err != nil {
				t.Fatal(err)
			}
			send, err := New(Config{Dir: filepath.Join(dir, "send"), Node: "send", CUDA: cu}, &fakeInbound{}, log)
			if err != nil {
				t.Fatal(err)
			}
			defer recv.Close()
			defer send.Close()
			gpu := func() memory.Memory {
				p, err := cu.MemAlloc(0, region)
				if err != nil {
					t.Fatal(err)
				}
				return memory.Memory{Kind: memory.CUDA, Addr: p, Len: region, DmabufFD: -1}
			}
			var srcMem, dstMem memory.Memory
			if tc.hostSrc {
				srcMem, dstMem = shmRegion(t, dir, region), gpu()
			} else {
				srcMem, dstMem = gpu(), shmRegion(t, dir, region)
			}
			dst, err := recv.Register(dstMem)
			if err != nil {
				t.Fatal(err)
			}
			in.add(dst)
			src, err := send.Register(srcMem)
			if err != nil {
				t.Fatal(err)
			}
			peer := transport.Peer{Address: "local", Node: "recv", Advert: MarshalEndpoint(recv.Endpoint())}
			conn, err := send.Connect(context.Background(), peer)
			if err != nil {
				t.Fatal(err)
			}
			// The host memory the sender's copies use: its own region, or
			// its mapping of the receiver's.
			hostSide := func() []byte {
				if tc.hostSrc {
					return srcMem.Host
				}
				return cachedMapping(t, conn, dst.Key().Key)
			}
			// Unmapping a destination while it is still registered would
			// leave the driver a stale registration: check at every munmap.
			var unmapped, unmappedPinned int
			old := munmap
			defer func() { munmap = old }()
			munmap = func(b []byte) error {
				unmapped++
				if cu.HostRegistered(uintptrOf(b), 1) {
					unmappedPinned++
				}
				return old(b)
			}
			bytesOf := func(m memory.Memory) []byte {
				if m.Kind == memory.Host {
					return m.Host
				}
				b, err := cu.DeviceBytes(m.Addr, m.Len)
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
			sb, db := bytesOf(srcMem), bytesOf(dstMem)
			fill(sb, 0x11)
			fill(db, 0x22)
			b := gapped(blocks, bs)
			want := append([]byte(nil), db...)
			for i := range b.Len {
				copy(want[b.Dst[i]:b.Dst[i]+b.Len[i]], sb[b.Src[i]:b.Src[i]+b.Len[i]])
			}
			if tc.failPin {
				cu.FailNextResult("HostRegister", gpudirect.ErrorOutOfMemory)
			}
			rr := transport.RemoteRegion{Name: "d", Size: region, Key: dst.Key()}
			if tc.warm {
				if err := conn.(*Conn).Warm(context.Background(), src, rr); err != nil {
					t.Fatal(err)
				}
				if n := cu.Calls("HostRegister"); n != 1 {
					t.Fatalf("Warm made %d host registrations; want 1, before any batch", n)
				}
			}
			k0 := cu.Copies() // the staging calibration's copies are not the batches'
			for round := 0; round < 3; round++ {
				if _, err := transport.Write(context.Background(), conn, src, rr, b); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
			}
			if !bytes.Equal(db, want) {
				t.Fatal("destination differs from the expected blocks and gaps")
			}
			if n := cu.Calls("HostRegister"); n != 1 {
				t.Errorf("%d HostRegister calls for 3 batches on one mapping; want 1", n)
			}
			k := cu.Copies()
			k.PinnedHostSide -= k0.PinnedHostSide
			k.PageableHostSide -= k0.PageableHostSide
			if tc.wantPinned && (k.PinnedHostSide != 3*blocks || k.PageableHostSide != 0) {
				t.Errorf("copies %+v: want every host end pinned (%d)", k, 3*blocks)
			}
			if !tc.wantPinned && k.PageableHostSide != 3*blocks {
				t.Errorf("copies %+v: want every host end pageable after the refusal", k)
			}
			if got := cu.HostRegistered(uintptrOf(hostSide()), uint64(len(hostSide()))); got != tc.wantPinned {
				t.Errorf("host side registered = %v; want %v", got, tc.wantPinned)
			}
			detail := send.Advertise().Detail
			if tc.wantPinned != strings.Contains(detail, "host-GPU batches: host memory registered with the driver") ||
				!tc.wantPinned && !strings.Contains(detail, "pageable") {
				t.Errorf("Status detail %q does not say how host-GPU batches run (pinned: %v)", detail, tc.wantPinned)
			}
			if warns := strings.Count(logs.String(), "cuMemHostRegister"); tc.failPin && warns != 1 {
				t.Errorf("the refused registration was logged %d times; want once:\n%s", warns, logs.String())
			}
			if err := conn.Close(); err != nil {
				t.Fatal(err)
			}
			if err := src.Close(); err != nil {
				t.Fatal(err)
			}
			if !tc.hostSrc && unmapped == 0 {
				t.Error("Close did not unmap the destination")
			}
			if unmappedPinned != 0 {
				t.Errorf("%d mappings unmapped while still registered with the driver", unmappedPinned)
			}
			for _, l := range cu.Leaks() {
				if strings.HasPrefix(l, "host registration") {
					t.Errorf("left registered after Close: %s", l)
				}
			}
		})
	}
}
