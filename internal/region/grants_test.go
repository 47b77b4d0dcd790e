package region

import (
	"errors"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

func TestGrants(t *testing.T) {
	r, w := transport.AccessRead, transport.AccessWrite
	for _, c := range []struct {
		name string
		e    Export
		peer string
		a    transport.Access
		ok   bool
	}{
		{"default export is writable by all", Export{Name: "x"}, "p", w, true},
		{"default export is not readable", Export{Name: "x"}, "p", r, false},
		{"readers * reads", Export{Name: "x", Readers: []string{AnyPeer}}, "p", r, true},
		{"readers * reads unauthenticated (insecure loopback)", Export{Name: "x", Readers: []string{AnyPeer}}, "", r, true},
		{"named reader", Export{Name: "x", Readers: []string{"a", "b"}}, "b", r, true},
		{"another peer", Export{Name: "x", Readers: []string{"a"}}, "b", r, false},
		{"named reader is not a writer", Export{Name: "x", To: []string{"a"}, Readers: []string{"b"}}, "b", w, false},
		{"read-only refuses writes", Export{Name: "x", Readers: []string{AnyPeer}, ReadOnly: true}, "p", w, false},
		{"read-only reads", Export{Name: "x", Readers: []string{AnyPeer}, ReadOnly: true}, "p", r, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := Grants(c.e, c.peer, c.a, "region", "x")
			if c.ok != (err == nil) {
				t.Fatalf("Grants = %v, want ok %v", err, c.ok)
			}
			if err != nil && !errors.Is(err, errs.ErrPermissionDenied) {
				t.Fatalf("refusal %v is not PermissionDenied", err)
			}
		})
	}
}

func TestNarrowsReaders(t *testing.T) {
	for _, c := range []struct {
		name string
		old  []string
		e    Export
		want bool
	}{
		{"no readers before", nil, Export{Name: "x"}, false},
		{"export removed", []string{"a"}, Export{}, true},
		{"a reader dropped", []string{"a", "b"}, Export{Name: "x", Readers: []string{"a"}}, true},
		{"* to named", []string{AnyPeer}, Export{Name: "x", Readers: []string{"a"}}, true},
		{"named to *", []string{"a"}, Export{Name: "x", Readers: []string{AnyPeer}}, false},
		{"superset", []string{"a"}, Export{Name: "x", Readers: []string{"a", "b"}}, false},
		{"readers cleared", []string{"a"}, Export{Name: "x"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := narrowsReaders("x", c.old, c.e); got != c.want {
				t.Fatalf("narrowsReaders = %v, want %v", got, c.want)
			}
		})
	}
}

// FuzzExportCheck: the export validator never panics and refuses with
// InvalidArgument only.
func FuzzExportCheck(f *testing.F) {
	f.Add("kv", "a", "*", true)
	f.Add("", "", "", false)
	f.Add("x y", "*", "b", false)
	f.Fuzz(func(t *testing.T, name, to, reader string, ro bool) {
		e := Export{Name: name, ReadOnly: ro}
		if to != "" {
			e.To = []string{to}
		}
		if reader != "" {
			e.Readers = []string{reader}
		}
		if err := e.check(); err != nil && !errors.Is(err, errs.ErrInvalidArgument) {
			t.Fatalf("check(%+v) = %v: not InvalidArgument", e, err)
		}
	})
}
