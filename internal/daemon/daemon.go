// Package daemon wires b2bd together: transports, the region registry, the
// peer manager and the gRPC services, with their listeners and shutdown.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/batch"
	"github.com/b2bd/b2bd/internal/config"
	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/health"
	"github.com/b2bd/b2bd/internal/metrics"
	"github.com/b2bd/b2bd/internal/notify"
	"github.com/b2bd/b2bd/internal/peer"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/staging"
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
	"github.com/b2bd/b2bd/server"
)

// Version is stamped at build time.
var Version = "dev"

// Config is everything the daemon is told on its command line.
type Config struct {
	NodeName   string
	Socket     string // local API Unix socket
	SocketMode string // octal
	Group      string // group of the socket and the shm dir: name or gid; "": b2bd if it exists
	APIListen  string // optional local API TCP listener
	PeerListen string // peer control plane
	ShmDir     string
	Transport  string // auto, or a registered kind (transport.Names)
	// Calibrate "start": measure this host's paths once serving, for
	// auto's choice for same-host peers (calibrate.go); "" or "off": by
	// rank. CalibrationFile keeps the result for later starts.
	Calibrate       string
	CalibrationFile string
	MaxDescriptors  int
	MaxPlans        int // prepared plans per client identity
	MaxTransfers    int // async transfers per client
	// PeerIdleTimeout closes a peer's connections once unused this long;
	// MaxPeers caps the peers kept at once (internal/peer.Limits). Zero:
	// the default; the flags refuse values out of range.
	PeerIdleTimeout time.Duration
	MaxPeers        int
	ConnsPerPeer    int    // data connections per peer and transport (peer.Limits)
	SubmitSocket    string // optional raw submit socket (server/raw.go)
	DefaultTimeout  time.Duration
	ShutdownGrace   time.Duration
	LogLevel        string
	TLSCert         string // peer mTLS: this daemon's certificate
	TLSKey          string
	TLSCA           string // the CA peers' certificates must chain to
	Insecure        bool   // plaintext between daemons, loopback addresses only
	MetricsListen   string // optional Prometheus /metrics (and /healthz) HTTP address
	HealthListen    string // optional plaintext health-only address (grpc.health.v1 and HTTP /healthz)
	// Phases reads a successful batch's phase durations from its response
	// for b2bd_batch_phase_duration_seconds (with --metrics-listen); nil:
	// none. See docs/observe-deploy.md for wiring it to the phases message.
	Phases metrics.PhaseObserver
	// Kinds are the registered transports' settings, bound to their flags
	// by RegisterKindFlags; nil: every kind's defaults (New makes them).
	Kinds *KindSettings
	// KindFlags sets transport flags by name ("data-listen":
	// "127.0.0.1:0"), checked against their ranges, for a Config built
	// without b2bd's flag set (tests, programs embedding the daemon).
	KindFlags map[string]string
}

