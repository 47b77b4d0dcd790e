package transporttest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// poison fills destinations, so a gap written by mistake shows.
const poison = 0xA5

func fill(r *rand.Rand, b []byte) {
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	for ; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}

func poisoned(b []byte) {
	for i := range b {
		b[i] = poison
	}
}

// layout is a named batch and the region size it needs on both sides.
type layout struct {
	name string
	size int
	b    desc.Batch
}

// slots places n blocks of the given lengths (cycled) at random slots of
// slot bytes; adjacent makes them back to back, in order, on both sides
// (blocks a transport may merge).
func slots(r *rand.Rand, name string, n int, lens []uint64, slot uint64, adjacent bool) layout {
	b := desc.Batch{Src: make([]uint64, n), Dst: make([]uint64, n), Len: make([]uint64, n)}
	ps, pd := r.Perm(n), r.Perm(n)
	var at uint64
	for i := range n {
		l := lens[i%len(lens)]
		if adjacent {
			b.Src[i], b.Dst[i] = at, at
			at += l
		} else {
			b.Src[i], b.Dst[i] = uint64(ps[i])*slot, uint64(pd[i])*slot
		}
		b.Len[i] = l
	}
	size := int(uint64(n) * slot)
	if adjacent {
		size = int(at)
	}
	return layout{name, size, b}
}

func layouts() []layout {
	r := rand.New(rand.NewPCG(22, 4))
	return []layout{
		slots(r, "one byte", 1, []uint64{1}, 64, false),
		slots(r, "2000x128 scattered", 2000, []uint64{128}, 192, false),
		slots(r, "1000x4KiB adjacent", 1000, []uint64{4096}, 4096, true),
		slots(r, "300 mixed sizes scattered", 300, []uint64{1, 100, 4096, 65536 + 7, 3000}, 70<<10, false),
		slots(r, "64 mixed adjacent", 64, []uint64{17, 4096, 1 << 16, 5}, 1<<16, true),
		slots(r, "3x3MiB scattered", 3, []uint64{3 << 20}, 3<<20+4096, false),
	}
}

// check compares every block by checksum and every other destination byte
// with the poison.
func check(t testing.TB, src, dst []byte, b *desc.Batch) {
	t.Helper()
	covered := make([]bool, len(dst))
	for i := range b.Src {
		s, d, n := b.Src[i], b.Dst[i], b.Len[i]
		if xxhash.Sum64(src[s:s+n]) != xxhash.Sum64(dst[d:d+n]) {
			t.Fatalf("block %d (src %d, dst %d, %d bytes) differs at the destination", i, s, d, n)
		}
		for k := d; k < d+n; k++ {
			covered[k] = true
		}
	}
	for k, c := range covered {
		if !c && dst[k] != poison {
			t.Fatalf("destination byte %d, in a gap between blocks, was written (%#x)", k, dst[k])
		}
	}
}

func write(ctx context.Context, c transport.Conn, src transport.Registration, dst transport.RemoteRegion, b *desc.Batch) error {
	_, err := transport.Write(ctx, c, src, dst, b)
	return err
}

func testLands(t *testing.T, f Factory) {
	for _, l := range layouts() {
		t.Run(l.name, func(t *testing.T) {
			r := start(t, f)
			src, sb := r.source(t, l.size)
			_, dst, db := r.dest(t, l.size)
			rng := rand.New(rand.NewPCG(uint64(l.size), 1))
			for round := 1; round <= 2; round++ {
				fill(rng, sb)
				poisoned(db)
				before := r.rin.landedBytes.Load()
				st, err := transport.Write(context.Background(), r.conn, src, dst, &l.b)
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				check(t, sb, db, &l.b)
				if got, want := r.rin.landedBytes.Load()-before, l.b.Bytes(); got != want {
					t.Fatalf("round %d: the receiver counted %d bytes landed, want %d", round, got, want)
				}
				// Merging lowers the count, striping a block over rails
				// raises it; none is wrong, no segment at all is.
				if st.Segments == 0 {
					t.Fatalf("round %d: Stats.Segments = 0 for %d blocks", round, l.b.N())
				}
				if n := r.rin.Held(); n != 0 {
					t.Fatalf("round %d: %d pins held after Write returned", round, n)
				}
			}
		})
	}
}

