package auth

import (
	"net"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/credentials"
)

// A client or peer whose TLS handshake the daemon refuses (a certificate
// of another CA, none at all) sees only its connection reset, which looks
// like a daemon that is down; the daemon says why in its log, at most once
// a second (a stranger cannot flood it).

// refusals logs refused handshakes, rate-limited; the zero value logs
// nothing.
type refusals struct {
	log  hclog.Logger
	last *atomic.Int64 // unix ns of the last line; shared by copies
}

func newRefusals(log hclog.Logger) refusals { return refusals{log: log, last: new(atomic.Int64)} }

func (r refusals) refused(where string, c net.Conn, err error) {
	if r.log == nil || r.last == nil {
		return
	}
	now, prev := time.Now().UnixNano(), r.last.Load()
	if now-prev < int64(time.Second) || !r.last.CompareAndSwap(prev, now) {
		return
	}
	r.log.Warn("TLS handshake refused (the other side sees its connection reset)", "listener", where, "remote", c.RemoteAddr().String(), "error", err)
}

// NewPeerCred is PeerCred that logs the refused TLS handshakes of the
// --api-listen listener off loopback.
func NewPeerCred(log hclog.Logger) PeerCred { return PeerCred{refusals: newRefusals(log)} }

// LogRefused wraps c (the peer listener's TLS) so that its refused
// handshakes are logged.
func LogRefused(c credentials.TransportCredentials, where string, log hclog.Logger) credentials.TransportCredentials {
	return &loggedCreds{TransportCredentials: c, where: where, refusals: newRefusals(log)}
}

type loggedCreds struct {
	credentials.TransportCredentials
	where string
	refusals
}

func (l *loggedCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, ai, err := l.TransportCredentials.ServerHandshake(c)
	if err != nil {
		l.refused(l.where, c, err)
	}
	return conn, ai, err
}

func (l *loggedCreds) Clone() credentials.TransportCredentials {
	return &loggedCreds{TransportCredentials: l.TransportCredentials.Clone(), where: l.where, refusals: l.refusals}
}
