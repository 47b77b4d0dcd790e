package region

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// fakeTransport registers memory under counting keys (the same counter
// values under every kind, so a key alone does not find a region), or fails
// every registration with fail. It remembers every registration it made.
type fakeTransport struct {
	transport.Quiet
	kind transport.Kind
	fail error

	mu   sync.Mutex
	next uint64
	regs []*fakeReg
}

type fakeReg struct {
	transport.SingleKey
	t      *fakeTransport
	mem    memory.Memory
	key    uint64
	closes int // guarded by t.mu
}

func newFake(k transport.Kind) *fakeTransport { return &fakeTransport{kind: k} }

func (t *fakeTransport) Kind() transport.Kind { return t.kind }
func (t *fakeTransport) Register(m memory.Memory) (transport.Registration, error) {
	if t.fail != nil {
		return nil, t.fail
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	r := &fakeReg{t: t, mem: m, key: t.next}
	t.regs = append(t.regs, r)
	return r, nil
}
func (t *fakeTransport) Connect(context.Context, transport.Peer) (transport.Conn, error) {
	return nil, errs.ErrUnimplemented
}
func (t *fakeTransport) Close() error { return nil }

// open is the number of registrations not closed yet; it fails the test if
// one was closed more than once.
func (t *fakeTransport) open(tb testing.TB) int {
	tb.Helper()
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, r := range t.regs {
		switch r.closes {
		case 0:
			n++
		case 1:
		default:
			tb.Errorf("%s registration %d closed %d times", t.kind, r.key, r.closes)
		}
	}
	return n
}

func (r *fakeReg) Memory() memory.Memory    { return r.mem }
func (r *fakeReg) Key() transport.RemoteKey { return transport.RemoteKey{Key: r.key} }
func (r *fakeReg) Close() error {
	r.t.mu.Lock()
	r.closes++
	r.t.mu.Unlock()
	return nil
}

var (
	alice   = Caller{UID: 1000, GID: 1000, Known: true}
	bob     = Caller{UID: 1001, GID: 1001, Known: true}
	tlsAnna = Caller{Identity: "anna.example"}
	anon    = Caller{}
)

// newRegistry makes a registry over a fresh shm directory with trs.
func newRegistry(t *testing.T, trs ...transport.Transport) *Registry {
	t.Helper()
	g, err := New(Config{ShmDir: filepath.Join(t.TempDir(), "shm"), Transports: trs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g
}

// wantErr fails unless err is sentinel and its message has every one of
// words (the field it names, the limit...).
func wantErr(t *testing.T, err, sentinel error, words ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %v", sentinel)
	}
	if !errors.Is(err, sentinel) {
		t.Fatalf("error %q is not %v", err, sentinel)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("error %q does not name %q", err, w)
		}
	}
}

// regionFiles lists the daemon's region files in dir (not its lock file).
func regionFiles(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if strings.HasPrefix(e.Name(), reservedPrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// mapped reports whether the process maps the file at path.
func mapped(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Skipf("no /proc/self/maps: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, " "+path) {
			return true
		}
	}
	return false
}

func writeFile(t *testing.T, path string, size int) {
	t.Helper()
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(i / 4096) // page i holds the byte i
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestNewShmDir(t *testing.T) {
	t.Run("created with the directory mode", func(t *testing.T) {
		defer syscall.Umask(syscall.Umask(0o077))
		g := newRegistry(t)
		st, err := os.Stat(g.ShmDir())
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode() != ShmDirMode {
			t.Fatalf("shm dir mode %v, want %v", st.Mode(), ShmDirMode)
		}
		es, _ := os.ReadDir(g.ShmDir())
		re := regexp.MustCompile(`^\.b2bd-[0-9a-f]{16}\.lock$`)
		if len(es) != 1 || !re.MatchString(es[0].Name()) {
			t.Fatalf("shm dir holds %v, want one instance lock file", es)
		}
	})
	for _, tc := range []struct {
		name string
		make func(t *testing.T, p string)
	}{
		{"world-writable", func(t *testing.T, p string) {
			if err := os.Mkdir(p, 0o777); err != nil {
				t.Fatal(err)
			}
			os.Chmod(p, 0o777)
		}},
		{"sticky", func(t *testing.T, p string) {
			if err := os.Mkdir(p, 0o770); err != nil {
				t.Fatal(err)
			}
			os.Chmod(p, 0o770|os.ModeSticky)
		}},
		{"not a directory", func(t *testing.T, p string) { writeFile(t, p, 1) }},
	} {
		t.Run(tc.name+" refused", func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "shm")
			tc.make(t, p)
			g, err := New(Config{ShmDir: p})
			if err == nil {
				g.Close()
			}
			wantErr(t, err, errs.ErrInvalidArgument, "--shm-dir", p)
		})
	}
}

func TestAllocHost(t *testing.T) {
	// A umask that would leave 0600 if the mode came through it.
	defer syscall.Umask(syscall.Umask(0o077))
	root := os.Geteuid() == 0
	for _, tc := range []struct {
		name     string
		size     uint64
		who      Caller
		export   Export
		err      error
		words    []string
		uid, gid int // file owner; -1: the daemon's
	}{
		{name: "size 0", size: 0, who: alice, err: errs.ErrInvalidArgument, words: []string{"host_alloc.size", "is 0"}},
		{name: "size over the limit", size: 1<<46 + 1, who: alice, err: errs.ErrInvalidArgument, words: []string{"host_alloc.size", "70368744177665", "70368744177664"}},
		{name: "bad export name", size: 4096, who: alice, export: Export{Name: "a b"}, err: errs.ErrInvalidArgument, words: []string{"export_name"}},
		{name: "one byte, socket caller", size: 1, who: alice, uid: 1000, gid: 1000},
		{name: "pages, other gid", size: 3 * 4096, who: Caller{UID: 1234, GID: 5678, Known: true}, export: Export{Name: "kv", To: []string{"b"}}, uid: 1234, gid: 5678},
		{name: "root", size: 4096, who: Root, uid: 0, gid: 0},
		{name: "TCP caller: the daemon's own", size: 4096, who: tlsAnna, uid: -1, gid: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := newFake(transport.TCP)
			g := newRegistry(t, tr)
			r, err := g.AllocHost(tc.size, tc.export, tc.who)
			if tc.err != nil {
				if r != nil {
					t.Fatalf("region %v returned with an error", r.ID)
				}
				wantErr(t, err, tc.err, tc.words...)
				if f := regionFiles(t, g.ShmDir()); len(f) != 0 || g.Len() != 0 || tr.open(t) != 0 {
					t.Fatalf("after a refused AllocHost: files %v, %d regions, %d registrations", f, g.Len(), tr.open(t))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			re := regexp.MustCompile(`^` + regexp.QuoteMeta(g.ShmDir()) + `/b2bd-` + g.dir.instance + `-region-[0-9a-f]{16}$`)
			if !re.MatchString(r.ShmPath) {
				t.Fatalf("region file %q does not match %s", r.ShmPath, re)
			}
			st, err := os.Stat(r.ShmPath)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode() != ShmFileMode {
				t.Fatalf("region file mode %v, want %v", st.Mode(), os.FileMode(ShmFileMode))
			}
			if uint64(st.Size()) != tc.size || r.Mem.Len != tc.size || uint64(len(r.Mem.Host)) != tc.size || r.Mem.Kind != memory.Host {
				t.Fatalf("file %d bytes, memory %d bytes (%d mapped, kind %v), want %d of host memory", st.Size(), r.Mem.Len, len(r.Mem.Host), r.Mem.Kind, tc.size)
			}
			sys := st.Sys().(*syscall.Stat_t)
			uid, gid := tc.uid, tc.gid
			if uid == -1 || !root {
				uid, gid = os.Geteuid(), os.Getegid()
			}
			if int(sys.Uid) != uid || int(sys.Gid) != gid {
				t.Fatalf("region file owned by %d:%d, want %d:%d", sys.Uid, sys.Gid, uid, gid)
			}
			if r.Owner != tc.who || r.Export != tc.export.Name || !slices.Equal(r.ExportTo, tc.export.To) || r.ShmOff != 0 {
				t.Fatalf("region owner %v export %q to %v off %d, want %v %q %v 0", r.Owner, r.Export, r.ExportTo, r.ShmOff, tc.who, tc.export.Name, tc.export.To)
			}
			// The mapping is the file: a byte written through it is in the file.
			r.Mem.Host[tc.size-1] = 0x5a
			if b, err := os.ReadFile(r.ShmPath); err != nil || b[tc.size-1] != 0x5a {
				t.Fatalf("the file does not show the byte written through the mapping (err %v)", err)
			}
			if got := r.Transports(); !slices.Equal(got, []transport.Kind{transport.TCP}) || tr.open(t) != 1 {
				t.Fatalf("registered with %v (%d open), want tcp once", got, tr.open(t))
			}
			if reg, ok := r.Registration(transport.TCP); !ok || reg.Memory().Addr != r.Mem.Addr {
				t.Fatal("the tcp registration is not of the region's memory")
			}
			if err := g.Deregister(r.ID, tc.who); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(r.ShmPath); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("region file still there after deregistration: %v", err)
			}
			if mapped(t, r.ShmPath) || tr.open(t) != 0 {
				t.Fatalf("after deregistration: mapped %v, %d registrations open", mapped(t, r.ShmPath), tr.open(t))
			}
		})
	}
}

// A client that replaced its region's file keeps the new file when the
// region goes.
func TestDeregisterLeavesReplacedFile(t *testing.T) {
	g := newRegistry(t)
	r, err := g.AllocHost(4096, Export{}, alice)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(r.ShmPath); err != nil {
		t.Fatal(err)
	}
	writeFile(t, r.ShmPath, 10)
	if err := g.Deregister(r.ID, alice); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(r.ShmPath); err != nil || st.Size() != 10 {
		t.Fatalf("the client's new file went with the region: %v", err)
	}
}

func TestImportHost(t *testing.T) {
	page := os.Getpagesize()
	root := os.Geteuid() == 0
	me := Caller{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid()), Known: true}
	if me.UID == 0 {
		me = alice // root can give files away: the caller is alice, the files hers
	}
	type env struct{ dir, outside string }
	for _, tc := range []struct {
		name     string
		setup    func(t *testing.T, e env) string // returns the path to import
		off, sz  uint64
		who      *Caller // default me
		export   Export
		err      error
		words    []string
		wantLen  uint64
		needRoot bool
	}{
		{name: "empty path", setup: func(t *testing.T, e env) string { return "" }, err: errs.ErrInvalidArgument, words: []string{"host_file.path", "empty"}},
		{name: "missing", setup: func(t *testing.T, e env) string { return "nope" }, err: errs.ErrNotFound, words: []string{"host_file.path", "nope", "does not exist"}},
		{name: "outside the dir", setup: func(t *testing.T, e env) string {
			p := filepath.Join(e.outside, "f")
			writeFile(t, p, page)
			return p
		}, err: errs.ErrPermissionDenied, words: []string{"host_file.path", "outside the shm directory"}},
		{name: "relative escape", setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.outside, "f"), page)
			rel, _ := filepath.Rel(e.dir, filepath.Join(e.outside, "f"))
			return rel
		}, err: errs.ErrPermissionDenied, words: []string{"outside the shm directory"}},
		{name: "the dir itself", setup: func(t *testing.T, e env) string { return e.dir }, err: errs.ErrPermissionDenied, words: []string{"outside the shm directory"}},
		{name: "symlink escaping", setup: func(t *testing.T, e env) string {
			p := filepath.Join(e.outside, "f")
			writeFile(t, p, page)
			must(t, os.Symlink(p, filepath.Join(e.dir, "link")))
			return "link"
		}, err: errs.ErrPermissionDenied, words: []string{"host_file.path", "link", "outside the shm directory"}},
		{name: "symlink inside", setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.dir, "f"), 2*page)
			must(t, os.Symlink("f", filepath.Join(e.dir, "link")))
			return "link"
		}, wantLen: uint64(2 * page)},
		{name: "directory", setup: func(t *testing.T, e env) string {
			must(t, os.Mkdir(filepath.Join(e.dir, "d"), 0o700))
			return "d"
		}, err: errs.ErrInvalidArgument, words: []string{"host_file.path", "not a regular file"}},
		{name: "fifo", setup: func(t *testing.T, e env) string {
			must(t, unix.Mkfifo(filepath.Join(e.dir, "p"), 0o600))
			return "p"
		}, err: errs.ErrInvalidArgument, words: []string{"host_file.path", "not a regular file"}},
		{name: "reserved region name", setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.dir, "b2bd-0123456789abcdef-region-1"), page)
			return "b2bd-0123456789abcdef-region-1"
		}, err: errs.ErrInvalidArgument, words: []string{"host_file.path", "reserved"}},
		{name: "reserved lock name", setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.dir, ".b2bd-x.lock"), page)
			return ".b2bd-x.lock"
		}, err: errs.ErrInvalidArgument, words: []string{"reserved"}},
		{name: "link to a reserved name", setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.dir, "b2bd-x"), page)
			must(t, os.Symlink("b2bd-x", filepath.Join(e.dir, "mine")))
			return "mine"
		}, err: errs.ErrInvalidArgument, words: []string{"reserved"}},
		{name: "reserved name linking to a file", setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.dir, "mine"), page)
			must(t, os.Symlink("mine", filepath.Join(e.dir, "b2bd-link")))
			return "b2bd-link"
		}, err: errs.ErrInvalidArgument, words: []string{"b2bd-link", "reserved"}},
		{name: "another uid's file", needRoot: true, setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.dir, "bobs"), page)
			must(t, os.Chown(filepath.Join(e.dir, "bobs"), int(bob.UID), int(bob.GID)))
			return "bobs"
		}, err: errs.ErrPermissionDenied, words: []string{"host_file.path", "belongs to uid 1001", "uid 1000"}},
		{name: "root imports another uid's file", needRoot: true, who: &Root, setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.dir, "bobs"), page)
			must(t, os.Chown(filepath.Join(e.dir, "bobs"), int(bob.UID), int(bob.GID)))
			return "bobs"
		}, wantLen: uint64(page)},
		{name: "TCP caller", who: &tlsAnna, setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.dir, "f"), page)
			return "f"
		}, err: errs.ErrPermissionDenied, words: []string{"host_file", "Unix socket"}},
		{name: "bad export", export: Export{To: []string{"b"}}, setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.dir, "f"), page)
			return "f"
		}, err: errs.ErrInvalidArgument, words: []string{"export_to", "export_name is empty"}},
		{name: "offset not page-aligned", off: 100, setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.dir, "f"), 2*page)
			return "f"
		}, err: errs.ErrInvalidArgument, words: []string{"host_file.offset", "100", "page size"}},
		{name: "offset at the end", off: uint64(2 * page), setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.dir, "f"), 2*page)
			return "f"
		}, err: errs.ErrInvalidArgument, words: []string{"host_file.offset", "past the end"}},
		{name: "empty file", setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.dir, "f"), 0)
			return "f"
		}, err: errs.ErrInvalidArgument, words: []string{"host_file.offset"}},
		{name: "size past the end", off: uint64(page), sz: uint64(page) + 1, setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.dir, "f"), 2*page)
			return "f"
		}, err: errs.ErrInvalidArgument, words: []string{"host_file.size", "runs past the end"}},
		{name: "offset and size to the end", off: uint64(page), sz: uint64(2 * page), setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.dir, "f"), 3*page)
			return "f"
		}, wantLen: uint64(2 * page)},
		{name: "offset, size 0: the rest", off: uint64(2 * page), setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.dir, "f"), 3*page)
			return "f"
		}, wantLen: uint64(page)},
		{name: "absolute path inside", setup: func(t *testing.T, e env) string {
			writeFile(t, filepath.Join(e.dir, "f"), page)
			return filepath.Join(e.dir, "f")
		}, wantLen: uint64(page)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.needRoot && !root {
				t.Skip("needs root to give a file to another uid")
			}
			tr := newFake(transport.TCP)
			g := newRegistry(t, tr)
			e := env{dir: g.ShmDir(), outside: t.TempDir()}
			path := tc.setup(t, e)
			if root && path != "" {
				// Files are the caller's (the TCP case included: refused before).
				p := path
				if !filepath.IsAbs(p) {
					p = filepath.Join(e.dir, p)
				}
				// Files the test made as root become the caller's; a file
				// given to another uid stays that uid's.
				for _, q := range []string{p, evalOr(p)} {
					var st unix.Stat_t
					if unix.Lstat(q, &st) == nil && st.Uid == 0 {
						_ = os.Lchown(q, int(me.UID), int(me.GID))
					}
				}
			}
			who := me
			if tc.who != nil {
				who = *tc.who
			}
			before, _ := os.ReadDir(e.dir)
			r, err := g.ImportHost(path, tc.off, tc.sz, tc.export, who)
			if tc.err != nil {
				if r != nil {
					t.Fatalf("region %s returned with an error", r.ID)
				}
				wantErr(t, err, tc.err, tc.words...)
				if g.Len() != 0 || tr.open(t) != 0 {
					t.Fatalf("a refused import left %d regions, %d registrations", g.Len(), tr.open(t))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			real, _ := filepath.EvalSymlinks(filepath.Join(e.dir, filepath.Base(path)))
			if r.ShmPath != real || r.ShmOff != tc.off || r.Mem.Len != tc.wantLen || uint64(len(r.Mem.Host)) != tc.wantLen || r.Owner != who {
				t.Fatalf("region %s at %d, %d bytes, owner %v; want %s at %d, %d bytes, owner %v", r.ShmPath, r.ShmOff, r.Mem.Len, r.Owner, real, tc.off, tc.wantLen, who)
			}
			// The mapping starts at the offset: page k of the file holds k.
			if got, want := r.Mem.Host[0], byte(tc.off/uint64(page)); got != want {
				t.Fatalf("first mapped byte %d, want %d (page %d of the file)", got, want, want)
			}
			if err := g.Deregister(r.ID, who); err != nil {
				t.Fatal(err)
			}
			after, _ := os.ReadDir(e.dir)
			if len(after) != len(before) || mapped(t, real) || tr.open(t) != 0 {
				t.Fatalf("deregistering an import: dir %d -> %d entries (the file must stay), mapped %v, %d open", len(before), len(after), mapped(t, real), tr.open(t))
			}
		})
	}
}