// refusal is a batch the contract refuses, and the class it must carry.
type refusal struct {
	name string
	// mut spoils the batch or the destination; bad key cases also close.
	mut  func(r *rig, b *desc.Batch, dst *transport.RemoteRegion, reg transport.Registration)
	want error
	// untouched: no byte of the destination may change (the key does not
	// reach it any more, or never did).
	untouched bool
}

func refusals() []refusal {
	return []refusal{
		{"source past its end", func(r *rig, b *desc.Batch, _ *transport.RemoteRegion, _ transport.Registration) {
			b.Src[len(b.Src)-1] = 1 << 40
			// Any subset may land on an error (Conn.Write): a striping
			// transport checks each share where it is posted.
		}, errs.ErrInvalidArgument, false},
		{"destination past the region's size", func(r *rig, b *desc.Batch, dst *transport.RemoteRegion, _ transport.Registration) {
			b.Dst[len(b.Dst)-1] = dst.Size - 1
		}, errs.ErrInvalidArgument, false},
		{"destination region smaller than resolved", func(r *rig, b *desc.Batch, dst *transport.RemoteRegion, _ transport.Registration) {
			// The peer resolved a larger size (stale, or lying): only the
			// receiver, which knows the region, can refuse.
			b.Dst[len(b.Dst)-1] = dst.Size
			dst.Size *= 2
		}, errs.ErrInvalidArgument, false},
		{"unknown key", func(r *rig, b *desc.Batch, dst *transport.RemoteRegion, _ transport.Registration) {
			dst.Key.Key ^= 0x5a5a0000
			dst.Devices = append([]transport.RemoteKey(nil), dst.Devices...)
			for i := range dst.Devices {
				dst.Devices[i].Key ^= 0x5a5a0000
			}
		}, errs.ErrNotFound, true},
		{"deregistered region", func(r *rig, b *desc.Batch, dst *transport.RemoteRegion, reg transport.Registration) {
			r.rin.remove(reg.Key().Key)
			if err := reg.Close(); err != nil {
				panic(fmt.Sprintf("receiver registration Close: %v", err))
			}
		}, errs.ErrNotFound, true},
	}
}

func testRefusals(t *testing.T, f Factory) {
	const n, blk = 64, 4096
	for _, c := range refusals() {
		t.Run(c.name, func(t *testing.T) {
			r := start(t, f)
			src, sb := r.source(t, n*blk)
			reg, dst, db := r.dest(t, n*blk)
			fill(rand.New(rand.NewPCG(1, 2)), sb)
			poisoned(db)
			b := blockBatch(n, blk, true)
			good, gb := dst, b
			gb.Dst = append([]uint64(nil), b.Dst...)
			gb.Src = append([]uint64(nil), b.Src...)
			c.mut(r, &b, &dst, reg)
			refused(t, f, "Write", write(context.Background(), r.conn, src, dst, &b), c.want)
			if c.untouched && !allPoison(db) {
				t.Fatal("the refused batch wrote into the destination")
			}
			if got := r.rin.landedBytes.Load(); got != 0 {
				gap(t, f, GapLandedOnRefusal, fmt.Sprintf("a refused batch was counted as landed (%d bytes)", got))
			}
			// A refusal breaks nothing the peer manager cannot mend: it
			// closes a conn that says it is broken (which tells the
			// receiver to drop its half and what it pinned), and the conn,
			// or a fresh one, carries the next batch to a live region.
			r.fresh(t)
			if err := r.rin.settle(10 * time.Second); err != nil {
				t.Fatalf("after the refusal: %v", err)
			}
			if c.name == "deregistered region" {
				_, good, db = r.dest(t, n*blk)
				poisoned(db)
			} else {
				poisoned(db)
			}
			if err := write(context.Background(), r.conn, src, good, &gb); err != nil {
				t.Fatalf("the next batch: %v", err)
			}
			check(t, sb, db, &gb)
		})
	}
}

// blockBatch is n blocks of blk bytes from offset 0 of the source, each
// landing at the same offset of the destination, or, reversed, in the
// mirrored slot (the first block in the last).
func blockBatch(n, blk uint64, reversed bool) desc.Batch {
	b := desc.Batch{}
	for i := range n {
		d := i
		if reversed {
			d = n - 1 - i
		}
		b.Src, b.Dst, b.Len = append(b.Src, i*blk), append(b.Dst, d*blk), append(b.Len, blk)
	}
	return b
}