// RegisterFlags binds cfg to fs with the daemon's defaults, and each flag
// to its documented range in flagRanges (setting a flag checks it).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	host, _ := os.Hostname()
	fs.StringVar(&c.NodeName, "node-name", host, "this daemon's name, sent to peers")
	fs.StringVar(&c.Socket, "socket", "/run/b2bd/b2bd.sock", "local API Unix socket")
	fs.StringVar(&c.SocketMode, "socket-mode", "0660", "local API socket file mode (octal)")
	fs.StringVar(&c.Group, "group", "", "group (name or gid) owning the socket and --shm-dir, whose members may use b2bd (default b2bd if that group exists)")
	fs.StringVar(&c.APIListen, "api-listen", "", "also serve the local API on this TCP address (host:port)")
	fs.StringVar(&c.PeerListen, "peer-listen", ":7470", "peer control-plane address (host:port)")
	// Per-peer state is bounded: idle peers are closed, and peers capped.
	fs.DurationVar(&c.PeerIdleTimeout, "peer-idle-timeout", peer.DefaultIdleTimeout,
		"close a peer's connections once nothing used them this long; the next batch reconnects")
	fs.IntVar(&c.MaxPeers, "max-peers", peer.DefaultMaxPeers,
		"most peers this daemon keeps connections to at once; a batch to one more is refused with ResourceExhausted")
	fs.IntVar(&c.ConnsPerPeer, "conns-per-peer", peer.DefaultConnsPerPeer,
		"most data connections to one peer per transport; each carries one batch at a time, so batches to a peer run side by side up to this many")
	fs.StringVar(&c.ShmDir, "shm-dir", "/dev/shm/b2bd", "directory of host regions' shared-memory files")
	fs.StringVar(&c.Transport, "transport", transport.Auto, "data plane: auto (local when the peer proves it is on this host, else verbs when both peers have RDMA, else tcp), tcp, verbs or local (same host only: shared memory and CUDA IPC)")
	fs.StringVar(&c.Calibrate, "calibrate", "start", "start: once serving, time batches to this daemon over each transport per memory route and block size (about a second), and let auto give a peer on this host the fastest; off: auto goes by rank")
	fs.StringVar(&c.CalibrationFile, "calibration-file", "", "keep --calibrate's result in this file and reuse it on a later start of the same build on the same host, transports and GPUs (empty: measure at every start)")
	fs.IntVar(&c.MaxDescriptors, "max-descriptors", desc.DefaultMaxBlocks, "most blocks per batch")
	fs.IntVar(&c.MaxPlans, "max-plans", batch.DefaultMaxPlans, "most prepared transfers (PrepareTransfer) one client identity may hold")
	fs.IntVar(&c.MaxTransfers, "max-transfers-per-client", batch.DefaultMaxTransfers, "most async transfers (StartTransfer) one client may hold, running or ended and not yet reported")
	fs.StringVar(&c.SubmitSocket, "submit-socket", "", "also accept submits of prepared transfers on this Unix socket, without gRPC (opt-in; client.DialSubmit)")
	fs.DurationVar(&c.DefaultTimeout, "default-timeout", time.Minute, "deadline of a batch whose caller set none")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", 30*time.Second, "how long in-flight batches may run on SIGTERM")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log detail")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "PEM certificate this daemon presents to peers (mutual TLS)")
	fs.StringVar(&c.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&c.TLSCA, "tls-ca", "", "PEM CA bundle that peers' certificates must chain to")
	fs.BoolVar(&c.Insecure, "insecure", false, "plaintext between daemons; refused on any address that is not loopback")
	fs.StringVar(&c.MetricsListen, "metrics-listen", "", "serve Prometheus metrics on http://host:port/metrics (and /healthz); off when empty")
	fs.StringVar(&c.HealthListen, "health-listen", "", "plaintext health-only address (host:port) serving grpc.health.v1 and HTTP /healthz, for probes that cannot do TLS; off when empty")
	bindRanges(fs, flagRanges)
}

// flagRanges is the documented range of every flag RegisterFlags defines
// (each transport's are its driver's Ranges). Setting a flag, on
// the command line or as a --config key, checks it; CheckFlags refuses a
// flag set with a flag no table names, so a new flag cannot go without one.
// The usage text shows each range (withRange).
var flagRanges = config.Ranges{
	"node-name":                config.Text{Min: 1, Max: 255},
	"socket":                   config.Path(true),
	"socket-mode":              config.Octal{Max: 0o777},
	"group":                    config.Text{Min: 0, Max: config.PathMax},
	"api-listen":               config.HostPort{Optional: true},
	"peer-listen":              config.HostPort{},
	"peer-idle-timeout":        config.Duration{Min: minPeerIdleTimeout, Max: maxPeerIdleTimeout},
	"max-peers":                config.Int{Min: 1, Max: maxMaxPeers},
	"conns-per-peer":           config.Int{Min: 1, Max: maxConnsPerPeer},
	"shm-dir":                  config.Path(false),
	"transport":                config.OneOf(transport.Names),
	"calibrate":                config.OneOf{"start", "off"},
	"calibration-file":         config.Path(true),
	"max-descriptors":          config.Int{Min: 1, Max: 1 << 24},
	"max-plans":                config.Int{Min: 1, Max: 1 << 20},
	"max-transfers-per-client": config.Int{Min: 1, Max: 1 << 20},
	"submit-socket":            config.Path(true),
	"default-timeout":          config.Duration{Min: time.Millisecond, Max: 24 * time.Hour},
	"shutdown-grace":           config.Duration{Min: 0, Max: time.Hour},
	"log-level":                config.OneOf{"trace", "debug", "info", "warn", "error"},
	"tls-cert":                 config.Path(true),
	"tls-key":                  config.Path(true),
	"tls-ca":                   config.Path(true),
	"insecure":                 config.Bool{},
	"metrics-listen":           config.HostPort{Optional: true},
	"health-listen":            config.HostPort{Optional: true},
}

