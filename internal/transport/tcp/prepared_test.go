package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/transport"
)

// scattered is n blocks of size bytes at random slots of slot bytes on both
// sides (no two adjacent when slot > size).
func scattered(r *rand.Rand, n int, size, slot uint64) desc.Batch {
	b := desc.Batch{Src: make([]uint64, n), Dst: make([]uint64, n), Len: make([]uint64, n)}
	ps, pd := r.Perm(n), r.Perm(n)
	for i := range n {
		b.Src[i], b.Dst[i], b.Len[i] = uint64(ps[i])*slot, uint64(pd[i])*slot, size
	}
	return b
}

func fill(r *rand.Rand, b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
}

func checkLanded(t testing.TB, p *pair, b *desc.Batch) {
	t.Helper()
	for i := range b.Src {
		s, d, n := b.Src[i], b.Dst[i], b.Len[i]
		if !bytes.Equal(p.srcMem.Host[s:s+n], p.dstMem.Host[d:d+n]) {
			t.Fatalf("block %d (src %d, dst %d, %d bytes) differs", i, s, d, n)
		}
	}
}

func prepare(t testing.TB, p *pair, dst transport.RemoteRegion, b *desc.Batch) transport.Prepared {
	t.Helper()
	pr, err := transport.Prepare(p.conn, p.src, dst, b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pr.Close() })
	return pr
}

// TestPreparedLandsEveryBlock: a prepared batch written several times, with
// new source bytes each time, lands every block each time; the receiver
// counts exactly the bytes of every write.
func TestPreparedLandsEveryBlock(t *testing.T) {
	for _, c := range []struct {
		blocks  int
		size    uint64
		streams int
	}{{1, 1, 1}, {10000, 128, 4}, {5000, 100, 1}, {300, 5000, 2}, {40, 1 << 20, 4}, {3, 3 << 20, 4}, {2000, 3000, 3}} {
		t.Run(fmt.Sprintf("%dx%d/%d", c.blocks, c.size, c.streams), func(t *testing.T) {
			slot := c.size + 32
			p := newPair(t, int(uint64(c.blocks)*slot), c.streams)
			r := rand.New(rand.NewPCG(uint64(c.blocks), c.size))
			b := scattered(r, c.blocks, c.size, slot)
			pr := prepare(t, p, p.dst, &b)
			// The plan does not keep b.
			b2 := desc.Batch{Src: append([]uint64(nil), b.Src...), Dst: append([]uint64(nil), b.Dst...), Len: append([]uint64(nil), b.Len...)}
			clear(b.Src)
			for round := 1; round <= 3; round++ {
				fill(r, p.srcMem.Host)
				st, err := pr.Write(context.Background())
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				checkLanded(t, p, &b2)
				if got, want := p.in.landed.Load(), uint64(round*c.blocks)*c.size; got != want {
					t.Fatalf("round %d: receiver reported %d bytes landed, want %d", round, got, want)
				}
				if st.Segments != uint64(c.blocks) || st.WorkRequests == 0 || st.Plan != 0 {
					t.Fatalf("round %d: stats %+v: want %d segments, some frames, no plan time", round, st, c.blocks)
				}
			}
		})
	}
}

