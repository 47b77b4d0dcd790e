package region

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

func evalOr(p string) string {
	if real, err := filepath.EvalSymlinks(p); err == nil {
		return real
	}
	return p
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestExportChecks(t *testing.T) {
	long := strings.Repeat("n", MaxNameLen)
	for _, tc := range []struct {
		name  string
		e     Export
		err   error
		words []string
	}{
		{"every allowed character", Export{Name: "az-AZ_09./:"}, nil, nil},
		{"longest name", Export{Name: long}, nil, nil},
		{"name too long", Export{Name: long + "n"}, errs.ErrInvalidArgument, []string{"export_name", fmt.Sprint(MaxNameLen + 1), fmt.Sprint(MaxNameLen)}},
		{"space", Export{Name: "kv cache"}, errs.ErrInvalidArgument, []string{"export_name", `' '`, "byte 2"}},
		{"non-ASCII", Export{Name: "kvé"}, errs.ErrInvalidArgument, []string{"export_name", "byte 2"}},
		{"NUL", Export{Name: "kv\x00"}, errs.ErrInvalidArgument, []string{"export_name"}},
		{"export_to without a name", Export{To: []string{"b"}}, errs.ErrInvalidArgument, []string{"export_to", "export_name is empty"}},
		{"empty peer", Export{Name: "kv", To: []string{"b", ""}}, errs.ErrInvalidArgument, []string{"export_to[1]"}},
		{"peer too long", Export{Name: "kv", To: []string{strings.Repeat("p", 254)}}, errs.ErrInvalidArgument, []string{"export_to[0]", "253"}},
		{"longest peer", Export{Name: "kv", To: []string{strings.Repeat("p", 253)}}, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newRegistry(t)
			// At registration...
			r, err := g.AllocHost(4096, tc.e, alice)
			if tc.err != nil {
				wantErr(t, err, tc.err, tc.words...)
			} else if err != nil {
				t.Fatal(err)
			} else if r.Export != tc.e.Name || !slices.Equal(r.ExportTo, tc.e.To) {
				t.Fatalf("exported as %q to %v, want %q to %v", r.Export, r.ExportTo, tc.e.Name, tc.e.To)
			} else {
				must(t, g.Deregister(r.ID, alice)) // frees the name for SetExport
			}
			// ... and later.
			r, err = g.AllocHost(4096, Export{}, alice)
			if err != nil {
				t.Fatal(err)
			}
			_, err = g.SetExport(r.ID, tc.e, alice)
			if tc.err != nil {
				wantErr(t, err, tc.err, tc.words...)
				if r.Export != "" {
					t.Fatalf("a refused export set the name %q", r.Export)
				}
			} else if err != nil {
				t.Fatal(err)
			} else if r.Export != tc.e.Name {
				t.Fatalf("SetExport: exported as %q, want %q", r.Export, tc.e.Name)
			}
		})
	}
}

func TestExportNameUnique(t *testing.T) {
	tr := newFake(transport.TCP)
	g := newRegistry(t, tr)
	a, err := g.AllocHost(4096, Export{Name: "kv"}, alice)
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.AllocHost(4096, Export{Name: "kv"}, bob)
	wantErr(t, err, errs.ErrAlreadyExists, "export_name", `"kv"`)
	if n, f, o := g.Len(), regionFiles(t, g.ShmDir()), tr.open(t); n != 1 || len(f) != 1 || o != 1 {
		t.Fatalf("after the refused duplicate: %d regions, files %v, %d registrations open; want 1 of each", n, f, o)
	}
	b, err := g.AllocHost(4096, Export{Name: "other"}, bob)
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.SetExport(b.ID, Export{Name: "kv"}, bob)
	wantErr(t, err, errs.ErrAlreadyExists, "export_name", `"kv"`, a.ID)
	if b.Export != "other" {
		t.Fatalf("a refused rename changed the export to %q", b.Export)
	}
	// Setting its own name again is no conflict; renaming frees the old one.
	if _, err := g.SetExport(a.ID, Export{Name: "kv", To: []string{"x"}}, alice); err != nil {
		t.Fatal(err)
	}
	if _, err := g.SetExport(a.ID, Export{Name: "kv2"}, alice); err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.Lookup("kv", ""); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("old name still resolves after the rename: %v", err)
	}
	if _, err := g.SetExport(b.ID, Export{Name: "kv"}, bob); err != nil {
		t.Fatal(err)
	}
	// A deregistered region's name is free again.
	must(t, g.Deregister(a.ID, alice))
	if _, err := g.AllocHost(4096, Export{Name: "kv2"}, bob); err != nil {
		t.Fatal(err)
	}
	// Un-exporting drops export_to along with the name.
	r, err := g.SetExport(b.ID, Export{}, bob)
	if err != nil || r.Export != "" || r.ExportTo != nil {
		t.Fatalf("un-export: %v, export %q to %v", err, r.Export, r.ExportTo)
	}
}

