package peer

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/b2bd/b2bd/internal/transport"
)

// track wraps a peer's data connection so that the peer counts as busy
// while a write is in flight on it or a batch prepared on it lives, and is
// never reaped then, and counts its own batches for connSet. The wrapper
// adds four atomic adds, two stores and two clock reads per transfer, and no
// allocation. What the kind really does is its Caps, which
// the Session carries and the batch layer checks before calling.
func track(c transport.Conn, st *state) *trackedConn {
	return &trackedConn{Conn: c, st: st}
}

type trackedConn struct {
	transport.Conn
	st *state
	// inflight counts the batches on this connection now (connSet.pick),
	// plans the live plans prepared on it, lastUse when its last batch
	// ended (UnixNano): an extra connection idle long enough is closed
	// (connSet.trim).
	inflight atomic.Int32
	plans    atomic.Int32
	lastUse  atomic.Int64
}

// Post forwards a transfer to the connection, counted busy while it runs.
func (c *trackedConn) Post(ctx context.Context, r *transport.Request) (transport.Stats, error) {
	c.st.busy.Add(1)
	c.inflight.Add(1)
	defer c.st.done()
	defer c.end()
	return c.Conn.Post(ctx, r)
}

// end ends a batch on c.
func (c *trackedConn) end() {
	c.lastUse.Store(time.Now().UnixNano())
	c.inflight.Add(-1)
}

// Prepare prepares on the connection; a live plan keeps its peer busy.
func (c *trackedConn) Prepare(r *transport.Request) (transport.Prepared, error) {
	p, err := c.Conn.Prepare(r)
	if err != nil {
		return nil, err
	}
	c.st.busy.Add(1) // until Close: a live plan keeps its peer
	c.plans.Add(1)   // and its connection
	tp := &trackedPrepared{Prepared: p, st: c.st, conn: c}
	tp.wr, _ = p.(workRequester)
	return tp, nil
}

type workRequester interface{ WorkRequests() uint64 }

type trackedPrepared struct {
	transport.Prepared
	st     *state
	conn   *trackedConn // the connection it was prepared on, which its writes use
	closed atomic.Bool
	wr     workRequester // nil: the kind does not count its work requests
}

func (p *trackedPrepared) Write(ctx context.Context) (transport.Stats, error) {
	p.st.busy.Add(1)
	p.conn.inflight.Add(1)
	defer p.st.done()
	defer p.conn.end()
	return p.Prepared.Write(ctx)
}

func (p *trackedPrepared) Close() error {
	if p.closed.CompareAndSwap(false, true) {
		p.conn.plans.Add(-1)
		p.st.done()
	}
	return p.Prepared.Close()
}

// WorkRequests is the prepared work's count (verbs: WRs posted per Write),
// 0 where the kind keeps none, which is what the batch layer reports then.
func (p *trackedPrepared) WorkRequests() uint64 {
	if p.wr == nil {
		return 0
	}
	return p.wr.WorkRequests()
}

// dial is the control connection's dialer: plain TCP, remembering the
// first bytes the other end sends, so that a failed handshake can say what
// answered instead of a daemon (sniffed).
func (st *state) dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &sniffConn{Conn: c}
	st.sniff.Store(s)
	return s, nil
}

// sniffLen is how much of the first answer is kept.
const sniffLen = 24

type sniffConn struct {
	net.Conn
	mu    sync.Mutex
	first []byte
}

func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	if k := min(n, sniffLen-len(c.first)); k > 0 {
		c.first = append(c.first, p[:k]...)
	}
	c.mu.Unlock()
	return n, err
}

// sniffed says what answered on the control connection when it is plainly
// not gRPC: "" when it looked like HTTP/2 or TLS, or said nothing.
func (st *state) sniffed() string {
	c := st.sniff.Load()
	if c == nil {
		return ""
	}
	c.mu.Lock()
	first := string(c.first)
	c.mu.Unlock()
	return describeAnswer(first)
}

// describeAnswer names a server by the first bytes it sent on a gRPC
// connection: "" for what a daemon sends (an HTTP/2 SETTINGS frame in
// plaintext, a TLS record under TLS) or too little to judge.
func describeAnswer(first string) string {
	switch {
	case len(first) == 0:
		return ""
	case first[0] == 0x16 || first[0] == 0x15: // TLS handshake or alert record
		return ""
	case len(first) < 4:
		return ""
	case first[3] == 0x4 && first[0] == 0: // an HTTP/2 SETTINGS frame
		return ""
	case strings.HasPrefix(first, "HTTP/"):
		return fmt.Sprintf("it answered HTTP/1 (%q), not gRPC: a web server?", firstLine(first))
	case strings.HasPrefix(first, "SSH-"):
		return fmt.Sprintf("it answered %q: an SSH server", firstLine(first))
	}
	return fmt.Sprintf("it answered %q, which is not gRPC (HTTP/2)", first)
}

func firstLine(s string) string {
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		return s[:i]
	}
	return s
}