// TestPreparedManySubmits: prepared writes of two plans and ad hoc writes,
// from several goroutines at once on one conn, all land.
func TestPreparedManySubmits(t *testing.T) {
	const n, size, slot = 2000, 256, 512
	p := newPair(t, n*slot*2, 4)
	r := rand.New(rand.NewPCG(7, 7))
	fill(r, p.srcMem.Host)
	// Two layouts into disjoint halves of the destination.
	b1, b2 := scattered(r, n, size, slot), scattered(r, n, size, slot)
	for i := range b2.Dst {
		b2.Dst[i] += n * slot
	}
	pr1, pr2 := prepare(t, p, p.dst, &b1), prepare(t, p, p.dst, &b2)
	const workers, each = 4, 25
	var wg sync.WaitGroup
	errc := make(chan error, workers*each)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range each {
				var err error
				switch (w + k) % 3 {
				case 0:
					_, err = pr1.Write(context.Background())
				case 1:
					_, err = pr2.Write(context.Background())
				default:
					_, err = transport.Write(context.Background(), p.conn, p.src, p.dst, &b1)
				}
				if err != nil {
					errc <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	checkLanded(t, p, &b1)
	checkLanded(t, p, &b2)
	if got, want := p.in.landed.Load(), uint64(workers*each*n*size); got != want {
		t.Fatalf("receiver reported %d bytes landed, want %d", got, want)
	}
}

// TestPreparedDeadline: a receiver that never acks makes a prepared Write
// fail with the deadline, promptly.
func TestPreparedDeadline(t *testing.T) {
	p := newPair(t, 4<<20, 2)
	b := desc.Batch{Src: []uint64{0, 2 << 20}, Dst: []uint64{2 << 20, 0}, Len: []uint64{1 << 20, 1 << 20}}
	pr := prepare(t, p, p.dst, &b)
	p.in.mu.Lock() // the receiver cannot pin, so it never places nor acks
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := pr.Write(ctx)
	p.in.mu.Unlock()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Write took %v past a 200ms deadline", d)
	}
	// The streams are out of step: the conn is failed and the plan with it.
	if p.conn.Err() == nil {
		t.Fatal("conn not failed after a cut-off batch")
	}
	if _, err := pr.Write(context.Background()); !errors.Is(err, errs.ErrUnavailable) || !strings.Contains(err.Error(), "prepare again") {
		t.Fatalf("write on a broken conn: err = %v, want Unavailable saying to prepare again", err)
	}
}

// TestPreparedClosed: a released plan refuses writes (Close twice is fine);
// a plan on a closed conn fails, also when the conn closes under a Write.
func TestPreparedClosed(t *testing.T) {
	b := desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{4096}}
	t.Run("released", func(t *testing.T) {
		p := newPair(t, 1<<20, 1)
		pr := prepare(t, p, p.dst, &b)
		if _, err := pr.Write(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := pr.Close(); err != nil {
			t.Fatal(err)
		}
		if err := pr.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if _, err := pr.Write(context.Background()); !errors.Is(err, errs.ErrFailedPrecondition) {
			t.Fatalf("err = %v, want FailedPrecondition", err)
		}
	})
	t.Run("conn closed", func(t *testing.T) {
		p := newPair(t, 1<<20, 1)
		pr := prepare(t, p, p.dst, &b)
		p.conn.Close()
		p.conn.Close()
		if _, err := pr.Write(context.Background()); err == nil {
			t.Fatal("write on a closed conn succeeded")
		}
		if _, err := transport.Prepare(p.conn, p.src, p.dst, &b); err == nil {
			// A closed conn that was never failed still has Err nil; the
			// write above failed it.
			t.Fatal("prepare on a failed conn succeeded")
		}
	})
	t.Run("conn closed during write", func(t *testing.T) {
		p := newPair(t, 8<<20, 2)
		big := desc.Batch{Src: []uint64{0, 4 << 20}, Dst: []uint64{4 << 20, 0}, Len: []uint64{4 << 20, 4 << 20}}
		pr := prepare(t, p, p.dst, &big)
		p.in.mu.Lock() // stall the receiver
		errc := make(chan error, 1)
		go func() { _, err := pr.Write(context.Background()); errc <- err }()
		time.Sleep(50 * time.Millisecond)
		pr.Close() // released while in flight: the write goes on
		p.conn.Close()
		var err error
		select {
		case err = <-errc:
		case <-time.After(5 * time.Second):
			t.Fatal("Write did not return after its conn was closed")
		}
		p.in.mu.Unlock()
		if err == nil {
			t.Fatal("a write cut off by Close succeeded")
		}
	})
}

// TestPreparedRefusal: a refused prepared batch (stale key) fails with
// NotFound and leaves the conn in step: the next write of a good plan lands.
func TestPreparedRefusal(t *testing.T) {
	p := newPair(t, 1<<20, 2)
	b := scattered(rand.New(rand.NewPCG(3, 3)), 5000, 128, 192)
	bad := p.dst
	bad.Key.Key ^= 1
	prBad, prGood := prepare(t, p, bad, &b), prepare(t, p, p.dst, &b)
	if _, err := prBad.Write(context.Background()); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("err = %v, want NotFound", err)
	}
	if err := p.conn.Err(); err != nil {
		t.Fatalf("a clean refusal broke the conn: %v", err)
	}
	fill(rand.New(rand.NewPCG(4, 4)), p.srcMem.Host)
	if _, err := prGood.Write(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkLanded(t, p, &b)
}

// TestPrepareBounds: blocks outside either region are refused at Prepare,
// naming the block.
func TestPrepareBounds(t *testing.T) {
	p := newPair(t, 1<<20, 1)
	for _, c := range []struct {
		name string
		b    desc.Batch
		want string
	}{
		{"source past end", desc.Batch{Src: []uint64{0, 1<<20 - 10}, Dst: []uint64{0, 4096}, Len: []uint64{16, 16}}, "block 1 source"},
		{"destination past end", desc.Batch{Src: []uint64{0}, Dst: []uint64{1 << 20}, Len: []uint64{1}}, "block 0 destination"},
		{"overflow", desc.Batch{Src: []uint64{^uint64(0)}, Dst: []uint64{0}, Len: []uint64{2}}, "block 0 source"},
		{"zero length", desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{0}}, "block 0 has length 0"},
		{"ragged", desc.Batch{Src: []uint64{0}, Dst: []uint64{0, 1}, Len: []uint64{1}}, "1 sources, 2 destinations"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := transport.Prepare(p.conn, p.src, p.dst, &c.b)
			if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want InvalidArgument naming %q", err, c.want)
			}
		})
	}
}