// holds names the three ways of holding a region.
type holder struct {
	name string
	hold func(g *Registry, r *Region) (func(), error)
}

var holders = []holder{
	{"Acquire", func(g *Registry, r *Region) (func(), error) {
		_, rel, err := g.Acquire(r.ID, "src_region_id", r.Owner)
		return rel, err
	}},
	{"Lookup", func(g *Registry, r *Region) (func(), error) {
		_, rel, err := g.Lookup(r.Export, "")
		return rel, err
	}},
	{"Pin", func(g *Registry, r *Region) (func(), error) {
		reg, _ := r.Registration(transport.TCP)
		_, rel, err := g.Pins().Pin(transport.TCP, reg.Key().Key)
		return rel, err
	}},
}

func TestRefcounting(t *testing.T) {
	for _, h := range holders {
		t.Run(h.name, func(t *testing.T) {
			tr := newFake(transport.TCP)
			g := newRegistry(t, tr)
			r, err := g.AllocHost(4096, Export{Name: "kv"}, alice)
			if err != nil {
				t.Fatal(err)
			}
			rel1, err := h.hold(g, r)
			must(t, err)
			rel2, err := h.hold(g, r)
			must(t, err)
			if s := g.List(alice); len(s) != 1 || s[0].Active != 2 {
				t.Fatalf("List after two holds: %+v, want one region, active 2", s)
			}
			wantErr(t, g.Deregister(r.ID, alice), errs.ErrFailedPrecondition, r.ID, "in use by 2")
			rel1()
			wantErr(t, g.Deregister(r.ID, alice), errs.ErrFailedPrecondition, "in use by 1")
			if _, err := os.Stat(r.ShmPath); err != nil || tr.open(t) != 1 {
				t.Fatalf("a refused deregistration released the region: %v, %d open", err, tr.open(t))
			}
			rel2()
			if s := g.List(alice); s[0].Active != 0 {
				t.Fatalf("active %d after every release", s[0].Active)
			}
			must(t, g.Deregister(r.ID, alice))
			if _, err := os.Stat(r.ShmPath); !errors.Is(err, os.ErrNotExist) || tr.open(t) != 0 {
				t.Fatalf("deregistered region: file %v, %d open", err, tr.open(t))
			}
			// Gone for every way in.
			wantErr(t, g.Deregister(r.ID, alice), errs.ErrNotFound, "region_id", r.ID)
			_, err = h.hold(g, r)
			wantErr(t, err, errs.ErrNotFound)
		})
	}
}

func TestAcquire(t *testing.T) {
	g := newRegistry(t, newFake(transport.TCP))
	r, err := g.AllocHost(4096, Export{}, alice)
	must(t, err)
	_, _, err = g.Acquire("r99", "src_region_id", alice)
	wantErr(t, err, errs.ErrNotFound, "src_region_id", "r99")
	_, _, err = g.Acquire(r.ID, "src_region_id", bob)
	wantErr(t, err, errs.ErrPermissionDenied, "src_region_id", r.ID, "uid 1000", "uid 1001")
	got, rel, err := g.Acquire(r.ID, "src_region_id", Root)
	must(t, err)
	if got != r {
		t.Fatalf("Acquire(%s) returned region %s", r.ID, got.ID)
	}
	rel()
}

func TestLookup(t *testing.T) {
	g := newRegistry(t, newFake(transport.TCP))
	_, _, err := g.Lookup("kv", "b")
	wantErr(t, err, errs.ErrNotFound, `"kv"`)
	r, err := g.AllocHost(4096, Export{Name: "kv", To: []string{"b", "c"}}, alice)
	must(t, err)
	for _, tc := range []struct {
		peer  string
		err   error
		words []string
	}{
		{"b", nil, nil},
		{"c", nil, nil},
		{"d", errs.ErrPermissionDenied, []string{"d may not write", `"kv"`}},
		{"", errs.ErrPermissionDenied, []string{"unauthenticated peer"}},
	} {
		got, rel, err := g.Lookup("kv", tc.peer)
		if tc.err != nil {
			wantErr(t, err, tc.err, tc.words...)
			continue
		}
		must(t, err)
		if got != r {
			t.Fatalf("Lookup(kv, %s) returned %s", tc.peer, got.ID)
		}
		rel()
	}
	// Widened to every peer.
	_, err = g.SetExport(r.ID, Export{Name: "kv"}, alice)
	must(t, err)
	_, rel, err := g.Lookup("kv", "d")
	must(t, err)
	rel()
}

