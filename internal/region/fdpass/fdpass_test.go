package fdpass

import (
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/b2bd/b2bd/internal/errs"
)

func TestCheckState(t *testing.T) {
	reg, rw := uint32(unix.S_IFREG|0o600), unix.O_RDWR
	for _, c := range []struct {
		name     string
		mode     uint32
		size     int64
		flags    int
		flagsErr error
		seals    int
		sealsErr error
		want     uint64
		wantIn   []string
	}{
		{name: "sealed memfd", mode: reg, size: 4096, flags: rw, seals: unix.F_SEAL_SHRINK, want: 4096},
		{name: "sealed against growing too", mode: reg, size: 1 << 30, flags: rw, seals: unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL, want: 1 << 30},
		{name: "no seals", mode: reg, size: 4096, flags: rw, wantIn: []string{"host_fd", "F_SEAL_SHRINK", "b2b.alloc_host"}},
		{name: "sealing not allowed", mode: reg, size: 4096, flags: rw, seals: unix.F_SEAL_SEAL, wantIn: []string{"F_SEAL_SHRINK", "b2b.alloc_host"}},
		{name: "not sealable", mode: reg, size: 4096, flags: rw, sealsErr: unix.EINVAL, wantIn: []string{"not a memfd", "b2b.alloc_host"}},
		{name: "directory", mode: unix.S_IFDIR | 0o700, size: 4096, flags: rw, seals: unix.F_SEAL_SHRINK, wantIn: []string{"not a regular file"}},
		{name: "read-only", mode: reg, size: 4096, flags: unix.O_RDONLY, seals: unix.F_SEAL_SHRINK, wantIn: []string{"read-write", "O_RDWR"}},
		{name: "write-only", mode: reg, size: 4096, flags: unix.O_WRONLY, seals: unix.F_SEAL_SHRINK, wantIn: []string{"read-write"}},
		{name: "flags unknown", mode: reg, size: 4096, flagsErr: unix.EBADF, seals: unix.F_SEAL_SHRINK, wantIn: []string{"F_GETFL"}},
		{name: "write sealed", mode: reg, size: 4096, flags: rw, seals: unix.F_SEAL_SHRINK | unix.F_SEAL_WRITE, wantIn: []string{"write seals"}},
		{name: "future-write sealed", mode: reg, size: 4096, flags: rw, seals: unix.F_SEAL_SHRINK | unix.F_SEAL_FUTURE_WRITE, wantIn: []string{"write seals"}},
		{name: "empty", mode: reg, size: 0, flags: rw, seals: unix.F_SEAL_SHRINK, wantIn: []string{"empty", "ftruncate"}},
	} {
		got, err := CheckState(c.mode, c.size, c.flags, c.flagsErr, c.seals, c.sealsErr)
		if c.wantIn == nil {
			if err != nil || got != c.want {
				t.Errorf("%s: %d, %v; want %d", c.name, got, err, c.want)
			}
			continue
		}
		if !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want InvalidArgument", c.name, err)
			continue
		}
		for _, w := range c.wantIn {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", c.name, err, w)
			}
		}
	}
}

// Check on real descriptors: what the kernel says of memfds as made.
func TestCheckDescriptors(t *testing.T) {
	mk := func(flags, seals int, size int64) int {
		fd, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC|flags)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if err := unix.Ftruncate(fd, size); err != nil {
			t.Fatal(err)
		}
		if seals != 0 {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
				t.Fatal(err)
			}
		}
		return fd
	}
	if n, err := Check(mk(unix.MFD_ALLOW_SEALING, unix.F_SEAL_SHRINK, 8192)); err != nil || n != 8192 {
		t.Fatalf("sealed memfd: %d, %v", n, err)
	}
	if _, err := Check(mk(unix.MFD_ALLOW_SEALING, 0, 8192)); err == nil {
		t.Fatal("unsealed memfd accepted")
	}
	if _, err := Check(mk(0, 0, 8192)); err == nil {
		t.Fatal("memfd without MFD_ALLOW_SEALING accepted")
	}
}

