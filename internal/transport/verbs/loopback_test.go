package verbs

// Hardware tests: they run only when B2B_RDMA_DEV names an RDMA device
// (the Soft-RoCE testbed VMs export B2B_RDMA_DEV=rxe0). Two transports
// open the same device in one process and connect through a fake peer
// client that calls the other side's AcceptVerbs directly (no gRPC).

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// inbound counts landed batches and pins. Its release func is made once,
// so the benchmark's allocation count is the transport's alone.
type inbound struct {
	transport.NoReads
	batches, blocks, bytes atomic.Uint64
	pins, unpins           atomic.Int64
	unpin                  func()
	refuse                 atomic.Bool // Pin fails, as for a deregistered or un-exported region
	// gate, when set, holds Pin (and so the receiving poller, which calls
	// it for each batch's meta) until it is closed: a receiver that runs no
	// code, as a stopped daemon's, while its NIC still places WRITEs.
	gate atomic.Pointer[chan struct{}]
}

func (in *inbound) Pin(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	if g := in.gate.Load(); g != nil {
		<-*g
	}
	if in.refuse.Load() {
		return memory.Memory{}, nil, fmt.Errorf("test inbound: no live %s registration has key %#x: %w", k, key, errs.ErrNotFound)
	}
	in.pins.Add(1)
	return memory.Memory{}, in.unpin, nil
}
func (in *inbound) Landed(k transport.Kind, blocks, bytes uint64) {
	in.batches.Add(1)
	in.blocks.Add(blocks)
	in.bytes.Add(bytes)
}

func hwDevice(t testing.TB) string {
	d := os.Getenv("B2B_RDMA_DEV")
	if d == "" {
		t.Skip("B2B_RDMA_DEV not set: no RDMA device (run inside the rdma testbed)")
	}
	return d
}

func testConfig(dev string) Config {
	c := DefaultConfig()
	c.Device = dev
	c.QPsPerPeer = 4
	c.KeepAlive = time.Hour
	return c
}

func mmapHost(t testing.TB, n int) memory.Memory {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return memory.Memory{Kind: memory.Host, Addr: uintptr(unsafePointer(b)), Len: uint64(n), Host: b, DmabufFD: -1}
}

type pair struct {
	a, b     *Transport
	in       *inbound
	conn     transport.Conn
	src, dst transport.Registration
	sm, dm   memory.Memory
	remote   transport.RemoteRegion
}

func newPair(t testing.TB, cfg Config, size int) *pair {
	t.Helper()
	log := hclog.New(&hclog.LoggerOptions{Name: "verbs", Level: hclog.Warn, Output: os.Stderr})
	p := &pair{in: &inbound{}}
	p.in.unpin = func() { p.in.unpins.Add(1) }
	var err error
	if p.a, err = New(cfg, nil, log.Named("a")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.a.Close() })
	if p.b, err = New(cfg, p.in, log.Named("b")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.b.Close() })
	p.sm, p.dm = mmapHost(t, size), mmapHost(t, size)
	if p.src, err = p.a.Register(p.sm); err != nil {
		t.Fatal(err)
	}
	if p.dst, err = p.b.Register(p.dm); err != nil {
		t.Fatal(err)
	}
	p.remote = transport.RemoteRegion{Name: "dst", Size: p.dm.Len, Key: p.dst.Key()}
	p.connect(t)
	return p
}

func (p *pair) connect(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := p.a.Connect(ctx, transport.Peer{Address: "loopback", Signal: p.b.HandleSignal})
	if err != nil {
		t.Fatal(err)
	}
	p.conn = c
	t.Cleanup(func() { c.Close() })
}

