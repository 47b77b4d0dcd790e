package region

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/transport"
)

// TestRegionIDsOfAnotherIncarnation: a client holding a region of a daemon
// that was restarted still names it by its id, and its channel reaches the
// new daemon on the same socket as the same uid. The id must not name
// another client's region there: before, ids counted from r1 in every
// daemon, so the stale client's push sent another process's bytes and its
// close deregistered that process's region.
func TestRegionIDsOfAnotherIncarnation(t *testing.T) {
	shm := filepath.Join(t.TempDir(), "shm") // restarted on the same --shm-dir
	for _, tc := range []struct {
		name          string
		before, after int
	}{
		{"one each", 1, 1},
		{"more after", 2, 16},
		{"more before", 16, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, err := New(Config{ShmDir: shm, Transports: []transport.Transport{newFake(transport.TCP)}})
			must(t, err)
			var stale []string
			for range tc.before {
				r, err := old.AllocHost(4096, Export{}, alice)
				must(t, err)
				stale = append(stale, r.ID)
			}
			old.Close()

			g, err := New(Config{ShmDir: shm, Transports: []transport.Transport{newFake(transport.TCP)}})
			must(t, err)
			defer g.Close()
			for range tc.after {
				_, err := g.AllocHost(4096, Export{}, alice)
				must(t, err)
			}
			for _, id := range stale {
				if _, _, err := g.Acquire(id, "src_region_id", alice); !errors.Is(err, errs.ErrNotFound) {
					t.Fatalf("Acquire(%s), a region of the old daemon, on the new one: %v; want NotFound", id, err)
				}
				if err := g.Deregister(id, alice); !errors.Is(err, errs.ErrNotFound) {
					t.Fatalf("Deregister(%s), a region of the old daemon, on the new one: %v; want NotFound", id, err)
				}
			}
		})
	}
}
