package daemon

import (
	"fmt"
	"net"
	"os"
)

// sdNotify sends state (e.g. "READY=1") to systemd's notification socket,
// $NOTIFY_SOCKET, as sd_notify(3) does: one datagram on a Unix datagram
// socket, a leading '@' meaning the abstract namespace. Without
// $NOTIFY_SOCKET (not started by systemd with Type=notify) it does nothing
// and returns false.
func sdNotify(state string) (bool, error) {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return false, nil
	}
	if addr[0] != '/' && addr[0] != '@' {
		return false, fmt.Errorf("NOTIFY_SOCKET %q: want an absolute path or an abstract name (@...)", addr)
	}
	if addr[0] == '@' {
		addr = "\x00" + addr[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		return false, fmt.Errorf("sd_notify %s: %w", state, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return false, fmt.Errorf("sd_notify %s: %w", state, err)
	}
	return true, nil
}