func TestRegistrationFailure(t *testing.T) {
	errTCP, errVerbs := errors.New("tcp refuses"), errors.New("verbs refuses")
	t.Run("every transport fails", func(t *testing.T) {
		tcp, verbs := newFake(transport.TCP), newFake(transport.Verbs)
		tcp.fail, verbs.fail = errTCP, errVerbs
		g := newRegistry(t, tcp, verbs)
		_, err := g.AllocHost(4096, Export{Name: "kv"}, alice)
		if err == nil || !errors.Is(err, errTCP) || !errors.Is(err, errVerbs) || !strings.Contains(err.Error(), "no transport") {
			t.Fatalf("AllocHost with every transport failing: %v", err)
		}
		if n, f := g.Len(), regionFiles(t, g.ShmDir()); n != 0 || len(f) != 0 {
			t.Fatalf("left behind: %d regions, files %v", n, f)
		}
		if _, _, err := g.Lookup("kv", ""); !errors.Is(err, errs.ErrNotFound) {
			t.Fatalf("the failed region's name resolves: %v", err)
		}
		// An import fails alike and leaves the client's file alone.
		p := filepath.Join(g.ShmDir(), "mine")
		writeFile(t, p, 4096)
		me := Caller{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid()), Known: true}
		_, err = g.ImportHost("mine", 0, 0, Export{}, me)
		if !errors.Is(err, errTCP) || !errors.Is(err, errVerbs) {
			t.Fatalf("ImportHost with every transport failing: %v", err)
		}
		if _, err := os.Stat(p); err != nil || mapped(t, p) || g.Len() != 0 {
			t.Fatalf("failed import: file %v, mapped %v, %d regions", err, mapped(t, p), g.Len())
		}
		// The name was never taken.
		tcp.fail = nil
		if _, err := g.AllocHost(4096, Export{Name: "kv"}, alice); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("one transport fails", func(t *testing.T) {
		tcp, verbs := newFake(transport.TCP), newFake(transport.Verbs)
		tcp.fail = errTCP
		g := newRegistry(t, tcp, verbs)
		r, err := g.AllocHost(4096, Export{Name: "kv"}, alice)
		must(t, err)
		if got := r.Transports(); !slices.Equal(got, []transport.Kind{transport.Verbs}) {
			t.Fatalf("registered with %v, want verbs only", got)
		}
		if _, ok := r.Registration(transport.TCP); ok {
			t.Fatal("a tcp registration although tcp failed")
		}
		reg, ok := r.Registration(transport.Verbs)
		if !ok {
			t.Fatal("no verbs registration")
		}
		_, rel, err := g.Pins().Pin(transport.Verbs, reg.Key().Key)
		must(t, err)
		rel()
		_, _, err = g.Pins().Pin(transport.TCP, reg.Key().Key)
		wantErr(t, err, errs.ErrNotFound, "tcp")
		must(t, g.Deregister(r.ID, alice))
		if verbs.open(t) != 0 {
			t.Fatal("the verbs registration is still open after deregistration")
		}
	})
	t.Run("no transports", func(t *testing.T) {
		g := newRegistry(t)
		r, err := g.AllocHost(4096, Export{}, alice)
		must(t, err)
		if len(r.Transports()) != 0 {
			t.Fatalf("registered with %v", r.Transports())
		}
	})
	t.Run("duplicate name undoes the registrations", func(t *testing.T) {
		tcp, verbs := newFake(transport.TCP), newFake(transport.Verbs)
		g := newRegistry(t, tcp, verbs)
		_, err := g.AllocHost(4096, Export{Name: "kv"}, alice)
		must(t, err)
		_, err = g.AllocHost(4096, Export{Name: "kv"}, alice)
		wantErr(t, err, errs.ErrAlreadyExists)
		if len(tcp.regs) != 2 || tcp.open(t) != 1 || verbs.open(t) != 1 {
			t.Fatalf("registrations: tcp %d made, %d open; verbs %d open; want 2, 1, 1", len(tcp.regs), tcp.open(t), verbs.open(t))
		}
	})
}

func TestClose(t *testing.T) {
	tcp, verbs := newFake(transport.TCP), newFake(transport.Verbs)
	g, err := New(Config{ShmDir: filepath.Join(t.TempDir(), "shm"), Transports: []transport.Transport{tcp, verbs}})
	must(t, err)
	dir := g.ShmDir()
	var paths, ids []string
	for i := range 3 {
		r, err := g.AllocHost(4096, Export{Name: fmt.Sprint("kv", i)}, alice)
		must(t, err)
		paths, ids = append(paths, r.ShmPath), append(ids, r.ID)
	}
	// One is held by a batch (callers stop batches first), one imported.
	_, _, err = g.Acquire(ids[0], "src_region_id", alice)
	must(t, err)
	imp := filepath.Join(dir, "mine")
	writeFile(t, imp, 4096)
	me := Caller{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid()), Known: true}
	ri, err := g.ImportHost("mine", 0, 0, Export{Name: "imp"}, me)
	must(t, err)
	reg, _ := ri.Registration(transport.TCP)

	g.Close()

	if g.Len() != 0 || tcp.open(t) != 0 || verbs.open(t) != 0 {
		t.Fatalf("after Close: %d regions, %d tcp and %d verbs registrations open", g.Len(), tcp.open(t), verbs.open(t))
	}
	es, _ := os.ReadDir(dir)
	if len(es) != 1 || es[0].Name() != "mine" {
		t.Fatalf("after Close the shm dir holds %v, want only the imported file", es)
	}
	for _, p := range append(paths, imp) {
		if mapped(t, p) {
			t.Fatalf("%s still mapped after Close", p)
		}
	}
	if _, _, err := g.Acquire(ids[1], "src_region_id", alice); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("Acquire after Close: %v", err)
	}
	if _, _, err := g.Pins().Pin(transport.TCP, reg.Key().Key); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("Pin after Close: %v", err)
	}
	if _, _, err := g.Lookup("imp", ""); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("Lookup after Close: %v", err)
	}
	g.Close() // twice is harmless
}

