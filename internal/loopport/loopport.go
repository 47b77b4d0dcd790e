// Package loopport picks loopback ports for daemons that tests and the soak
// start on fixed ports (and restart on the same ones).
package loopport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// Free is 127.0.0.1:PORT for a port that was free a moment ago, picked at
// random below the kernel's ephemeral range: a port from that range (what
// listening on port 0 gives) can be taken by any outgoing connection
// before the daemon binds it, or while it restarts, and CI saw exactly
// that ("bind: address already in use").
func Free() (string, error) {
	lo := ephemeralLow()
	for range 200 {
		port := 10000 + rand.IntN(lo-10000)
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		addr := l.Addr().String()
		l.Close()
		return addr, nil
	}
	return "", fmt.Errorf("loopport: no free loopback port in 10000..%d after 200 tries", lo-1)
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768
// when it cannot be read, or when it leaves too few ports below it).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil || lo < 12000 {
		return 32768
	}
	return lo
}