// TestPreparedTruncatedSource: the source's file truncated after Prepare: a
// prepared write fails with a DataLoss fault (not a crash), and the conn is
// failed (its stream was cut mid-frame).
func TestPreparedTruncatedSource(t *testing.T) {
	const size = 8 << 20
	for _, blk := range []uint64{128, 256 << 10} {
		t.Run(fmt.Sprint(blk), func(t *testing.T) {
			p := newPair(t, size, 2)
			mem, truncate := truncatable(t, size)
			src, err := p.a.Register(mem)
			if err != nil {
				t.Fatal(err)
			}
			b := desc.Batch{}
			for i := uint64(0); i < size/blk/2; i++ {
				b.Src, b.Dst, b.Len = append(b.Src, 2*i*blk), append(b.Dst, 2*i*blk), append(b.Len, blk)
			}
			pr, err := transport.Prepare(p.conn, src, p.dst, &b)
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Close()
			if _, err := pr.Write(context.Background()); err != nil {
				t.Fatalf("before truncation: %v", err)
			}
			truncate()
			_, err = pr.Write(context.Background())
			if !errors.Is(err, errs.ErrDataLoss) || !memguard.IsFault(err) {
				t.Fatalf("err = %v, want a DataLoss fault", err)
			}
			if p.conn.Err() == nil {
				t.Fatal("the conn is out of step after a cut frame, yet not failed")
			}
			if n := p.in.pins.Load(); n != 0 {
				t.Fatalf("%d pins held after the cut batch", n)
			}
		})
	}
}