// A dead instance's files are reclaimed at start; a live one's are not.
func TestReclaim(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "shm")
	live, err := New(Config{ShmDir: dir})
	must(t, err)
	defer live.Close()
	r, err := live.AllocHost(4096, Export{}, alice)
	must(t, err)
	const dead = "0123456789abcdef"
	writeFile(t, filepath.Join(live.ShmDir(), lockPrefix+dead+lockSuffix), 0)
	writeFile(t, filepath.Join(live.ShmDir(), reservedPrefix+dead+"-region-1"), 4096)
	writeFile(t, filepath.Join(live.ShmDir(), reservedPrefix+dead+"-region-2"), 8192)
	writeFile(t, filepath.Join(live.ShmDir(), "client-file"), 10)

	g, err := New(Config{ShmDir: dir})
	must(t, err)
	defer g.Close()
	var names []string
	es, _ := os.ReadDir(g.ShmDir())
	for _, e := range es {
		names = append(names, e.Name())
	}
	for _, gone := range []string{lockPrefix + dead + lockSuffix, reservedPrefix + dead + "-region-1", reservedPrefix + dead + "-region-2"} {
		if slices.Contains(names, gone) {
			t.Errorf("the dead instance's %s is still there", gone)
		}
	}
	for _, kept := range []string{filepath.Base(live.dir.lockPath), filepath.Base(r.ShmPath), "client-file", filepath.Base(g.dir.lockPath)} {
		if !slices.Contains(names, kept) {
			t.Errorf("%s was removed (dir: %v)", kept, names)
		}
	}
}

