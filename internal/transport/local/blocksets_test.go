package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/gpudirect/cudatest"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/layout"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/staging"
	"github.com/b2bd/b2bd/internal/transport"
)

// readableInbound is fakeInbound that also pins by read key (pulls).
type readableInbound struct{ fakeInbound }

func (f *readableInbound) PinRead(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.regs {
		if rk, err := r.KeyFor(transport.AccessRead); err == nil && rk.Key == key {
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
	return memory.Memory{}, nil, fmt.Errorf("%w: no live %s registration has read key %#x", errs.ErrNotFound, k, key)
}

func (f *readableInbound) export(r transport.Registration, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.exported[r] = on
}

// multiPair is nreg regions on the sender ("ours") and nreg on the
// receiver ("theirs"), one segment each (the KV bench's shape: one layer
// tensor per region), a block write from ours to theirs and a block read
// from theirs into ours, both over the same ids.
type multiPair struct {
	send, recv *Transport
	in         *readableInbound
	conn       transport.Conn
	ours       []transport.Registration
	theirs     []transport.Registration
	w          transport.Blocks
	rd         transport.Blocks
	sids, dids []uint32
	blk        int
}

func newMultiPair(t testing.TB, nreg, pool, blk, nids int) *multiPair {
	t.Helper()
	dir := t.TempDir()
	m := &multiPair{in: &readableInbound{}, blk: blk}
	var err error
	if m.recv, err = New(Config{Dir: filepath.Join(dir, "recv"), Node: "recv"}, m.in, nil); err != nil {
		t.Fatal(err)
	}
	if m.send, err = New(Config{Dir: filepath.Join(dir, "send"), Node: "send"}, &fakeInbound{}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.send.Close(); _ = m.recv.Close() })
	size := uint64(pool * blk)
	var segs []layout.Segment
	for r := 0; r < nreg; r++ {
		segs = append(segs, layout.Segment{Region: fmt.Sprintf("r%d", r), BlockLen: uint64(blk), Stride: uint64(blk), NumBlocks: uint64(pool)})
		o, err := m.send.Register(shmRegion(t, dir, int(size)))
		if err != nil {
			t.Fatal(err)
		}
		th, err := m.recv.Register(shmRegion(t, dir, int(size)))
		if err != nil {
			t.Fatal(err)
		}
		m.in.add(th)
		fill(o.Memory().Host, byte(r))
		fill(th.Memory().Host, ^byte(r))
		m.ours, m.theirs = append(m.ours, o), append(m.theirs, th)
		rk, err := th.KeyFor(transport.AccessRead)
		if err != nil {
			t.Fatal(err)
		}
		m.w.Local = append(m.w.Local, o)
		m.w.Remote = append(m.w.Remote, transport.RemoteRegion{Name: fmt.Sprintf("d%d", r), Size: size, Key: th.Key()})
		m.rd.Remote = append(m.rd.Remote, transport.RemoteRegion{Name: fmt.Sprintf("s%d", r), Size: size, Key: rk})
		m.rd.Local = append(m.rd.Local, o)
	}
	l, err := layout.New("l", segs, func(string) (uint64, error) { return size, nil }, layout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	pr, err := layout.NewPair(l, l, layout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, uint64(nreg)))
	dp := rng.Perm(pool)
	for i, x := range rng.Perm(pool)[:nids] {
		m.sids, m.dids = append(m.sids, uint32(x)), append(m.dids, uint32(dp[i]))
	}
	var pl layout.Planner
	ids, err := pl.Validate(pr, layout.Request{SrcIDs: layout.PackIDs(m.sids), DstIDs: layout.PackIDs(m.dids)})
	if err != nil {
		t.Fatal(err)
	}
	m.w.Pair, m.w.IDs, m.rd.Pair, m.rd.IDs = pr, ids, pr, ids
	peer := transport.Peer{Address: "local", Node: "recv", Advert: MarshalEndpoint(m.recv.Endpoint())}
	if m.conn, err = m.send.Connect(context.Background(), peer); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.conn.Close() })
	return m
}

