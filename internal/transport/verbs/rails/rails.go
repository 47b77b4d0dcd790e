// Package rails is the verbs data plane over several RDMA devices (rails):
// one verbs transport per device, each with its own context, PD, CQs, SRQ
// and poller, layered so the verbs package itself is unchanged.
//
//   - Register registers memory with every rail (one MR each); the region's
//     remote key carries one key per rail (transport.RemoteRegion.Devices), and
//     the rails it prefers come from its GPU–NIC or NUMA affinity
//     (internal/topology), logged and shown in ListRegions.
//   - Connect pairs this daemon's rails with the peer's by reachability
//     (the same IP subnet for RoCE, the same GID prefix for InfiniBand, or
//     the configured map) and connects each pair on its own rail; the peer's
//     acceptor routes ConnectVerbs by its rail field.
//   - Write stripes a batch by bytes over the preferred rails that are up
//     (blocks whole up to 64 KiB, bigger ones cut at 4 KiB boundaries), each
//     share written and acknowledged by its own rail's connection; the batch
//     has landed when every share has.
//   - A rail whose share fails (port down, QP error, stall) is marked down
//     and reconnected in the background; its share is written again, whole,
//     on the rails left, within the caller's deadline. Only when no rail is
//     left does the batch fail, with errs.ErrUnavailable naming every rail
//     and its error. Success still means every byte landed and was
//     acknowledged (writes are idempotent: the same bytes to the same
//     places).
//
// With one device the daemon does not use this package at all.
package rails

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/topology"
	"github.com/b2bd/b2bd/internal/transport"
	"github.com/b2bd/b2bd/internal/transport/verbs"
)

// Rail is what this package needs of one device's transport; the verbs
// transport provides it.
type Rail interface {
	transport.Transport
	verbs.Acceptor
	Port() verbs.Port
	Describe() string
}

// Open builds the transport of one device, with in as its receiving side.
type Open func(device string, in transport.Inbound) (Rail, error)

// Config tunes the rails layer.
type Config struct {
	// Devices are the RDMA devices, one rail each, in rail order.
	Devices []string
	// Port is the devices' port (for its state in sysfs).
	Port int
	// Map pairs our devices with the peer's by name (--rdma-rail-map
	// "mlx5_0=mlx5_2,..."); unmapped devices pair by reachability.
	Map map[string]string
	// MaxRails caps the rails one batch is striped over (0: every
	// preferred rail that is up).
	MaxRails int
	// StripeMin: a batch of fewer bytes goes whole on one rail (its share
	// would not pay for a second ack).
	StripeMin uint64
	// Retry is the first background reconnect interval of a failed rail
	// (doubling to 16x); Monitor how often port states are read.
	Retry, Monitor time.Duration
	// GPUBusID gives a CUDA device's PCI address (cuDeviceGetPCIBusId);
	// nil without CUDA.
	GPUBusID func(device int) (string, error)
	// Sysfs is where device topology and port states are read ("" = /).
	Sysfs topology.Sysfs
}

// Defaults. DefaultStripeMin, from the two-rail testbed (test-rails.sh,
// docs/topology.md): striping 64 KiB, 256 KiB and 1 MiB batches of 4 KiB
// blocks over two rails took 0.70x, 0.59x and 0.67x of one rail's rate
// (each share pays its own meta, immediates and ack), while 8 MiB and more
// broke even (1.03x at 2000 x 4 KiB). On a real NIC a share's fixed cost is
// microseconds, so the break-even (fixed cost x one rail's bandwidth) is
// about 256 KiB at 5 us and 50 GB/s; 1 MiB keeps batches below it on one
// rail everywhere.
const (
	DefaultStripeMin = 1 << 20
	DefaultRetry     = time.Second
	DefaultMonitor   = 250 * time.Millisecond
	maxRails         = verbs.MaxRails
)

// ParseMap reads --rdma-rail-map: "local=peer" pairs separated by commas.
func ParseMap(s string) (map[string]string, error) {
	m := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return m, nil
	}
	for _, kv := range strings.Split(s, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || a == "" || b == "" || strings.ContainsAny(a+b, " =/") {
			return nil, fmt.Errorf("--rdma-rail-map: %q is not local_device=peer_device: %w", kv, errs.ErrInvalidArgument)
		}
		if _, dup := m[a]; dup {
			return nil, fmt.Errorf("--rdma-rail-map: device %q mapped twice: %w", a, errs.ErrInvalidArgument)
		}
		m[a] = b
	}
	return m, nil
}

