package peer

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/b2bd/b2bd/internal/errs"
)

// DefaultPort is the peer port a daemon listens on by default (--peer-listen).
const DefaultPort = 7470

// maxHostLen bounds a peer's host name (DNS names are at most 253 bytes).
const maxHostLen = 253

// CheckAddr validates a peer address's shape before anything dials it:
// host:port with a non-empty host (an IP address, [bracketed] for IPv6, or
// a DNS name) and a decimal port from 1 to 65535. The error is
// InvalidArgument, naming the field peer, the value and the rule, with the
// fix where one is obvious (a missing port).
func CheckAddr(addr string) error {
	if addr == "" {
		return fmt.Errorf("%w: peer is empty: give the destination daemon's peer address, host:port (its --peer-listen, default port %d)", errs.ErrInvalidArgument, DefaultPort)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: %s", errs.ErrInvalidArgument, noPort(addr))
	}
	if host == "" {
		return fmt.Errorf("%w: peer address %q has no host: use host:port, e.g. 127.0.0.1:%s", errs.ErrInvalidArgument, addr, port)
	}
	if n, err := strconv.ParseUint(port, 10, 32); err != nil || n < 1 || n > 65535 || port[0] == '0' {
		return fmt.Errorf("%w: peer address %q has port %q: the port must be a decimal number from 1 to 65535 (the peer port, --peer-listen, default %d)", errs.ErrInvalidArgument, addr, port, DefaultPort)
	}
	if err := checkHost(host); err != nil {
		return fmt.Errorf("%w: peer address %q: host %q %v", errs.ErrInvalidArgument, addr, host, err)
	}
	return nil
}

// noPort says what is wrong with an address net.SplitHostPort refused,
// which is nearly always a missing port.
func noPort(addr string) string {
	fix := func(host string) string {
		return fmt.Sprintf("peer address %q has no port: use host:port, e.g. %s:%d (the peer port, --peer-listen)", addr, host, DefaultPort)
	}
	switch {
	case strings.HasPrefix(addr, "[") && strings.HasSuffix(addr, "]"): // [::1]
		return fix(addr)
	case strings.Count(addr, ":") > 1: // ::1, a bare IPv6 address
		if _, err := netip.ParseAddr(addr); err == nil {
			return fix("[" + addr + "]")
		}
	case !strings.ContainsAny(addr, ":[]"): // localhost, 10.0.0.2, node7
		return fix(addr)
	}
	return fmt.Sprintf("peer address %q is not host:port (a port from 1 to 65535; an IPv6 host in brackets, e.g. [::1]:%d)", addr, DefaultPort)
}

// checkHost accepts an IP address (with an IPv6 zone) or a DNS name.
func checkHost(host string) error {
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if len(host) > maxHostLen {
		return fmt.Errorf("is %d bytes long: a host name is at most %d", len(host), maxHostLen)
	}
	for _, label := range strings.Split(strings.TrimSuffix(host, "."), ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("is not an IP address or a host name (each dot-separated label is 1 to 63 characters)")
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return fmt.Errorf("is not an IP address or a host name (letters, digits, '-', '_' and '.' only)")
			}
		}
	}
	return nil
}
