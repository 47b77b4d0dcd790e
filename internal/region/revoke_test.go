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
	next  uint64
	fail  bool
	calls int
}

type rekeyReg struct {
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
		_, release, err := g.Pin(transport.Verbs, k)
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
