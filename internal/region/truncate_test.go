package region

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// pinningTransport registers memory as an MR would: its registrations pin
// the pages (Withdraw; Caps.Keys.Withdraw, pinning below), and say when
// they are withdrawn.
type pinningTransport struct {
	rekeyTransport
	withdrawn chan struct{} // closed by the first Withdraw
	calls     atomic.Int32
}

// pinning declares pinningTransport's kind as one whose registrations pin
// pages, as the verbs driver's Caps do.
var pinning = map[transport.Kind]transport.KeyCaps{transport.Verbs: {Rekey: true, Withdraw: true}}

type pinningReg struct {
	*rekeyReg
	t *pinningTransport
}

func (t *pinningTransport) Register(m memory.Memory) (transport.Registration, error) {
	reg, err := t.rekeyTransport.Register(m)
	if err != nil {
		return nil, err
	}
	return &pinningReg{rekeyReg: reg.(*rekeyReg), t: t}, nil
}

func (r *pinningReg) Withdraw() error {
	if r.t.calls.Add(1) == 1 {
		close(r.t.withdrawn)
	}
	return nil
}

// A host region whose file shrinks below the region's end is failed: its
// keys are withdrawn (no NIC may read or write the pages the MR pins, which
// are no longer the file's), and resolving it, pinning its keys and using it
// locally answer DataLoss naming the region and the sizes; regrowing the
// file does not make it valid again. It is seen at resolve time (fstat) and
// by the watcher (inotify) without a resolve.
func TestTruncatedFileWithdrawsRegion(t *testing.T) {
	const size = 64 << 10
	for _, tc := range []struct {
		name    string
		to      int64
		resolve bool // look at resolve time; else wait for the watcher
		imp     bool // an imported file (host_file) rather than an allocation
	}{
		{"to 0, seen at resolve", 0, true, false},
		{"to one page, seen at resolve", 4096, true, false},
		{"to 0, seen by the watcher", 0, false, false},
		{"imported file to one page, seen by the watcher", 4096, false, true},
		{"imported file to one byte short, seen at resolve", 2*size - 1, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &pinningTransport{withdrawn: make(chan struct{})}
			dir := t.TempDir()
			g, err := New(Config{ShmDir: dir, Transports: []transport.Transport{tr}, KeyCaps: pinning})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			exp := Export{Name: "victim", Readers: []string{AnyPeer}}
			var r *Region
			var path string
			end := int64(size)
			if tc.imp {
				// The region is the file's second 64 KiB: its end is 128 KiB.
				path = dir + "/import"
				if err := os.WriteFile(path, make([]byte, 3*size), 0o600); err != nil {
					t.Fatal(err)
				}
				r, err = g.ImportHost(path, size, size, exp, Caller{UID: uint32(os.Getuid()), GID: uint32(os.Getgid()), Known: true})
				end = 2 * size
			} else {
				r, err = g.AllocHost(size, exp, Caller{})
				path = r.ShmPath
			}
			if err != nil {
				t.Fatal(err)
			}
			reg, _ := r.Registration(transport.Verbs)
			key := reg.Key().Key
			if _, release, err := g.LookupFor("victim", "p", transport.AccessRead); err != nil {
				t.Fatalf("before the truncation: %v", err)
			} else {
				release()
			}

			if err := os.Truncate(path, tc.to); err != nil {
				t.Fatal(err)
			}
			if !tc.resolve {
				select {
				case <-tr.withdrawn:
				case <-time.After(10 * time.Second):
					t.Fatal("the watcher did not withdraw the region's keys within 10 s of the truncation")
				}
			}
			want := []string{r.ID, `"victim"`, fmt.Sprintf("truncated to %d bytes", tc.to), fmt.Sprintf("below the region's end %d", end)}
			check := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, errs.ErrDataLoss) {
					t.Fatalf("%s: %v, want DataLoss", what, err)
				}
				for _, w := range want {
					if !strings.Contains(err.Error(), w) {
						t.Fatalf("%s: %q does not say %q", what, err, w)
					}
				}
			}
			for _, a := range []transport.Access{transport.AccessRead, transport.AccessWrite} {
				_, _, err := g.LookupFor("victim", "p", a)
				check(fmt.Sprintf("resolve for access %d", a), err)
			}
			if tr.calls.Load() != 1 {
				t.Fatalf("Withdraw called %d times, want once", tr.calls.Load())
			}
			_, _, err = g.Pins().Pin(transport.Verbs, key)
			check("pin with the old key", err)
			_, _, err = g.Acquire(r.ID, "src_region_id", Root)
			check("a local batch", err)

			// Regrown and rewritten: still failed, and says so.
			if err := os.Truncate(path, 3*size); err != nil {
				t.Fatal(err)
			}
			_, _, err = g.LookupFor("victim", "p", transport.AccessRead)
			check("resolve after the file grew back", err)
			if !strings.Contains(err.Error(), "register it again") {
				t.Fatalf("the refusal does not say how to recover: %v", err)
			}
			// A narrowing or a layout's rekey has nothing left to revoke.
			if _, err := g.SetExport(r.ID, Export{Name: "victim"}, Root); err != nil {
				t.Fatalf("narrowing a failed region's export: %v", err)
			}
			if err := g.Deregister(r.ID, Root); err != nil {
				t.Fatalf("deregister the failed region: %v", err)
			}
		})
	}
}

// A region whose file only grows, or is rewritten, stays valid.
func TestGrownFileKeepsRegion(t *testing.T) {
	tr := &pinningTransport{withdrawn: make(chan struct{})}
	g, err := New(Config{ShmDir: t.TempDir(), Transports: []transport.Transport{tr}, KeyCaps: pinning})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	r, err := g.AllocHost(8192, Export{Name: "ok"}, Caller{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(r.ShmPath, 16384); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(r.ShmPath, os.O_RDWR, 0) // no O_TRUNC: rewritten in place
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt(make([]byte, 16384), 0)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, release, err := g.Lookup("ok", ""); err != nil {
		t.Fatalf("a grown file failed its region: %v", err)
	} else {
		release()
	}
	if n := tr.calls.Load(); n != 0 {
		t.Fatalf("Withdraw called %d times on a file that never shrank", n)
	}
}

// A region that no registration pins (tcp, local: CPU copies through the
// mapping) survives its file rewritten with O_TRUNC and write: the mapping
// sees the new pages, and a copy in the short moment faults (memguard).
func TestRewrittenFileKeepsUnpinnedRegion(t *testing.T) {
	g, err := New(Config{ShmDir: t.TempDir(), Transports: []transport.Transport{newFake(transport.TCP)}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	r, err := g.AllocHost(8192, Export{Name: "ok"}, Caller{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(r.ShmPath, make([]byte, 8192), 0); err != nil { // O_TRUNC, then write
		t.Fatal(err)
	}
	if _, release, err := g.Lookup("ok", ""); err != nil {
		t.Fatalf("a rewritten file failed a region no transport pins: %v", err)
	} else {
		release()
	}
}