// refused fails t unless err refuses op with class want. A kind whose NIC
// refuses (a stale or unknown key) learns only a remote access error
// (Aborted): that is the declared gap GapRefusedAsAborted.
func refused(t *testing.T, f Factory, op string, err, want error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s succeeded", op)
	}
	got := errs.Class(err)
	if got == want {
		return
	}
	msg := fmt.Sprintf("%s: err = %v: class %v, want %v", op, err, got, want)
	if got != errs.ErrAborted || want == errs.ErrAborted {
		t.Fatal(msg)
	}
	gap(t, f, GapRefusedAsAborted, msg)
}

func allPoison(b []byte) bool {
	for _, x := range b {
		if x != poison {
			return false
		}
	}
	return true
}

// testCutOff: the receiver is stalled in Pin, so the batch cannot be
// acknowledged; the Write must answer with the deadline (or the
// cancellation, made once the receiver is stalled) and, once it answered,
// no byte may land: the destination is compared after the receiver was let
// go and finished with every batch it began.
func testCutOff(t *testing.T, f Factory, cancel bool) {
	r := start(t, f)
	src, sb := r.source(t, cutN*cutBlk)
	_, dst, db := r.dest(t, cutN*cutBlk)
	fill(rand.New(rand.NewPCG(3, 3)), sb)
	cutOff(t, f, r, cancel, cutOp{
		name: "Write", whom: "receiver", from: sb, into: db, intoName: "destination", lateIsGap: true,
		do: func(ctx context.Context, b *desc.Batch) error { return write(ctx, r.conn, src, dst, b) },
	})
}

// The size of a cut-off check's batch: cutN blocks of cutBlk bytes.
const cutN, cutBlk = 64, 64 << 10

// cutOp is the op a cut-off check cuts: a Write into the stalled receiver
// or a Read from it (the roles of from and into swap).
type cutOp struct {
	name, whom string // "Write", "receiver": for the messages
	// do runs the op on the rig's conn of the moment (a fresh one after
	// the cut).
	do func(ctx context.Context, b *desc.Batch) error
	// from holds the bytes the op copies; into is where they land.
	from, into []byte
	intoName   string // "destination": for the messages
	// lateIsGap: bytes landing after the op answered are the declared gap
	// GapLateBytes, else a failure.
	lateIsGap bool
}

// cutOff stalls the receiver, cuts op off with a deadline (or a
// cancellation, made once the receiver is stalled), checks the op answered
// with it and that no byte landed in op.into after it answered, also once
// the receiver was let go and settled; then a fresh conn carries the batch.
func cutOff(t *testing.T, f Factory, r *rig, cancel bool, op cutOp) {
	t.Helper()
	poisoned(op.into)
	b := blockBatch(cutN, cutBlk, false)
	stall, entered := r.rin.Stall, (<-chan struct{})(r.rin.entered)
	if r.p.Stall != nil {
		stall, entered = r.p.Stall, nil
	}
	resume := stall()
	defer resume()
	var (
		ctx  context.Context
		stop context.CancelFunc
		want error
	)
	if cancel {
		ctx, stop = context.WithCancel(context.Background())
		want = context.Canceled
		go func() {
			select {
			case <-entered: // the receiver is stalled: cancel now
			case <-time.After(50 * time.Millisecond): // or it never pins (its own design): cancel anyway
			}
			stop()
		}()
	} else {
		ctx, stop = context.WithTimeout(context.Background(), 100*time.Millisecond)
		want = context.DeadlineExceeded
	}
	defer stop()
	err := op.do(ctx, &b)
	snap := bytes.Clone(op.into)
	landed := r.rin.landedBytes.Load()
	if err == nil {
		t.Fatalf("%s succeeded while the %s was stalled", op.name, op.whom)
	}
	if got := errs.Class(err); got != want {
		t.Fatalf("err = %v: class %v, want %v", err, got, want)
	}
	resume()
	// A conn the cut left broken is closed, as the peer manager drops it;
	// the receiver may hold its pin until then.
	if r.conn.Err() != nil {
		_ = r.conn.Close()
	}
	if err := r.rin.settle(10 * time.Second); err != nil {
		t.Fatalf("after the cut-off: %v", err)
	}
	if late, first := diff(snap, op.into); late > 0 {
		msg := fmt.Sprintf("%d %s bytes (first at offset %d) changed after %s answered %v",
			late, op.intoName, first, op.name, errs.Class(err))
		if !op.lateIsGap {
			t.Fatal(msg)
		}
		gap(t, f, GapLateBytes, fmt.Sprintf("%s; the receiver counted %d more bytes landed", msg, r.rin.landedBytes.Load()-landed))
	}
	r.fresh(t)
	poisoned(op.into)
	if err := op.do(context.Background(), &b); err != nil {
		t.Fatalf("the next %s: %v", strings.ToLower(op.name), err)
	}
	check(t, op.from, op.into, &b)
}