// rail is one device's transport and what this layer knows of it.
type rail struct {
	idx    int
	name   string
	t      Rail
	topo   topology.Device
	topoOK bool
	nets   []*net.IPNet // the addresses of its netdev: the subnets it reaches

	portDown   atomic.Bool // the monitor saw its port not ACTIVE
	failovers  atomic.Uint64
	reconnects atomic.Uint64
	sent       atomic.Uint64
	mu         sync.Mutex
	lastErr    string
	downPairs  int // peer connections on it that failed and have not come back
}

// pairDown and pairUp count a pair on this rail going down and coming back
// (or being dropped while down).
func (r *rail) pairDown(err error) {
	r.mu.Lock()
	r.downPairs++
	r.lastErr = err.Error()
	r.mu.Unlock()
}

func (r *rail) pairUp() {
	r.mu.Lock()
	r.downPairs--
	r.mu.Unlock()
}

// Transport is the verbs transport over several rails.
type Transport struct {
	cfg   Config
	in    transport.Inbound
	log   hclog.Logger
	rails []*rail

	mu     sync.Mutex
	keys   []map[uint32]uint64 // per rail > 0: its rkey -> rail 0's (the registry's key)
	closed bool
	stop   chan struct{}
	bg     sync.WaitGroup
	pool   sync.Pool // *writeState
	blocks sync.Pool // *blockState
}

var (
	_ transport.Transport = (*Transport)(nil)
	_ verbs.Acceptor      = (*Transport)(nil)
)

// New opens every device of cfg with open. A device that fails to open is
// an error: the operator named it (or auto found its port active).
func New(cfg Config, in transport.Inbound, log hclog.Logger, open Open) (*Transport, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if len(cfg.Devices) < 1 || len(cfg.Devices) > maxRails {
		return nil, fmt.Errorf("rails: %d devices (want 1..%d): %w", len(cfg.Devices), maxRails, errs.ErrInvalidArgument)
	}
	if cfg.Port == 0 {
		cfg.Port = 1
	}
	if cfg.StripeMin == 0 {
		cfg.StripeMin = DefaultStripeMin
	}
	if cfg.Retry <= 0 {
		cfg.Retry = DefaultRetry
	}
	if cfg.Monitor <= 0 {
		cfg.Monitor = DefaultMonitor
	}
	if cfg.MaxRails < 0 {
		return nil, fmt.Errorf("rails: --rdma-stripe-rails %d < 0: %w", cfg.MaxRails, errs.ErrInvalidArgument)
	}
	t := &Transport{cfg: cfg, in: in, log: log, stop: make(chan struct{})}
	t.pool.New = func() any { return new(writeState) }
	t.blocks.New = func() any { return new(blockState) }
	t.keys = make([]map[uint32]uint64, len(cfg.Devices))
	for i, dev := range cfg.Devices {
		if slices.Index(cfg.Devices, dev) != i {
			t.Close()
			return nil, fmt.Errorf("rails: device %s listed twice: %w", dev, errs.ErrInvalidArgument)
		}
		t.keys[i] = map[uint32]uint64{}
		rt, err := open(dev, railInbound{t: t, rail: i})
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("rails: rail %d (%s): %w", i, dev, err)
		}
		r := &rail{idx: i, name: dev, t: rt}
		if d, err := cfg.Sysfs.RDMADevice(dev); err == nil {
			r.topo, r.topoOK = d, true
		} else {
			r.topo = topology.Device{Name: dev, NUMA: -1}
			log.Warn("rails: device topology unknown; it ranks by nothing", "device", dev, "error", err)
		}
		r.nets = netsOf(cfg.Sysfs, dev, cfg.Port, rt.Port().GIDIndex)
		t.rails = append(t.rails, r)
		log.Info("rail ready", "rail", i, "device", dev, "detail", t.detail(r), "subnets", fmt.Sprint(r.nets))
	}
	t.bg.Add(1)
	go t.monitor()
	return t, nil
}

