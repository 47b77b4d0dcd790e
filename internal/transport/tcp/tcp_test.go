package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// keyed is a minimal Inbound: registrations by key.
type keyed struct {
	mu     sync.Mutex
	regs   map[uint64]memory.Memory
	landed atomic.Uint64
	// pins held now, and Pin calls so far; unpin is made once, so that
	// pinning does not allocate.
	pins, pinCalls atomic.Int64
	unpin          func()
}

func (k *keyed) Pin(_ transport.Kind, key uint64) (memory.Memory, func(), error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	m, ok := k.regs[key]
	if !ok {
		return memory.Memory{}, nil, errs.ErrNotFound
	}
	if k.unpin == nil {
		k.unpin = func() { k.pins.Add(-1) }
	}
	k.pins.Add(1)
	k.pinCalls.Add(1)
	return m, k.unpin, nil
}
func (k *keyed) Landed(_ transport.Kind, _, bytes uint64) { k.landed.Add(bytes) }

// PinRead serves pulls from the same regions (the tests' read tokens are
// their keys).
func (k *keyed) PinRead(kind transport.Kind, key uint64) (memory.Memory, func(), error) {
	return k.Pin(kind, key)
}

func hostMem(t testing.TB, n int) memory.Memory {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return memory.Memory{Kind: memory.Host, Host: b, Len: uint64(n), DmabufFD: -1}
}

type pair struct {
	a, b   *Transport
	in     *keyed
	conn   transport.Conn
	src    transport.Registration
	dst    transport.RemoteRegion
	srcMem memory.Memory
	dstMem memory.Memory
}

func newPair(t testing.TB, size int, streams int) *pair {
	return newPairCfg(t, size, Config{Listen: "127.0.0.1:0", Streams: streams, MinShareBytes: 64 << 10})
}

// newPairCfg is newPair with the sender's Config.
func newPairCfg(t testing.TB, size int, cfg Config) *pair {
	p := &pair{in: &keyed{regs: map[uint64]memory.Memory{}}}
	// Memory first, so it is unmapped only after the transports stopped.
	p.srcMem, p.dstMem = hostMem(t, size), hostMem(t, size)
	var err error
	if p.a, err = New(cfg, &keyed{}, nil); err != nil {
		t.Fatal(err)
	}
	if p.b, err = New(Config{Listen: "127.0.0.1:0"}, p.in, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.a.Close(); p.b.Close() })
	if p.src, err = p.a.Register(p.srcMem); err != nil {
		t.Fatal(err)
	}
	dreg, err := p.b.Register(p.dstMem)
	if err != nil {
		t.Fatal(err)
	}
	p.in.regs[dreg.Key().Key] = p.dstMem
	p.dst = transport.RemoteRegion{Name: "d", Size: uint64(size), Key: dreg.Key()}
	p.conn, err = p.a.Connect(context.Background(), transport.Peer{Address: "127.0.0.1:1",
		Advert: MarshalAdvert(p.b.Addr(), p.b.Token())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.conn.Close() })
	return p
}

func TestWriteLandsEveryBlock(t *testing.T) {
	for _, c := range []struct {
		blocks  int
		size    uint64
		streams int
	}{{1, 1, 1}, {5000, 128, 4}, {300, 5000, 2}, {40, 1 << 20, 4}, {3, 3 << 20, 4}} {
		slot := c.size + 32
		p := newPair(t, int(uint64(c.blocks)*slot), c.streams)
		r := rand.New(rand.NewPCG(uint64(c.blocks), c.size))
		for i := range p.srcMem.Host {
			p.srcMem.Host[i] = byte(r.Uint32())
		}
		b := desc.Batch{Src: make([]uint64, c.blocks), Dst: make([]uint64, c.blocks), Len: make([]uint64, c.blocks)}
		perm := r.Perm(c.blocks)
		for i := range c.blocks {
			b.Src[i], b.Dst[i], b.Len[i] = uint64(i)*slot, uint64(perm[i])*slot, c.size
		}
		if _, err := transport.Write(context.Background(), p.conn, p.src, p.dst, &b); err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		for i := range c.blocks {
			if !bytes.Equal(p.srcMem.Host[b.Src[i]:b.Src[i]+c.size], p.dstMem.Host[b.Dst[i]:b.Dst[i]+c.size]) {
				t.Fatalf("%+v: block %d differs", c, i)
			}
		}
		if got, want := p.in.landed.Load(), uint64(c.blocks)*c.size; got != want {
			t.Fatalf("%+v: receiver reported %d bytes landed, want %d", c, got, want)
		}
	}
}

