package loopport

import (
	"net"
	"strconv"
	"testing"
)

// TestFree: the port is below the ephemeral range, and free to bind.
func TestFree(t *testing.T) {
	lo := ephemeralLow()
	for range 20 {
		addr, err := Free()
		if err != nil {
			t.Fatal(err)
		}
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if port < 10000 || port >= lo {
			t.Fatalf("port %d: want 10000 to %d", port, lo-1)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%s was handed out but does not bind: %v", addr, err)
		}
		l.Close()
	}
}
