package verbs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
	ibv "github.com/b2bd/b2bd/verbs"
)

// Transport is the verbs data plane of one daemon: one device context, PD,
// shared receive queue and poller; one QP set per connection, in each
// direction.
type Transport struct {
	cfg Config
	in  transport.Inbound
	log hclog.Logger

	ctx    *ibv.Context
	pd     *ibv.PD
	cch    *ibv.CompChannel
	srq    *ibv.SRQ
	rmem   *ibv.HostMem // SRQ receive buffers, recvBufLen each
	rmr    *ibv.MR
	port   ibv.PortAttr
	gid    ibv.GIDChoice
	maxSGE int
	// maxSGERd: SGEs per RDMA READ WR (the device's max_sge_rd, at most maxSGE).
	maxSGERd int
	// rdInit and rdDest: each QP's max_rd_atomic (READs it keeps
	// outstanding) and max_dest_rd_atomic (peer READs it answers at once),
	// the device's max_qp_init_rd_atom and max_qp_rd_atom (at most 255).
	rdInit, rdDest int
	// lastRdAtomic is the newest connection's max_rd_atomic (low 16 bits)
	// and the peer's max_dest_rd_atomic as it was taken (high 16), for
	// Describe; 0 before any.
	lastRdAtomic atomic.Uint32
	// linkBps is the port's nominal rate (0: unreported), for stopWait.
	linkBps uint64
	inline  int
	wrBytes uint64
	node    string

	p *poller
	// posters posts the shares of prepared batches in parallel.
	posters *posters

	mu     sync.Mutex
	sets   map[*qpSet]struct{}
	byQPN  map[uint32]*qpSet
	regs   map[*registration]struct{}
	byRKey map[uint32]*registration // every live MR's rkey, retired ones included
	closed bool
	connID atomic.Uint64

	// bg runs control-plane disconnects; stopBG ends them at Close.
	bg     sync.WaitGroup
	stopBG chan struct{}
	// ctls is each peer's newest control plane (Connect's), by address,
	// under mu: a disconnect retries over it (see disconnect).
	ctls map[string]transport.Signal

	// live counts handles as they are created and destroyed, so Status can
	// show leaks (QP sets mid-construction or mid-teardown included).
	live struct{ sets, qps, mrs atomic.Int64 }
}

var _ transport.Transport = (*Transport)(nil)

// New opens the configured device and starts the poller. It fails with an
// error wrapping errs.ErrUnavailable when verbs cannot work here: no cgo,
// no libibverbs, no device, or no active port.
func New(cfg Config, in transport.Inbound, log hclog.Logger) (*Transport, error) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	if err := ibv.Load(); err != nil {
		return nil, err
	}
	dev := cfg.Device
	if dev == "" && cfg.NetDev != "" {
		d, err := ibv.DeviceForNetDev(cfg.NetDev)
		if err != nil {
			return nil, err
		}
		dev = d
	}
	if dev == "" {
		d, err := firstActive(cfg.Port)
		if err != nil {
			return nil, err
		}
		dev = d
	}
	t := &Transport{cfg: cfg, in: in, log: log, sets: map[*qpSet]struct{}{}, byQPN: map[uint32]*qpSet{},
		regs: map[*registration]struct{}{}, byRKey: map[uint32]*registration{}, stopBG: make(chan struct{}),
		ctls: map[string]transport.Signal{}}
	t.connID.Store(rand.Uint64() &^ (1 << 63))
	t.node, _ = os.Hostname()
	if err := t.open(dev); err != nil {
		t.teardown()
		return nil, err
	}
	t.log.Info("verbs transport ready", "detail", t.Describe(), "qps_per_peer", t.cfg.QPsPerPeer,
		"signal_every", t.cfg.SignalEvery, "max_chain", t.cfg.MaxChain, "max_sge", t.maxSGE, "sq_depth", t.cfg.SQDepth)
	return t, nil
}

