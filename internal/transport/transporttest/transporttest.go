// Package transporttest is the transport contract (internal/transport's
// Transport, Conn, Registration, Preparer, Prepared) as one conformance suite:
// every kind's tests call Run with a Factory, so the contract is written and
// checked once instead of restated per transport. Model: containerd's
// core/snapshots/testsuite.
//
// What it checks:
//   - every block lands, byte for byte, with gaps left alone (several sizes,
//     scattered and adjacent blocks), and the receiver counts it as landed;
//   - refusals carry the right internal/errs class (source or destination
//     out of range, a destination region smaller than claimed, an unknown
//     key, a deregistered region) and leave no pin behind;
//   - a Write cut off by its deadline or by cancellation answers with that
//     class, and no byte lands after the answer (the receiver is stalled in
//     Pin, so the cut is deterministic);
//   - Close twice on transport, conn, registration and prepared;
//   - prepared plans land every block and allocate nothing per Write;
//   - Rekey: the old key is refused, the new one works; every other key
//     method of a registration works exactly when Caps.Keys declares it;
//   - concurrent Writes on one conn;
//   - block-id writes (Conn.WriteBlocks) over several regions, with
//     merges, fused segments and repeated source ids.
//
// What a kind can do is declared once, in its driver's transport.Caps
// (Ops, Prepared, Keys): the suite runs the Read checks iff Caps says
// OpRead, the prepared checks iff Prepared, and fails a kind whose Conns
// or registrations do more or less than that (a probe call answers
// errs.ErrUnimplemented exactly where undeclared), so a declaration cannot
// lie. Caps.Blocks (a block-id request in one go, not stretch by stretch)
// is the kind's word on how, not whether: every Conn moves one. Every transport advertises (its Kind or nothing) and reports
// Status, checked by the Kind checks.
package transporttest