// check compares every requested block: from[r] block sids[i] against
// to[r] block dids[i].
func (m *multiPair) check(t *testing.T, from, to []transport.Registration) {
	t.Helper()
	for r := range from {
		f, d := from[r].Memory().Host, to[r].Memory().Host
		for i := range m.sids {
			s, o := int(m.sids[i])*m.blk, int(m.dids[i])*m.blk
			if !bytes.Equal(d[o:o+m.blk], f[s:s+m.blk]) {
				t.Fatalf("region %d entry %d (block %d -> %d) did not land", r, i, m.sids[i], m.dids[i])
			}
		}
	}
}

// exchanges is what the receiving server answered since the last call.
func (m *multiPair) exchanges(last *[opBeginSet + 1]uint64) (d [opBeginSet + 1]uint64) {
	for op := range last {
		n := m.recv.served[op].Load()
		d[op], last[op] = n-last[op], n
	}
	return d
}

// TestBlockSetOneExchange: a block request over 160 regions (write and
// read) is one begin and one end on the wire, the receiver counts a
// write landed once, and every block lands; over more regions than a set
// holds, one exchange per maxSetKeys. Warm, a write allocates nothing.
func TestBlockSetOneExchange(t *testing.T) {
	for _, tc := range []struct {
		nreg int
		read bool
	}{{160, false}, {160, true}, {300, false}, {300, true}, {maxCached + 40, false}} {
		t.Run(fmt.Sprintf("%d regions read=%v", tc.nreg, tc.read), func(t *testing.T) {
			m := newMultiPair(t, tc.nreg, 16, 64, 8)
			sets := uint64((tc.nreg + maxSetKeys - 1) / maxSetKeys)
			var last [opBeginSet + 1]uint64
			m.exchanges(&last)
			var sc transport.BlockScratch
			ctx := context.Background()
			for round := 0; round < 2; round++ { // cold (maps), then warm
				b0, _, _, _ := m.in.snap()
				var err error
				if tc.read {
					_, err = transport.PostBlocks(ctx, m.conn, transport.OpRead, &m.rd, &sc)
				} else {
					_, err = transport.PostBlocks(ctx, m.conn, transport.OpWrite, &m.w, &sc)
				}
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				batches, _, _, pinned := m.in.snap()
				wantLanded := sets
				if tc.read {
					wantLanded = 0
				}
				if got := batches - b0; got != wantLanded {
					t.Fatalf("round %d: the receiver counted %d landings, want %d (one per set)", round, got, wantLanded)
				}
				if d := m.exchanges(&last); d[opBeginSet] != sets || d[opEnd] != sets || d[opBegin] != 0 || d[opAbort] != 0 {
					t.Fatalf("round %d: the receiver served %v (by op), want %d begins of a set and %d ends, nothing else", round, d, sets, sets)
				}
				if pinned != 0 {
					t.Fatalf("round %d: %d pins held after the request", round, pinned)
				}
			}
			if tc.read {
				m.check(t, m.theirs, m.ours)
			} else {
				m.check(t, m.ours, m.theirs)
			}
			if n := len(m.conn.(*Conn).cache); n > maxCached {
				t.Fatalf("%d mappings cached, over the bound of %d", n, maxCached)
			}
			if tc.nreg > maxCached || tc.read {
				return
			}
			bw := m.conn
			post := transport.Request{Op: transport.OpWrite, Blocks: &m.w, Scratch: &sc} // kept, as the batch layer keeps its own
			if a := testing.AllocsPerRun(10, func() {
				if _, err := bw.Post(ctx, &post); err != nil {
					t.Fatal(err)
				}
			}); a != 0 {
				t.Fatalf("%v allocations per warm 160-region block write", a)
			}
		})
	}
}