// firstActive picks the first device whose port is ACTIVE.
func firstActive(port int) (string, error) {
	names, err := ibv.ListDevices()
	if err != nil {
		return "", err
	}
	if len(names) == 0 {
		return "", fmt.Errorf("verbs: no RDMA device (sysfs lists %v): %w", ibv.SysfsDevices(), errs.ErrUnavailable)
	}
	var states []string
	for _, n := range names {
		c, err := ibv.Open(n)
		if err != nil {
			states = append(states, n+": "+err.Error())
			continue
		}
		pa, err := c.QueryPort(port)
		c.Close()
		if err == nil && pa.State == ibv.PortActive {
			return n, nil
		}
		states = append(states, fmt.Sprintf("%s port %d: %s", n, port, pa.State))
	}
	return "", fmt.Errorf("verbs: no device with an ACTIVE port %d (%v): %w", port, states, errs.ErrUnavailable)
}

func (t *Transport) open(dev string) error {
	cfg := &t.cfg
	var err error
	if t.ctx, err = ibv.Open(dev); err != nil {
		return err
	}
	if t.port, err = t.ctx.QueryPort(cfg.Port); err != nil {
		return fmt.Errorf("%w (%w)", err, errs.ErrUnavailable)
	}
	t.linkBps = t.port.LinkBitsPerSecond()
	if t.port.State != ibv.PortActive {
		return fmt.Errorf("verbs: %s port %d is %s, not ACTIVE: %w", dev, cfg.Port, t.port.State, errs.ErrUnavailable)
	}
	table, err := ibv.ReadGIDTable(ibv.SysfsRoot, dev, cfg.Port)
	if err != nil && t.port.LinkLayer == ibv.LinkEthernet {
		return fmt.Errorf("%w (%w)", err, errs.ErrUnavailable)
	}
	if t.gid, err = ibv.SelectGID(table, t.port.LinkLayer, cfg.NetDev, cfg.GIDIndex, ibv.NetDevAddrs); err != nil {
		return err
	}
	// Cross-check sysfs against the verbs GID table.
	if g, err := t.ctx.QueryGID(cfg.Port, t.gid.Index); err == nil && g != t.gid.GID {
		return fmt.Errorf("verbs: GID index %d reads %s via verbs but %s via sysfs: %w", t.gid.Index, g, t.gid.GID, errs.ErrUnavailable)
	}
	attr := t.ctx.Attr()
	t.maxSGE = min(cfg.MaxSGE, attr.MaxSGE)
	if t.maxSGE < 1 {
		t.maxSGE = 1
	}
	t.maxSGERd, t.rdInit, t.rdDest = readLimits(attr, t.maxSGE, cfg.ReadDepth)
	if fitted, err := fitSendQueue(cfg, attr.MaxQPWR); err != nil {
		return err
	} else if fitted {
		t.log.Info("send queue default deeper than the device allows: using the device's max_qp_wr",
			"default", DefaultSQDepth, "max_qp_wr", attr.MaxQPWR, "max_chain", cfg.MaxChain, "signal_every", cfg.SignalEvery)
	}
	if attr.MaxSRQWR > 0 && cfg.SRQDepth > attr.MaxSRQWR {
		cfg.SRQDepth = attr.MaxSRQWR
	}
	t.wrBytes = uint64(cfg.MaxWRBytes)
	if m := uint64(t.port.MaxMsgSize); m > 0 && t.wrBytes > m {
		t.wrBytes = m
	}
	t.inline = cfg.InlineBytes
	if t.pd, err = t.ctx.AllocPD(); err != nil {
		return err
	}
	if t.cch, err = t.ctx.NewCompChannel(); err != nil {
		return err
	}
	if t.srq, err = t.pd.NewSRQ(cfg.SRQDepth, 1); err != nil {
		return err
	}
	if t.rmem, err = ibv.AllocHost(cfg.SRQDepth * recvBufLen); err != nil {
		return err
	}
	if t.rmr, err = t.pd.RegMR(t.rmem.Addr(), uint64(cfg.SRQDepth*recvBufLen), ibv.AccessLocalWrite); err != nil {
		return err
	}
	t.live.mrs.Add(1)
	idx := make([]uint32, cfg.SRQDepth)
	for k := range idx {
		idx[k] = uint32(k)
	}
	if err := t.srq.PostRecv(idx, t.rmr.Addr(), recvBufLen, t.rmr.LKey()); err != nil {
		return err
	}
	if t.p, err = newPoller(t); err != nil {
		return err
	}
	t.p.start()
	t.posters = newPosters(cfg.PostThreads)
	return nil
}