// TestAllocError maps each errno that fallocate gives for a size the shm
// directory cannot take to its gRPC code, with the cause kept and the field,
// the value and the directory (and its filesystem) named.
func TestAllocError(t *testing.T) {
	const size = 1 << 45
	const dir = "/tmp/x/shm"
	ext4 := shmFS{known: true, name: "ext4", free: 12345}
	for _, tc := range []struct {
		name  string
		err   error
		fs    shmFS
		code  codes.Code
		words []string
	}{
		{"ENOSPC", syscall.ENOSPC, ext4, codes.ResourceExhausted, []string{"no room", "12345 bytes free"}},
		{"ENOSPC, statfs failed", syscall.ENOSPC, shmFS{}, codes.ResourceExhausted, []string{"no room", "the filesystem of shm directory"}},
		{"EDQUOT", syscall.EDQUOT, ext4, codes.ResourceExhausted, []string{"quota"}},
		{"ENOMEM", syscall.ENOMEM, shmFS{known: true, name: "tmpfs"}, codes.ResourceExhausted, []string{"out of memory", "tmpfs"}},
		{"EFBIG", syscall.EFBIG, ext4, codes.ResourceExhausted, []string{"larger than the largest file", "ext4", "70368744177664"}},
		{"EFBIG, over ulimit -f", syscall.EFBIG, shmFS{known: true, name: "ext4", fsizeLimit: 1 << 20}, codes.ResourceExhausted, []string{"ulimit -f", "1048576"}},
		{"EFBIG, under ulimit -f", syscall.EFBIG, shmFS{known: true, name: "ext4", fsizeLimit: 1 << 50}, codes.ResourceExhausted, []string{"larger than the largest file"}},
		{"EINVAL", syscall.EINVAL, ext4, codes.ResourceExhausted, []string{"larger than the largest file"}},
		{"EOPNOTSUPP", syscall.EOPNOTSUPP, shmFS{known: true, name: "fuse"}, codes.FailedPrecondition, []string{"cannot reserve", "fuse", "--shm-dir"}},
		{"wrapped errno", &os.SyscallError{Syscall: "fallocate", Err: syscall.EFBIG}, ext4, codes.ResourceExhausted, []string{"larger than the largest file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := allocError(tc.err, size, dir+"/region-1", dir, tc.fs)
			if c := grpcstatus.Code(err); c != tc.code {
				t.Fatalf("%q: code %v, want %v", err, c, tc.code)
			}
			if !errors.Is(err, tc.err) {
				t.Fatalf("%q does not wrap its cause %v", err, tc.err)
			}
			words := append([]string{"host_alloc.size 35184372088832", dir, tc.err.Error()}, tc.words...)
			if tc.fs.known {
				words = append(words, "the "+tc.fs.name+" filesystem")
			}
			for _, w := range words {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not name %q", err, w)
				}
			}
		})
	}
	// Not the caller's doing: Internal, with the cause.
	for _, e := range []error{syscall.EIO, syscall.EPERM, syscall.EBADF} {
		err := allocError(e, size, dir+"/region-1", dir, ext4)
		if c := grpcstatus.Code(err); c != codes.Internal || !errors.Is(err, e) {
			t.Errorf("%v: %q, code %v, want Internal wrapping it", e, err, c)
		}
	}
}

