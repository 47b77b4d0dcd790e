package transport

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
)

func newNothing(Env) (Transport, error) { return nil, errors.New("not started in this test") }

func TestRegistryRefusals(t *testing.T) {
	cases := []struct {
		name string
		d    Driver
		want error
	}{
		{"empty kind", Driver{New: newNothing}, errs.ErrInvalidArgument},
		{"no New", Driver{Kind: "x"}, errs.ErrInvalidArgument},
		{"twice", Driver{Kind: "a", New: newNothing}, errs.ErrAlreadyExists},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r Registry
			if err := r.Register(Driver{Kind: "a", New: newNothing, Caps: Caps{Rank: 1}}); err != nil {
				t.Fatal(err)
			}
			err := r.Register(c.d)
			if !errors.Is(err, c.want) {
				t.Fatalf("Register(%+v) = %v, want %v", c.d, err, c.want)
			}
			ds, rerr := r.Registered()
			if !errors.Is(rerr, c.want) {
				t.Fatalf("Registered kept %v, want the refusal %v", rerr, c.want)
			}
			if len(ds) != 1 || ds[0].Kind != "a" || ds[0].Caps.Rank != 1 {
				t.Fatalf("the refused driver replaced or joined the first: %+v", ds)
			}
		})
	}
}

func TestRegisteredByRank(t *testing.T) {
	var r Registry
	for _, d := range []Driver{
		{Kind: "tcp", Caps: Caps{Rank: 10}},
		{Kind: "local", Caps: Caps{Rank: 30, SameHostOnly: true}},
		{Kind: "verbs", Caps: Caps{Rank: 20}},
		{Kind: "beta", Caps: Caps{Rank: 10}},
	} {
		d.New = newNothing
		if err := r.Register(d); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := r.Registered()
	if err != nil {
		t.Fatal(err)
	}
	var got []Kind
	for _, d := range ds {
		got = append(got, d.Kind)
	}
	want := []Kind{"local", "verbs", "beta", "tcp"}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v (rank, then kind)", got, want)
		}
	}
	if d, ok := r.Lookup("verbs"); !ok || d.Caps.Rank != 20 {
		t.Fatalf("Lookup(verbs) = %+v, %v", d, ok)
	}
	if _, ok := r.Lookup("nope"); ok {
		t.Fatal("Lookup found an unregistered kind")
	}
}

// TestRegisterCopiesCaps: a driver that reuses its Memory slice after
// registering cannot change what the registry declared.
func TestRegisterCopiesCaps(t *testing.T) {
	var r Registry
	mem := []memory.Kind{memory.Host}
	if err := r.Register(Driver{Kind: "k", New: newNothing, Caps: Caps{Memory: mem}}); err != nil {
		t.Fatal(err)
	}
	mem[0] = memory.CUDA
	d, _ := r.Lookup("k")
	if !d.Caps.Supports(memory.Host) || d.Caps.Supports(memory.CUDA) {
		t.Fatalf("caps %+v changed with the caller's slice", d.Caps)
	}
}

func TestCheckUsable(t *testing.T) {
	why := errors.New("peer is on another host")
	for _, c := range []struct {
		name   string
		usable func(Transport, []byte) error
		want   error
	}{
		{"nil Usable", nil, nil},
		{"usable", func(Transport, []byte) error { return nil }, nil},
		{"refused", func(_ Transport, advert []byte) error {
			if string(advert) != "boot-b" {
				t.Fatalf("Usable got advert %q", advert)
			}
			return why
		}, why},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := Driver{Kind: "local", New: newNothing, Usable: c.usable}
			err := d.CheckUsable(nil, []byte("boot-b"))
			if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
				t.Fatalf("CheckUsable = %v, want %v", err, c.want)
			}
		})
	}
}

// TestCapsLacks: a need is met only when every op and the memory kind are
// in the Caps; the refusal is FailedPrecondition naming the kind and what
// it lacks. CapsFor prefers CapsOf's answer for the transport at hand.
func TestCapsLacks(t *testing.T) {
	rw := Caps{Ops: OpWrite | OpRead, Memory: []memory.Kind{memory.Host}}
	wo := Caps{Ops: OpWrite, Memory: []memory.Kind{memory.Host, memory.CUDA}}
	for _, c := range []struct {
		name string
		caps Caps
		need Need
		msg  string // "": met
	}{
		{"write on a reader", rw, Need{Op: OpWrite, Memory: memory.Host}, ""},
		{"read on a reader", rw, Need{Op: OpRead}, ""},
		{"read on a writer", wo, Need{Op: OpRead, Memory: memory.Host}, "transport k cannot read (pull) (its capabilities: write (push))"},
		{"GPU memory on a host-only kind", rw, Need{Op: OpWrite, Memory: memory.CUDA}, "transport k cannot move cuda memory"},
		{"nothing declared", Caps{}, Need{Op: OpWrite}, "transport k cannot write (push) (its capabilities: no operation)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.caps.Lacks("k", c.need)
			if c.msg == "" {
				if err != nil {
					t.Fatalf("Lacks = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, errs.ErrFailedPrecondition) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("Lacks = %v, want FailedPrecondition saying %q", err, c.msg)
			}
		})
	}
	d := Driver{Kind: "k", Caps: rw, CapsOf: func(Transport) Caps { return wo }}
	if got := d.CapsFor(nil); got.Ops != rw.Ops {
		t.Fatalf("CapsFor(nil) = %+v, want the declared Caps", got)
	}
	if got := d.CapsFor(nothing{}); got.Ops != wo.Ops || !got.Supports(memory.CUDA) {
		t.Fatalf("CapsFor = %+v, want CapsOf's", got)
	}
}

// nothing is a Transport that does nothing, for CapsOf.
type nothing struct{ Quiet }

func (nothing) Kind() Kind                                   { return "k" }
func (nothing) Register(memory.Memory) (Registration, error) { return nil, errors.ErrUnsupported }
func (nothing) Connect(context.Context, Peer) (Conn, error)  { return nil, errors.ErrUnsupported }
func (nothing) Close() error                                 { return nil }
