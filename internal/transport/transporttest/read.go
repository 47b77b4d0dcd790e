package transporttest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// The Read checks: a pull copies blocks of the receiver's
// region (the peer, whose read key the sender holds) into the sender's own
// registration. Every byte is verified, gaps stay poisoned, refusals carry
// their class and write nothing, and a cut-off Read places no byte after
// it answered.

// reader is the rig's conn where the kind pulls (Caps.Ops has OpRead), or
// the check is skipped. A kind that declares no reads is held to it: a
// probe Read must answer errs.ErrUnimplemented. One that declares them is
// not probed: the checks' own Reads show it, and a probe would set up the
// rig's first pull ahead of the cut-off checks, which expect it to start
// cold (over verbs the peer's stall does not hold a READ; a cold first
// read outlasts the cut).
func (r *rig) reader(t *testing.T) transport.Conn {
	t.Helper()
	if r.wants(Read) {
		return r.conn
	}
	const n = 4096
	local, _ := r.source(t, n)
	_, remote, _ := r.readable(t, n)
	b := desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{n}}
	_, err := transport.Read(context.Background(), r.conn, local, remote, &b)
	r.declared(t, Read, !errors.Is(err, errs.ErrUnimplemented))
	return r.conn
}

// readable registers size bytes with the receiver as an export with
// readers: its read key indexed for PinRead (a kind without a read key of
// its own reads with its key). It returns the region as a puller resolves
// it for reading.
func (r *rig) readable(t testing.TB, size int) (transport.Registration, transport.RemoteRegion, []byte) {
	t.Helper()
	reg, m := r.register(t, r.p.Receiver, "receiver", size)
	rk := readKey(t, reg)
	r.rin.addRead(rk.Key, m)
	rr := r.remote(reg, uint64(size))
	rr.Key, rr.Devices = rk, nil
	return reg, rr, m.Host
}

func readKey(t testing.TB, reg transport.Registration) transport.RemoteKey {
	t.Helper()
	k, err := reg.KeyFor(transport.AccessRead)
	if errors.Is(err, errs.ErrUnimplemented) {
		return reg.Key() // one key for every access
	}
	if err != nil {
		t.Fatalf("KeyFor(read): %v", err)
	}
	return k
}

// read pulls b (Src: the peer's offsets) into dst.
func read(ctx context.Context, rd transport.Conn, dst transport.Registration, src transport.RemoteRegion, b *desc.Batch) error {
	_, err := transport.Read(ctx, rd, dst, src, b)
	return err
}

func testReadLands(t *testing.T, f Factory) {
	for _, l := range layouts() {
		t.Run(l.name, func(t *testing.T) {
			r := start(t, f)
			rd := r.reader(t)
			local, lb := r.source(t, l.size)
			_, remote, rb := r.readable(t, l.size)
			rng := rand.New(rand.NewPCG(uint64(l.size), 24))
			for round := 1; round <= 2; round++ {
				fill(rng, rb)
				poisoned(lb)
				if err := read(context.Background(), rd, local, remote, &l.b); err != nil {
					t.Fatalf("round %d: %v", round, err)
				}
				check(t, rb, lb, &l.b)
				if n := r.rin.Held(); n != 0 {
					t.Fatalf("round %d: %d pins held after Read returned", round, n)
				}
			}
		})
	}
}

