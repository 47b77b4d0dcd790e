package peer

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/errs"
)

func TestCheckAddr(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want []string // "" accepted; else what the message says
	}{
		{"127.0.0.1:7470", nil},
		{"localhost:7470", nil},
		{"[::1]:7470", nil},
		{"[fe80::1%eth0]:7470", nil},
		{"node-7.cluster.local:1", nil},
		{"host_a:65535", nil},
		{"localhost", []string{`peer address "localhost" has no port`, "localhost:7470", "--peer-listen"}},
		{"10.0.0.2", []string{"has no port", "10.0.0.2:7470"}},
		{"::1", []string{"has no port", "[::1]:7470"}},
		{"[::1]", []string{"has no port", "[::1]:7470"}},
		{"", []string{"peer is empty", "host:port"}},
		{":7470", []string{"has no host"}},
		{"127.0.0.1:0", []string{`port "0"`, "1 to 65535"}},
		{"127.0.0.1:70000", []string{`port "70000"`, "1 to 65535"}},
		{"127.0.0.1:http", []string{`port "http"`, "1 to 65535"}},
		{"127.0.0.1:", []string{`port ""`}},
		{"a b:7470", []string{`host "a b"`, "not an IP address or a host name"}},
		{"a..b:7470", []string{"not an IP address or a host name"}},
		{"1:2:3", []string{"is not host:port"}},
	} {
		err := CheckAddr(tc.addr)
		if tc.want == nil {
			if err != nil {
				t.Errorf("%q: %v, want accepted", tc.addr, err)
			}
			continue
		}
		if !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("%q: %v, want InvalidArgument", tc.addr, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v, want it to say %q", tc.addr, err, w)
			}
		}
	}
}

// The manager refuses a malformed address before anything else (before
// the loopback rule, which misread "localhost" with no port).
func TestGetChecksAddrFirst(t *testing.T) {
	m := New(nil, nil, nil, true)
	defer m.Close()
	_, err := m.Get(context.Background(), "localhost", "", writeNeed)
	if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), "has no port") {
		t.Fatalf("Get localhost: %v, want InvalidArgument: no port", err)
	}
	if m.Peers() != 0 {
		t.Fatal("a refused address was kept")
	}
}

// FuzzCheckAddr: CheckAddr never panics; what it accepts splits into a
// host and a port from 1 to 65535, and what it refuses is InvalidArgument
// naming the value.
func FuzzCheckAddr(f *testing.F) {
	for _, s := range []string{"127.0.0.1:7470", "localhost", "[::1]:1", "::1", ":0", "a:65536", "[", "]:1", "x:01", "%:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, addr string) {
		err := CheckAddr(addr)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), "peer") {
				t.Fatalf("%q: %v: not InvalidArgument naming the field", addr, err)
			}
			if addr != "" && !strings.Contains(err.Error(), strconv.Quote(addr)) {
				t.Fatalf("%q: %v: does not name the value", addr, err)
			}
			return
		}
		host, port, serr := net.SplitHostPort(addr)
		n, perr := strconv.Atoi(port)
		if serr != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			t.Fatalf("%q accepted: host %q port %q", addr, host, port)
		}
	})
}

func TestDescribeAnswer(t *testing.T) {
	for _, tc := range []struct{ first, want string }{
		{"", ""},
		{"\x16\x03\x03\x00", ""}, // TLS
		{"\x00\x00\x12\x04\x00\x00\x00\x00\x00", ""}, // HTTP/2 SETTINGS
		{"HTTP/1.1 400 Bad Request\r\n", `HTTP/1 ("HTTP/1.1 400 Bad Request")`},
		{"SSH-2.0-OpenSSH_9.6\r\n", "SSH server"},
		{"220 smtp ready", "not gRPC"},
	} {
		got := describeAnswer(tc.first)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.first, got, tc.want)
		}
	}
}