// teardown releases everything open, children first. Used by Close and by
// New on failure.
func (t *Transport) teardown() error {
	var errList []error
	// Sending sets first, while the poller runs: their goodbyes let the
	// peers free their halves now rather than at the next keepalive.
	t.mu.Lock()
	var senders []*qpSet
	for s := range t.sets {
		if s.sender {
			senders = append(senders, s)
		}
	}
	t.mu.Unlock()
	for _, s := range senders {
		errList = append(errList, s.Close())
	}
	t.posters.close()
	close(t.stopBG)
	t.bg.Wait()
	if t.p != nil {
		t.p.stop()
	}
	t.mu.Lock()
	sets := make([]*qpSet, 0, len(t.sets))
	for s := range t.sets {
		sets = append(sets, s)
	}
	regs := make([]*registration, 0, len(t.regs))
	for r := range t.regs {
		regs = append(regs, r)
	}
	t.mu.Unlock()
	for _, s := range sets {
		s.fail(fmt.Errorf("verbs: transport closed: %w", errs.ErrAborted), false)
		t.detach(s, false)
		errList = append(errList, s.destroy())
	}
	for _, r := range regs {
		errList = append(errList, r.Close())
	}
	if t.p != nil {
		errList = append(errList, t.p.close())
	}
	if t.rmr != nil {
		t.live.mrs.Add(-1)
	}
	errList = append(errList, t.srq.Close(), t.rmr.Close())
	t.rmem.Free()
	errList = append(errList, t.cch.Close(), t.pd.Close(), t.ctx.Close())
	return errors.Join(errList...)
}

// Resources counts the live QP sets, QPs and MRs; see transport.Counter.
// Status is the transport's live handles (Resources).
func (t *Transport) Status() transport.Status { return transport.Status{Resources: t.Resources()} }

func (t *Transport) Resources() transport.Resources {
	return transport.Resources{Connections: int(t.live.sets.Load()), QueuePairs: int(t.live.qps.Load()), MemoryRegions: int(t.live.mrs.Load())}
}

// Kind is transport.Verbs.
func (t *Transport) Kind() transport.Kind { return transport.Verbs }

// Close stops the poller, tears down every connection and registration and
// closes the device; safe to call twice.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.mu.Unlock()
	return t.teardown()
}

// Advertise describes the transport for the daemon's Status; peers learn
// its port parameters at connect (Data lists no rail: one device).
func (t *Transport) Advertise() transport.Advert {
	return transport.Advert{Kind: transport.Verbs, Detail: t.Describe(), Data: MarshalAdvert(nil)}
}

// Describe names the device, port, GID and MTU for the daemon's Status.
func (t *Transport) Describe() string {
	s := fmt.Sprintf("%s port %d (%s, %s, MTU %s", t.ctx.Name(), t.cfg.Port, t.port.LinkLayer, t.port.State, t.port.ActiveMTU)
	if t.port.LinkLayer == ibv.LinkInfiniBand {
		s += fmt.Sprintf(", LID %d", t.port.LID)
	}
	s += fmt.Sprintf(") GID[%d] %s", t.gid.Index, t.gid.GID)
	if t.gid.Type != "" || t.gid.NetDev != "" {
		s += fmt.Sprintf(" (%s %s)", t.gid.Type, t.gid.NetDev)
	}
	// rd_atomic: max_rd_atomic before the peer's say (device, and the
	// --rdma-read-depth cap if any) / max_dest_rd_atomic; then the newest
	// connection's max_rd_atomic, the lesser of that and the peer's
	// max_dest_rd_atomic.
	s += fmt.Sprintf(" rd_atomic %d/%d", t.rdInit, t.rdDest)
	if v := t.lastRdAtomic.Load(); v > 0 {
		s += fmt.Sprintf(" (last connection %d: peer answers %d)", v&0xFFFF, v>>16)
	}
	return s + fmt.Sprintf(" max_sge_rd %d", t.maxSGERd)
}

// readLimits derives the RDMA READ parameters from the device's limits:
// SGEs per READ WR (max_sge_rd, at most maxSGE; devices that report 0
// get maxSGE), and each QP's max_rd_atomic before the peer's say
// (max_qp_init_rd_atom, at most depth, Config.ReadDepth, when it is not 0)
// and max_dest_rd_atomic (max_qp_rd_atom: the responder answers as many as
// the device can). Each at least 1, at most 255 (the attribute's width).
func readLimits(a ibv.DeviceAttr, maxSGE, depth int) (sgeRd, rdInit, rdDest int) {
	sgeRd = maxSGE
	if a.MaxSGERd > 0 {
		sgeRd = min(sgeRd, a.MaxSGERd)
	}
	clamp := func(v int) int { return min(max(v, 1), 255) }
	rdInit = a.MaxQPInitRdAtm
	if depth > 0 {
		rdInit = min(rdInit, depth)
	}
	return sgeRd, clamp(rdInit), clamp(a.MaxQPRdAtm)
}