// bindRanges binds table's rules to fs and adds each range to its flag's
// usage. A row naming no flag is a bug that TestRangeTables catches;
// CheckFlags then refuses the flags left unbound.
func bindRanges(fs *flag.FlagSet, table config.Ranges) {
	_ = table.Bind(fs)
	for name, rule := range table {
		if f := fs.Lookup(name); f != nil && !strings.Contains(f.Usage, "(range: ") {
			f.Usage += " (range: " + rule.String() + ")"
		}
	}
}

// NewFlagSet is b2bd's whole flag set (RegisterFlags and
// RegisterKindFlags) bound to cfg, less --config.
func NewFlagSet(name string, cfg *Config) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	RegisterKindFlags(fs, cfg)
	return fs
}

// CheckFlags is the check b2bd and b2bd doctor --config run once the
// command line and the file are in: every flag is in its documented range
// (and has one), then the limits between flags. It opens no file.
func CheckFlags(fs *flag.FlagSet, cfg *Config) error {
	if err := config.Check(fs); err != nil {
		return fmt.Errorf("%w: %w", errs.ErrInvalidArgument, err)
	}
	if err := cfg.checkSecurity(); err != nil {
		return err
	}
	return cfg.Kinds.check()
}

// checkSecurity is security's part that reads no file: the flags agree.
func (c *Config) checkSecurity() error {
	anyTLS := c.TLSCert != "" || c.TLSKey != "" || c.TLSCA != ""
	if c.Insecure {
		if anyTLS {
			return fmt.Errorf("%w: --insecure and --tls-* are exclusive", errs.ErrInvalidArgument)
		}
		listens := []struct{ flag, addr string }{{"--peer-listen", c.PeerListen}}
		for _, name := range c.Kinds.listens() {
			listens = append(listens, struct{ flag, addr string }{"--" + name, c.Kinds.value(name)})
		}
		listens = append(listens, struct{ flag, addr string }{"--api-listen", c.APIListen})
		for _, a := range listens {
			if a.addr != "" && !auth.IsLoopback(a.addr) {
				return fmt.Errorf("%w: --insecure: %s %q is not a loopback address; plaintext is only allowed on loopback (use --tls-cert/--tls-key/--tls-ca)", errs.ErrInvalidArgument, a.flag, a.addr)
			}
		}
		return nil
	}
	if !anyTLS {
		return fmt.Errorf("%w: daemons must authenticate each other: give --tls-cert, --tls-key and --tls-ca (make certs makes a test CA), or --insecure for plaintext on loopback addresses only", errs.ErrInvalidArgument)
	}
	if c.TLSCert == "" || c.TLSKey == "" || c.TLSCA == "" {
		return fmt.Errorf("%w: --tls-cert %q, --tls-key %q, --tls-ca %q: give all three (mutual TLS needs this host's certificate, its key and the CA)", errs.ErrInvalidArgument, c.TLSCert, c.TLSKey, c.TLSCA)
	}
	return nil
}

// security checks the peer-authentication flags and returns the TLS
// configs, or nil for --insecure after checking every address is loopback.
func (c *Config) security() (*auth.PeerTLS, error) {
	if err := c.checkSecurity(); err != nil {
		return nil, err
	}
	if c.Insecure {
		return nil, nil
	}
	return auth.LoadPeerTLS(c.TLSCert, c.TLSKey, c.TLSCA)
}