func TestReceiverRefusals(t *testing.T) {
	cases := []struct {
		name string
		mut  func(*pair, *desc.Batch)
		want error
	}{
		{"unknown key", func(p *pair, b *desc.Batch) { p.dst.Key.Key ^= 1 }, errs.ErrNotFound},
		{"range past end", func(p *pair, b *desc.Batch) { b.Dst[4999] = p.dst.Size - 1 }, errs.ErrInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newPair(t, 1<<20, 2)
			// Several frames on two streams, so the refusal must be drained.
			b := desc.Batch{}
			for i := uint64(0); i < 5000; i++ {
				b.Src, b.Dst, b.Len = append(b.Src, i*128), append(b.Dst, i*128), append(b.Len, 128)
			}
			good := p.dst
			c.mut(p, &b)
			_, err := transport.Write(context.Background(), p.conn, p.src, p.dst, &b)
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if p.in.landed.Load() != 0 {
				t.Fatal("a refused batch was reported as landed")
			}
			// Every stream's share is done before the last ack: no pin is
			// left behind by the refusal.
			if n := p.in.pins.Load(); n != 0 {
				t.Fatalf("%d pins held after the refusal was acked", n)
			}
			// The receiver drained the refused batch, so the connection is
			// still in step and carries the next batch.
			if err := p.conn.Err(); err != nil {
				t.Fatalf("a clean refusal broke the connection: %v", err)
			}
			ok := desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{16}}
			if _, err := transport.Write(context.Background(), p.conn, p.src, good, &ok); err != nil {
				t.Fatalf("next batch on the same connection: %v", err)
			}
		})
	}
}

// TestBatchPinnedOnce: the receiver pins a batch's destination once, at its
// first frame, and holds it until every stream's share is in place (it used
// to pin per frame, so the region could be deregistered between frames);
// nothing is held once the sender has its acks.
func TestBatchPinnedOnce(t *testing.T) {
	for _, streams := range []int{1, 4} {
		p := newPair(t, 64<<20, streams)
		// 64 MiB in 1 MiB blocks: 16 frames of 4 MiB.
		b := desc.Batch{}
		for i := uint64(0); i < 64; i++ {
			b.Src, b.Dst, b.Len = append(b.Src, i<<20), append(b.Dst, (63-i)<<20), append(b.Len, 1<<20)
		}
		for round := 1; round <= 2; round++ {
			if _, err := transport.Write(context.Background(), p.conn, p.src, p.dst, &b); err != nil {
				t.Fatal(err)
			}
			if n := p.in.pinCalls.Load(); n < 1 || n > int64(round*streams) {
				t.Fatalf("streams %d, round %d: %d Pin calls so far, want 1..%d per batch (one per batch, or one per stream in a race)", streams, round, n, streams)
			}
			if n := p.in.pins.Load(); n != 0 {
				t.Fatalf("streams %d: %d pins held after the batch was acked", streams, n)
			}
		}
	}
}

// TestDeadline: a receiver that never acks makes Write fail with the deadline.
func TestDeadline(t *testing.T) {
	p := newPair(t, 1<<20, 1)
	// Stall the receiver: hold the Pin lock so it cannot place bytes.
	p.in.mu.Lock()
	defer p.in.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	b := desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{1 << 20}}
	start := time.Now()
	_, err := transport.Write(ctx, p.conn, p.src, p.dst, &b)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Write took %v past a 200ms deadline", d)
	}
}

// BenchmarkWrite10K128 is the data path for 10,000 scattered 128 B blocks:
// it must not allocate.
func BenchmarkWrite10K128(b *testing.B) {
	const n, size, slot = 10000, 128, 192
	p := newPair(b, n*slot, 4)
	bt := desc.Batch{Src: make([]uint64, n), Dst: make([]uint64, n), Len: make([]uint64, n)}
	perm := rand.New(rand.NewPCG(1, 1)).Perm(n)
	for i := range n {
		bt.Src[i], bt.Dst[i], bt.Len[i] = uint64(i)*slot, uint64(perm[i])*slot, size
	}
	ctx := context.Background()
	req := transport.Request{Op: transport.OpWrite, Local: p.src, Remote: p.dst, Batch: &bt} // kept, as the batch layer keeps its own
	b.ReportAllocs()
	b.SetBytes(n * size)
	defer cpuPerByte(b, n*size)()
	for b.Loop() {
		if _, err := p.conn.Post(ctx, &req); err != nil {
			b.Fatal(err)
		}
	}
}