// legacyPeerRdAtomic is what a peer that does not send its
// max_dest_rd_atomic is taken to answer: every b2bd before the field kept
// 16 READs outstanding (the old --rdma-read-depth default), so its
// responders answered at least that many, and ConnectX's max_qp_rd_atom is
// 16 too.
const legacyPeerRdAtomic = 16

// rdAtomicWith is a QP's max_rd_atomic against a peer: this side's limit
// (readLimits) and no more than the peer's responder answers at once. A
// requester that keeps more outstanding than the responder's
// max_dest_rd_atomic overruns it: the extra READs are NAKed or dropped and
// retried until the QP fails (mixed hardware, e.g. rxe's 128 against
// ConnectX's 16).
func rdAtomicWith(local int, peerDest uint32) int {
	p := int(peerDest)
	if p == 0 {
		p = legacyPeerRdAtomic
	}
	return max(1, min(local, p))
}

// Port is this side's Port for connect signals.
func (t *Transport) Port() Port {
	g := t.gid.GID
	return Port{
		GID: g[:], GIDIndex: uint32(t.gid.Index), LID: uint32(t.port.LID),
		ActiveMTU: uint32(t.port.ActiveMTU.Bytes()), LinkLayer: t.port.LinkLayer.String(), Device: t.ctx.Name(),
		MaxDestRdAtomic: uint32(t.rdDest),
	}
}

// endpoints are s's QPs' halves of their connections.
func (s *qpSet) endpoints() []Endpoint {
	eps := make([]Endpoint, len(s.qps))
	for i, q := range s.qps {
		eps[i] = Endpoint{QPN: q.qp.Num(), PSN: q.psn}
	}
	return eps
}

// Register registers m for local and remote access. Host memory uses
// ibv_reg_mr; CUDA memory uses its dma-buf when it has one, else
// ibv_reg_mr on the device pointer (which needs nvidia-peermem).
func (t *Transport) Register(m memory.Memory) (transport.Registration, error) {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("verbs: register: transport closed: %w", errs.ErrFailedPrecondition)
	}
	if m.Addr == 0 || m.Len == 0 {
		return nil, fmt.Errorf("verbs: register: empty memory (addr %#x, len %d): %w", m.Addr, m.Len, errs.ErrInvalidArgument)
	}
	mr, path, err := t.regMR(m, accessFlags(transport.AccessWrite))
	if err != nil {
		return nil, err
	}
	t.live.mrs.Add(1)
	r := &registration{t: t, mem: m, cur: &mrRef{mr: mr, write: true}, path: path}
	if m.Kind == memory.CUDA {
		t.log.Info("GPU memory registered", "device", m.Device, "bytes", m.Len, "path", path)
	}
	t.mu.Lock()
	t.regs[r] = struct{}{}
	t.byRKey[mr.RKey()] = r
	t.mu.Unlock()
	return r, nil
}