func diff(a, b []byte) (n, first int) {
	first = -1
	for i := range a {
		if a[i] != b[i] {
			if first < 0 {
				first = i
			}
			n++
		}
	}
	return n, first
}

func testCloseTwice(t *testing.T, f Factory) {
	r := start(t, f)
	src, _ := r.source(t, 1<<16)
	dreg, dst, _ := r.dest(t, 1<<16)
	b := desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{4096}}
	if err := write(context.Background(), r.conn, src, dst, &b); err != nil {
		t.Fatal(err)
	}
	closeTwice := func(what string, close func() error) {
		t.Helper()
		if err := close(); err != nil {
			t.Errorf("%s: first Close: %v", what, err)
		}
		if err := close(); err != nil {
			t.Errorf("%s: second Close: %v", what, err)
		}
	}
	if r.caps.Prepared {
		pr, err := transport.Prepare(r.conn, src, dst, &b)
		if err != nil {
			t.Fatal(err)
		}
		closeTwice("prepared", pr.Close)
		if _, err := pr.Write(context.Background()); err == nil {
			t.Error("a closed Prepared wrote")
		}
	}
	closeTwice("conn", r.conn.Close)
	if err := write(context.Background(), r.conn, src, dst, &b); err == nil {
		t.Error("a closed conn wrote")
	}
	if r.conn.Err() == nil {
		t.Error("a closed conn reports itself usable (Err is nil)")
	}
	closeTwice("source registration", src.Close)
	r.rin.remove(dreg.Key().Key)
	closeTwice("destination registration", dreg.Close)
	closeTwice("sender transport", r.p.Sender.Close)
	closeTwice("receiver transport", r.p.Receiver.Close)
}

func testConcurrent(t *testing.T, f Factory) {
	const workers, each, n, blk = 4, 8, 256, 1024
	r := start(t, f)
	src, sb := r.source(t, workers*n*blk)
	_, dst, db := r.dest(t, workers*n*blk)
	fill(rand.New(rand.NewPCG(5, 5)), sb)
	poisoned(db)
	batches := make([]desc.Batch, workers)
	var all desc.Batch
	for w := range batches {
		rng := rand.New(rand.NewPCG(uint64(w), 9))
		perm := rng.Perm(n)
		for i := range n {
			s, d := uint64(w*n+i)*blk, uint64(w*n+perm[i])*blk
			batches[w].Src, batches[w].Dst, batches[w].Len = append(batches[w].Src, s), append(batches[w].Dst, d), append(batches[w].Len, blk)
			all.Src, all.Dst, all.Len = append(all.Src, s), append(all.Dst, d), append(all.Len, blk)
		}
	}
	var wg sync.WaitGroup
	errc := make(chan error, workers*each)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := write(context.Background(), r.conn, src, dst, &batches[w]); err != nil {
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
	check(t, sb, db, &all)
	if got, want := r.rin.landedBytes.Load(), uint64(workers*each*n*blk); got != want {
		t.Fatalf("the receiver counted %d bytes landed, want %d", got, want)
	}
}

func testPrepared(t *testing.T, f Factory) {
	r := start(t, f)
	p := r.conn
	{ // a probe: Prepare works exactly when Caps.Prepared says so
		src, _ := r.source(t, 4096)
		_, dst, _ := r.dest(t, 4096)
		pr, err := transport.Prepare(p, src, dst, &desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{4096}})
		has := !errors.Is(err, errs.ErrUnimplemented)
		if has && err != nil {
			t.Fatalf("probe Prepare of one block: %v", err)
		}
		if pr != nil {
			_ = pr.Close()
		}
		r.declared(t, Prepare, has)
	}
	for _, l := range layouts() {
		t.Run(l.name, func(t *testing.T) {
			src, sb := r.source(t, l.size)
			_, dst, db := r.dest(t, l.size)
			b := desc.Batch{Src: append([]uint64(nil), l.b.Src...), Dst: append([]uint64(nil), l.b.Dst...), Len: append([]uint64(nil), l.b.Len...)}
			pr, err := transport.Prepare(p, src, dst, &b)
			if err != nil {
				t.Fatal(err)
			}
			defer pr.Close()
			clear(b.Src) // the plan must not keep b
			clear(b.Dst)
			rng := rand.New(rand.NewPCG(uint64(l.size), 7))
			for round := 1; round <= 3; round++ {
				fill(rng, sb)
				poisoned(db)
				before := r.rin.landedBytes.Load()
				st, err := pr.Write(context.Background())
				if err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				check(t, sb, db, &l.b)
				if got, want := r.rin.landedBytes.Load()-before, l.b.Bytes(); got != want {
					t.Fatalf("round %d: the receiver counted %d bytes landed, want %d", round, got, want)
				}
				if st.Plan != 0 {
					t.Fatalf("round %d: a prepared Write reports %v of planning", round, st.Plan)
				}
			}
			ctx := context.Background()
			var werr error
			allocs := testing.AllocsPerRun(20, func() {
				if _, err := pr.Write(ctx); err != nil && werr == nil {
					werr = err
				}
			})
			if werr != nil {
				t.Fatal(werr)
			}
			if allocs != 0 {
				t.Fatalf("a prepared Write allocates %v times", allocs)
			}
			if err := pr.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := pr.Write(ctx); errs.Class(err) != errs.ErrFailedPrecondition {
				t.Fatalf("Write after Close: %v, want FailedPrecondition", err)
			}
		})
	}
}