// truncatable maps n bytes of a memfd, shared, and returns a function that
// truncates the file: the mapping's pages then raise SIGBUS, as when a
// client truncates its region's shm file.
func truncatable(t testing.TB, n int) (memory.Memory, func()) {
	fd, err := unix.MemfdCreate("b2b-test", 0)
	if err != nil {
		t.Skipf("memfd_create: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		t.Fatal(err)
	}
	b, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return memory.Memory{Kind: memory.Host, Host: b, Len: uint64(n), DmabufFD: -1}, func() {
		if err := unix.Ftruncate(fd, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTruncatedMemory: a fault on the source fails the batch with DataLoss
// and fails the conn (its stream is out of step); a fault on the
// destination is refused with DataLoss after the frame is drained, so the
// same conn carries the next batch. Neither kills the process.
func TestTruncatedMemory(t *testing.T) {
	const size = 8 << 20
	for _, blk := range []uint64{128, 256 << 10} {
		b := desc.Batch{}
		for i := uint64(0); i < size/blk/2; i++ {
			b.Src, b.Dst, b.Len = append(b.Src, 2*i*blk), append(b.Dst, 2*i*blk), append(b.Len, blk)
		}
		t.Run(fmt.Sprintf("destination/%d", blk), func(t *testing.T) {
			p := newPair(t, size, 2)
			mem, truncate := truncatable(t, size)
			reg, err := p.b.Register(mem)
			if err != nil {
				t.Fatal(err)
			}
			p.in.mu.Lock()
			p.in.regs[reg.Key().Key] = mem
			p.in.mu.Unlock()
			truncate()
			bad := transport.RemoteRegion{Name: "t", Size: size, Key: reg.Key()}
			_, err = transport.Write(context.Background(), p.conn, p.src, bad, &b)
			if !errors.Is(err, errs.ErrDataLoss) {
				t.Fatalf("err = %v, want DataLoss", err)
			}
			if err := p.conn.Err(); err != nil {
				t.Fatalf("a fault at the receiver broke the connection: %v", err)
			}
			if n := p.in.pins.Load(); n != 0 {
				t.Fatalf("%d pins held after the fault", n)
			}
			for i := range p.srcMem.Host {
				p.srcMem.Host[i] = byte(i * 7)
			}
			if _, err := transport.Write(context.Background(), p.conn, p.src, p.dst, &b); err != nil {
				t.Fatalf("next batch on the same connection: %v", err)
			}
			if !bytes.Equal(p.srcMem.Host[:blk], p.dstMem.Host[:blk]) {
				t.Fatal("next batch did not land")
			}
		})
		t.Run(fmt.Sprintf("source/%d", blk), func(t *testing.T) {
			p := newPair(t, size, 2)
			mem, truncate := truncatable(t, size)
			src, err := p.a.Register(mem)
			if err != nil {
				t.Fatal(err)
			}
			truncate()
			_, err = transport.Write(context.Background(), p.conn, src, p.dst, &b)
			if !errors.Is(err, errs.ErrDataLoss) || !memguard.IsFault(err) {
				t.Fatalf("err = %v, want a DataLoss fault", err)
			}
			if p.conn.Err() == nil {
				t.Fatal("the conn is out of step after a cut frame, yet not failed")
			}
		})
	}
}

// TestSegmentOverFrameLimit: one block longer than the receiver's frame
// limit (maxPayload; merging makes such blocks of adjacent ones) is cut
// into frames and lands whole, pushed and pulled.
func TestSegmentOverFrameLimit(t *testing.T) {
	const size = maxPayload + 5<<20
	p := newPairCfg(t, size, Config{Listen: "127.0.0.1:0", Streams: 2, FrameBytes: maxPayload})
	for i := range p.srcMem.Host {
		p.srcMem.Host[i] = byte(i*7 + i>>20)
	}
	b := desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{size}}
	if _, err := transport.Write(context.Background(), p.conn, p.src, p.dst, &b); err != nil {
		t.Fatalf("write of one %d-byte block: %v", size, err)
	}
	if !bytes.Equal(p.srcMem.Host, p.dstMem.Host) {
		t.Fatal("the block differs at the destination")
	}
}