// regMR registers m with the PD for access and names the path it took.
func (t *Transport) regMR(m memory.Memory, access ibv.Access) (*ibv.MR, string, error) {
	var mr *ibv.MR
	var err error
	path := "ibv_reg_mr (host)"
	switch m.Kind {
	case memory.Host:
		mr, err = t.pd.RegMR(m.Addr, m.Len, access)
	case memory.CUDA:
		path = "ibv_reg_mr (nvidia-peermem)"
		if m.DmabufFD >= 0 {
			path = "ibv_reg_dmabuf_mr"
			mr, err = t.pd.RegDmabufMR(m.DmabufFD, m.DmabufOffset, m.Len, uint64(m.Addr), access)
			if err != nil {
				path = "ibv_reg_mr (nvidia-peermem)"
				mr2, err2 := t.pd.RegMR(m.Addr, m.Len, access)
				if err2 != nil {
					return nil, "", fmt.Errorf("%w: verbs: register GPU memory on device %d: ibv_reg_dmabuf_mr failed (%v; needs kernel >= 5.12, rdma-core >= 34 and a NIC driver with dma-buf support) and ibv_reg_mr on the device pointer failed (%v; needs the nvidia-peermem module: modprobe nvidia_peermem)", errs.ErrFailedPrecondition, m.Device, err, err2)
				}
				mr, err = mr2, nil
			}
		} else {
			mr, err = t.pd.RegMR(m.Addr, m.Len, access)
			if err != nil {
				err = fmt.Errorf("%w: verbs: register GPU memory on device %d, which has no dma-buf (memory imported through an IPC handle cannot export one): ibv_reg_mr on the device pointer failed (%v): load nvidia-peermem (modprobe nvidia_peermem), or allocate the region through the daemon (cuda_alloc) so it can use dma-buf", errs.ErrFailedPrecondition, m.Device, err)
			}
		}
	default:
		return nil, "", fmt.Errorf("verbs: register: memory kind %s: %w", m.Kind, errs.ErrInvalidArgument)
	}
	if err != nil {
		return nil, "", err
	}
	return mr, path, nil
}

// attach makes a set visible to the poller and async-event routing.
func (t *Transport) attach(s *qpSet) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return fmt.Errorf("verbs: transport closed: %w", errs.ErrFailedPrecondition)
	}
	t.sets[s] = struct{}{}
	for _, q := range s.qps {
		t.byQPN[q.qp.Num()] = s
	}
	t.publishLocked()
	return nil
}

// detach hides a set from the poller. With wait, it returns only once the
// poller can no longer be touching the set's CQ (not needed when the
// poller itself detaches, or after it stopped).
func (t *Transport) detach(s *qpSet, wait bool) {
	t.mu.Lock()
	if _, ok := t.sets[s]; ok {
		delete(t.sets, s)
		for _, q := range s.qps {
			if t.byQPN[q.qp.Num()] == s {
				delete(t.byQPN, q.qp.Num())
			}
		}
		t.publishLocked()
	}
	t.mu.Unlock()
	if wait {
		t.p.sync()
	}
}

func (t *Transport) publishLocked() {
	l := make([]*qpSet, 0, len(t.sets))
	for s := range t.sets {
		l = append(l, s)
	}
	t.p.list.Store(&l)
}

func (t *Transport) setByQPN(qpn uint32) *qpSet {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.byQPN[qpn]
}

// Connect creates QPsPerPeer RC QPs, exchanges endpoints with the peer over
// its control plane (a connect signal) and brings them to RTS.
func (t *Transport) Connect(ctx context.Context, p transport.Peer) (transport.Conn, error) {
	if p.Signal == nil {
		return nil, fmt.Errorf("verbs: connect %s: no control client: %w", p.Address, errs.ErrInvalidArgument)
	}
	id := t.connID.Add(1)
	s, err := t.newSet(t.cfg.QPsPerPeer, true, p.Address, id)
	if err != nil {
		return nil, err
	}
	s.ctl = p.Signal
	t.mu.Lock()
	t.ctls[p.Address] = p.Signal
	t.mu.Unlock()
	resp, err := CallConnect(ctx, p.Signal, ConnectRequest{Node: t.node, Port: t.Port(), ConnID: id, Endpoints: s.endpoints()})
	if err != nil {
		s.destroy()
		return nil, fmt.Errorf("verbs: connect signal to %s: %w (%w)", p.Address, err, errs.ErrUnavailable)
	}
	if len(resp.Endpoints) != len(s.qps) {
		s.destroy()
		return nil, fmt.Errorf("verbs: %s answered %d endpoints for %d QPs: %w", p.Address, len(resp.Endpoints), len(s.qps), errs.ErrUnavailable)
	}
	mtu, err := t.pathMTU(resp.Port, resp.PathMTU)
	if err != nil {
		s.destroy()
		return nil, fmt.Errorf("verbs: connect %s: %w", p.Address, err)
	}
	if err := s.connect(resp.Port, resp.Endpoints, mtu); err != nil {
		s.destroy()
		return nil, fmt.Errorf("verbs: connect %s: %w", p.Address, err)
	}
	if err := t.attach(s); err != nil {
		s.destroy()
		return nil, err
	}
	t.log.Info("verbs connection up", "peer", p.Address, "conn", id, "qps", len(s.qps), "path_mtu", mtu,
		"remote_gid", ibv.GID(toGID(resp.Port.GID)).String())
	return s, nil
}