// Daemon is one running b2bd.
type Daemon struct {
	cfg        Config
	log        hclog.Logger
	transports []transport.Transport
	registry   *region.Registry
	peers      *peer.Manager
	srv        *server.Server
	submitLn   net.Listener // --submit-socket, served by srv.ServeSubmit
	api        *grpc.Server
	peerSrv    *grpc.Server
	listeners  []net.Listener
	peerAddr   string
	peerLn     net.Listener // served by peerSrv; every other listener by api
	apiAddr    string
	apiTCPAddr string
	counters   server.Counters
	cuda       gpudirect.Interface // nil without a GPU
	staging    *staging.Pool
	health     *health.Health
	metrics    *metrics.Metrics // nil without --metrics-listen
	// The optional HTTP listeners (--metrics-listen, --health-listen):
	// served by Serve, stopped after the gRPC servers drained.
	metricsLn, healthLn   net.Listener
	metricsSrv, healthSrv *http.Server
	calib                 calibrator // --calibrate: auto's measured choices
}

// inbound is the registry's key index plus counters, as the transports'
// receiving sides see them. It exists before the transports and the
// registry; the registry fills the index in (region.Config.Pins).
type inbound struct {
	*region.Pins
	counters *server.Counters
}

func (in *inbound) Landed(k transport.Kind, blocks, bytes uint64) {
	in.counters.BatchesReceived.Add(1)
	in.counters.BytesReceived.Add(bytes)
}