// netsOf lists the IP networks of the netdev behind dev's GID: the subnets
// the rail reaches directly.
func netsOf(s topology.Sysfs, dev string, port int, gidIndex uint32) []*net.IPNet {
	root := s.Root
	if root == "" {
		root = "/"
	}
	b, err := os.ReadFile(filepath.Join(root, "sys/class/infiniband", dev, "ports", fmt.Sprint(port), "gid_attrs/ndevs", fmt.Sprint(gidIndex)))
	nd := strings.TrimSpace(string(b))
	if err != nil || nd == "" {
		b, err = os.ReadFile(filepath.Join(root, "sys/class/infiniband", dev, "parent"))
		nd = strings.TrimSpace(string(b))
	}
	if err != nil || nd == "" {
		return nil
	}
	ifc, err := net.InterfaceByName(nd)
	if err != nil {
		return nil
	}
	addrs, _ := ifc.Addrs()
	var out []*net.IPNet
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() {
			out = append(out, n)
		}
	}
	return out
}

func (t *Transport) detail(r *rail) string {
	s := r.t.Describe()
	if r.topoOK {
		s += fmt.Sprintf(" PCI %s NUMA %d", r.topo.BusID, r.topo.NUMA)
	}
	return s
}

// monitor reads every rail's port state: a port that is not ACTIVE takes
// its rail out of new batches at once, before its QPs time out.
func (t *Transport) monitor() {
	defer t.bg.Done()
	tick := time.NewTicker(t.cfg.Monitor)
	defer tick.Stop()
	for {
		for _, r := range t.rails {
			active := t.portActive(r)
			if was := !r.portDown.Load(); was != active {
				r.portDown.Store(!active)
				if active {
					t.log.Info("rail port ACTIVE again", "rail", r.idx, "device", r.name)
				} else {
					r.mu.Lock()
					r.lastErr = fmt.Sprintf("port %d of %s is not ACTIVE", t.cfg.Port, r.name)
					r.mu.Unlock()
					t.log.Warn("rail port not ACTIVE; new batches avoid it", "rail", r.idx, "device", r.name)
				}
			}
		}
		select {
		case <-t.stop:
			return
		case <-tick.C:
		}
	}
}

// portActive reads the port state from sysfs ("4: ACTIVE"); a state it
// cannot read counts as active (the QPs then decide).
func (t *Transport) portActive(r *rail) bool {
	root := t.cfg.Sysfs.Root
	if root == "" {
		root = "/"
	}
	b, err := os.ReadFile(filepath.Join(root, "sys/class/infiniband", r.name, "ports", fmt.Sprint(t.cfg.Port), "state"))
	return err != nil || strings.Contains(string(b), "ACTIVE")
}

// Kind is transport.Verbs: peers see one verbs transport.
func (t *Transport) Kind() transport.Kind { return transport.Verbs }

// Advertise lists every rail for the handshake and Status.
func (t *Transport) Advertise() transport.Advert {
	a := transport.Advert{Kind: transport.Verbs}
	var d []string
	var adv []verbs.RailAdvert
	for _, r := range t.rails {
		adv = append(adv, verbs.RailAdvert{Index: r.idx, Port: r.t.Port()})
		d = append(d, fmt.Sprintf("rail %d: %s", r.idx, t.detail(r)))
	}
	a.Data = verbs.MarshalAdvert(adv)
	a.Detail = fmt.Sprintf("%d rails: %s", len(t.rails), strings.Join(d, "; "))
	return a
}

// RailStatus reports every rail; see transport.RailReporter.
func (t *Transport) RailStatus() []transport.RailStatus {
	out := make([]transport.RailStatus, len(t.rails))
	for i, r := range t.rails {
		r.mu.Lock()
		out[i] = transport.RailStatus{Rail: i, Device: r.name, Detail: t.detail(r), Up: r.downPairs == 0 && !r.portDown.Load(), LastError: r.lastErr,
			Failovers: r.failovers.Load(), Reconnects: r.reconnects.Load(), BytesSent: r.sent.Load()}
		r.mu.Unlock()
	}
	return out
}

// Status is every rail's handles summed (Resources) and each rail's state.
func (t *Transport) Status() transport.Status {
	return transport.Status{Resources: t.Resources(), Rails: t.RailStatus()}
}

// Resources adds up the rails' handles.
func (t *Transport) Resources() transport.Resources {
	var s transport.Resources
	for _, r := range t.rails {
		x := r.t.Status().Resources
		s.Connections += x.Connections
		s.QueuePairs += x.QueuePairs
		s.MemoryRegions += x.MemoryRegions
	}
	return s
}

