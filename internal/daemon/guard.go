package daemon

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// http2Preface is what every gRPC client sends first in plaintext; under TLS
// the first byte is a handshake record (0x16).
var (
	http2Preface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	tlsHandshake = []byte{0x16}
)

// guardListener closes peer connections whose first bytes are not the
// expected protocol, with a log line naming the remote and the bytes, before
// gRPC has to make sense of them.
type guardListener struct {
	net.Listener
	want []byte
	log  hclog.Logger
}

func guard(ln net.Listener, tlsOn bool, log hclog.Logger) net.Listener {
	want := http2Preface
	if tlsOn {
		want = tlsHandshake
	}
	return &guardListener{Listener: ln, want: want, log: log}
}

func (g *guardListener) Accept() (net.Conn, error) {
	c, err := g.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &guardConn{Conn: c, g: g}, nil
}

type guardConn struct {
	net.Conn
	g    *guardListener
	mu   sync.Mutex
	seen int // bytes of the expected prefix checked so far
}

var errNotOurProtocol = errors.New("peer port: not the b2bd peer protocol")

func (c *guardConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen < len(c.g.want) {
		k := min(n, len(c.g.want)-c.seen)
		if !bytes.Equal(p[:k], c.g.want[c.seen:c.seen+k]) {
			c.g.log.Warn("peer connection closed: not the b2bd peer protocol", "remote", c.RemoteAddr().String(), "first_bytes", string(p[:min(n, 16)]))
			c.Conn.Close()
			return 0, errNotOurProtocol
		}
		c.seen += k
		if err != nil && c.seen < len(c.g.want) && errors.Is(err, io.EOF) {
			c.g.log.Warn("peer connection closed before its protocol preface", "remote", c.RemoteAddr().String(), "bytes", c.seen)
		}
	}
	return n, err
}