func TestFSTypeName(t *testing.T) {
	for magic, want := range map[int64]string{unix.TMPFS_MAGIC: "tmpfs", unix.EXT4_SUPER_MAGIC: "ext4", unix.XFS_SUPER_MAGIC: "xfs", 0x1234: "type 0x1234"} {
		if got := fsTypeName(magic); got != want {
			t.Errorf("fsTypeName(%#x) = %q, want %q", magic, got, want)
		}
	}
}

// TestAllocHostOverFileSizeLimit makes the kernel itself refuse a region
// with EFBIG (no root needed: the process's ulimit -f, which every
// filesystem's fallocate checks) and wants ResourceExhausted naming the
// field, the value and the limit, and nothing left behind.
func TestAllocHostOverFileSizeLimit(t *testing.T) {
	tr := newFake(transport.TCP)
	g := newRegistry(t, tr)
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	const limit = 1 << 20
	if old.Cur != unix.RLIM_INFINITY && old.Cur < limit {
		t.Skipf("ulimit -f is already %d bytes", old.Cur)
	}
	// SIGXFSZ, which the kernel sends with the EFBIG, is ignored by the Go
	// runtime (no signal.Notify for it here).
	if err := unix.Setrlimit(unix.RLIMIT_FSIZE, &unix.Rlimit{Cur: limit, Max: old.Max}); err != nil {
		t.Skipf("setrlimit: %v", err)
	}
	r, err := g.AllocHost(2*limit, Export{}, alice)
	if rerr := unix.Setrlimit(unix.RLIMIT_FSIZE, &old); rerr != nil {
		t.Fatalf("restore ulimit -f: %v", rerr)
	}
	if err == nil {
		_ = g.Deregister(r.ID, alice)
		t.Skip("the shm directory's filesystem reserved a file over ulimit -f")
	}
	wantErr(t, err, errs.ErrResourceExhausted, "host_alloc.size 2097152", "ulimit -f", "1048576", g.ShmDir())
	if !errors.Is(err, syscall.EFBIG) || grpcstatus.Code(err) != codes.ResourceExhausted {
		t.Fatalf("%q: want EFBIG as the cause and code ResourceExhausted, got %v", err, grpcstatus.Code(err))
	}
	if f := regionFiles(t, g.ShmDir()); len(f) != 0 || g.Len() != 0 || tr.open(t) != 0 {
		t.Fatalf("after the refusal: files %v, %d regions, %d registrations", f, g.Len(), tr.open(t))
	}
}
