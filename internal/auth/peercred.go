// Package auth identifies callers: local applications by their Unix socket
// credentials (SO_PEERCRED).
package auth

import (
	"context"
	"crypto/tls"
	"errors"
	"net"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Local is a local caller as the kernel reports it.
type Local struct {
	credentials.CommonAuthInfo
	UID, GID uint32
	PID      int32
}

func (Local) AuthType() string { return "peercred" }

// PeerCred are transport credentials for the local API: on a Unix socket
// they record the caller's uid, gid and pid; on a mutual-TLS connection the
// verified certificate; on plaintext TCP nothing.
type PeerCred struct {
	refusals // NewPeerCred: refused TLS handshakes are logged
}

func (p PeerCred) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if tc, ok := c.(*tls.Conn); ok {
		// The --api-listen listener off loopback does mutual TLS itself:
		// record the verified certificate, so that the caller's identity
		// (PeerIdentity) owns the regions it registers. gRPC has set the
		// connection's handshake deadline.
		if err := tc.Handshake(); err != nil {
			p.refused("api", c, err)
			return nil, nil, err
		}
		return c, credentials.TLSInfo{State: tc.ConnectionState(), CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return c, nil, nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, nil, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, nil, err
	}
	if serr != nil {
		return nil, nil, serr
	}
	return c, Local{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}, UID: cred.Uid, GID: cred.Gid, PID: cred.Pid}, nil
}

func (PeerCred) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("auth: PeerCred is server-side only")
}
func (PeerCred) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "peercred"}
}
func (p PeerCred) Clone() credentials.TransportCredentials { return p }
func (PeerCred) OverrideServerName(string) error           { return nil }

// Caller returns the local caller of ctx; ok is false for TCP callers.
func Caller(ctx context.Context) (Local, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return Local{}, false
	}
	l, ok := p.AuthInfo.(Local)
	return l, ok
}
