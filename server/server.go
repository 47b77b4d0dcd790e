// Package server implements b2bd's gRPC services: B2B (local.go), which
// applications call on their local daemon, and Peer (peer.go), which daemons
// call on each other. Handlers convert (convert.go), call the layer below
// (internal/batch, the registry, the transports) and map errors to statuses
// in one place, grpcstatus.ToStatus.
package server

import (
	"context"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/batch"
	"github.com/b2bd/b2bd/internal/callid"
	"github.com/b2bd/b2bd/internal/notify"
	"github.com/b2bd/b2bd/internal/peer"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/staging"
	"github.com/b2bd/b2bd/internal/transport"
	"github.com/b2bd/b2bd/internal/trigger"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Counters are the daemon's batch statistics.
type Counters = batch.Counters

// MaxNotification bounds a batch's notification.
const MaxNotification = batch.MaxNotification

// Config is what the services need from the daemon.
type Config struct {
	// Batches is the transfer layer the handlers call, built by the
	// daemon; nil: New builds one from the fields below (tests).
	Batches     *batch.Service
	NodeName    string
	Version     string
	PeerAddress string
	Registry    *region.Registry
	Peers       *peer.Manager
	Transports  []*b2bv1.TransportStatus // every transport, available or not
	// Live are the running transports, whose Status the daemon's Status
	// reports; nil reports none.
	Live map[b2bv1.TransportKind]transport.Transport
	// Adverts are the running transports' own parameters (the TCP data
	// listener and token), told to peers in the handshake.
	// Every running transport's is here, one per kind (a kind without
	// parameters has an empty Data): a kind absent is not offered.
	Adverts []transport.Advert
	// Signals answer the Peer service's Signal, by kind: the running
	// transports (a kind that takes no set-up messages from peers answers
	// ErrUnimplemented).
	Signals        map[transport.Kind]transport.SignalHandler
	MaxDescriptors int
	MaxPlans       int // prepared plans per client identity; 0: batch.DefaultMaxPlans
	MaxTransfers   int // async transfers per client; 0: batch.DefaultMaxTransfers
	DefaultTimeout time.Duration
	CUDAAvailable  bool
	CUDADetail     string
	Counters       *Counters
	Notify         *notify.Hub
	Staging        *staging.Pool // nil without CUDA
	// OpenFDs counts the process's open file descriptors for Status; nil
	// reports 0.
	OpenFDs func() uint32
	// Calibration is the daemon's measurement for auto (Status shows
	// it); nil reports none.
	Calibration func() *transport.Calibration
	// InstanceID names this start of the daemon in handshakes (peers'
	// prepared plans go stale when it changes); 0: New picks a random one.
	InstanceID uint64
	// Triggers is the trigger watcher's policy (docs/kv.md, "Layer
	// streaming"); the zero value spins while a CPU is free.
	Triggers trigger.Policy
	Log      hclog.Logger
}

// Server holds both services.
type Server struct {
	cfg     Config
	batches *batch.Service
	late    lateLog // calls answered past their caller's deadline (deadline.go)

	// calls are the synchronous calls in flight that CancelCall (calls.go)
	// can stop.
	calls callid.Registry[region.Caller]

	rawMu     sync.Mutex
	raw       map[net.Conn]struct{} // raw submit connections (raw.go)
	rawClosed bool

	// observeSubmit sees each transfer that no unary interceptor sees (a
	// submit on a SubmitStream or the raw socket, a ring record's, one
	// started by StartTransfer(s) as it ends); nil: none. Set before serving.
	observeSubmit SubmitObserver

	// unknownPID: a Unix-socket client's pid was 0 (warned once, leases.go).
	unknownPID atomic.Bool

	// drain is closed by Drain: long-lived peer streams end.
	drain     chan struct{}
	drainOnce sync.Once

	// cut cancels the API calls still running when the shutdown grace
	// ends (CutCalls).
	cut *cutter
}

// Drain ends the peers' note streams (NotifyStream), so that the peer
// server's graceful stop waits only for calls in flight; call it as the
// daemon starts draining. Safe to call twice.
func (s *Server) Drain() { s.drainOnce.Do(func() { close(s.drain) }) }

// SubmitObserver is told of a submit's result (nil on error), error and
// duration in seconds.
type SubmitObserver func(res *b2bv1.BatchTransferResponse, err error, seconds float64)

// ObserveSubmits has fn told of every transfer that the unary calls'
// interceptor does not see: submits on a SubmitStream or the raw submit
// socket, the ring's submits, batches and block transfers, and transfers
// started with StartTransfer(s), as each ends. Call it before serving.
func (s *Server) ObserveSubmits(fn SubmitObserver) {
	s.observeSubmit = fn
	s.batches.SetObserver(func(res batch.Result, err error, d time.Duration) {
		var resp *b2bv1.BatchTransferResponse
		if err == nil {
			resp = transferResponse(res)
		}
		fn(resp, grpcstatus.ToStatus(err), d.Seconds())
	})
}

// New validates cfg and returns the services.
func New(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	if cfg.Notify == nil {
		cfg.Notify = &notify.Hub{}
	}
	for cfg.InstanceID == 0 {
		cfg.InstanceID = rand.Uint64()
	}
	if cfg.OpenFDs == nil {
		cfg.OpenFDs = func() uint32 { return 0 }
	}
	b := cfg.Batches
	if b == nil {
		var peers batch.Peers
		if cfg.Peers != nil {
			peers = cfg.Peers
		}
		b = batch.New(batch.Config{NodeName: cfg.NodeName, Self: cfg.InstanceID, Registry: cfg.Registry, Peers: peers, MaxDescriptors: cfg.MaxDescriptors, MaxPlans: cfg.MaxPlans, MaxTransfers: cfg.MaxTransfers,
			DefaultTimeout: cfg.DefaultTimeout, Counters: cfg.Counters, Triggers: cfg.Triggers, Notes: cfg.Notify, Log: cfg.Log})
	}
	cfg.Counters, cfg.MaxDescriptors = b.Counters(), b.MaxDescriptors()
	return &Server{cfg: cfg, batches: b, drain: make(chan struct{}), cut: newCutter()}
}

// Close frees every prepared plan and refuses new ones (daemon shutdown,
// before the registry closes); safe to call twice.
func (s *Server) Close() {
	s.closeRaw()
	s.batches.Close()
}

// Plans counts the prepared plans held.
func (s *Server) Plans() int { return s.batches.Plans().Len() }

// Local is the B2B service.
func (s *Server) Local() b2bv1.B2BServer { return &local{s: s} }

// Peer is the Peer service.
func (s *Server) Peer() b2bv1.PeerServer { return &peerService{s: s} }

// caller is who calls the local API: its uid on the Unix socket, else its
// authenticated TLS identity ("" on the plaintext loopback API). Regions
// belong to it (region.Caller.Owns).
func caller(ctx context.Context) region.Caller {
	c, ok := auth.Caller(ctx)
	if !ok {
		return region.Caller{Identity: auth.PeerIdentity(ctx)}
	}
	return region.Caller{UID: c.UID, GID: c.GID, Known: true}
}
