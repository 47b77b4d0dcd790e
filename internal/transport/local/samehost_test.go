package local

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// fakeInbound pins registrations whose key is exported, and counts landings.
type fakeInbound struct {
	transport.NoReads
	mu       sync.Mutex
	regs     []transport.Registration
	exported map[transport.Registration]bool
	pinned   int
	batches  uint64
	blocks   uint64
	bytes    uint64
	unpin    func() // made once, so that pinning allocates nothing
}

func (f *fakeInbound) add(r transport.Registration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.exported == nil {
		f.exported = map[transport.Registration]bool{}
	}
	f.regs = append(f.regs, r)
	f.exported[r] = true
}

func (f *fakeInbound) Pin(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.regs {
		if r.Key().Key == key {
			if !f.exported[r] {
				return memory.Memory{}, nil, fmt.Errorf("%w: region is no longer exported", errs.ErrNotFound)
			}
			f.pinned++
			if f.unpin == nil {
				f.unpin = func() { f.mu.Lock(); f.pinned--; f.mu.Unlock() }
			}
			return r.Memory(), f.unpin, nil
		}
	}
	return memory.Memory{}, nil, fmt.Errorf("%w: no live %s registration has key %#x", errs.ErrNotFound, k, key)
}

// snap reads the counters under the lock.
func (f *fakeInbound) snap() (batches, blocks, bytes uint64, pinned int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.batches, f.blocks, f.bytes, f.pinned
}

func (f *fakeInbound) Landed(k transport.Kind, blocks, bytes uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batches++
	f.blocks += blocks
	f.bytes += bytes
}

// shmRegion maps a file of size bytes in dir, as the registry does.
func shmRegion(t testing.TB, dir string, size int) memory.Memory {
	t.Helper()
	f, err := os.CreateTemp(dir, "region-")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(size)); err != nil {
		t.Fatal(err)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return memory.Memory{Kind: memory.Host, Addr: uintptrOf(b), Len: uint64(size), Host: b, DmabufFD: -1}
}

type pair struct {
	send, recv *Transport
	in         *fakeInbound
	dst        transport.Registration
	src        transport.Registration
	conn       transport.Conn
	peer       transport.Peer
}

func newPair(t testing.TB, size int) *pair {
	t.Helper()
	dir := t.TempDir()
	p := &pair{in: &fakeInbound{}}
	var err error
	if p.recv, err = New(Config{Dir: filepath.Join(dir, "recv"), Node: "recv"}, p.in, nil); err != nil {
		t.Fatal(err)
	}
	if p.send, err = New(Config{Dir: filepath.Join(dir, "send"), Node: "send"}, &fakeInbound{}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.send.Close(); _ = p.recv.Close() })
	if p.dst, err = p.recv.Register(shmRegion(t, dir, size)); err != nil {
		t.Fatal(err)
	}
	p.in.add(p.dst)
	if p.src, err = p.send.Register(shmRegion(t, dir, size)); err != nil {
		t.Fatal(err)
	}
	p.peer = transport.Peer{Address: "local", Node: "recv", Advert: MarshalEndpoint(p.recv.Endpoint())}
	if p.conn, err = p.send.Connect(context.Background(), p.peer); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.conn.Close() })
	return p
}

// gapped is n blocks of size bytes at every other slot, the destination
// reversed, so no two blocks merge.
func gapped(n int, size uint64) *desc.Batch {
	b := &desc.Batch{Src: make([]uint64, n), Dst: make([]uint64, n), Len: make([]uint64, n)}
	for i := 0; i < n; i++ {
		b.Src[i] = uint64(2*i) * size
		b.Dst[i] = uint64(2*(n-1-i)) * size
		b.Len[i] = size
	}
	return b
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
}

func TestWriteHostVerified(t *testing.T) {
	for _, tc := range []struct {
		name   string
		blocks int
		size   uint64
	}{
		{"128B", 1000, 128},
		{"4KiB", 200, 4096},
		{"1MiB", 4, 1 << 20},     // 4 MiB: copied in parallel shares
		{"64KiB", 300, 64 << 10}, // ~19 MiB over the pool, shares of unequal block counts
	} {
		t.Run(tc.name, func(t *testing.T) {
			region := int(2 * uint64(tc.blocks) * tc.size)
			p := newPair(t, region)
			src, dst := p.src.Memory().Host, p.dst.Memory().Host
			fill(src, 0x5a)
			fill(dst, 0xc3)
			before := crc32.ChecksumIEEE(dst)
			b := gapped(tc.blocks, tc.size)
			for round := 0; round < 3; round++ {
				if _, err := transport.Write(context.Background(), p.conn, p.src, transport.RemoteRegion{Name: "d", Size: uint64(region), Key: p.dst.Key()}, b); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
			}
			for i := range b.Len {
				s, d, n := b.Src[i], b.Dst[i], b.Len[i]
				if crc32.ChecksumIEEE(dst[d:d+n]) != crc32.ChecksumIEEE(src[s:s+n]) {
					t.Fatalf("block %d differs", i)
				}
				// the gap after every destination block is untouched
				g := dst[d+n : d+2*n]
				want := make([]byte, n)
				for j := range want {
					want[j] = byte(int(d+n+uint64(j))*7) ^ 0xc3
				}
				if string(g) != string(want) {
					t.Fatalf("gap after block %d was overwritten", i)
				}
			}
			if crc32.ChecksumIEEE(dst) == before {
				t.Fatal("destination unchanged")
			}
			nb, nbl, nby, pins := p.in.snap()
			if nb != 3 || nbl != uint64(3*tc.blocks) || nby != 3*uint64(tc.blocks)*tc.size || pins != 0 {
				t.Fatalf("landed %d batches %d blocks %d bytes, %d pins held; want 3, %d, %d, 0", nb, nbl, nby, pins, 3*tc.blocks, 3*uint64(tc.blocks)*tc.size)
			}
		})
	}
}

