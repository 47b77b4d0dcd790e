package region

import (
	"context"
	"errors"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// rekeyTransport registers memory under counting keys that Rekey replaces.
type rekeyTransport struct {
	transport.Quiet
	next  uint64
	fail  bool
	calls int
}

type rekeyReg struct {
	transport.SingleKey
	t   *rekeyTransport
	mem memory.Memory
	key uint64
}

func (t *rekeyTransport) Kind() transport.Kind { return transport.Verbs }
func (t *rekeyTransport) Register(m memory.Memory) (transport.Registration, error) {
	t.next++
	return &rekeyReg{t: t, mem: m, key: t.next}, nil
}
func (t *rekeyTransport) Connect(context.Context, transport.Peer) (transport.Conn, error) {
	return nil, errs.ErrUnimplemented
}
func (t *rekeyTransport) Close() error { return nil }

func (r *rekeyReg) Memory() memory.Memory    { return r.mem }
func (r *rekeyReg) Key() transport.RemoteKey { return transport.RemoteKey{Key: r.key} }
func (r *rekeyReg) Close() error             { return nil }
func (r *rekeyReg) Rekey() (transport.RemoteKey, error) {
	r.t.calls++
	if r.t.fail {
		return transport.RemoteKey{}, errors.New("rekey failed")
	}
	old := r.Key()
	r.t.next++
	r.key = r.t.next
	return old, nil
}

func TestNarrows(t *testing.T) {
	for _, tc := range []struct {
		oldName string
		oldTo   []string
		e       Export
		want    bool
	}{
		{"", nil, Export{Name: "x"}, false},
		{"x", nil, Export{}, true},
		{"x", []string{"a"}, Export{}, true},
		{"x", nil, Export{Name: "x", To: []string{"a"}}, true},
		{"x", []string{"a"}, Export{Name: "x"}, false},
		{"x", []string{"a"}, Export{Name: "y", To: []string{"a"}}, false},
		{"x", []string{"a"}, Export{Name: "x", To: []string{"b", "a"}}, false},
		{"x", []string{"a", "b"}, Export{Name: "x", To: []string{"b"}}, true},
		{"x", []string{"a"}, Export{Name: "x", To: []string{"b"}}, true},
	} {
		if got := narrows(tc.oldName, tc.oldTo, tc.e); got != tc.want {
			t.Errorf("narrows(%q, %v, %+v) = %v, want %v", tc.oldName, tc.oldTo, tc.e, got, tc.want)
		}
	}
}

// SetExport rekeys a region whose export narrows or is removed: the old key
// no longer pins, the new one does; widening keeps the key.
func TestSetExportRevokesKeys(t *testing.T) {
	tr := &rekeyTransport{}
	g, err := New(Config{ShmDir: t.TempDir(), Transports: []transport.Transport{tr}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	r, err := g.AllocHost(4096, Export{Name: "kv"}, Caller{})
	if err != nil {
		t.Fatal(err)
	}
	key := func() uint64 { reg, _ := r.Registration(transport.Verbs); return reg.Key().Key }
	pins := func(k uint64) bool {
		_, release, err := g.Pins().Pin(transport.Verbs, k)
		if err == nil {
			release()
		}
		return err == nil
	}
	k0 := key()
	if !pins(k0) {
		t.Fatal("the first key does not pin")
	}
	if _, err := g.SetExport(r.ID, Export{Name: "kv", To: []string{"b"}}, Root); err != nil { // narrowed
		t.Fatal(err)
	}
	k1 := key()
	if k1 == k0 || pins(k0) || !pins(k1) {
		t.Fatalf("after narrowing: key %d -> %d, old pins %v, new pins %v", k0, k1, pins(k0), pins(k1))
	}
	if _, err := g.SetExport(r.ID, Export{Name: "kv"}, Root); err != nil { // widened
		t.Fatal(err)
	}
	if key() != k1 {
		t.Fatal("widening the export changed the key")
	}
	if _, err := g.SetExport(r.ID, Export{Name: "kv2"}, Root); err != nil { // renamed
		t.Fatal(err)
	}
	if key() != k1 {
		t.Fatal("renaming the export changed the key")
	}
	if _, err := g.SetExport(r.ID, Export{}, Root); err != nil { // removed
		t.Fatal(err)
	}
	k2 := key()
	if k2 == k1 || pins(k1) {
		t.Fatalf("after removal: key %d -> %d, old pins %v", k1, k2, pins(k1))
	}
	// A failed rekey refuses the narrowing and leaves the export as it was.
	if _, err := g.SetExport(r.ID, Export{Name: "kv"}, Root); err != nil {
		t.Fatal(err)
	}
	tr.fail = true
	if _, err := g.SetExport(r.ID, Export{Name: "kv", To: []string{"b"}}, Root); err == nil {
		t.Fatal("narrowing succeeded although the key could not be revoked")
	}
	if _, release, err := g.Lookup("kv", "c"); err != nil {
		t.Fatalf("the export changed although the narrowing failed: %v", err)
	} else {
		release()
	}
	if err := g.Deregister(r.ID, Root); err != nil {
		t.Fatal(err)
	}
	if pins(key()) {
		t.Fatal("a deregistered region's key pins")
	}
}

// accessTransport's registrations make a read key of their own lazily
// (KeyFor), and Rekey retires it, as verbs' MRs per access
// set do.
type accessTransport struct{ rekeyTransport }

type accessReg struct {
	rekeyReg
	read  uint64 // 0: none made (or retired)
	reads int    // read keys made
}

func (t *accessTransport) Register(m memory.Memory) (transport.Registration, error) {
	t.next++
	return &accessReg{rekeyReg: rekeyReg{t: &t.rekeyTransport, mem: m, key: t.next}}, nil
}

func (r *accessReg) KeyFor(a transport.Access) (transport.RemoteKey, error) {
	if a != transport.AccessRead {
		return r.Key(), nil
	}
	if r.read == 0 {
		r.t.next++
		r.read = r.t.next
		r.reads++
	}
	return transport.RemoteKey{Key: r.read}, nil
}

func (r *accessReg) Rekey() (transport.RemoteKey, error) {
	r.read = 0
	return r.rekeyReg.Rekey()
}

// A region whose export grants no readers has no read key (over verbs no
// MR with remote READ access: a region gets one only to regions readable
// by some peer); granting readers makes one, which pins reads; narrowing
// the writers moves the read index to the new read key; taking the readers
// away un-indexes it and makes none.
func TestReadKeyOnlyWithReaders(t *testing.T) {
	tr := &accessTransport{}
	g, err := New(Config{ShmDir: t.TempDir(), Transports: []transport.Transport{tr}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	r, err := g.AllocHost(4096, Export{Name: "kv"}, Caller{})
	if err != nil {
		t.Fatal(err)
	}
	reg, _ := r.Registration(transport.Verbs)
	ar := reg.(*accessReg)
	pinsRead := func(k uint64) bool {
		_, release, err := g.Pins().PinRead(transport.Verbs, k)
		if err == nil {
			release()
		}
		return err == nil
	}
	if ar.reads != 0 {
		t.Fatalf("a write-only region made %d read keys, want 0", ar.reads)
	}
	if _, err := g.SetExport(r.ID, Export{Name: "kv", Readers: []string{AnyPeer}}, Root); err != nil {
		t.Fatal(err)
	}
	k0 := ar.read
	if ar.reads != 1 || !pinsRead(k0) {
		t.Fatalf("readers granted: %d read keys made, key %d pins %v; want 1 that pins", ar.reads, k0, pinsRead(k0))
	}
	if _, err := g.SetExport(r.ID, Export{Name: "kv", To: []string{"b"}, Readers: []string{AnyPeer}}, Root); err != nil { // writers narrowed
		t.Fatal(err)
	}
	k1 := ar.read
	if k1 == 0 || k1 == k0 || pinsRead(k0) || !pinsRead(k1) {
		t.Fatalf("writers narrowed: read key %d -> %d, old pins %v, new pins %v", k0, k1, pinsRead(k0), pinsRead(k1))
	}
	made := ar.reads
	if _, err := g.SetExport(r.ID, Export{Name: "kv", To: []string{"b"}}, Root); err != nil { // readers taken away
		t.Fatal(err)
	}
	if pinsRead(k1) || ar.reads != made {
		t.Fatalf("readers taken away: old read key pins %v, read keys made %d -> %d", pinsRead(k1), made, ar.reads)
	}
	if err := g.Deregister(r.ID, Root); err != nil {
		t.Fatal(err)
	}
	if ar.reads != made {
		t.Fatalf("deregistration made a read key (%d -> %d)", made, ar.reads)
	}
}
