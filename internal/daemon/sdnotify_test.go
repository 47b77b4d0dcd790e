package daemon

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSDNotify: no NOTIFY_SOCKET does nothing; a path or an abstract name
// gets the datagram; a relative name or a missing socket is an error.
func TestSDNotify(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "notify")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	abstract := "b2bd-test-" + filepath.Base(dir)
	aln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: "\x00" + abstract, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer aln.Close()
	cases := []struct {
		name, env string
		recv      *net.UnixConn
		sent      bool
		err       string
	}{
		{"unset", "", nil, false, ""},
		{"path", path, ln, true, ""},
		{"abstract", "@" + abstract, aln, true, ""},
		{"relative", "notify", nil, false, "absolute path"},
		{"missing", filepath.Join(dir, "none"), nil, false, "no such file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("NOTIFY_SOCKET", tc.env)
			sent, err := sdNotify("READY=1")
			if sent != tc.sent || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("sdNotify with NOTIFY_SOCKET=%q: %v, %v; want %v and an error containing %q", tc.env, sent, err, tc.sent, tc.err)
			}
			if tc.recv != nil {
				buf := make([]byte, 64)
				_ = tc.recv.SetReadDeadline(time.Now().Add(2 * time.Second))
				n, err := tc.recv.Read(buf)
				if err != nil || string(buf[:n]) != "READY=1" {
					t.Fatalf("received %q, %v; want READY=1", buf[:n], err)
				}
			}
		})
	}
}
