package verbs

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
	ibv "github.com/b2bd/b2bd/verbs"
)

// readPair is a pair whose A pulls from B: B's region (p.dm) is the
// source, resolved with B's read key, and A's (p.sm) the destination.
func readPair(t *testing.T, size int) (*pair, transport.Conn, transport.RemoteRegion) {
	t.Helper()
	p := newPair(t, testConfig(hwDevice(t)), size)
	rd := p.conn
	key, err := p.dst.KeyFor(transport.AccessRead)
	if err != nil {
		t.Fatal(err)
	}
	if key == p.dst.Key() {
		t.Fatalf("the read key %+v is the write key", key)
	}
	return p, rd, transport.RemoteRegion{Name: "src", Size: p.dm.Len, Key: key}
}

// verifyRead checks every block of b against the remote source (p.dm) and
// that nothing outside the blocks changed in the local destination (p.sm,
// zero before).
func verifyRead(t *testing.T, p *pair, b *desc.Batch) {
	t.Helper()
	src, dst := p.dm.Host, p.sm.Host
	covered := make([]bool, len(dst))
	for i := range b.Src {
		s, d, l := b.Src[i], b.Dst[i], b.Len[i]
		if xxhash.Sum64(src[s:s+l]) != xxhash.Sum64(dst[d:d+l]) {
			t.Fatalf("block %d (remote %d, local %d, len %d): checksum mismatch", i, s, d, l)
		}
		for x := d; x < d+l; x++ {
			covered[x] = true
		}
	}
	for x := range dst {
		if !covered[x] && dst[x] != 0 {
			t.Fatalf("local byte %d outside every block was written", x)
		}
	}
}

// Read lands every block, verified by checksum, at several sizes and
// layouts: scattered (one READ per block), adjacent (merged) and a
// contiguous remote range read into scattered local blocks (one READ
// scattering into several SGEs).
func TestHWRead(t *testing.T) {
	const size = 40 << 20
	p, rd, remote := readPair(t, size)
	r := rand.New(rand.NewSource(24))
	r.Read(p.dm.Host)
	cases := []struct {
		n     int
		sizes []uint64
		mode  string
	}{
		{2000, []uint64{128}, "random"},
		{2000, []uint64{4096}, "random"},
		{200, []uint64{65536}, "random"},
		{8, []uint64{2 << 20}, "random"},
		{3000, []uint64{512, 4096, 100, 8192}, "adjacent"},
		{2000, []uint64{4096}, "gather"},
		{300, []uint64{1000, 65536, 7}, "gather"},
	}
	for _, c := range cases {
		clear(p.sm.Host)
		// layout's "gather" has contiguous destinations; for a READ the
		// remote side is b.Src, so swap to get contiguous remote ranges
		// read into scattered local blocks.
		b := layout(r, c.n, c.sizes, c.mode, size)
		if c.mode == "gather" {
			b.Src, b.Dst = b.Dst, b.Src
		}
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		st, err := transport.Read(ctx, rd, p.src, remote, b)
		cancel()
		if err != nil {
			t.Fatalf("%d x %v %s: %v", c.n, c.sizes, c.mode, err)
		}
		verifyRead(t, p, b)
		t.Logf("%d x %v %s: %d WRs, %d SGEs", c.n, c.sizes, c.mode, st.WorkRequests, st.Segments)
		if c.mode == "gather" && st.Segments <= st.WorkRequests {
			t.Fatalf("%s: %d SGEs in %d WRs: no READ scattered into several SGEs", c.mode, st.Segments, st.WorkRequests)
		}
	}
	if p.conn.Err() != nil {
		t.Fatal(p.conn.Err())
	}
	// The READs needed nothing of B's daemon: no batch was accounted there.
	if n := p.in.batches.Load(); n != 0 {
		t.Fatalf("the source side accounted %d batches for READs", n)
	}
}