// HandleSignal answers a peer's verbs signal: a connect goes to the rail
// it names, a disconnect to whichever rail has the set.
func (t *Transport) HandleSignal(ctx context.Context, payload []byte) ([]byte, error) {
	return verbs.ServeSignal(ctx, payload, t)
}

// AcceptVerbs routes a peer's connect to the rail it names.
func (t *Transport) AcceptVerbs(ctx context.Context, req verbs.ConnectRequest) (verbs.Accept, error) {
	if req.Rail < 0 || req.Rail >= len(t.rails) {
		return verbs.Accept{}, fmt.Errorf("rails: connect from %s for rail %d, but this daemon has rails 0..%d: %w", req.Node, req.Rail, len(t.rails)-1, errs.ErrInvalidArgument)
	}
	return t.rails[req.Rail].t.AcceptVerbs(ctx, req)
}

// DisconnectVerbs drops a sender's connection on whichever rail has it.
func (t *Transport) DisconnectVerbs(node string, id uint64) bool {
	for _, r := range t.rails {
		if r.t.DisconnectVerbs(node, id) {
			return true
		}
	}
	return false
}

// Close stops the monitor and closes every rail; safe to call twice.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	close(t.stop)
	t.mu.Unlock()
	t.bg.Wait()
	var el []error
	for _, r := range t.rails {
		el = append(el, r.t.Close())
	}
	return errors.Join(el...)
}

// railInbound is a rail's receiving side: rkeys of rails after the first
// are translated to the region's rail-0 key, which the registry knows.
type railInbound struct {
	t    *Transport
	rail int
}

func (ri railInbound) Pin(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	if ri.rail > 0 {
		ri.t.mu.Lock()
		primary, ok := ri.t.keys[ri.rail][uint32(key)]
		ri.t.mu.Unlock()
		if !ok || key > 0xFFFFFFFF {
			return memory.Memory{}, nil, fmt.Errorf("rails: rail %d: rkey %#x is not a registered region's: %w", ri.rail, key, errs.ErrNotFound)
		}
		key = primary
	}
	return ri.t.in.Pin(k, key)
}

// PinRead: rails serves no reads (Caps.Ops).
func (ri railInbound) PinRead(transport.Kind, uint64) (memory.Memory, func(), error) {
	return memory.Memory{}, nil, fmt.Errorf("%w: rails serves no reads", errs.ErrUnimplemented)
}

// Landed counts each rail's share of a batch as the receiving side sees it.
func (ri railInbound) Landed(k transport.Kind, blocks, bytes uint64) {
	ri.t.in.Landed(k, blocks, bytes)
}

// Devices turns --rdma-device into the rails' devices: "auto" is every
// device whose port is ACTIVE (sysfs), in name order; else a comma list.
// One name or none means no rails (the plain verbs transport).
func Devices(spec string, port int, s topology.Sysfs) ([]string, error) {
	spec = strings.TrimSpace(spec)
	if spec != "auto" {
		var out []string
		for _, d := range strings.Split(spec, ",") {
			if d = strings.TrimSpace(d); d != "" {
				if strings.ContainsAny(d, "/ ") {
					return nil, fmt.Errorf("--rdma-device %q: %q is not a device name: %w", spec, d, errs.ErrInvalidArgument)
				}
				out = append(out, d)
			}
		}
		return out, nil
	}
	root := s.Root
	if root == "" {
		root = "/"
	}
	ents, err := os.ReadDir(filepath.Join(root, "sys/class/infiniband"))
	if err != nil {
		return nil, fmt.Errorf("--rdma-device auto: no RDMA device in sysfs: %w (%w)", err, errs.ErrUnavailable)
	}
	var out, states []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(root, "sys/class/infiniband", e.Name(), "ports", fmt.Sprint(port), "state"))
		st := strings.TrimSpace(string(b))
		if err == nil && strings.Contains(st, "ACTIVE") {
			out = append(out, e.Name())
		} else {
			states = append(states, e.Name()+": "+st)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--rdma-device auto: no device with an ACTIVE port %d (%s): %w", port, strings.Join(states, ", "), errs.ErrUnavailable)
	}
	return out, nil
}
