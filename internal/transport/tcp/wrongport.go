package tcp

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
)

// A daemon given this daemon's data port as a peer address dials it with
// gRPC, whose first bytes are the HTTP/2 client preface. Closing on it left
// the caller with "error reading server preface: EOF", or, when the
// preface was shorter than a hello, waiting for its deadline. Instead the
// data port answers that gRPC client in its own protocol: every call fails
// at once with FailedPrecondition naming the peer port.

// http2Prefix is how the HTTP/2 client preface ("PRI * HTTP/2.0...")
// begins; a hello begins with helloMagic.
const http2Prefix = "PRI "

// wrongPortIdle closes a wrong-port gRPC connection left open.
const wrongPortIdle = 30 * time.Second

// SetPeerAddr tells the data port the daemon's peer port (--peer-listen),
// named to a gRPC client that dialled the data port by mistake.
func (t *Transport) SetPeerAddr(addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.peerAddr = addr
}

// wrongPortError is what a gRPC call to the data port on local (the
// address the caller dialled) gets.
func (t *Transport) wrongPortError(local net.Addr) error {
	t.mu.Lock()
	peer := t.peerAddr
	t.mu.Unlock()
	if peer == "" {
		peer = "its --peer-listen address"
	} else if host, port, err := net.SplitHostPort(peer); err == nil {
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			// The peer port listens on every address: name it on the one
			// the caller reached.
			if lh, _, err := net.SplitHostPort(local.String()); err == nil {
				peer = net.JoinHostPort(lh, port)
			}
		}
	}
	return fmt.Errorf("%w: %s is b2bd's data port (--data-listen), not its peer port: the peer port is %s (--peer-listen); give that as the peer address",
		errs.ErrFailedPrecondition, local, peer)
}

// serveWrongPort hands c, whose first bytes (already read) are first, to
// the wrong-port gRPC server, started on first use; it owns c from here.
func (t *Transport) serveWrongPort(c net.Conn, first []byte) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		c.Close()
		return
	}
	if t.wrongPort == nil {
		t.wrongPort = newConnListener(t.ln.Addr())
		t.wrongSrv = grpc.NewServer(grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: wrongPortIdle}),
			grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
				local := t.ln.Addr()
				if p, ok := peer.FromContext(ss.Context()); ok && p.LocalAddr != nil {
					local = p.LocalAddr
				}
				return grpcstatus.ToStatus(t.wrongPortError(local))
			}))
		t.wg.Add(1)
		go func(srv *grpc.Server, ln net.Listener) {
			defer t.wg.Done()
			_ = srv.Serve(ln)
		}(t.wrongSrv, t.wrongPort)
	}
	ln := t.wrongPort
	t.mu.Unlock()
	select {
	case ln.conns <- replay(c, first):
	case <-ln.done:
		c.Close()
	}
}

// connListener is a net.Listener fed with connections already accepted.
type connListener struct {
	addr  net.Addr
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

func newConnListener(addr net.Addr) *connListener {
	return &connListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }

// replayConn reads first before the rest of the connection.
type replayConn struct {
	net.Conn
	r io.Reader
}

func (c *replayConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func replay(c net.Conn, first []byte) net.Conn {
	return &replayConn{Conn: c, r: io.MultiReader(bytes.NewReader(first), c)}
}
