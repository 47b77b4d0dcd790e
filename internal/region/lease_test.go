package region

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// TestLeaseExpire: when a client is gone, its leased regions go (names
// free, files removed, registrations closed); its persistent regions and
// other clients' regions stay; a region a batch still uses goes when the
// batch lets go, and is unreachable meanwhile.
func TestLeaseExpire(t *testing.T) {
	for _, h := range holders {
		t.Run(h.name, func(t *testing.T) {
			tr := newFake(transport.TCP)
			g := newRegistry(t, tr)
			idle, err := g.AllocHost(4096, Export{Name: "kv"}, alice, Lease{Client: 7, PID: 4242})
			must(t, err)
			busy, err := g.AllocHost(4096, Export{Name: "busy"}, alice, Lease{Client: 7, PID: 4242})
			must(t, err)
			kept, err := g.AllocHost(4096, Export{Name: "kept"}, alice, Lease{PID: 4242})
			must(t, err)
			other, err := g.AllocHost(4096, Export{Name: "other"}, alice, Lease{Client: 8, PID: 4343})
			must(t, err)
			if idle.Persist || !kept.Persist || kept.PID != 4242 {
				t.Fatalf("persist: leased %v, unleased %v (pid %d)", idle.Persist, kept.Persist, kept.PID)
			}
			if p, n := g.Leases().Counts(); p != 1 || n != 2 {
				t.Fatalf("Leases = %d persistent, %d holders; want 1, 2", p, n)
			}
			rel, err := h.hold(g, busy)
			must(t, err)

			if now, later := g.Leases().Expire(7); now != 1 || later != 1 {
				t.Fatalf("Expire = %d now, %d later; want 1, 1", now, later)
			}
			if _, err := os.Stat(idle.ShmPath); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the idle region's file after its client left: %v", err)
			}
			// Both names are free at once; the busy region's memory is not.
			for _, name := range []string{"kv", "busy"} {
				r, err := g.AllocHost(4096, Export{Name: name}, bob, Lease{Client: 9})
				if err != nil {
					t.Fatalf("name %q of a gone client: %v", name, err)
				}
				must(t, g.Deregister(r.ID, bob))
			}
			if _, err := os.Stat(busy.ShmPath); err != nil {
				t.Fatalf("a region in use was released under its batch: %v", err)
			}
			wantErr(t, g.Deregister(busy.ID, alice), errs.ErrNotFound, busy.ID)
			rel()
			g.drained.Wait()
			if _, err := os.Stat(busy.ShmPath); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the busy region's file after its batch ended: %v", err)
			}
			var ids []string
			for _, s := range g.List(Root) {
				ids = append(ids, s.ID)
			}
			if strings.Join(ids, ",") != kept.ID+","+other.ID || tr.open(t) != 2 {
				t.Fatalf("left: %v with %d registrations open, want %s,%s and 2", ids, tr.open(t), kept.ID, other.ID)
			}
			if now, later := g.Leases().Expire(0); now+later != 0 {
				t.Fatalf("Expire(0) released %d regions: 0 is no client", now+later)
			}
		})
	}
}

// TestNameTakenNamesTheHolder: a refused export name says which region
// holds it, whose, which process, since when, and whether it persists.
func TestNameTakenNamesTheHolder(t *testing.T) {
	g := newRegistry(t, newFake(transport.TCP))
	a, err := g.AllocHost(4096, Export{Name: "kv-cache"}, alice, Lease{Client: 3, PID: 4242})
	must(t, err)
	_, err = g.AllocHost(4096, Export{Name: "kv-cache"}, alice)
	wantErr(t, err, errs.ErrAlreadyExists, `"kv-cache"`, "region "+a.ID, "uid 1000", "pid 4242", "ago", "leased")
	p, err := g.AllocHost(4096, Export{Name: "weights"}, bob, Lease{PID: 77})
	must(t, err)
	_, err = g.SetExport(a.ID, Export{Name: "weights"}, alice)
	wantErr(t, err, errs.ErrAlreadyExists, `"weights"`, "region "+p.ID, "uid 1001", "pid 77", "persistent")
}

// TestLeasesJoinLeave: the connections of one process are one client,
// whose leased regions go with its last connection, after first let go of
// what else it held; a caller of unknown pid is a client per connection.
func TestLeasesJoinLeave(t *testing.T) {
	g := newRegistry(t, newFake(transport.TCP))
	ls := g.Leases()
	a, b := ls.Join(4242), ls.Join(4242)
	tcp1, tcp2 := ls.Join(0), ls.Join(0)
	if a != b || a.ID == 0 || a.PID != 4242 {
		t.Fatalf("two connections of pid 4242: clients %+v and %+v, want one", a, b)
	}
	if tcp1 == tcp2 || tcp1.ID == a.ID || tcp2.ID == a.ID {
		t.Fatalf("connections of unknown pid share a client: %+v %+v (pid 4242: %+v)", tcp1, tcp2, a)
	}
	r, err := g.AllocHost(4096, Export{Name: "kv"}, alice, a.Lease(4242, false))
	must(t, err)
	kept, err := g.AllocHost(4096, Export{Name: "kept"}, alice, a.Lease(4242, true))
	must(t, err)
	if r.Persist || !kept.Persist || kept.PID != 4242 {
		t.Fatalf("leased region persists %v; persisting one %v (pid %d)", r.Persist, kept.Persist, kept.PID)
	}
	if l := (*Client)(nil).Lease(7, false); l.Client != 0 || l.PID != 7 {
		t.Fatalf("lease of an untracked connection = %+v, want none with pid 7", l)
	}

	if ls.Leave(a, func(*Client) { t.Fatal("first ran while a connection of the client is open") }) {
		t.Fatal("the client is gone with one of its two connections open")
	}
	if g.Len() != 2 {
		t.Fatalf("%d regions after one of two connections closed, want 2", g.Len())
	}
	var firstSaw int
	if !ls.Leave(b, func(c *Client) {
		if c != a {
			t.Errorf("first got client %+v, want %+v", c, a)
		}
		firstSaw = g.Len()
	}) {
		t.Fatal("the client is not gone with its last connection")
	}
	if firstSaw != 2 || g.Len() != 1 {
		t.Fatalf("first saw %d regions and %d are left, want 2 (before expiry) and 1", firstSaw, g.Len())
	}
	if _, err := os.Stat(r.ShmPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the leased region's file after its client left: %v", err)
	}
	if c := ls.Join(4242); c == a {
		t.Fatal("a new connection of pid 4242 joined the gone client")
	}
	if ls.Leave(nil, nil) {
		t.Fatal("Leave(nil) reports a client gone")
	}
}