func testReadRefusals(t *testing.T, f Factory) {
	const n, blk = 64, 4096
	cases := []struct {
		name string
		mut  func(r *rig, b *desc.Batch, src *transport.RemoteRegion, reg transport.Registration)
		want error
		// partial: any subset may land (Reader's contract on error): only
		// the peer, which knows its region, can refuse the bad block.
		partial bool
	}{
		{"source past the peer's region", func(r *rig, b *desc.Batch, src *transport.RemoteRegion, _ transport.Registration) {
			b.Src[len(b.Src)-1] = src.Size - 1
		}, errs.ErrInvalidArgument, false},
		{"peer's region smaller than resolved", func(r *rig, b *desc.Batch, src *transport.RemoteRegion, _ transport.Registration) {
			b.Src[len(b.Src)-1] = src.Size
			src.Size *= 2
		}, errs.ErrInvalidArgument, true},
		{"destination past its end", func(r *rig, b *desc.Batch, _ *transport.RemoteRegion, _ transport.Registration) {
			b.Dst[len(b.Dst)-1] = 1 << 40
		}, errs.ErrInvalidArgument, false},
		{"unknown key", func(r *rig, b *desc.Batch, src *transport.RemoteRegion, _ transport.Registration) {
			src.Key.Key ^= 0x5a5a0000
		}, errs.ErrNotFound, false},
		{"the write key", func(r *rig, b *desc.Batch, src *transport.RemoteRegion, reg transport.Registration) {
			if reg.Key() == src.Key {
				src.Key.Key ^= 0x5a5a0000 // one key for both: stands for an unknown one
				return
			}
			r.rin.add(reg.Key().Key, reg.Memory()) // writable too: its write key must still not read
			src.Key = reg.Key()
		}, errs.ErrNotFound, false},
		{"deregistered region", func(r *rig, b *desc.Batch, src *transport.RemoteRegion, reg transport.Registration) {
			r.rin.remove(src.Key.Key)
			if err := reg.Close(); err != nil {
				panic(fmt.Sprintf("receiver registration Close: %v", err))
			}
		}, errs.ErrNotFound, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := start(t, f)
			rd := r.reader(t)
			local, lb := r.source(t, n*blk)
			reg, remote, rb := r.readable(t, n*blk)
			fill(rand.New(rand.NewPCG(1, 24)), rb)
			poisoned(lb)
			b := blockBatch(n, blk, true)
			good, gb := remote, desc.Batch{Src: append([]uint64(nil), b.Src...), Dst: append([]uint64(nil), b.Dst...), Len: b.Len}
			c.mut(r, &b, &remote, reg)
			// A kind whose NIC refuses the key learns only a remote access
			// error (Aborted), as for Write's refusals.
			refused(t, f, "Read", read(context.Background(), rd, local, remote, &b), c.want)
			if !c.partial && !allPoison(lb) {
				t.Fatal("the refused read wrote into the local region")
			}
			r.fresh(t)
			rd = r.reader(t)
			if err := r.rin.settle(10 * time.Second); err != nil {
				t.Fatalf("after the refusal: %v", err)
			}
			if c.name == "deregistered region" {
				_, good, rb = r.readable(t, n*blk)
				fill(rand.New(rand.NewPCG(2, 24)), rb)
			}
			if err := read(context.Background(), rd, local, good, &gb); err != nil {
				t.Fatalf("the next read: %v", err)
			}
			check(t, rb, lb, &gb)
		})
	}
	t.Run("read key cannot write", func(t *testing.T) {
		r := start(t, f)
		r.reader(t)
		src, sb := r.source(t, n*blk)
		reg, remote, rb := r.readable(t, n*blk)
		if readKey(t, reg) == reg.Key() {
			t.Skipf("%s keys reads and writes alike", f.Kind)
		}
		fill(rand.New(rand.NewPCG(3, 24)), sb)
		poisoned(rb)
		b := desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{blk}}
		refused(t, f, "a Write with the read key", write(context.Background(), r.conn, src, remote, &b), errs.ErrNotFound)
		if !allPoison(rb) {
			t.Fatal("a Write with the read key wrote into the region")
		}
	})
}

// testReadCutOff: the peer is stalled in PinRead, so no byte can come; the
// Read answers with the deadline (or cancellation) and, once it answered,
// no byte lands in the local region, also after the peer was let go.
func testReadCutOff(t *testing.T, f Factory, cancel bool) {
	r := start(t, f)
	r.reader(t)
	local, lb := r.source(t, cutN*cutBlk)
	_, remote, rb := r.readable(t, cutN*cutBlk)
	fill(rand.New(rand.NewPCG(4, 24)), rb)
	cutOff(t, f, r, cancel, cutOp{
		name: "Read", whom: "peer", from: rb, into: lb, intoName: "local",
		do: func(ctx context.Context, b *desc.Batch) error { return read(ctx, r.reader(t), local, remote, b) },
	})
}