func TestTokenPath(t *testing.T) {
	for _, c := range []struct {
		path    string
		token   uint64
		ok, bad bool
	}{
		{path: TokenPath(0xdeadbeef), token: 0xdeadbeef, ok: true},
		{path: TokenPath(^uint64(0)), token: ^uint64(0), ok: true},
		{path: "/dev/shm/b2bd/pool"},
		{path: "pool"},
		{path: ""},
		{path: "memfd:", ok: true, bad: true},
		{path: "memfd:0000000000000000", ok: true, bad: true},
		{path: "memfd:00000000000000001", ok: true, bad: true},
		{path: "memfd:zzzzzzzzzzzzzzzz", ok: true, bad: true},
		{path: "memfd:+000000000000001", ok: true, bad: true},
	} {
		tok, ok, err := ParseTokenPath(c.path)
		if ok != c.ok || (err != nil) != c.bad || (!c.bad && tok != c.token) {
			t.Errorf("%q: %#x %v %v; want %#x ok %v bad %v", c.path, tok, ok, err, c.token, c.ok, c.bad)
		}
		if err != nil && (!errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), "host_file.path")) {
			t.Errorf("%q: %v does not name host_file.path as InvalidArgument", c.path, err)
		}
	}
}

func TestFrames(t *testing.T) {
	req := Request()
	if err := CheckRequest(req[:]); err != nil {
		t.Fatal(err)
	}
	for _, a := range []Answer{{Token: 7, Size: 4096}, {Code: 3, Msg: "host_fd: no"}, {Code: 8, Msg: strings.Repeat("x", MaxMsg+10)}} {
		b := a.Encode(nil)
		got, n, err := DecodeAnswer(b[:AnswerLen])
		if err != nil {
			t.Fatalf("%+v: %v", a, err)
		}
		got.Msg = string(b[AnswerLen : AnswerLen+n])
		want := a
		if len(want.Msg) > MaxMsg {
			want.Msg = want.Msg[:MaxMsg]
		}
		if got != want {
			t.Errorf("round trip: %+v, want %+v", got, want)
		}
	}
	// An older daemon answers as the submit socket: no marker at the end.
	old := (Answer{Code: 5, Msg: "plan 0"}).Encode(nil)[:AnswerLen]
	clear(old[40:])
	if _, _, err := DecodeAnswer(old); !errors.Is(err, errs.ErrUnimplemented) || !strings.Contains(err.Error(), "does not take descriptors") {
		t.Errorf("an old daemon's answer: %v, want Unimplemented", err)
	}
	if _, _, err := DecodeAnswer((Answer{}).Encode(nil)); err == nil {
		t.Error("code 0 without a token accepted")
	}
}

func FuzzParseTokenPath(f *testing.F) {
	for _, s := range []string{TokenPath(1), "memfd:", "memfd:ffffffffffffffff", "pool", "memfd:-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, ok, err := ParseTokenPath(s)
		if !ok && (err != nil || tok != 0) {
			t.Fatalf("%q: not a token path but %#x %v", s, tok, err)
		}
		if ok && err == nil && TokenPath(tok) != strings.ToLower(s) {
			t.Fatalf("%q: token %#x prints as %q", s, tok, TokenPath(tok))
		}
	})
}

func FuzzDecodeFrames(f *testing.F) {
	req := Request()
	f.Add(req[:])
	f.Add((Answer{Token: 1, Size: 2}).Encode(nil))
	f.Add((Answer{Code: 3, Msg: "m"}).Encode(nil)[:AnswerLen])
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := CheckRequest(b); err == nil && (len(b) != RequestLen || b[8] != 0) {
			t.Fatalf("bad request %x accepted", b)
		}
		a, n, err := DecodeAnswer(b)
		if err != nil {
			return
		}
		if n > MaxMsg || (a.Code == 0 && (n != 0 || a.Token == 0)) {
			t.Fatalf("answer %x decoded to %+v with %d", b, a, n)
		}
		// The fixed fields but the message length (Encode's own message is empty).
		if e := a.Encode(nil); string(e[:12]) != string(b[:12]) || string(e[16:32]) != string(b[16:32]) {
			t.Fatalf("answer %x does not round-trip", b)
		}
	})
}