// layout builds a batch: n blocks of sizes from sizes (cycled), placed per
// mode in a region of size bytes.
func layout(r *rand.Rand, n int, sizes []uint64, mode string, size uint64) *desc.Batch {
	b := &desc.Batch{}
	var slot uint64
	for _, s := range sizes {
		slot = max(slot, s)
	}
	slots := size / slot
	ps, pd := r.Perm(int(slots)), r.Perm(int(slots))
	var so, do uint64
	for i := 0; i < n; i++ {
		l := sizes[i%len(sizes)]
		var s, d uint64
		switch mode {
		case "random": // scattered on both sides: one WR per block
			s, d = uint64(ps[i])*slot, uint64(pd[i])*slot
		case "adjacent": // contiguous on both sides: merged
			s, d = so, do
		case "gather": // contiguous destinations, scattered sources: multi-SGE
			s, d = uint64(ps[i])*slot, do
		}
		so += l
		do += l
		b.Src, b.Dst, b.Len = append(b.Src, s), append(b.Dst, d), append(b.Len, l)
	}
	return b
}

// verify compares every block by xxhash and that nothing outside the
// blocks was written.
func verify(t testing.TB, p *pair, b *desc.Batch) {
	t.Helper()
	src, dst := p.sm.Host, p.dm.Host
	covered := make([]bool, len(dst))
	for i := range b.Src {
		s, d, l := b.Src[i], b.Dst[i], b.Len[i]
		if xxhash.Sum64(src[s:s+l]) != xxhash.Sum64(dst[d:d+l]) {
			t.Fatalf("block %d (src %d, dst %d, len %d): checksum mismatch", i, s, d, l)
		}
		for x := d; x < d+l; x++ {
			covered[x] = true
		}
	}
	for x := range dst {
		if !covered[x] && dst[x] != 0 {
			t.Fatalf("byte %d outside every block was written", x)
		}
	}
}

func TestHWLoopbackSweep(t *testing.T) {
	dev := hwDevice(t)
	const size = 40 << 20
	p := newPair(t, testConfig(dev), size)
	r := rand.New(rand.NewSource(1))
	cases := []struct {
		name  string
		n     int
		sizes []uint64
		mode  string
	}{
		{"128B random", 4000, []uint64{128}, "random"},
		{"4KiB random", 2000, []uint64{4096}, "random"},
		{"64KiB random", 200, []uint64{64 << 10}, "random"},
		{"2MiB random", 8, []uint64{2 << 20}, "random"},
		{"mixed random", 300, []uint64{128, 4096, 700, 64 << 10, 1}, "random"},
		{"128B adjacent (merged)", 5000, []uint64{128}, "adjacent"},
		{"512B gather", 3000, []uint64{512}, "gather"},
		{"2MiB adjacent (cut across QPs)", 16, []uint64{2 << 20}, "adjacent"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clear(p.dm.Host)
			r.Read(p.sm.Host)
			b := layout(r, tc.n, tc.sizes, tc.mode, size)
			before := p.in.batches.Load()
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			start := time.Now()
			st, err := transport.Write(ctx, p.conn, p.src, p.remote, b)
			el := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			verify(t, p, b)
			if got := p.in.batches.Load(); got != before+1 {
				t.Fatalf("Landed called %d times, want 1", got-before)
			}
			if st.Plan <= 0 || st.Post <= 0 || st.Plan+st.Post > el {
				t.Fatalf("phase times plan %v post %v of a %v write", st.Plan, st.Post, el)
			}
			t.Logf("%d blocks, %d bytes: %d WRs, %d SGEs, %v (%.1f MB/s; plan %v, post %v)", b.N(), b.Bytes(), st.WorkRequests, st.Segments, el,
				float64(b.Bytes())/el.Seconds()/1e6, st.Plan, st.Post)
			if tc.mode == "adjacent" && st.WorkRequests > 64 {
				t.Fatalf("adjacent blocks took %d WRs", st.WorkRequests)
			}
		})
	}
	if pins, unpins := p.in.pins.Load(), p.in.unpins.Load(); pins != unpins || pins == 0 {
		t.Fatalf("pins %d, unpins %d", pins, unpins)
	}
}