// New builds the daemon and opens its listeners; Serve runs it. On error
// everything built so far is torn down.
func New(cfg Config, log hclog.Logger) (_ *Daemon, err error) {
	d := &Daemon{cfg: cfg, log: log}
	defer func() {
		if err != nil {
			d.teardown()
		}
	}()
	in := &inbound{Pins: region.NewPins(), counters: &d.counters}
	if err := d.cfg.ensureKinds(); err != nil {
		return nil, err
	}
	cfg = d.cfg
	peerTLS, err := cfg.security()
	if err != nil {
		return nil, err
	}
	if err := transport.CheckName(cfg.Transport); err != nil {
		return nil, fmt.Errorf("%w: --%w", errs.ErrInvalidArgument, err)
	}
	cuda, cudaWhy := loadCUDA(log.Named("gpudirect"))
	var cudaHook region.CUDA
	if cuda != nil {
		d.cuda = cuda
		d.staging = &staging.Pool{CUDA: cuda}
		cudaHook = staging.Regions{CUDA: cuda}
	}
	gid, err := resolveGroup(cfg.Group, log)
	if err != nil {
		return nil, err
	}
	// The peer listener comes first: a transport may name its address
	// (TCP tells a gRPC client that dialled the data port where to go).
	peerLn, err := net.Listen("tcp", cfg.PeerListen)
	if err != nil {
		return nil, fmt.Errorf("listen for peers on %s: %w", cfg.PeerListen, err)
	}
	d.peerAddr = peerLn.Addr().String()
	d.peerLn = guard(peerLn, peerTLS != nil, log.Named("peer"))
	d.listeners = append(d.listeners, d.peerLn)

	statuses, err := d.buildTransports(in, transport.Env{Node: cfg.NodeName, PeerAddr: d.peerAddr, ShmDir: cfg.ShmDir, Group: gid,
		TLS: peerTLS, CUDA: cuda, Staging: d.staging})
	if err != nil {
		return nil, err
	}
	// One hub: notes that land fan out to watchers and fire key-armed
	// transfers; a region released or unexported ends its watches.
	notes := &notify.Hub{}
	d.registry, err = region.New(region.Config{ShmDir: cfg.ShmDir, Group: gid, Transports: d.transports, Pins: in.Pins, CUDA: cudaHook, CUDAWhy: cudaWhy,
		Unwatchable: notes.End, Log: log.Named("region")})
	if err != nil {
		return nil, err
	}

	self := &b2bv1.HandshakeRequest{ProtocolVersion: peer.ProtocolVersion, NodeName: cfg.NodeName}
	for _, t := range d.transports {
		self.Kinds = append(self.Kinds, string(t.Kind()))
	}
	dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if peerTLS != nil {
		dial = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(peerTLS.Client))}
	}
	if err := cfg.checkPeerLimits(); err != nil {
		return nil, err
	}
	d.peers = peer.New(self, d.transports, log.Named("peer"), peerTLS == nil, dial...)
	d.peers.SetLimits(peer.Limits{IdleTimeout: cfg.PeerIdleTimeout, MaxPeers: cfg.MaxPeers, ConnsPerPeer: cfg.ConnsPerPeer})

	live := map[b2bv1.TransportKind]transport.Transport{}
	var adverts []transport.Advert
	signals := map[transport.Kind]transport.SignalHandler{}
	for _, t := range d.transports {
		live[peer.KindToProto(t.Kind())] = t
		a := t.Advertise() // offered, with nothing to say where Data is empty
		a.Kind = t.Kind()
		adverts = append(adverts, a)
		signals[t.Kind()] = t
	}
	// The transfer layer, which the API's handlers call.
	// One instance ID for the handshakes and the batches, which tell by
	// it a batch to this daemon itself (batch.checkSelfOverlap).
	instance := rand.Uint64() | 1
	batches := batch.New(batch.Config{NodeName: cfg.NodeName, Self: instance, Registry: d.registry, Peers: d.peers, MaxDescriptors: cfg.MaxDescriptors,
		MaxPlans: cfg.MaxPlans, MaxTransfers: cfg.MaxTransfers, DefaultTimeout: cfg.DefaultTimeout, Counters: &d.counters, Notes: notes,
		Log: log.Named("batch")})
	scfg := server.Config{
		Batches: batches, Notify: notes,
		NodeName: cfg.NodeName, InstanceID: instance, Version: Version, PeerAddress: d.peerAddr,
		Registry: d.registry, Peers: d.peers, Transports: statuses, Live: live, Adverts: adverts, Signals: signals,
		MaxDescriptors: cfg.MaxDescriptors, MaxPlans: cfg.MaxPlans, MaxTransfers: cfg.MaxTransfers, DefaultTimeout: cfg.DefaultTimeout,
		CUDAAvailable: cuda != nil, CUDADetail: cudaWhy, Calibration: d.Calibration, Counters: &d.counters, Staging: d.staging, OpenFDs: openFDs, Log: log.Named("server"),
	}
	srv := server.New(scfg)
	d.srv = srv

	// Descriptor lists of 1M entries are 24 MiB; allow them through.
	msgMax := 64<<20 + 3*8*cfg.MaxDescriptors
	apiOpts := append([]grpc.ServerOption{grpc.Creds(auth.NewPeerCred(log.Named("auth"))), grpc.MaxRecvMsgSize(msgMax), grpc.MaxSendMsgSize(msgMax)},
		srv.APIOptions()...)
	d.health = health.New()
	if err := d.buildObservability(); err != nil {
		return nil, err
	}
	if d.metrics != nil {
		apiOpts = append(apiOpts, grpc.ChainUnaryInterceptor(d.metrics.UnaryInterceptor()))
		srv.ObserveSubmits(d.metrics.ObserveSubmit)
	}
	d.api = grpc.NewServer(apiOpts...)
	b2bv1.RegisterB2BServer(d.api, srv.Local())
	d.health.Register(d.api)
	peerOpts := []grpc.ServerOption{grpc.MaxRecvMsgSize(16 << 20)}
	if peerTLS != nil {
		peerOpts = append(peerOpts, grpc.Creds(auth.LogRefused(credentials.NewTLS(peerTLS.Server), "peer", log.Named("auth"))))
	}
	d.peerSrv = grpc.NewServer(peerOpts...)
	b2bv1.RegisterPeerServer(d.peerSrv, srv.Peer())
	d.health.Register(d.peerSrv)

	if cfg.Socket != "" {
		ln, err := listenUnix(cfg.Socket, cfg.SocketMode, gid)
		if err != nil {
			return nil, err
		}
		d.listeners = append(d.listeners, ln)
		d.apiAddr = "unix://" + cfg.Socket
	}
	if cfg.SubmitSocket != "" {
		d.submitLn, err = listenUnix(cfg.SubmitSocket, cfg.SocketMode, gid)
		if err != nil {
			return nil, err
		}
	}
	if cfg.APIListen != "" {
		ln, err := net.Listen("tcp", cfg.APIListen)
		if err != nil {
			return nil, fmt.Errorf("listen for the local API on %s: %w", cfg.APIListen, err)
		}
		if !auth.IsLoopback(cfg.APIListen) {
			// Off this host the API is only reachable with a peer certificate.
			// gRPC clients insist on ALPN "h2", which credentials.NewTLS would
			// add; this listener does TLS itself, so it says so here.
			c := peerTLS.Server.Clone()
			c.NextProtos = []string{"h2"}
			ln = tls.NewListener(ln, c)
		}
		d.listeners = append(d.listeners, ln)
		d.apiTCPAddr = ln.Addr().String()
		if d.apiAddr == "" {
			d.apiAddr = d.apiTCPAddr
		}
	}
	return d, nil
}

