package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/b2bd/b2bd/internal/errs"
)

// PeerTLS is the daemon's mutual-TLS identity for talking to other daemons:
// its certificate, and the CA that peers' certificates must chain to.
type PeerTLS struct {
	Server *tls.Config // presents our cert, requires and verifies the peer's
	Client *tls.Config // presents our cert, verifies the peer's against the CA
}

// LoadPeerTLS reads PEM files. Peers are identified by their certificate's
// first DNS name (else its common name), and must present one signed by ca.
func LoadPeerTLS(certFile, keyFile, caFile string) (*PeerTLS, error) {
	if certFile == "" || keyFile == "" || caFile == "" {
		return nil, fmt.Errorf("%w: peer TLS needs --tls-cert, --tls-key and --tls-ca together", errs.ErrInvalidArgument)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: load --tls-cert %s / --tls-key %s: %v", errs.ErrInvalidArgument, certFile, keyFile, err)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("%w: read --tls-ca %s: %v", errs.ErrInvalidArgument, caFile, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: --tls-ca %s holds no PEM certificate", errs.ErrInvalidArgument, caFile)
	}
	return NewPeerTLS(cert, pool), nil
}

// NewPeerTLS builds the configs from a loaded certificate and CA pool.
func NewPeerTLS(cert tls.Certificate, ca *x509.CertPool) *PeerTLS {
	return &PeerTLS{
		Server: &tls.Config{
			Certificates: []tls.Certificate{cert},
			ClientAuth:   tls.RequireAndVerifyClientCert,
			ClientCAs:    ca,
			MinVersion:   tls.VersionTLS13,
		},
		Client: &tls.Config{
			Certificates: []tls.Certificate{cert},
			RootCAs:      ca,
			MinVersion:   tls.VersionTLS13,
		},
	}
}

// ClientFor is the client config for dialing addr (host:port): the peer's
// certificate must name that host.
func (p *PeerTLS) ClientFor(addr string) *tls.Config {
	c := p.Client.Clone()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		c.ServerName = host
	}
	return c
}

// Identity names a verified peer certificate.
func Identity(cert *x509.Certificate) string {
	if len(cert.DNSNames) > 0 {
		return cert.DNSNames[0]
	}
	return cert.Subject.CommonName
}

// PeerIdentity is the authenticated identity of the peer daemon calling ctx,
// or "" when the call did not come over mutual TLS (--insecure).
func PeerIdentity(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.PeerCertificates) == 0 {
		return ""
	}
	return Identity(ti.State.PeerCertificates[0])
}

// IsLoopback reports whether a listen or dial address stays on this host.
// An empty host (":7470") listens on every interface, so it is not loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
