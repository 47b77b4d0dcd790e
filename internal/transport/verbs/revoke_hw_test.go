package verbs

// Hardware tests (B2B_RDMA_DEV, see loopback_test.go) for what a batch may
// never report: success for a destination the receiver could not pin, a
// write through a key revoked by a narrowed export, and bytes landing after
// the caller was told the batch failed.

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/transport"
)

// A batch whose destination the receiver cannot pin (deregistered or no
// longer exported) is refused: the sender fails it with NotFound, never
// success, and the connection stays usable.
func TestHWRefusedDestination(t *testing.T) {
	dev := hwDevice(t)
	p := newPair(t, testConfig(dev), 1<<20)
	rand.New(rand.NewSource(7)).Read(p.sm.Host)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		b    *desc.Batch
	}{
		{"one block", &desc.Batch{Src: []uint64{0}, Dst: []uint64{4096}, Len: []uint64{4096}}},
		{"blocks on every QP", layout(rand.New(rand.NewSource(8)), 200, []uint64{4096}, "random", 1<<20)},
		{"empty batch", &desc.Batch{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			landed := p.in.batches.Load()
			p.in.refuse.Store(true)
			_, err := transport.Write(ctx, p.conn, p.src, p.remote, tc.b)
			p.in.refuse.Store(false)
			if err == nil {
				t.Fatal("a batch whose destination could not be pinned was reported as success")
			}
			if !errors.Is(err, errs.ErrNotFound) {
				t.Fatalf("got %v, want NotFound", err)
			}
			t.Logf("refused: %v", err)
			if got := p.in.batches.Load(); got != landed {
				t.Fatalf("a refused batch was accounted as landed (%d)", got-landed)
			}
			if err := p.conn.Err(); err != nil {
				t.Fatalf("a refusal broke the connection: %v", err)
			}
			// The same connection carries the next batch.
			clear(p.dm.Host)
			if _, err := transport.Write(ctx, p.conn, p.src, p.remote, tc.b); err != nil {
				t.Fatal(err)
			}
			verify(t, p, tc.b)
		})
	}
	if pins, unpins := p.in.pins.Load(), p.in.unpins.Load(); pins != unpins {
		t.Fatalf("pins %d, unpins %d", pins, unpins)
	}
}

// regInbound forwards to a registry made after the transport.
type regInbound struct{ g *region.Registry }

func (r *regInbound) Pin(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	return r.g.Pins().Pin(k, key)
}
func (r *regInbound) PinRead(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	return r.g.Pins().PinRead(k, key)
}
func (r *regInbound) Landed(transport.Kind, uint64, uint64) {}

// revokePair is a sender transport and a receiver transport whose regions
// live in a real registry, so SetExport acts on the receiver's keys.
type revokePair struct {
	a, b   *Transport
	g      *region.Registry
	dst    *region.Region
	src    transport.Registration
	sm     memory.Memory
	conn   transport.Conn
	remote transport.RemoteRegion
}

func newRevokePair(t *testing.T, size int) *revokePair {
	t.Helper()
	dev := hwDevice(t)
	cfg := testConfig(dev)
	log := hclog.New(&hclog.LoggerOptions{Name: "verbs", Level: hclog.Warn, Output: os.Stderr})
	rp := &revokePair{}
	in := &regInbound{}
	var err error
	if rp.a, err = New(cfg, nil, log.Named("a")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rp.a.Close() })
	if rp.b, err = New(cfg, in, log.Named("b")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rp.b.Close() })
	if rp.g, err = region.New(region.Config{ShmDir: t.TempDir(), Transports: []transport.Transport{rp.b}, Log: log.Named("region")}); err != nil {
		t.Fatal(err)
	}
	in.g = rp.g
	t.Cleanup(rp.g.Close)
	if rp.dst, err = rp.g.AllocHost(uint64(size), region.Export{Name: "dst"}, region.Caller{}); err != nil {
		t.Fatal(err)
	}
	rp.sm = mmapHost(t, size)
	if rp.src, err = rp.a.Register(rp.sm); err != nil {
		t.Fatal(err)
	}
	rp.remote = rp.resolve(t)
	rp.connect(t)
	return rp
}

// resolve is what the peer learns from Peer.Resolve: size and current key.
func (rp *revokePair) resolve(t *testing.T) transport.RemoteRegion {
	t.Helper()
	reg, ok := rp.dst.Registration(transport.Verbs)
	if !ok {
		t.Fatal("destination has no verbs registration")
	}
	return transport.RemoteRegion{Name: "dst", Size: rp.dst.Mem.Len, Key: reg.Key()}
}