func TestHWConcurrentWrites(t *testing.T) {
	dev := hwDevice(t)
	const size = 16 << 20
	p := newPair(t, testConfig(dev), size)
	r := rand.New(rand.NewSource(2))
	r.Read(p.sm.Host)
	// Four writers, each owning a quarter of the destination.
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	batches := make([]*desc.Batch, 4)
	for w := 0; w < 4; w++ {
		b := &desc.Batch{}
		for i := 0; i < 500; i++ {
			b.Src = append(b.Src, uint64(r.Intn(size-4096)))
			b.Dst = append(b.Dst, uint64(w)*size/4+uint64(i)*4096)
			b.Len = append(b.Len, uint64(1+r.Intn(4096)))
		}
		batches[w] = b
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 3; k++ {
				if _, err := transport.Write(context.Background(), p.conn, p.src, p.remote, b); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	all := &desc.Batch{}
	for _, b := range batches {
		all.Src, all.Dst, all.Len = append(all.Src, b.Src...), append(all.Dst, b.Dst...), append(all.Len, b.Len...)
	}
	verify(t, p, all)
}

func TestHWBadInput(t *testing.T) {
	dev := hwDevice(t)
	p := newPair(t, testConfig(dev), 1<<20)
	tests := []struct {
		name string
		b    desc.Batch
	}{
		{"dst past the region", desc.Batch{Src: []uint64{0}, Dst: []uint64{1<<20 - 10}, Len: []uint64{64}}},
		{"src past the registration", desc.Batch{Src: []uint64{1 << 20}, Dst: []uint64{0}, Len: []uint64{1}}},
		{"ragged arrays", desc.Batch{Src: []uint64{0, 1}, Dst: []uint64{0}, Len: []uint64{1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := transport.Write(context.Background(), p.conn, p.src, p.remote, &tc.b)
			if !errors.Is(err, errs.ErrInvalidArgument) {
				t.Fatalf("got %v, want ErrInvalidArgument", err)
			}
			if p.conn.Err() != nil {
				t.Fatalf("bad input broke the connection: %v", p.conn.Err())
			}
		})
	}
	t.Run("foreign registration", func(t *testing.T) {
		_, err := transport.Write(context.Background(), p.conn, p.dst, p.remote, &desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{1}})
		if !errors.Is(err, errs.ErrInvalidArgument) {
			t.Fatalf("got %v", err)
		}
	})
	// The connection still works.
	b := &desc.Batch{Src: []uint64{0}, Dst: []uint64{4096}, Len: []uint64{4096}}
	rand.New(rand.NewSource(3)).Read(p.sm.Host[:4096])
	if _, err := transport.Write(context.Background(), p.conn, p.src, p.remote, b); err != nil {
		t.Fatal(err)
	}
	verify(t, p, b)
}

func TestHWWrongRKey(t *testing.T) {
	dev := hwDevice(t)
	p := newPair(t, testConfig(dev), 1<<20)
	bad := p.remote
	bad.Key.Key ^= 0x5a5a00
	b := &desc.Batch{Src: []uint64{0, 8192}, Dst: []uint64{0, 8192}, Len: []uint64{4096, 4096}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := transport.Write(ctx, p.conn, p.src, bad, b)
	if !errors.Is(err, errs.ErrAborted) {
		t.Fatalf("got %v, want ErrAborted", err)
	}
	if !strings.Contains(err.Error(), "remote access error") {
		t.Fatalf("error does not name the WC status: %v", err)
	}
	if p.conn.Err() == nil {
		t.Fatal("Err() is nil after a failed work completion")
	}
	if _, err := transport.Write(ctx, p.conn, p.src, p.remote, b); !errors.Is(err, errs.ErrAborted) {
		t.Fatalf("broken conn wrote again: %v", err)
	}
	t.Logf("error: %v", err)
	// Reconnecting gives a working connection; the receiver freed the old set.
	p.conn.Close()
	p.connect(t)
	rand.New(rand.NewSource(4)).Read(p.sm.Host)
	if _, err := transport.Write(ctx, p.conn, p.src, p.remote, b); err != nil {
		t.Fatal(err)
	}
	verify(t, p, b)
	waitSets(t, p.b, 1, 10*time.Second)
}

func TestHWDeadPeer(t *testing.T) {
	dev := hwDevice(t)
	cfg := testConfig(dev)
	p := newPair(t, cfg, 1<<20)
	if err := p.b.Close(); err != nil { // the receiving daemon vanishes
		t.Fatal(err)
	}
	b := &desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{4096}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	_, err := transport.Write(ctx, p.conn, p.src, p.remote, b)
	if !errors.Is(err, errs.ErrAborted) || p.conn.Err() == nil {
		t.Fatalf("got %v, want ErrAborted and a broken conn", err)
	}
	t.Logf("dead peer detected after %v: %v", time.Since(start), err)
}

// A sender that vanishes without a goodbye is found by the receiver's
// keepalive probe, and its QP set freed.
func TestHWKeepAlive(t *testing.T) {
	dev := hwDevice(t)
	cfg := testConfig(dev)
	cfg.KeepAlive = time.Second
	p := newPair(t, cfg, 1<<20)
	for _, q := range p.conn.(*qpSet).qps {
		if err := q.qp.ToError(); err != nil { // no goodbye can leave now
			t.Fatal(err)
		}
	}
	p.conn.Close()
	start := time.Now()
	waitSets(t, p.b, 0, 30*time.Second)
	t.Logf("receiver freed the dead sender's QPs after %v", time.Since(start))
}

func waitSets(t *testing.T, tr *Transport, want int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		tr.mu.Lock()
		n := len(tr.sets)
		tr.mu.Unlock()
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("transport holds %d QP sets, want %d", n, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestHWDeadline(t *testing.T) {
	dev := hwDevice(t)
	p := newPair(t, testConfig(dev), 8<<20)
	b := layout(rand.New(rand.NewSource(5)), 2000, []uint64{4096}, "random", 8<<20)
	ctx, cancel := context.WithTimeout(context.Background(), time.Microsecond)
	defer cancel()
	time.Sleep(time.Millisecond)
	_, err := transport.Write(ctx, p.conn, p.src, p.remote, b)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	if p.conn.Err() != nil { // nothing was posted: the conn is fine
		t.Fatalf("conn broken by a batch that never started: %v", p.conn.Err())
	}
}

func TestHWCloseTwice(t *testing.T) {
	dev := hwDevice(t)
	p := newPair(t, testConfig(dev), 1<<20)
	for k := 0; k < 2; k++ {
		if err := p.conn.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := transport.Write(context.Background(), p.conn, p.src, p.remote, &desc.Batch{}); !errors.Is(err, errs.ErrAborted) {
		t.Fatalf("write on closed conn: %v", err)
	}
	for k := 0; k < 2; k++ {
		if err := p.src.Close(); err != nil {
			t.Fatal(err)
		}
		if err := p.a.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkHWWrite posts whole batches over the loopback: ns per WR and
// allocations per batch (there must be none).
func BenchmarkHWWrite(b *testing.B) {
	dev := hwDevice(b)
	for _, sz := range []uint64{128, 4096, 65536} {
		b.Run(fmt.Sprintf("%dB", sz), func(b *testing.B) {
			n := 2000
			if sz == 65536 {
				n = 200
			}
			size := int(sz) * n * 2
			p := newPair(b, testConfig(dev), size)
			batch := layout(rand.New(rand.NewSource(6)), n, []uint64{sz}, "random", uint64(size))
			ctx := context.Background()
			var wrs uint64
			b.ReportAllocs()
			b.SetBytes(int64(batch.Bytes()))
			b.ResetTimer()
			for k := 0; k < b.N; k++ {
				st, err := transport.Write(ctx, p.conn, p.src, p.remote, batch)
				if err != nil {
					b.Fatal(err)
				}
				wrs += st.WorkRequests
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(wrs), "ns/WR")
		})
	}
}