import (
	"context"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// Optional names what a kind may or may not do, as its Caps declare.
type Optional uint

const (
	// Prepare: Conn.Prepare works (Caps.Prepared).
	Prepare Optional = 1 << iota
	// Rekey: the registrations' Rekey works (Caps.Keys.Rekey).
	Rekey
	// Read: Conn.Read and ReadBlocks work (pulls; Caps.Ops has OpRead),
	// checked by the Read* checks.
	Read
)

func (o Optional) String() string {
	var s []string
	for _, x := range []struct {
		o    Optional
		name string
	}{{Prepare, "Prepare"}, {Rekey, "Rekey"}, {Read, "Read"}} {
		if o&x.o != 0 {
			s = append(s, x.name)
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, "|")
}

// Pair is a sender and a receiver transport, started by a Factory.
type Pair struct {
	Sender, Receiver transport.Transport
	// Connect opens a data path from Sender to Receiver (the control-plane
	// part, a Peer with its Signal, is the factory's).
	Connect func(ctx context.Context) (transport.Conn, error)
	// Remote is reg (a Receiver registration of size bytes) as a peer
	// resolves it; nil: RemoteRegion{Key: reg.Key()}.
	Remote func(reg transport.Registration, size uint64) transport.RemoteRegion
	// Stall holds the data path so that no batch can complete until
	// resume is called; nil: the suite stalls the receiver's Inbound.Pin.
	// For kinds whose fake places bytes without the receiver's Pin.
	Stall func() (resume func())
}

// Factory builds the kind under test.
type Factory struct {
	Kind transport.Kind
	// Caps is what the kind declares it can do, for a kind whose driver is
	// not registered in the test's binary (verbs inside its own package);
	// nil: the registered driver's CapsFor(the Pair's Sender).
	Caps *transport.Caps
	// New starts a Pair whose receiving sides answer Pin and Landed through
	// send and recv. The suite closes both transports at the end of t.
	New func(t testing.TB, send, recv transport.Inbound) *Pair
	// Memory is size bytes that both transports can register; nil:
	// anonymous host memory (mmap).
	Memory func(t testing.TB, size int) memory.Memory
	// Gaps are the checks (Gap...) this kind is known to fail, each with
	// why: such a check still runs, and reports its finding with the reason
	// in the log instead of failing. A stated gap, visible in every -v run,
	// not a silent one.
	Gaps map[string]string
}

// Checks a Factory may declare as known gaps.
const (
	// GapLateBytes: bytes land after a cut-off Write answered.
	GapLateBytes = "late bytes"
	// GapLandedOnRefusal: part of a refused batch is counted by
	// Inbound.Landed.
	GapLandedOnRefusal = "landed on refusal"
	// GapRefusedAsAborted: a refusal the receiver's NIC makes (a stale or
	// revoked key, a region smaller than resolved) reaches the sender as
	// one remote access error, Aborted, not the receiver's own class.
	GapRefusedAsAborted = "refused as aborted"
)

// gap fails t with msg or, when the factory declared the check a known
// gap, logs msg with the reason and lets the test go on.
func gap(t testing.TB, f Factory, check, msg string) {
	t.Helper()
	if why, ok := f.Gaps[check]; ok {
		t.Logf("KNOWN GAP %q: %s (%s)", check, msg, why)
		return
	}
	t.Fatal(msg)
}

// Run runs the suite against f.
func Run(t *testing.T, f Factory) {
	t.Run("Kind", func(t *testing.T) { testKind(t, f) })
	t.Run("LandsEveryBlock", func(t *testing.T) { testLands(t, f) })
	t.Run("Refusals", func(t *testing.T) { testRefusals(t, f) })
	t.Run("Deadline", func(t *testing.T) { testCutOff(t, f, false) })
	t.Run("Cancel", func(t *testing.T) { testCutOff(t, f, true) })
	t.Run("CloseTwice", func(t *testing.T) { testCloseTwice(t, f) })
	t.Run("ConcurrentWrites", func(t *testing.T) { testConcurrent(t, f) })
	t.Run("Prepared", func(t *testing.T) { testPrepared(t, f) })
	t.Run("Rekey", func(t *testing.T) { testRekey(t, f) })
	t.Run("KeyCaps", func(t *testing.T) { testKeyCaps(t, f) })
	t.Run("Blocks", func(t *testing.T) { testBlocks(t, f) })
	t.Run("BlocksCancel", func(t *testing.T) { testBlocksCancel(t, f) })
	t.Run("ReadLandsEveryBlock", func(t *testing.T) { testReadLands(t, f) })
	t.Run("ReadRefusals", func(t *testing.T) { testReadRefusals(t, f) })
	t.Run("ReadDeadline", func(t *testing.T) { testReadCutOff(t, f, false) })
	t.Run("ReadCancel", func(t *testing.T) { testReadCutOff(t, f, true) })
	t.Run("BlocksRead", func(t *testing.T) { testBlocksRead(t, f) })
	t.Run("Warm", func(t *testing.T) { testWarm(t, f) })
}

// rig is one started Pair with the suite's Inbounds and a conn.
type rig struct {
	f        Factory
	p        *Pair
	sin, rin *Inbound
	conn     transport.Conn
	caps     transport.Caps
}

func start(t testing.TB, f Factory) *rig {
	t.Helper()
	r := &rig{f: f, sin: newInbound(f.Kind), rin: newInbound(f.Kind)}
	r.p = f.New(t, r.sin, r.rin)
	switch d, ok := transport.Lookup(f.Kind); {
	case f.Caps != nil:
		r.caps = *f.Caps
	case ok:
		r.caps = d.CapsFor(r.p.Sender)
	default:
		t.Fatalf("no driver of kind %s is registered and the factory gives no Caps", f.Kind)
	}
	t.Cleanup(func() {
		_ = r.p.Sender.Close()
		_ = r.p.Receiver.Close()
		for _, in := range []*Inbound{r.sin, r.rin} {
			if err := in.kindErr(); err != nil {
				t.Errorf("the transport named the wrong kind to its Inbound: %v", err)
			}
		}
	})
	r.connect(t)
	return r
}

func (r *rig) connect(t testing.TB) {
	t.Helper()
	c, err := r.p.Connect(context.Background())
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	r.conn = c
	t.Cleanup(func() { _ = c.Close() })
}

// fresh replaces the conn when it reports itself broken, as the peer
// manager does.
func (r *rig) fresh(t testing.TB) {
	t.Helper()
	if r.conn.Err() != nil {
		_ = r.conn.Close()
		r.connect(t)
	}
}

func (r *rig) memory(t testing.TB, size int) memory.Memory {
	t.Helper()
	if r.f.Memory != nil {
		return r.f.Memory(t, size)
	}
	return AnonMemory(t, size)
}

// AnonMemory is size bytes of anonymous host memory, unmapped at the end
// of t.
func AnonMemory(t testing.TB, size int) memory.Memory {
	t.Helper()
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return memory.Memory{Kind: memory.Host, Addr: addrOf(b), Host: b, Len: uint64(size), DmabufFD: -1}
}

// register registers size bytes of fresh memory with tr (who: "sender"
// or "receiver", for the message), closed at the end of t.
func (r *rig) register(t testing.TB, tr transport.Transport, who string, size int) (transport.Registration, memory.Memory) {
	t.Helper()
	m := r.memory(t, size)
	reg, err := tr.Register(m)
	if err != nil {
		t.Fatalf("%s Register: %v", who, err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	return reg, m
}

// source registers size bytes with the sender.
func (r *rig) source(t testing.TB, size int) (transport.Registration, []byte) {
	t.Helper()
	reg, m := r.register(t, r.p.Sender, "sender", size)
	return reg, m.Host
}

// dest registers size bytes with the receiver and indexes its key, as the
// registry does for an exported region.
func (r *rig) dest(t testing.TB, size int) (transport.Registration, transport.RemoteRegion, []byte) {
	t.Helper()
	reg, m := r.register(t, r.p.Receiver, "receiver", size)
	r.rin.add(reg.Key().Key, m)
	return reg, r.remote(reg, uint64(size)), m.Host
}

func (r *rig) remote(reg transport.Registration, size uint64) transport.RemoteRegion {
	if r.p.Remote != nil {
		return r.p.Remote(reg, size)
	}
	return transport.RemoteRegion{Name: "conformance", Size: size, Key: reg.Key()}
}

// wants says whether the kind's Caps declare o.
func (r *rig) wants(o Optional) bool {
	c := r.caps
	switch o {
	case Prepare:
		return c.Prepared
	case Read:
		return c.Ops&transport.OpRead != 0
	case Rekey:
		return c.Keys.Rekey
	}
	return false
}

// declared fails t when the kind's declaration of o disagrees with what
// it has, and says whether to run o's checks.
func (r *rig) declared(t *testing.T, o Optional, has bool) bool {
	t.Helper()
	switch want := r.wants(o); {
	case want && !has:
		t.Fatalf("the %s transport declares %v in its Caps, and does not implement it", r.f.Kind, o)
	case !want && has:
		t.Fatalf("the %s transport implements %v and its Caps do not declare it", r.f.Kind, o)
	case !has:
		t.Skipf("%s has no %v (as declared)", r.f.Kind, o)
	}
	return true
}

func testKind(t *testing.T, f Factory) {
	r := start(t, f)
	for _, tr := range []transport.Transport{r.p.Sender, r.p.Receiver} {
		if k := tr.Kind(); k != f.Kind {
			t.Fatalf("Kind() = %q, the factory says %q", k, f.Kind)
		}
	}
	t.Run("Caps", func(t *testing.T) {
		if r.caps.Ops&transport.OpWrite == 0 {
			t.Fatalf("Caps.Ops = %v: every kind writes", r.caps.Ops)
		}
		if r.f.Memory == nil && !r.caps.Supports(memory.Host) {
			t.Fatalf("Caps.Memory = %v lacks host memory, which the suite moved", r.caps.Memory)
		}
	})
	t.Run("Advertise", func(t *testing.T) {
		if a := r.p.Receiver.Advertise(); a.Kind != "" && a.Kind != f.Kind {
			t.Fatalf("Advertise().Kind = %q, want %q (or none: the daemon sets it)", a.Kind, f.Kind)
		}
	})
	t.Run("Status", func(t *testing.T) {
		st := r.p.Receiver.Status()
		if res := st.Resources; res.Connections < 0 || res.QueuePairs < 0 || res.MemoryRegions < 0 {
			t.Fatalf("Status().Resources = %+v", res)
		}
		if (st.Rails != nil) != r.caps.Keys.Rails {
			t.Fatalf("Status() lists %d rails, and Caps.Keys.Rails is %v", len(st.Rails), r.caps.Keys.Rails)
		}
	})
}