func TestRevocation(t *testing.T) {
	p := newPair(t, 1<<16)
	b := gapped(8, 1024)
	dst := transport.RemoteRegion{Name: "d", Size: 1 << 16, Key: p.dst.Key()}
	if _, err := transport.Write(context.Background(), p.conn, p.src, dst, b); err != nil {
		t.Fatal(err)
	}
	c := p.conn.(*Conn)
	if len(c.cache) != 1 {
		t.Fatalf("cache holds %d mappings, want 1", len(c.cache))
	}
	// Narrowing the export rekeys: the old key is refused and its mapping dropped.
	if _, err := p.dst.Rekey(); err != nil {
		t.Fatal(err)
	}
	_, err := transport.Write(context.Background(), p.conn, p.src, dst, b)
	if !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("write with a revoked key: %v, want NotFound", err)
	}
	if len(c.cache) != 0 {
		t.Fatalf("cache holds %d mappings after the refusal, want 0", len(c.cache))
	}
	if p.conn.Err() != nil {
		t.Fatalf("a refused batch broke the connection: %v", p.conn.Err())
	}
	// The new key works; un-exporting refuses it.
	dst.Key = p.dst.Key()
	if _, err := transport.Write(context.Background(), p.conn, p.src, dst, b); err != nil {
		t.Fatal(err)
	}
	p.in.mu.Lock()
	p.in.exported[p.dst] = false
	p.in.mu.Unlock()
	if _, err := transport.Write(context.Background(), p.conn, p.src, dst, b); !errors.Is(err, errs.ErrNotFound) || !strings.Contains(err.Error(), "no longer exported") {
		t.Fatalf("write into an un-exported region: %v", err)
	}
	// Out of bounds against the real size is refused before any copy.
	p.in.mu.Lock()
	p.in.exported[p.dst] = true
	p.in.mu.Unlock()
	big := &desc.Batch{Src: []uint64{0}, Dst: []uint64{1<<16 - 8}, Len: []uint64{16}}
	if _, err := transport.Write(context.Background(), p.conn, p.src, dst, big); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("out-of-bounds write: %v, want InvalidArgument", err)
	}
	if _, _, _, pins := p.in.snap(); pins != 0 {
		t.Fatalf("%d pins held", pins)
	}
	if err := p.conn.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.conn.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestConnectRefused(t *testing.T) {
	p := newPair(t, 4096)
	ep := p.recv.Endpoint()
	for _, tc := range []struct {
		name string
		edit func(*transport.Peer, *Endpoint)
		want string
	}{
		{"other boot", func(q *transport.Peer, e *Endpoint) { e.BootID = "00000000-0000-0000-0000-000000000000" }, "boot ID"},
		{"wrong digest", func(q *transport.Peer, e *Endpoint) { e.TokenDigest = Digest([]byte("guess")) }, "does not match"},
		{"unreadable token", func(q *transport.Peer, e *Endpoint) { e.TokenPath = "/nonexistent/b2bd.token" }, "cannot be read"},
		{"relative socket", func(q *transport.Peer, e *Endpoint) { e.Socket = "b2bd.sock" }, "clean absolute path"},
		{"node mismatch", func(q *transport.Peer, e *Endpoint) { q.Node = "someone-else" }, "not the peer"},
		{"advert not a local advert", func(q *transport.Peer, e *Endpoint) { q.Advert = []byte{0xff} }, "local advert"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := ep
			e.TokenDigest = append([]byte(nil), ep.TokenDigest...)
			q := transport.Peer{Address: "x", Node: "recv"}
			q.Advert = MarshalEndpoint(e)
			tc.edit(&q, &e)
			if q.Advert[0] != 0xff {
				q.Advert = MarshalEndpoint(e)
			}
			c, err := p.send.Connect(context.Background(), q)
			if err == nil {
				_ = c.Close()
				t.Fatal("connected")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
	// A client that skips the proof and sends a wrong token is refused.
	nc, err := (&netDialer{}).dial(ep.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	h := hello{node: "intruder"}
	_, _ = nc.Write(h.marshal())
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	var rep [replySize]byte
	if _, err := nc.Read(rep[:]); err != nil {
		t.Fatal(err)
	}
	r, err := parseReply(rep[:])
	if err != nil || r.status != statusDenied {
		t.Fatalf("wrong token: reply %+v, %v; want denied", r, err)
	}
}

func TestCloseTwice(t *testing.T) {
	tr, err := New(Config{Dir: t.TempDir(), Node: "n"}, &fakeInbound{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok := tr.Endpoint().TokenPath
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tok); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("token file left behind: %v", err)
	}
}

func BenchmarkWrite10K128(b *testing.B) {
	p := newPair(b, 2*10000*128)
	bt := gapped(10000, 128)
	dst := transport.RemoteRegion{Name: "d", Size: 2 * 10000 * 128, Key: p.dst.Key()}
	ctx := context.Background()
	if _, err := transport.Write(ctx, p.conn, p.src, dst, bt); err != nil {
		b.Fatal(err)
	}
	req := transport.Request{Op: transport.OpWrite, Local: p.src, Remote: dst, Batch: bt} // kept, as the batch layer keeps its own
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := p.conn.Post(ctx, &req); err != nil {
			b.Fatal(err)
		}
	}
}

func TestHostCopyHonoursDeadline(t *testing.T) {
	p := newPair(t, 64<<20)
	b := &desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{64 << 20}}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// The pin and the begin reply come first; a context already done is
	// refused before any byte moves.
	_, err := transport.Write(ctx, p.conn, p.src, transport.RemoteRegion{Name: "d", Size: 64 << 20, Key: p.dst.Key()}, b)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("write under a cancelled context: %v", err)
	}
	// copyHost itself stops after its first chunk.
	dst, src := make([]byte, 64<<20), make([]byte, 64<<20)
	fill(src, 1)
	if err := copyHost(ctx, dst, src, b, 0, b.N()); !errors.Is(err, context.Canceled) {
		t.Fatalf("copyHost: %v", err)
	}
	if dst[hostChunk-1] != src[hostChunk-1] || dst[hostChunk] == src[hostChunk] && src[hostChunk] != 0 {
		t.Fatalf("copyHost copied other than exactly the first chunk")
	}
	if _, _, _, pins := p.in.snap(); pins != 0 {
		t.Fatalf("%d pins held", pins)
	}
}

func TestReclaimStale(t *testing.T) {
	dir := t.TempDir()
	// A dead daemon's files: a socket bound but never listened on refuses.
	dead := filepath.Join(dir, filePrefix+"dead.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: dead}); err != nil {
		t.Fatal(err)
	}
	_ = unix.Close(fd)
	if err := os.WriteFile(filepath.Join(dir, filePrefix+"dead.token"), make([]byte, TokenSize), 0o600); err != nil {
		t.Fatal(err)
	}
	live, err := New(Config{Dir: dir, Node: "live"}, &fakeInbound{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	if _, err := os.Stat(dead); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("dead socket left: %v", err)
	}
	// A second daemon in the same dir leaves the live one's files alone.
	other, err := New(Config{Dir: dir, Node: "other"}, &fakeInbound{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for _, p := range []string{live.Endpoint().Socket, live.Endpoint().TokenPath} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("live daemon's file removed: %v", err)
		}
	}
}

// TestGPUShares: a GPU batch is spread over the streams only when each
// share has MinSplit bytes and its blocks average MinSplitBlock or more.
func TestGPUShares(t *testing.T) {
	for _, tc := range []struct {
		n       int
		total   uint64
		streams int
		want    int
	}{
		{10_000, 10_000 * 128, 4, 1},             // 1.3 MB: not even two shares
		{10_000, 10_000 * 4096, 4, 1},            // 41 MB of 4 KiB blocks: one stream is faster
		{10_000, 10_000 * 65536, 4, 4},           // 64 KiB blocks: spread
		{10_000, 10_000 * (2 << 20), 4, 4},       // 2 MiB blocks
		{3, 3 * (2 << 20), 4, 3},                 // fewer blocks than streams
		{4, 4 * (64 << 10), 4, 1},                // 256 KiB in all: under two MinSplit shares
		{40, 40 * (64 << 10), 4, 2},              // 2.5 MiB: two shares of MinSplit
		{10_000, 10_000 * 65536, 1, 1},           // one stream configured
		{0, 0, 4, 1},                             // empty
		{1, 1 << 30, 8, 1},                       // one block
		{16, 16*(64<<10) + 16*(1<<20) - 1, 4, 4}, // a mixed batch averaging over 64 KiB
	} {
		if got := gpuShares(tc.n, tc.total, tc.streams); got != tc.want {
			t.Errorf("gpuShares(%d blocks, %d bytes, %d streams) = %d, want %d", tc.n, tc.total, tc.streams, got, tc.want)
		}
	}
}
