package local

import (
	"bytes"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/memory"
)

func TestParseMapsLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		ok   bool
		want mapping
	}{
		{"7f0000000000-7f0000100000 rw-s 00002000 00:1a 12345                      /dev/shm/b2bd/b2bd-x-region-1",
			true, mapping{start: 0x7f0000000000, end: 0x7f0000100000, offset: 0x2000, major: 0, minor: 0x1a, inode: 12345, path: "/dev/shm/b2bd/b2bd-x-region-1"}},
		{"00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon", true,
			mapping{start: 0x400000, end: 0x452000, major: 8, minor: 2, inode: 173521, path: "/usr/bin/dbus-daemon"}},
		{"7ffd1000-7ffd2000 rw-p 00000000 00:00 0", true, mapping{start: 0x7ffd1000, end: 0x7ffd2000}},
		{"7ffd1000-7ffd2000 rw-p 00000000 00:00 0    [stack]", true, mapping{start: 0x7ffd1000, end: 0x7ffd2000, path: "[stack]"}},
		{"", false, mapping{}},
		{"7ffd2000-7ffd1000 rw-p 00000000 00:00 0", false, mapping{}},
		{"7ffd1000 rw-p 00000000 00:00 0", false, mapping{}},
		{"7ffd1000-7ffd2000 rw-p 00000000 0000 0", false, mapping{}},
		{"7ffd1000-7ffd2000 rw-p zz 00:00 0", false, mapping{}},
		{"7ffd1000-7ffd2000 rw-p 00000000 00:00 -1", false, mapping{}},
	} {
		m, err := parseMapsLine([]byte(tc.line))
		if (err == nil) != tc.ok {
			t.Fatalf("%q: err %v, want ok=%v", tc.line, err, tc.ok)
		}
		if tc.ok && m != tc.want {
			t.Fatalf("%q: got %+v, want %+v", tc.line, m, tc.want)
		}
	}
}

func TestFindMappingOfOwnRegion(t *testing.T) {
	m := shmRegion(t, t.TempDir(), 1<<16)
	f, off, err := openBacking(memory4(m, 4096))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if off != 4096 {
		t.Fatalf("offset %d, want 4096", off)
	}
	if _, _, err := openBacking(memory4(m, 1<<16)); err == nil {
		t.Fatal("a range past the mapping was accepted")
	}
}

func FuzzParseMapsLine(f *testing.F) {
	f.Add([]byte("7f0000000000-7f0000100000 rw-s 00002000 00:1a 12345   /dev/shm/x"))
	f.Add([]byte("0-1 r 0 0:0 0"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseMapsLine(b)
		if err == nil && m.end <= m.start {
			t.Fatalf("accepted an empty range: %+v", m)
		}
	})
}

func FuzzWire(f *testing.F) {
	var rq [requestSize]byte
	(&request{op: opBegin, flags: flagMap, key: 7}).put(rq[:])
	f.Add(rq[:])
	var rp [replySize]byte
	(&reply{status: statusOK, kind: kindHost, size: 9, fds: 1}).put(rp[:])
	f.Add(rp[:])
	f.Add((&hello{node: "n"}).marshal()[:helloFixed])
	(&request{op: opBeginSet, flags: flagRead, a: 3}).put(rq[:])
	f.Add(rq[:])
	var se [setEntrySize]byte
	(&setEntry{key: 9, flags: flagMap}).put(se[:])
	f.Add(se[:])
	var sa [setReplyEntry + 4 + 64]byte
	(&setAnswer{kind: kindCUDA, flags: setHandle, size: 4096, busLen: 4}).put(sa[:])
	f.Add(sa[:])
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := parseSetReply(b); err == nil && (r.fds > maxSetKeys || r.status == statusOK && (r.size == 0 || r.size > maxSetKeys || r.offset > maxSetBody)) {
			t.Fatalf("set reply out of bounds accepted: %+v", r)
		}
		if e, err := parseSetEntry(b, 0); err == nil {
			var out [setEntrySize]byte
			e.put(out[:])
			if !bytes.Equal(out[:], b) {
				t.Fatalf("set entry does not round-trip")
			}
		}
		if a, bus, handle, rest, err := parseSetAnswer(b, 0); err == nil {
			if a.busLen > maxBusID || len(bus) != int(a.busLen) || (handle != nil) != (a.flags&setHandle != 0) ||
				setReplyEntry+len(bus)+len(handle)+len(rest) != len(b) {
				t.Fatalf("set answer %+v split %d+%d+%d of %d bytes", a, len(bus), len(handle), len(rest), len(b))
			}
		}
		if r, err := parseRequest(b); err == nil {
			if r.op == opBeginSet && (r.a == 0 || r.a > maxSetKeys || r.flags&flagMap != 0) {
				t.Fatalf("begin of a set out of bounds accepted: %+v", r)
			}
			var out [requestSize]byte
			r.put(out[:])
			if !bytes.Equal(out[:], b) {
				t.Fatalf("request does not round-trip")
			}
		}
		if r, err := parseReply(b); err == nil {
			if r.msgLen > maxMsg || r.fds > 1 || r.status > statusDataLoss {
				t.Fatalf("reply out of bounds accepted: %+v", r)
			}
		}
		var h hello
		if n, err := parseHelloFixed(b, &h); err == nil && n > maxNode {
			t.Fatalf("node length %d accepted", n)
		}
	})
}

func FuzzCheckEndpoint(f *testing.F) {
	f.Add("0a1b2c3d-0000-4000-8000-0123456789ab", "/dev/shm/b2bd/.b2bd-local-1.sock", "/dev/shm/b2bd/.b2bd-local-1.token", make([]byte, 32))
	f.Fuzz(func(t *testing.T, boot, sock, tok string, dig []byte) {
		_ = CheckEndpoint(endpoint(boot, sock, tok, dig))
	})
}

// TestFindMappingOfMemfd: a client's memfd has no path ("/memfd:NAME
// (deleted)" in the maps), so its file opens through the mapping; what
// opened is the mapped inode, and a write through it shows in the mapping.
func TestFindMappingOfMemfd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("opening /proc/self/map_files needs CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN; not root")
	}
	fd, err := unix.MemfdCreate("b2b-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Skipf("memfd_create: %v", err)
	}
	defer unix.Close(fd)
	const size = 1 << 16
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	m := memory.Memory{Kind: memory.Host, Addr: uintptr(unsafe.Pointer(&b[0])), Len: size, Host: b}
	f, off, err := openBacking(memory4(m, 4096))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if off != 4096 {
		t.Fatalf("offset %d, want 4096", off)
	}
	if _, err := f.WriteAt([]byte("landed"), int64(off)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b[4096:4102], []byte("landed")) {
		t.Fatalf("a write through the opened file does not show in the mapping: %q", b[4096:4102])
	}
}