// A read-only key READs, and cannot WRITE: a WRITE posted by hand with it
// (no meta, straight onto a QP) fails at the remote NIC with a remote
// access error, and no byte of the region changes. The write key cannot
// READ either.
func TestHWReadOnlyKeyRefusesWrite(t *testing.T) {
	const size = 4 << 20
	p, rd, remote := readPair(t, size)
	rand.New(rand.NewSource(7)).Read(p.dm.Host)
	b := layout(rand.New(rand.NewSource(8)), 64, []uint64{4096}, "random", size)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := transport.Read(ctx, rd, p.src, remote, b); err != nil {
		t.Fatalf("READ with the read-only key: %v", err)
	}
	verifyRead(t, p, b)

	// The hand-made WRITE: one chain of WRITEs with the read-only rkey on
	// the set's first QP, from A's region into B's.
	before := bytes.Clone(p.dm.Host)
	rand.New(rand.NewSource(9)).Read(p.sm.Host)
	s := p.conn.(*qpSet)
	reg := p.src.(*registration)
	q := s.qps[0]
	ch, err := ibv.NewChain(16, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	ch.Setup(&ibv.ChainParams{Op: ibv.WRWrite, SrcBase: reg.cur.mr.Addr(), DstBase: remote.Key.Addr,
		SrcLimit: p.sm.Len, DstLimit: p.dm.Len, LKey: reg.cur.mr.LKey(), RKey: uint32(remote.Key.Key),
		MaxWR: 16, MaxSGE: 1, SignalEvery: 1})
	w := &desc.Batch{Src: []uint64{0, 8192}, Dst: []uint64{0, 65536}, Len: []uint64{4096, 4096}}
	ch.Start(ibv.Pos{}, ibv.Pos{I: 2}, false, 0)
	ch.SetSeq(q.posted)
	if _, err := s.acquireWrite(ctx, "hand-made write"); err != nil {
		t.Fatal(err)
	}
	res, err := q.qp.PostChain(ch, w.Src, w.Dst, w.Len)
	q.posted = res.Seq
	s.releaseWrite()
	if err != nil || res.WRs != 2 {
		t.Fatalf("posting the hand-made WRITEs: %d WRs, %v", res.WRs, err)
	}
	select {
	case <-s.broken:
	case <-time.After(60 * time.Second):
		t.Fatal("no completion for the WRITE with a read-only rkey within 60 s")
	}
	err = p.conn.Err()
	if !errors.Is(err, errs.ErrAborted) || !strings.Contains(err.Error(), "remote access error") {
		t.Fatalf("WRITE with the read-only rkey: got %v, want a remote access error (Aborted)", err)
	}
	t.Logf("WRITE with the read-only rkey failed at the NIC: %v", err)
	if !bytes.Equal(before, p.dm.Host) {
		t.Fatal("the WRITE with a read-only rkey changed the remote region")
	}

	// The write key grants no READ.
	p.conn.Close()
	p.connect(t)
	wr := transport.RemoteRegion{Name: "dst", Size: p.dm.Len, Key: p.dst.Key()}
	_, err = transport.Read(ctx, p.conn, p.src, wr, b)
	if !errors.Is(err, errs.ErrAborted) || !strings.Contains(err.Error(), "READ") {
		t.Fatalf("READ with the write-only key: got %v, want a remote access error for READ", err)
	}
	t.Logf("READ with the write key failed: %v", err)
}

// A READ cut off by its deadline posts nothing more before
// DeadlineExceeded is returned: the local region does not change in the
// 2 s after, and the next READ lands every block (see afterStop).
func TestHWReadDeadline(t *testing.T) {
	const size = 64 << 20
	p, rd, remote := readPair(t, size)
	r := rand.New(rand.NewSource(11))
	r.Read(p.dm.Host)
	b := layout(r, size/4096, []uint64{4096}, "random", size)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := transport.Read(ctx, rd, p.src, remote, b)
	el := time.Since(start)
	snap := bytes.Clone(p.sm.Host)
	if err == nil {
		t.Skipf("64 MiB read within the 150 ms deadline (%v): this device is too fast for the test", el)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	t.Logf("cut off after %v: %v", el, err)
	time.Sleep(2 * time.Second) // the window the contract promises: nothing lands in it
	changed, first := 0, -1
	for k := range snap {
		if snap[k] != p.sm.Host[k] {
			if first < 0 {
				first = k
			}
			changed++
		}
	}
	if changed > 0 {
		t.Fatalf("%d local bytes (first at offset %d) changed in the 2 s after DeadlineExceeded", changed, first)
	}
	afterStop(t, p, err)
	clear(p.sm.Host)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Second)
	defer cancel2()
	if _, err := transport.Read(ctx2, p.conn, p.src, remote, b); err != nil {
		t.Fatal(err)
	}
	verifyRead(t, p, b)
}

// KeyFor makes one MR per access set, lazily, counted in Resources; Rekey
// re-keys all of them; Close deregisters them all.
func TestHWKeyForRekey(t *testing.T) {
	p := newPair(t, testConfig(hwDevice(t)), 1<<20)
	ak := p.dst
	base := p.b.Resources().MemoryRegions
	w, err := ak.KeyFor(transport.AccessWrite)
	if err != nil || w != p.dst.Key() {
		t.Fatalf("KeyFor(write) = %+v, %v; want Key() %+v", w, err, p.dst.Key())
	}
	rk, err := ak.KeyFor(transport.AccessRead)
	if err != nil {
		t.Fatal(err)
	}
	rw, err := ak.KeyFor(transport.AccessRead | transport.AccessWrite)
	if err != nil {
		t.Fatal(err)
	}
	if rk.Key == w.Key || rw.Key == w.Key || rk.Key == rw.Key {
		t.Fatalf("keys not distinct: write %#x read %#x both %#x", w.Key, rk.Key, rw.Key)
	}
	if again, _ := ak.KeyFor(transport.AccessRead); again != rk {
		t.Fatalf("second KeyFor(read) = %+v, want %+v", again, rk)
	}
	if got := p.b.Resources().MemoryRegions; got != base+2 {
		t.Fatalf("%d MRs after two access MRs, want %d", got, base+2)
	}
	if _, err := ak.KeyFor(0); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("KeyFor(0): %v, want InvalidArgument", err)
	}
	if _, err := p.dst.Rekey(); err != nil {
		t.Fatal(err)
	}
	if got := p.b.Resources().MemoryRegions; got != base {
		t.Fatalf("%d MRs after Rekey, want %d (the access MRs retired)", got, base)
	}
	for _, a := range []transport.Access{transport.AccessWrite, transport.AccessRead, transport.AccessRead | transport.AccessWrite} {
		k, err := ak.KeyFor(a)
		if err != nil {
			t.Fatal(err)
		}
		if k.Key == w.Key || k.Key == rk.Key || k.Key == rw.Key {
			t.Fatalf("access %#x kept an old key %#x after Rekey", a, k.Key)
		}
	}
	if err := p.dst.Close(); err != nil {
		t.Fatal(err)
	}
	if got := p.b.Resources().MemoryRegions; got != base-1 {
		t.Fatalf("%d MRs after Close, want %d", got, base-1)
	}
}