// AcceptVerbs is the receiving side of a peer's connect signal: it creates one QP
// per sender endpoint, attached to the SRQ, brings them to RTS and returns
// their endpoints.
func (t *Transport) AcceptVerbs(ctx context.Context, req ConnectRequest) (Accept, error) {
	var none Accept
	n := len(req.Endpoints)
	if n < 1 || n > maxQPsPerConn {
		return none, fmt.Errorf("verbs: ConnectVerbs from %s with %d endpoints (want 1..%d): %w", req.Node, n, maxQPsPerConn, errs.ErrInvalidArgument)
	}
	mtu, err := t.pathMTU(req.Port, 0)
	if err != nil {
		return none, fmt.Errorf("verbs: ConnectVerbs from %s: %w", req.Node, err)
	}
	s, err := t.newSet(n, false, req.Node, req.ConnID)
	if err != nil {
		return none, err
	}
	if err := s.connect(req.Port, req.Endpoints, mtu); err != nil {
		s.destroy()
		return none, fmt.Errorf("verbs: ConnectVerbs from %s: %w", req.Node, err)
	}
	if err := t.attach(s); err != nil {
		s.destroy()
		return none, err
	}
	t.log.Info("verbs connection accepted", "peer", req.Node, "conn", req.ConnID, "qps", n, "path_mtu", mtu)
	return Accept{Port: t.Port(), PathMTU: uint32(mtu.Bytes()), Endpoints: s.endpoints()}, nil
}

// HandleSignal answers a peer's verbs signal (connect, disconnect); see
// transport.SignalHandler.
func (t *Transport) HandleSignal(ctx context.Context, payload []byte) ([]byte, error) {
	return ServeSignal(ctx, payload, t)
}

// pathMTU is the smaller of both active MTUs (and of the peer's decision,
// when it made one); link layers must match.
func (t *Transport) pathMTU(peer Port, decided uint32) (ibv.MTU, error) {
	if len(peer.GID) != 16 {
		return 0, fmt.Errorf("peer port description missing or GID not 16 bytes: %w", errs.ErrInvalidArgument)
	}
	if peer.LinkLayer != t.port.LinkLayer.String() {
		return 0, fmt.Errorf("link layers differ: local %s, peer %s: %w", t.port.LinkLayer, peer.LinkLayer, errs.ErrInvalidArgument)
	}
	theirs, ok := ibv.MTUFromBytes(int(peer.ActiveMTU))
	if !ok {
		return 0, fmt.Errorf("peer active MTU %d is not 256..4096: %w", peer.ActiveMTU, errs.ErrInvalidArgument)
	}
	m := min(t.port.ActiveMTU, theirs)
	if decided != 0 {
		d, ok := ibv.MTUFromBytes(int(decided))
		if !ok || d > m {
			return 0, fmt.Errorf("peer chose path MTU %d, but min(local %s, peer %s) is %s: %w", decided, t.port.ActiveMTU, theirs, m, errs.ErrInvalidArgument)
		}
		m = d
	}
	return m, nil
}

func toGID(b []byte) (g ibv.GID) {
	copy(g[:], b)
	return g
}

// fitSendQueue checks the send queue depth against the device's max_qp_wr
// (0: unknown). The default is deep (a QP's whole share of a 10,000-block
// batch), so a device with a smaller queue gets its largest, with chains and
// signalling that fit it (fitted); a depth the operator asked for that the
// device cannot give is refused.
func fitSendQueue(cfg *Config, maxQPWR int) (fitted bool, err error) {
	if maxQPWR <= 0 || cfg.SQDepth <= maxQPWR {
		return false, nil
	}
	if cfg.SQDepth != DefaultSQDepth || maxQPWR < 8 {
		return false, fmt.Errorf("verbs: --rdma-sq-depth %d exceeds the device's max_qp_wr %d: %w", cfg.SQDepth, maxQPWR, errs.ErrInvalidArgument)
	}
	cfg.SQDepth = maxQPWR
	cfg.MaxChain = min(cfg.MaxChain, cfg.SQDepth)
	cfg.SignalEvery = max(1, min(cfg.SignalEvery, cfg.SQDepth/2))
	return true, nil
}