func TestPin(t *testing.T) {
	tr := newFake(transport.TCP)
	g := newRegistry(t, tr)
	_, _, err := g.Pins().Pin(transport.TCP, 1)
	wantErr(t, err, errs.ErrNotFound, "tcp", "0x1")
	r, err := g.AllocHost(4096, Export{}, alice)
	must(t, err)
	reg, _ := r.Registration(transport.TCP)
	key := reg.Key().Key
	_, _, err = g.Pins().Pin(transport.TCP, key)
	wantErr(t, err, errs.ErrNotFound, r.ID, "no longer exported")
	_, _, err = g.Pins().Pin(transport.Verbs, key)
	wantErr(t, err, errs.ErrNotFound, "verbs")
	_, err = g.SetExport(r.ID, Export{Name: "kv"}, alice)
	must(t, err)
	m, rel, err := g.Pins().Pin(transport.TCP, key)
	must(t, err)
	if m.Addr != r.Mem.Addr || m.Len != r.Mem.Len {
		t.Fatalf("Pin returned %#x+%d, want the region's %#x+%d", m.Addr, m.Len, r.Mem.Addr, r.Mem.Len)
	}
	rel()
	// Un-exporting revokes the key a peer may still hold.
	_, err = g.SetExport(r.ID, Export{}, alice)
	must(t, err)
	_, _, err = g.Pins().Pin(transport.TCP, key)
	wantErr(t, err, errs.ErrNotFound, "no longer exported")
}

func TestOwnership(t *testing.T) {
	g := newRegistry(t, newFake(transport.TCP))
	owners := []Caller{alice, bob, tlsAnna, anon, alice, Root, bob, alice, tlsAnna, anon, alice, bob}
	ids := map[Caller][]string{}
	var all []string
	for _, o := range owners {
		r, err := g.AllocHost(4096, Export{}, o)
		must(t, err)
		if r.Owner != o {
			t.Fatalf("region %s owner %v, want %v", r.ID, r.Owner, o)
		}
		ids[o] = append(ids[o], r.ID)
		all = append(all, r.ID)
	}
	list := func(who Caller) []string {
		var out []string
		for _, s := range g.List(who) {
			out = append(out, s.ID)
		}
		return out
	}
	for _, tc := range []struct {
		who  Caller
		want []string
	}{
		{alice, ids[alice]},
		{bob, ids[bob]},
		{tlsAnna, ids[tlsAnna]},
		{anon, ids[anon]},
		{Caller{Identity: "other"}, nil},
		{Root, all}, // by number: r2 before r10
	} {
		if got := list(tc.who); !slices.Equal(got, tc.want) {
			t.Errorf("List(%v) = %v, want %v", tc.who, got, tc.want)
		}
	}
	a := ids[alice][0]
	wantErr(t, g.Deregister(a, bob), errs.ErrPermissionDenied, "region_id", a, "uid 1000", "uid 1001")
	_, err := g.SetExport(a, Export{Name: "x"}, tlsAnna)
	wantErr(t, err, errs.ErrPermissionDenied, "region_id", a, `TLS identity "anna.example"`)
	_, err = g.SetExport(a, Export{Name: "x"}, anon)
	wantErr(t, err, errs.ErrPermissionDenied, "unauthenticated TCP caller")
	_, err = g.SetExport("r999", Export{Name: "x"}, Root)
	wantErr(t, err, errs.ErrNotFound, "region_id", "r999")
	if g.Len() != len(owners) {
		t.Fatalf("%d regions after refused calls, want %d", g.Len(), len(owners))
	}
	must(t, g.Deregister(ids[anon][0], anon))
	must(t, g.Deregister(ids[tlsAnna][0], tlsAnna))
	must(t, g.Deregister(a, Root))
	if g.Len() != len(owners)-3 {
		t.Fatalf("%d regions, want %d", g.Len(), len(owners)-3)
	}
}

func TestCallerString(t *testing.T) {
	for _, tc := range []struct {
		c    Caller
		want string
	}{
		{alice, "uid 1000"},
		{Root, "uid 0"},
		{tlsAnna, `TLS identity "anna.example"`},
		{anon, "an unauthenticated TCP caller"},
	} {
		if got := tc.c.String(); got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.c, got, tc.want)
		}
	}
}
