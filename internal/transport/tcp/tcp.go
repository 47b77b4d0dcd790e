// Package tcp is the data plane for hosts without RDMA. It emulates one-sided
// writes: the sender streams (destination offset, length) tables and payload
// over persistent connections with vectored writes, and the receiving daemon
// reads each block straight into the registered destination region, then
// acknowledges once its share of the batch is in place.
package tcp

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/staging"
	"github.com/b2bd/b2bd/internal/transport"
)

// Config configures the TCP transport.
type Config struct {
	// Listen is the data listener's address, e.g. ":7471" or "127.0.0.1:0".
	Listen string
	// Streams is the number of TCP connections per peer.
	Streams int
	// FrameBytes is the payload per frame before the sender starts another.
	FrameBytes int
	// MinShareBytes: a batch uses another stream only per this many bytes, so
	// small batches don't pay for fan-out.
	MinShareBytes int
	// Staging moves GPU memory through pinned host buffers; nil on hosts
	// without CUDA, where GPU regions cannot use this transport.
	Staging *staging.Pool
	// TLS, when set, wraps every data connection in mutual TLS with the
	// daemons' peer certificates; nil means plaintext (loopback only).
	TLS *auth.PeerTLS
}

// Defaults, chosen by measurement on loopback (docs/architecture.md, "TCP transport").
const (
	DefaultStreams       = 4
	DefaultFrameBytes    = 4 << 20
	DefaultMinShareBytes = 1 << 20
	// copyBelow: blocks smaller than this are copied into one staging buffer
	// per frame instead of getting an iovec each.
	copyBelow = 4096
	// frameTimeout bounds how long a receiver waits for the rest of a frame.
	frameTimeout = 60 * time.Second
	// recvBuf is the receiver's read buffer: small blocks are copied out of
	// it (one system call for many), larger ones read straight into the
	// region.
	recvBuf = 256 << 10
	// directRead: a block at least this long is read straight into the
	// region (plaintext), all of it, not through the read buffer.
	directRead = 64 << 10
)

// Transport is the TCP data plane of one daemon.
type Transport struct {
	transport.Quiet // HandleSignal: tcp sets up over its own data connections
	cfg             Config
	in              transport.Inbound
	log             hclog.Logger
	ln              net.Listener
	token           [16]byte

	mu       sync.Mutex
	closed   bool
	inbound  map[net.Conn]struct{}
	sessions map[uint64]*session // receiving side, by sender conn id
	wg       sync.WaitGroup
	// peerAddr is the daemon's peer port; wrongPort and wrongSrv answer
	// gRPC clients that dialled this data port instead (wrongport.go).
	peerAddr  string
	wrongPort *connListener
	wrongSrv  *grpc.Server
}

// New starts the data listener.
func New(cfg Config, in transport.Inbound, log hclog.Logger) (*Transport, error) {
	if cfg.Streams <= 0 {
		cfg.Streams = DefaultStreams
	}
	if cfg.FrameBytes <= 0 {
		cfg.FrameBytes = DefaultFrameBytes
	}
	if cfg.FrameBytes > maxPayload {
		cfg.FrameBytes = maxPayload
	}
	if cfg.MinShareBytes <= 0 {
		cfg.MinShareBytes = DefaultMinShareBytes
	}
	if log == nil {
		log = hclog.NewNullLogger()
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("tcp: listen %s: %w", cfg.Listen, err)
	}
	if cfg.TLS != nil {
		// "h2" too: a gRPC client that dialled this port by mistake
		// insists on it, and then learns which port it wanted
		// (wrongport.go); data connections negotiate no protocol.
		srv := cfg.TLS.Server.Clone()
		srv.NextProtos = append(srv.NextProtos, "h2")
		ln = tls.NewListener(ln, srv)
	}
	t := &Transport{cfg: cfg, in: in, log: log, ln: ln, inbound: map[net.Conn]struct{}{}, sessions: map[uint64]*session{}}
	if _, err := rand.Read(t.token[:]); err != nil {
		ln.Close()
		return nil, fmt.Errorf("tcp: session token: %w", err)
	}
	t.wg.Add(1)
	go t.acceptLoop()
	return t, nil
}

func (t *Transport) Kind() transport.Kind { return transport.TCP }

// Resources counts the accepted data streams; see transport.Counter.
// Outgoing streams belong to the peer manager's sessions and show in the
// daemon's file descriptors instead.
// Status is the transport's live handles (Resources).
func (t *Transport) Status() transport.Status { return transport.Status{Resources: t.Resources()} }

func (t *Transport) Resources() transport.Resources {
	t.mu.Lock()
	defer t.mu.Unlock()
	return transport.Resources{Connections: len(t.inbound)}
}

// Addr is the data listener's address, advertised in the peer handshake.
func (t *Transport) Addr() string { return t.ln.Addr().String() }