// TestPreparedWriteAllocatesNothing: the prepared data path, both sides.
func TestPreparedWriteAllocatesNothing(t *testing.T) {
	p := newPair(t, 10000*192, 4)
	b := scattered(rand.New(rand.NewPCG(1, 1)), 10000, 128, 192)
	pr := prepare(t, p, p.dst, &b)
	ctx := context.Background()
	if _, err := pr.Write(ctx); err != nil { // warm-up
		t.Fatal(err)
	}
	if a := testing.AllocsPerRun(50, func() {
		if _, err := pr.Write(ctx); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Fatalf("%v allocations per prepared write", a)
	}
}

// TestStatsPhases: both paths report where their time went: an ad hoc write
// plans (Plan > 0), a prepared one does not; both post.
func TestStatsPhases(t *testing.T) {
	p := newPair(t, 10000*192, 1)
	b := scattered(rand.New(rand.NewPCG(2, 2)), 10000, 128, 192)
	st, err := transport.Write(context.Background(), p.conn, p.src, p.dst, &b)
	if err != nil {
		t.Fatal(err)
	}
	if st.Plan <= 0 || st.Post <= 0 || st.WorkRequests != 3 { // 10,000 segments: frames of 4096
		t.Fatalf("ad hoc stats %+v: want plan and post time, 3 frames", st)
	}
	pr := prepare(t, p, p.dst, &b)
	st, err = pr.Write(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Plan != 0 || st.Post <= 0 || st.WorkRequests != 3 {
		t.Fatalf("prepared stats %+v: want no plan time, post time, 3 frames", st)
	}
}

// FuzzPlan: for any batch, the plan's frames carry every block exactly
// once, in table order, with the payload the table says: staging the
// copies and concatenating the write list gives the source's bytes.
func FuzzPlan(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9}, uint8(2), uint16(64))
	f.Add(bytes.Repeat([]byte{200, 3, 17}, 100), uint8(4), uint16(4096))
	f.Fuzz(func(t *testing.T, data []byte, streams uint8, frameKiB uint16) {
		const srcLen = 1 << 20
		src := make([]byte, srcLen)
		for i := range src {
			src[i] = byte(i*31 + i>>8)
		}
		// Three bytes per block: length class, source and destination slots.
		var b desc.Batch
		for i := 0; i+3 <= len(data) && b.N() < 20000; i += 3 {
			n := uint64(data[i])*37 + 1
			if data[i]&0x80 != 0 {
				n *= 97 // some blocks above copyBelow
			}
			s, d := uint64(data[i+1])*4096, uint64(data[i+2])*4096
			b.Src, b.Dst, b.Len = append(b.Src, s), append(b.Dst, d), append(b.Len, n)
		}
		if err := checkBounds(&b, srcLen, 2*srcLen); err != nil {
			return
		}
		lim := planLimits{streams: int(streams%8) + 1, minShare: 4096, frameBytes: uint64(frameKiB%8192+1) << 10}
		lim.smallCap = min(lim.frameBytes, maxSegsPerFrame*copyBelow)
		var p plan
		p.build(&b, 42, lim)
		small := make([]byte, lim.smallCap)
		next := 0 // the next block expected
		for si, sh := range p.shares {
			for fi := sh.lo; fi < sh.hi; fi++ {
				fr := &p.frames[fi]
				var h frameHeader
				hdr := p.hdr[fr.hdrLo:fr.hdrHi]
				if !h.parse(hdr) || h.key != 42 || h.streams != p.streams || int(h.segs) != fr.blk.hi-fr.blk.lo || h.segs > maxSegsPerFrame {
					t.Fatalf("frame %d: header %+v", fi, h)
				}
				if last := h.flags&flagLast != 0; last != (fi == sh.hi-1) {
					t.Fatalf("share %d frame %d: last flag %v", si, fi, last)
				}
				for _, c := range p.copies[fr.cp.lo:fr.cp.hi] {
					copy(small[c.at:c.at+c.n], src[c.src:c.src+c.n])
				}
				var payload []byte
				for _, pc := range p.pieces[fr.pc.lo:fr.pc.hi] {
					if pc.staged {
						payload = append(payload, small[pc.off:pc.off+pc.n]...)
					} else {
						payload = append(payload, src[pc.off:pc.off+pc.n]...)
					}
				}
				if uint64(len(payload)) != h.payload {
					t.Fatalf("frame %d: %d payload bytes, header says %d", fi, len(payload), h.payload)
				}
				var at uint64
				for x := 0; x < int(h.segs); x++ {
					d, n := binary.LittleEndian.Uint64(hdr[headerLen+x*segLen:]), binary.LittleEndian.Uint64(hdr[headerLen+x*segLen+8:])
					if next >= b.N() || d != b.Dst[next] || n != b.Len[next] {
						t.Fatalf("frame %d segment %d: (%d,%d), want block %d", fi, x, d, n, next)
					}
					if !bytes.Equal(payload[at:at+n], src[b.Src[next]:b.Src[next]+n]) {
						t.Fatalf("frame %d: block %d's bytes differ", fi, next)
					}
					at += n
					next++
				}
			}
		}
		if next != b.N() {
			t.Fatalf("plan carries %d of %d blocks", next, b.N())
		}
	})
}