// openFDs counts this process's open file descriptors, or 0 where
// /proc/self/fd cannot be read; Status reports it for leak checks.
func openFDs() uint32 {
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return 0
	}
	return uint32(len(names) - 1) // less the directory itself
}

// DefaultGroup owns the socket and the shm directory when --group is not given.
const DefaultGroup = "b2bd"

// resolveGroup turns --group into a gid; 0 means no group. Without --group
// it is DefaultGroup if that exists, else none, with a warning.
func resolveGroup(spec string, log hclog.Logger) (int, error) {
	if spec == "" {
		g, err := user.LookupGroup(DefaultGroup)
		if err != nil {
			log.Warn("no --group and no group "+DefaultGroup+": only root can use the socket and the shm directory (and a client only its own files); create the group or give --group", "error", err)
			return 0, nil
		}
		gid, err := strconv.Atoi(g.Gid)
		if err != nil {
			return 0, fmt.Errorf("group %s has gid %q: %w", DefaultGroup, g.Gid, err)
		}
		if !canChgrp(gid) {
			log.Warn("this daemon runs neither as root nor in group "+DefaultGroup+", so it cannot give it the socket and the shm directory; give --group", "gid", gid)
			return 0, nil
		}
		return gid, nil
	}
	if _, err := strconv.ParseUint(spec, 10, 32); err != nil {
		g, err := user.LookupGroup(spec)
		if err != nil {
			return 0, fmt.Errorf("%w: --group %q: %v", errs.ErrInvalidArgument, spec, err)
		}
		spec = g.Gid
	}
	gid, err := strconv.ParseUint(spec, 10, 31)
	if err != nil {
		return 0, fmt.Errorf("%w: --group %q is not a gid", errs.ErrInvalidArgument, spec)
	}
	return int(gid), nil
}

// canChgrp reports whether this process may give its files to gid.
func canChgrp(gid int) bool {
	if os.Geteuid() == 0 || os.Getegid() == gid {
		return true
	}
	groups, _ := os.Getgroups()
	return slices.Contains(groups, gid)
}

// listenUnix listens on path with mode and, when gid > 0, that group, both
// set explicitly (the umask does not matter).
func listenUnix(path, modeStr string, gid int) (net.Listener, error) {
	mode, err := strconv.ParseUint(modeStr, 8, 32)
	if err != nil || mode > 0o777 {
		return nil, fmt.Errorf("%w: --socket-mode %q is not an octal permission mode (0000..0777)", errs.ErrInvalidArgument, modeStr)
	}
	if err := region.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create socket dir %s: %w", filepath.Dir(path), err)
	}
	// A socket file left by a daemon that died is removed; a live one is not.
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("socket %s is in use by another daemon", path)
	}
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if gid > 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			ln.Close()
			return nil, fmt.Errorf("give socket %s to gid %d: %w", path, gid, err)
		}
	}
	if err := os.Chmod(path, os.FileMode(mode)); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return ln, nil
}

// PeerAddr is the bound peer control-plane address.
func (d *Daemon) PeerAddr() string { return d.peerAddr }

// APIAddr is a dialable local API address ("unix:///path" or host:port).
func (d *Daemon) APIAddr() string { return d.apiAddr }

// APITCPAddr is the bound --api-listen address, or "".
func (d *Daemon) APITCPAddr() string { return d.apiTCPAddr }

// MetricsAddr is the bound --metrics-listen address, or "".
func (d *Daemon) MetricsAddr() string { return addrOf(d.metricsLn) }

// HealthAddr is the bound --health-listen address, or "".
func (d *Daemon) HealthAddr() string { return addrOf(d.healthLn) }

func addrOf(ln net.Listener) string {
	if ln == nil {
		return ""
	}
	return ln.Addr().String()
}