// Token is presented by senders in their hello; peers learn it from the
// handshake, so a data connection is only accepted from a daemon that
// completed one.
func (t *Transport) Token() []byte { return t.token[:] }

// Advertise tells peers (handshake) the data listener and session token.
func (t *Transport) Advertise() transport.Advert {
	return transport.Advert{Kind: transport.TCP, Detail: "data listener " + t.Addr(), Data: marshalAdvert(t.Addr(), t.Token())}
}

// Close stops the listener and every inbound connection, and waits for them.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	for c := range t.inbound {
		c.Close()
	}
	wrongSrv := t.wrongSrv
	t.mu.Unlock()
	err := t.ln.Close()
	if wrongSrv != nil {
		wrongSrv.Stop() // closes its listener and connections
	}
	t.wg.Wait()
	return err
}

type registration struct {
	transport.SingleKey // Withdraw, Rails
	mem                 memory.Memory
	key                 atomic.Uint64
	// readKey is the token a peer reads the region with: distinct from key,
	// so a writer's token never reads and a reader's never writes (the
	// registry indexes each for its own operation).
	readKey atomic.Uint64
	t       *Transport
}

// KeyFor is the write or the read token.
func (r *registration) KeyFor(a transport.Access) (transport.RemoteKey, error) {
	switch a {
	case transport.AccessWrite:
		return r.Key(), nil
	case transport.AccessRead:
		return transport.RemoteKey{Key: r.readKey.Load()}, nil
	}
	return transport.RemoteKey{}, fmt.Errorf("%w: tcp: no single key grants %s", errs.ErrInvalidArgument, a)
}

// RekeyFor replaces the read token alone (the write token: Rekey).
func (r *registration) RekeyFor(a transport.Access) (transport.RemoteKey, error) {
	if a == transport.AccessWrite {
		return r.Rekey()
	}
	if a != transport.AccessRead {
		return transport.RemoteKey{}, fmt.Errorf("%w: tcp: rekey %s", errs.ErrInvalidArgument, a)
	}
	k, err := r.t.newKey()
	if err != nil {
		return transport.RemoteKey{}, fmt.Errorf("tcp: new region read key: %w", err)
	}
	return transport.RemoteKey{Key: r.readKey.Swap(k)}, nil
}

func (r *registration) Memory() memory.Memory    { return r.mem }
func (r *registration) Key() transport.RemoteKey { return transport.RemoteKey{Key: r.key.Load()} }
func (r *registration) Close() error             { return nil }

// Rekey gives the registration a new random write key: the
// receiver pins by key through the registry's index, which moves to the new
// one, so a batch under the old key is refused before a byte is placed.
func (r *registration) Rekey() (transport.RemoteKey, error) {
	k, err := r.t.newKey()
	if err != nil {
		return transport.RemoteKey{}, fmt.Errorf("tcp: new region key: %w", err)
	}
	return transport.RemoteKey{Key: r.key.Swap(k)}, nil
}
func (t *Transport) newKey() (uint64, error) {
	var b [8]byte
	for {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, err
		}
		if k := binary.LittleEndian.Uint64(b[:]); k != 0 {
			return k, nil
		}
	}
}

// stagersPerDevice is how many pinned buffers a device's GPU regions need
// for one batch each way at a time: writeStaged's two, and one for each of
// a peer's streams that lands frames here.
func stagersPerDevice(streams int) int { return 2 + streams }

// Register gives m a random key. GPU memory is accepted when the transport
// can stage it.
func (t *Transport) Register(m memory.Memory) (transport.Registration, error) {
	switch {
	case m.Kind == memory.Host && m.Host != nil:
	case m.Kind == memory.CUDA && t.cfg.Staging != nil:
	default:
		return nil, fmt.Errorf("%w: tcp transport: %s memory needs staging through pinned host buffers, and this daemon has no CUDA driver", errs.ErrFailedPrecondition, m.Kind)
	}
	if m.Kind == memory.CUDA {
		// The pinned buffers this device's batches take, allocated now and
		// not by the first batch (pinning 64 MiB takes tens to hundreds of
		// ms): a sender's two (writeStaged's double buffer) and one per
		// receiving stream (a peer with as many streams as this daemon).
		if err := t.cfg.Staging.Reserve(m.Device, stagersPerDevice(t.cfg.Streams)); err != nil {
			return nil, fmt.Errorf("tcp: register GPU memory on device %d: %w", m.Device, err)
		}
	}
	k, err := t.newKey()
	if err != nil {
		return nil, fmt.Errorf("tcp: region key: %w", err)
	}
	rk, err := t.newKey()
	if err != nil {
		return nil, fmt.Errorf("tcp: region read key: %w", err)
	}
	r := &registration{mem: m, t: t}
	r.key.Store(k)
	r.readKey.Store(rk)
	return r, nil
}