// TestBlockSetRefusal: a region of the set that the receiver refuses
// fails the request before any byte moves, names that region and its
// stretch, drops this side's mapping of it, and leaves no pin; once
// exported again the same request goes through.
func TestBlockSetRefusal(t *testing.T) {
	for _, read := range []bool{false, true} {
		t.Run(fmt.Sprintf("read=%v", read), func(t *testing.T) {
			const nreg, bad = 160, 77
			m := newMultiPair(t, nreg, 16, 64, 8)
			var sc transport.BlockScratch
			ctx := context.Background()
			do := func() error {
				if read {
					_, err := transport.PostBlocks(ctx, m.conn, transport.OpRead, &m.rd, &sc)
					return err
				}
				_, err := transport.PostBlocks(ctx, m.conn, transport.OpWrite, &m.w, &sc)
				return err
			}
			if err := do(); err != nil { // maps every region
				t.Fatal(err)
			}
			landing, name := m.theirs, fmt.Sprintf("%q", m.w.Remote[bad].Name)
			key := m.w.Remote[bad].Key.Key
			if read {
				landing, name, key = m.ours, fmt.Sprintf("%q", m.rd.Remote[bad].Name), m.rd.Remote[bad].Key.Key
			}
			for _, r := range landing {
				for i, h := 0, r.Memory().Host; i < len(h); i++ {
					h[i] = 0xee
				}
			}
			m.in.export(m.theirs[bad], false)
			b0, _, _, _ := m.in.snap()
			err := do()
			var se *transport.StretchError
			if !errors.As(err, &se) || se.DstRegion != bad || se.SrcRegion != bad {
				t.Fatalf("err = %v: want a StretchError naming region %d", err, bad)
			}
			if !errors.Is(err, errs.ErrNotFound) || !strings.Contains(err.Error(), name) {
				t.Fatalf("err = %v: want NotFound naming %s", err, name)
			}
			batches, _, _, pinned := m.in.snap()
			if pinned != 0 || batches != b0 {
				t.Fatalf("after the refusal: %d pins held, %d landings counted", pinned, batches-b0)
			}
			for ri, r := range landing {
				for i, b := range r.Memory().Host {
					if b != 0xee {
						t.Fatalf("region %d byte %d changed by a refused request", ri, i)
					}
				}
			}
			c := m.conn.(*Conn)
			c.lock()
			_, cached := c.cache[key]
			c.unlock()
			if cached {
				t.Fatal("the refused region's mapping is still cached")
			}
			m.in.export(m.theirs[bad], true)
			if err := do(); err != nil {
				t.Fatalf("after exporting again: %v", err)
			}
			if read {
				m.check(t, m.theirs, m.ours)
			} else {
				m.check(t, m.ours, m.theirs)
			}
		})
	}
}