// Serve runs until ctx is cancelled, then stops gracefully: new calls are
// refused, in-flight batches get ShutdownGrace to finish (or fail with their
// deadline), then connections, regions and transports are released.
func (d *Daemon) Serve(ctx context.Context) error {
	errc := make(chan error, len(d.listeners))
	for _, ln := range d.listeners {
		srv := d.api
		if ln == d.peerLn {
			srv = d.peerSrv
		}
		go func() { errc <- srv.Serve(ln) }()
	}
	if d.submitLn != nil {
		go func() { _ = d.srv.ServeSubmit(d.submitLn) }()
	}
	d.serveHTTP()
	calCtx, stopCal := context.WithCancel(ctx)
	defer stopCal()
	d.startCalibration(calCtx)
	d.log.Info("b2bd serving", "version", Version, "node", d.cfg.NodeName, "api", d.apiAddr, "peer", d.peerAddr,
		"transports", d.kinds(), "metrics", d.MetricsAddr(), "health", d.HealthAddr())
	if sent, nerr := sdNotify("READY=1\nSTATUS=serving"); nerr != nil {
		d.log.Warn("tell systemd we are ready", "error", nerr)
	} else if sent {
		d.log.Debug("told systemd READY=1")
	}
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		err = fmt.Errorf("serve: %w", err)
	}
	// Probes see NOT_SERVING from here on, while in-flight batches finish.
	d.health.Drain()
	if _, nerr := sdNotify("STOPPING=1\nSTATUS=draining"); nerr != nil {
		d.log.Warn("tell systemd we are stopping", "error", nerr)
	}
	d.log.Info("shutting down")
	stopCal()
	select { // its RPCs end with the cancel; the servers stop after it
	case <-d.calib.done:
	case <-time.After(5 * time.Second):
		d.log.Warn("calibration did not stop within 5s")
	}
	done := make(chan struct{})
	d.srv.Drain() // peers' note streams end: only calls in flight are waited for
	go func() {
		d.api.GracefulStop()
		d.peerSrv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d.cfg.ShutdownGrace):
		d.log.Warn("in-flight calls did not finish within the grace period; stopping them", "grace", d.cfg.ShutdownGrace)
		// Cut first, so that each answers why, then stop what is left.
		d.srv.CutCalls(fmt.Sprintf("b2bd is stopping: calls still running at the end of --shutdown-grace %s are cut", d.cfg.ShutdownGrace))
		select {
		case <-done:
		case <-time.After(cutAnswer):
		}
		d.api.Stop()
		d.peerSrv.Stop()
		<-done
	}
	d.stopHTTP()
	d.teardown()
	d.log.Info("stopped")
	if errors.Is(err, grpc.ErrServerStopped) {
		err = nil
	}
	return err
}

// cutAnswer is how long the calls cut at the end of the shutdown grace
// get to answer before the servers close their connections.
const cutAnswer = time.Second

func (d *Daemon) kinds() string {
	var s []string
	for _, t := range d.transports {
		s = append(s, string(t.Kind()))
	}
	return strings.Join(s, ",")
}

// teardown releases in dependency order: connections, regions (their
// registrations first), transports, listeners.
func (d *Daemon) teardown() {
	if d.api != nil {
		d.api.Stop()
	}
	if d.peerSrv != nil {
		d.peerSrv.Stop()
	}
	if d.submitLn != nil {
		d.submitLn.Close()
	}
	if d.srv != nil {
		d.srv.Close() // prepared plans hold regions and connections
	}
	if d.peers != nil {
		d.peers.Close()
	}
	if d.registry != nil {
		d.registry.Close()
	}
	for i := len(d.transports) - 1; i >= 0; i-- {
		if err := d.transports[i].Close(); err != nil {
			d.log.Warn("close transport", "transport", d.transports[i].Kind(), "error", err)
		}
	}
	d.transports = nil
	if d.staging != nil {
		if err := d.staging.Close(); err != nil {
			d.log.Warn("free staging buffers", "error", err)
		}
		d.staging = nil
	}
	if d.cuda != nil {
		if err := d.cuda.Close(); err != nil {
			d.log.Warn("close CUDA", "error", err)
		}
		d.cuda = nil
	}
	d.stopHTTP()
	for _, ln := range d.listeners {
		ln.Close()
	}
	d.listeners = nil
	if d.cfg.Socket != "" {
		_ = os.Remove(d.cfg.Socket)
	}
}