// BenchmarkPreparedWrite10K128 is BenchmarkWrite10K128 prepared: it must
// not allocate either.
func BenchmarkPreparedWrite10K128(b *testing.B) {
	const n, size, slot = 10000, 128, 192
	p := newPair(b, n*slot, 4)
	bt := scattered(rand.New(rand.NewPCG(1, 1)), n, size, slot)
	pr := prepare(b, p, p.dst, &bt)
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(n * size)
	defer cpuPerByte(b, n*size)()
	for b.Loop() {
		if _, err := pr.Write(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWriteLarge is the bench's large rows on the transport alone:
// 64 blocks of 256 KiB or 2 MiB at random slots (256 MiB of source and
// destination when 2 MiB), ad hoc, with the default frame and share sizes
// and `streams` streams. Compare with BenchmarkPlainTCP.
func BenchmarkWriteLarge(b *testing.B) {
	for _, size := range []uint64{256 << 10, 2 << 20} {
		for _, streams := range []int{1, 2, 4} {
			b.Run(fmt.Sprintf("%dKiB/streams=%d", size>>10, streams), func(b *testing.B) {
				const n = 64
				p := newPairCfg(b, int(n*2*size), Config{Listen: "127.0.0.1:0", Streams: streams})
				fill(rand.New(rand.NewPCG(1, 2)), p.srcMem.Host)
				clear(p.dstMem.Host) // first touch outside the timing
				bt := scattered(rand.New(rand.NewPCG(1, 1)), n, size, 2*size)
				ctx := context.Background()
				b.SetBytes(int64(n * size))
				defer cpuPerByte(b, n*size)()
				for b.Loop() {
					if _, err := transport.Write(ctx, p.conn, p.src, p.dst, &bt); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkPlainTCP is the yardstick: one loopback TCP connection, 4 MiB
// writes and reads, 16 MiB per op; "hot" from and into one 4 MiB buffer
// (the bench's yardstick), "region" walking 128 MiB on both sides as
// b2bd's regions do.
func BenchmarkPlainTCP(b *testing.B) {
	for _, c := range []struct {
		name string
		span int
	}{{"hot", 4 << 20}, {"region", 128 << 20}} {
		b.Run(c.name, func(b *testing.B) { plainTCP(b, c.span) })
	}
}

func plainTCP(b *testing.B, span int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	const chunk, per = 4 << 20, 16 << 20
	src, dst := hostMem(b, span).Host, hostMem(b, span).Host
	fill(rand.New(rand.NewPCG(1, 2)), src)
	clear(dst)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var got, at int
		for {
			k, err := c.Read(dst[at : at+chunk])
			if err != nil {
				return
			}
			if at += k; at+chunk > span {
				at = 0
			}
			if got += k; got >= per {
				got -= per
				c.Write([]byte{1})
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	one := make([]byte, 1)
	b.SetBytes(per)
	defer cpuPerByte(b, per)()
	at := 0
	for b.Loop() {
		for i := 0; i < per/chunk; i++ {
			if _, err := c.Write(src[at : at+chunk]); err != nil {
				b.Fatal(err)
			}
			if at += chunk; at+chunk > span {
				at = 0
			}
		}
		if _, err := io.ReadFull(c, one); err != nil {
			b.Fatal(err)
		}
	}
}

// cpuPerByte reports the process's CPU time (user and system, both sides of
// the loopback) per byte moved: unlike wall time, it hardly depends on what
// else the machine runs.
func cpuPerByte(b *testing.B, perOp uint64) func() {
	cpu := func() time.Duration {
		var ru unix.Rusage
		_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	switches := func() int64 {
		var ru unix.Rusage
		_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
		return ru.Nvcsw + ru.Nivcsw
	}
	start, sw := cpu(), switches()
	return func() {
		b.ReportMetric(float64(cpu()-start)/float64(uint64(b.N)*perOp), "cpu-ns/B")
		b.ReportMetric(float64(switches()-sw)/float64(b.N), "ctxsw/op")
	}
}

// BenchmarkPlan10K128 is the ad hoc path's planning alone: bounds, split,
// headers, tables and write lists of 10,000 scattered 128 B blocks.
func BenchmarkPlan10K128(b *testing.B) {
	bt := scattered(rand.New(rand.NewPCG(1, 1)), 10000, 128, 192)
	lim := planLimits{streams: 4, minShare: DefaultMinShareBytes, frameBytes: DefaultFrameBytes, smallCap: DefaultFrameBytes}
	var p plan
	b.ReportAllocs()
	for b.Loop() {
		if err := checkBounds(&bt, 10000*192, 10000*192); err != nil {
			b.Fatal(err)
		}
		p.build(&bt, 1, lim)
	}
}