// TestBlockSetGPU: one set over host and GPU destinations (a descriptor
// and an IPC handle in the same reply) lands every block; the handles are
// opened once per connection, not per request.
func TestBlockSetGPU(t *testing.T) {
	const nreg, pool, blk = 6, 16, 256
	size := uint64(pool * blk)
	cu := cudatest.New(cudatest.Device{})
	dir := t.TempDir()
	in := &fakeInbound{}
	recv, err := New(Config{Dir: filepath.Join(dir, "recv"), Node: "recv", CUDA: cu}, in, nil)
	if err != nil {
		t.Fatal(err)
	}
	send, err := New(Config{Dir: filepath.Join(dir, "send"), Node: "send", CUDA: cu}, &fakeInbound{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	defer send.Close()
	var w transport.Blocks
	var segs []layout.Segment
	var dsts [][]byte
	var srcs [][]byte
	for r := 0; r < nreg; r++ {
		segs = append(segs, layout.Segment{Region: fmt.Sprintf("r%d", r), BlockLen: blk, Stride: blk, NumBlocks: pool})
		src, err := send.Register(shmRegion(t, dir, int(size)))
		if err != nil {
			t.Fatal(err)
		}
		fill(src.Memory().Host, byte(r))
		var dm memory.Memory
		if r%2 == 0 {
			dm = shmRegion(t, dir, int(size))
		} else {
			p, err := cu.MemAlloc(0, size)
			if err != nil {
				t.Fatal(err)
			}
			dm = memory.Memory{Kind: memory.CUDA, Addr: p, Len: size, DmabufFD: -1}
		}
		dst, err := recv.Register(dm)
		if err != nil {
			t.Fatal(err)
		}
		in.add(dst)
		db := dm.Host
		if dm.Kind == memory.CUDA {
			if db, err = cu.DeviceBytes(dm.Addr, size); err != nil {
				t.Fatal(err)
			}
		}
		w.Local = append(w.Local, src)
		w.Remote = append(w.Remote, transport.RemoteRegion{Name: fmt.Sprintf("d%d", r), Size: size, Key: dst.Key()})
		srcs, dsts = append(srcs, src.Memory().Host), append(dsts, db)
	}
	l, err := layout.New("l", segs, func(string) (uint64, error) { return size, nil }, layout.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if w.Pair, err = layout.NewPair(l, l, layout.Limits{}); err != nil {
		t.Fatal(err)
	}
	sids, dids := []uint32{1, 2, 3, 9, 15}, []uint32{0, 7, 8, 4, 2}
	var pl layout.Planner
	if w.IDs, err = pl.Validate(w.Pair, layout.Request{SrcIDs: layout.PackIDs(sids), DstIDs: layout.PackIDs(dids)}); err != nil {
		t.Fatal(err)
	}
	conn, err := send.Connect(context.Background(), transport.Peer{Address: "local", Node: "recv", Advert: MarshalEndpoint(recv.Endpoint())})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var sc transport.BlockScratch
	for round := 0; round < 2; round++ {
		if _, err := transport.PostBlocks(context.Background(), conn, transport.OpWrite, &w, &sc); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
	for r := range dsts {
		for i := range sids {
			s, d := int(sids[i])*blk, int(dids[i])*blk
			if !bytes.Equal(dsts[r][d:d+blk], srcs[r][s:s+blk]) {
				t.Fatalf("region %d (GPU %v) entry %d did not land", r, r%2 == 1, i)
			}
		}
	}
	if n := cu.Calls("IPCOpenMemHandle"); n != nreg/2 {
		t.Fatalf("%d IPC handles opened over two requests, want %d (one per GPU region)", n, nreg/2)
	}
	if b, _, _, p := in.snap(); b != 2 || p != 0 {
		t.Fatalf("%d landings counted, %d pins held; want 2 and 0", b, p)
	}
}

// TestUnknownOpRefused: a request with an op this daemon does not know
// (a newer sender's) gets a refusal that names the op, then the
// connection ends.
func TestUnknownOpRefused(t *testing.T) {
	p := newPair(t, 4096)
	c := p.conn.(*Conn)
	c.lock()
	defer c.unlock()
	if err := c.send(opBeginSet+5, 0, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	r, msg, _, err := c.readReply(false)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != statusInvalid || !strings.Contains(string(msg), "op 9") {
		t.Fatalf("reply %+v %q: want invalid, naming op 9", r, msg)
	}
	if _, _, _, err := c.readReply(false); err == nil {
		t.Fatal("the connection went on after an unknown op")
	}
}

// BenchmarkWriteBlocks160: a block request over 160 regions per side
// with 4 ids of 64 B: nearly all of its time is per region, not copying.
func BenchmarkWriteBlocks160(b *testing.B) {
	m := newMultiPair(b, 160, 64, 64, 4)
	bw := m.conn
	var sc transport.BlockScratch
	ctx := context.Background()
	if _, err := transport.PostBlocks(ctx, bw, transport.OpWrite, &m.w, &sc); err != nil {
		b.Fatal(err)
	}
	req := transport.Request{Op: transport.OpWrite, Blocks: &m.w, Scratch: &sc} // kept, as the batch layer keeps its own
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := bw.Post(ctx, &req); err != nil {
			b.Fatal(err)
		}
	}
}

// TestGPUDestinationWithoutDriver: a GPU destination offered to a sender
// with no CUDA driver is refused (FailedPrecondition) and the connection
// stays in step: the IPC handle that followed the reply is read, not
// taken for the next reply, so the next batch to a host region goes.
func TestGPUDestinationWithoutDriver(t *testing.T) {
	cu := cudatest.New(cudatest.Device{})
	dir := t.TempDir()
	in := &fakeInbound{}
	recv, err := New(Config{Dir: filepath.Join(dir, "recv"), Node: "recv", CUDA: cu}, in, nil)
	if err != nil {
		t.Fatal(err)
	}
	send, err := New(Config{Dir: filepath.Join(dir, "send"), Node: "send"}, &fakeInbound{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	defer send.Close()
	const size = 1 << 16
	p, err := cu.MemAlloc(0, size)
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := recv.Register(memory.Memory{Kind: memory.CUDA, Addr: p, Len: size, DmabufFD: -1})
	if err != nil {
		t.Fatal(err)
	}
	host, err := recv.Register(shmRegion(t, dir, size))
	if err != nil {
		t.Fatal(err)
	}
	in.add(gpu)
	in.add(host)
	src, err := send.Register(shmRegion(t, dir, size))
	if err != nil {
		t.Fatal(err)
	}
	fill(src.Memory().Host, 3)
	conn, err := send.Connect(context.Background(), transport.Peer{Address: "local", Node: "recv", Advert: MarshalEndpoint(recv.Endpoint())})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	b := gapped(8, 1024)
	ctx := context.Background()
	for round := 0; round < 2; round++ {
		_, err = transport.Write(ctx, conn, src, transport.RemoteRegion{Name: "g", Size: size, Key: gpu.Key()}, b)
		if !errors.Is(err, errs.ErrFailedPrecondition) {
			t.Fatalf("round %d: write to a GPU region without a driver: %v, want FailedPrecondition", round, err)
		}
		if err := conn.Err(); err != nil {
			t.Fatalf("round %d: the connection broke: %v", round, err)
		}
		if _, err := transport.Write(ctx, conn, src, transport.RemoteRegion{Name: "h", Size: size, Key: host.Key()}, b); err != nil {
			t.Fatalf("round %d: the next write: %v", round, err)
		}
	}
	if _, _, _, pinned := in.snap(); pinned != 0 {
		t.Fatalf("%d pins held", pinned)
	}
}

// TestBlockSetWritesAndReadsStayMapped: pushes and pulls over the same 160
// regions alternate (the KV bench's --op both) without evicting and
// remapping: a region's write key and read key are two mappings, and both
// sets fit the cache.
func TestBlockSetWritesAndReadsStayMapped(t *testing.T) {
	m := newMultiPair(t, 160, 16, 64, 8)
	var sc transport.BlockScratch
	ctx := context.Background()
	round := func() {
		t.Helper()
		if _, err := transport.PostBlocks(ctx, m.conn, transport.OpWrite, &m.w, &sc); err != nil {
			t.Fatal(err)
		}
		if _, err := transport.PostBlocks(ctx, m.conn, transport.OpRead, &m.rd, &sc); err != nil {
			t.Fatal(err)
		}
	}
	round() // maps every region twice: for writes and for reads
	unmaps := 0
	defer func(f func([]byte) error) { munmap = f }(munmap)
	munmap = func(b []byte) error { unmaps++; return unix.Munmap(b) }
	for i := 0; i < 3; i++ {
		round()
	}
	if unmaps != 0 {
		t.Fatalf("%d mappings evicted and made again while writes and reads alternated over 160 regions", unmaps)
	}
}

// TestGPUDestinationOfItself: a daemon's batch from one of its regions
// into its own GPU region (two clients of one daemon, or its calibration)
// lands without opening the region's IPC handle, which CUDA refuses in
// the process that made it (CUDA_ERROR_INVALID_CONTEXT); host to GPU and
// GPU to GPU.
func TestGPUDestinationOfItself(t *testing.T) {
	cu := cudatest.New(cudatest.Device{})
	dir := t.TempDir()
	in := &fakeInbound{}
	self, err := New(Config{Dir: filepath.Join(dir, "self"), Node: "self", CUDA: cu}, in, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	const size = 1 << 16
	gpuRegion := func() (transport.Registration, []byte) {
		p, err := cu.MemAlloc(0, size)
		if err != nil {
			t.Fatal(err)
		}
		r, err := self.Register(memory.Memory{Kind: memory.CUDA, Addr: p, Len: size, DmabufFD: -1})
		if err != nil {
			t.Fatal(err)
		}
		in.add(r)
		b, err := cu.DeviceBytes(p, size)
		if err != nil {
			t.Fatal(err)
		}
		return r, b
	}
	host, err := self.Register(shmRegion(t, dir, size))
	if err != nil {
		t.Fatal(err)
	}
	in.add(host)
	gpuA, a := gpuRegion()
	gpuB, b := gpuRegion()
	conn, err := self.Connect(context.Background(), transport.Peer{Address: "self", Node: "self", Advert: MarshalEndpoint(self.Endpoint())})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	bt := gapped(64, 256)
	ctx := context.Background()
	fill(host.Memory().Host, 5)
	if _, err := transport.Write(ctx, conn, host, transport.RemoteRegion{Name: "a", Size: size, Key: gpuA.Key()}, bt); err != nil {
		t.Fatalf("host to its own GPU region: %v", err)
	}
	for i := range bt.Len {
		s, d := bt.Src[i], bt.Dst[i]
		if !bytes.Equal(a[d:d+bt.Len[i]], host.Memory().Host[s:s+bt.Len[i]]) {
			t.Fatalf("host to its own GPU region: block %d did not land", i)
		}
	}
	if _, err := transport.Write(ctx, conn, gpuA, transport.RemoteRegion{Name: "b", Size: size, Key: gpuB.Key()}, bt); err != nil {
		t.Fatalf("GPU to its own GPU region: %v", err)
	}
	for i := range bt.Len {
		d := bt.Dst[i]
		// gpuA got host's block Src[i] at Dst[i]; gpuB got gpuA's Src[i].
		if !bytes.Equal(b[d:d+bt.Len[i]], a[bt.Src[i]:bt.Src[i]+bt.Len[i]]) {
			t.Fatalf("GPU to its own GPU region: block %d did not land", i)
		}
	}
	if n := cu.Calls("IPCOpenMemHandle"); n != 0 {
		t.Fatalf("%d IPC handles opened; a daemon's own regions need none", n)
	}
}

// TestGPUToItsOwnRegionOnAnotherGPU: a daemon's batch between its regions
// on two GPUs (its calibration of GPU0 -> GPU1, or one daemon serving two
// TP ranks) runs as direct peer copies on the source's GPU, writes and
// reads, once the source's context reaches the other GPU; where the
// devices cannot, it is refused FailedPrecondition naming peer access,
// and no byte moves.
func TestGPUToItsOwnRegionOnAnotherGPU(t *testing.T) {
	for _, tc := range []struct {
		name string
		peer bool
		// app: the regions are an application's allocations, imported by
		// their IPC handles, which the daemon opens again in the source
		// GPU's context; else the daemon's own, reached by peer access
		// (CUDA refuses a process's own handles).
		app bool
	}{{"peer access", true, false}, {"no peer access", false, false}, {"app regions", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			cu := cudatest.New(cudatest.Device{}, cudatest.Device{})
			caps := cu.Capabilities()
			caps.PeerAccess = tc.peer
			cu.SetCapabilities(caps)
			cu.RefuseOwnHandles(true)
			dir := t.TempDir()
			in := &readableInbound{}
			self, err := New(Config{Dir: filepath.Join(dir, "self"), Node: "self", CUDA: cu}, in, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer self.Close()
			const size = 1 << 16
			region := func(dev int) (transport.Registration, []byte) {
				p, err := cu.MemAlloc(dev, size)
				if err != nil {
					t.Fatal(err)
				}
				m := memory.Memory{Kind: memory.CUDA, Device: dev, Addr: p, Len: size, DmabufFD: -1}
				if tc.app {
					h, err := cu.IPCGetMemHandle(dev, p)
					if err != nil {
						t.Fatal(err)
					}
					cu.Foreign(h)
					var release func() error
					if m, release, err = (staging.Regions{CUDA: cu}).Import(dev, h[:], 0, size); err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = release() })
				}
				r, err := self.Register(m)
				if err != nil {
					t.Fatal(err)
				}
				in.add(r)
				b, err := cu.DeviceBytes(p, size)
				if err != nil {
					t.Fatal(err)
				}
				return r, b
			}
			gpu0, a := region(0)
			gpu1, b := region(1)
			fill(a, 7)
			fill(b, 9)
			conn, err := self.Connect(context.Background(), transport.Peer{Address: "self", Node: "self", Advert: MarshalEndpoint(self.Endpoint())})
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			bt := gapped(64, 256)
			ctx := context.Background()
			before := append([]byte(nil), b...)
			_, err = transport.Write(ctx, conn, gpu0, transport.RemoteRegion{Name: "b", Size: size, Key: gpu1.Key()}, bt)
			if !tc.peer {
				if !errors.Is(err, errs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "peer access") {
					t.Fatalf("GPU0 into its own region on GPU1 without peer access: %v, want FailedPrecondition naming peer access", err)
				}
				if !bytes.Equal(b, before) {
					t.Fatal("a refused batch changed the destination")
				}
				return
			}
			if err != nil {
				t.Fatalf("GPU0 into its own region on GPU1: %v", err)
			}
			for i := range bt.Len {
				s, d := bt.Src[i], bt.Dst[i]
				if !bytes.Equal(b[d:d+bt.Len[i]], a[s:s+bt.Len[i]]) {
					t.Fatalf("GPU0 into its own region on GPU1: block %d did not land", i)
				}
			}
			fill(b, 11)
			rk, err := gpu1.KeyFor(transport.AccessRead)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := transport.Read(ctx, conn, gpu0, transport.RemoteRegion{Name: "b", Size: size, Key: rk}, bt); err != nil {
				t.Fatalf("GPU0 reads its own region on GPU1: %v", err)
			}
			for i := range bt.Len {
				s, d := bt.Src[i], bt.Dst[i]
				// A read's source is the remote region: Src there, Dst here.
				if !bytes.Equal(a[d:d+bt.Len[i]], b[s:s+bt.Len[i]]) {
					t.Fatalf("GPU0 reads its own region on GPU1: block %d did not land", i)
				}
			}
			if k := cu.Copies(); k.CrossDevice == 0 || k.SameDevice != 0 {
				t.Fatalf("copies %+v: want direct peer copies only", k)
			}
			opens, peers := cu.Calls("IPCOpenMemHandle"), cu.Calls("EnablePeerAccess")
			switch {
			case tc.app && (opens < 3 || peers != 0):
				// Two imports, then each one opened again for the other GPU.
				t.Fatalf("%d IPC opens, %d EnablePeerAccess: want the application's handles opened again in the source's context, no peer access", opens, peers)
			case !tc.app && peers == 0:
				t.Fatal("no EnablePeerAccess before the peer copies")
			}
		})
	}
}