// testKeyCaps holds a registration's methods beyond Key to the kind's
// Caps.Keys: each answers errs.ErrUnimplemented exactly when undeclared.
func testKeyCaps(t *testing.T, f Factory) {
	r := start(t, f)
	reg, _ := r.register(t, r.p.Receiver, "receiver", 1<<16)
	kc := r.caps.Keys
	agree := func(what string, declared bool, err error) {
		t.Helper()
		switch unimpl := errors.Is(err, errs.ErrUnimplemented); {
		case declared && err != nil:
			t.Errorf("the %s transport declares %s in Caps.Keys, and it failed: %v", f.Kind, what, err)
		case !declared && !unimpl:
			t.Errorf("the %s transport does not declare %s in Caps.Keys, yet it answered %v, not ErrUnimplemented", f.Kind, what, err)
		}
	}
	rk, err := reg.KeyFor(transport.AccessRead)
	agree("PerAccess (KeyFor)", kc.PerAccess, err)
	if kc.PerAccess && err == nil && rk == reg.Key() {
		t.Errorf("the %s transport declares a key per access, and its read key is its write key %+v", f.Kind, rk)
	}
	_, err = reg.RekeyFor(transport.AccessRead)
	agree("RekeyRead (RekeyFor)", kc.RekeyRead, err)
	if rails := reg.Rails(); kc.Rails != (rails != nil) {
		t.Errorf("the %s transport declares Rails %v, and its registration lists %d rails", f.Kind, kc.Rails, len(rails))
	}
	agree("Withdraw", kc.Withdraw, reg.Withdraw()) // last: the registration is of no use after it
}

func testRekey(t *testing.T, f Factory) {
	const n, blk = 16, 4096
	r := start(t, f)
	src, sb := r.source(t, n*blk)
	reg, dst, db := r.dest(t, n*blk)
	fill(rand.New(rand.NewPCG(8, 8)), sb)
	b := blockBatch(n, blk, false)
	poisoned(db)
	if err := write(context.Background(), r.conn, src, dst, &b); err != nil {
		t.Fatal(err)
	}
	check(t, sb, db, &b)
	before := reg.Key()
	old, err := reg.Rekey()
	r.declared(t, Rekey, !errors.Is(err, errs.ErrUnimplemented))
	if err != nil {
		t.Fatal(err)
	}
	if old != before {
		t.Fatalf("Rekey returned %+v, the key was %+v", old, before)
	}
	if reg.Key() == old {
		t.Fatal("Rekey left the key as it was")
	}
	r.rin.move(old.Key, reg.Key().Key)
	poisoned(db)
	refused(t, f, "a batch with the old key", write(context.Background(), r.conn, src, dst, &b), errs.ErrNotFound)
	if !allPoison(db) {
		t.Fatal("a batch with the old key wrote into the region")
	}
	r.fresh(t)
	if err := write(context.Background(), r.conn, src, r.remote(reg, dst.Size), &b); err != nil {
		t.Fatalf("new key: %v", err)
	}
	check(t, sb, db, &b)
}