func (rp *revokePair) connect(t *testing.T) {
	t.Helper()
	if rp.conn != nil {
		rp.conn.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := rp.a.Connect(ctx, transport.Peer{Address: "loopback", Signal: rp.b.HandleSignal})
	if err != nil {
		t.Fatal(err)
	}
	rp.conn = c
	t.Cleanup(func() { c.Close() })
}

// When an export narrows (or is removed), the key a peer resolved before
// stops working at the NIC: a WRITE with it fails with a remote access error
// and the destination's bytes do not change; the new key works.
func TestHWRevokeOnNarrowedExport(t *testing.T) {
	const size = 1 << 20
	rp := newRevokePair(t, size)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := rand.New(rand.NewSource(9))
	b := layout(r, 64, []uint64{4096}, "random", size)
	dm := rp.dst.Mem.Host
	land := func(remote transport.RemoteRegion) {
		t.Helper()
		r.Read(rp.sm.Host)
		if _, err := transport.Write(ctx, rp.conn, rp.src, remote, b); err != nil {
			t.Fatal(err)
		}
		for i := range b.Src {
			s, d, l := b.Src[i], b.Dst[i], b.Len[i]
			if !bytes.Equal(rp.sm.Host[s:s+l], dm[d:d+l]) {
				t.Fatalf("block %d did not land", i)
			}
		}
	}
	refused := func(old transport.RemoteRegion) {
		t.Helper()
		before := bytes.Clone(dm)
		r.Read(rp.sm.Host)
		_, err := transport.Write(ctx, rp.conn, rp.src, old, b)
		if err == nil {
			t.Fatalf("a batch with the revoked rkey %#x succeeded", old.Key.Key)
		}
		t.Logf("write with the old rkey %#x: %v", old.Key.Key, err)
		if !strings.Contains(err.Error(), "remote access error") {
			t.Fatalf("the NIC did not refuse the old rkey (want a remote access error): %v", err)
		}
		if !bytes.Equal(before, dm) {
			t.Fatal("bytes changed through the revoked rkey")
		}
		if _, _, err := rp.g.Pins().Pin(transport.Verbs, old.Key.Key); err == nil {
			t.Fatal("the registry still pins the old key")
		}
	}

	mrs := func(want int64) {
		t.Helper()
		if n := rp.b.live.mrs.Load(); n != want {
			t.Fatalf("receiver holds %d MRs, want %d", n, want)
		}
	}
	land(rp.remote)
	old := rp.remote
	mrs(2) // the SRQ buffers' and the region's write MR: no read MR, the export grants no readers
	// A batch landing through the old key (between its meta and its ack)
	// holds the old MR: the narrowing does not cut it off.
	hreg, held := rp.b.useRKey(uint32(old.Key.Key))
	if held == nil {
		t.Fatal("the region's MR is not found by its rkey")
	}
	// Narrowed: every authenticated peer -> one other identity.
	if _, err := rp.g.SetExport(rp.dst.ID, region.Export{Name: "dst", To: []string{"someone-else"}}, region.Root); err != nil {
		t.Fatal(err)
	}
	cur := rp.resolve(t)
	if cur.Key == old.Key {
		t.Fatalf("narrowing the export kept the rkey %#x", old.Key.Key)
	}
	mrs(3) // the old MR waits for the batch holding it
	// A new batch with the old key while the old MR drains: the registry no
	// longer pins the key, so it is refused (never success).
	r.Read(rp.sm.Host)
	if _, err := transport.Write(ctx, rp.conn, rp.src, old, b); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("a batch with the old key while it drains: got %v, want a NotFound refusal", err)
	} else {
		t.Logf("while the old MR drains: %v", err)
	}
	hreg.done(held) // the held batch ends: the old MR goes
	mrs(2)
	refused(old)
	rp.connect(t) // the failed completion broke the connection
	land(cur)

	// Widened back to everyone: the key stays.
	if _, err := rp.g.SetExport(rp.dst.ID, region.Export{Name: "dst"}, region.Root); err != nil {
		t.Fatal(err)
	}
	if k := rp.resolve(t).Key; k != cur.Key {
		t.Fatalf("widening the export changed the key %#x -> %#x", cur.Key.Key, k.Key)
	}
	land(cur)

	// Removed: the key goes too.
	if _, err := rp.g.SetExport(rp.dst.ID, region.Export{}, region.Root); err != nil {
		t.Fatal(err)
	}
	refused(cur)
	rp.connect(t)
	if err := rp.g.Deregister(rp.dst.ID, region.Root); err != nil {
		t.Fatalf("deregister after the revocation: %v", err)
	}
	if n := rp.b.Resources().MemoryRegions; n != 1 { // the SRQ buffers' MR only
		t.Fatalf("receiver holds %d MRs after deregistration, want 1", n)
	}
}
