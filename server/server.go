// Package server implements b2bd's gRPC services: B2B, which applications
// call on their local daemon, and Peer, which daemons call on each other.
// Domain errors become gRPC statuses in one place, grpcstatus.ToStatus.
package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/proto"

	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/checksum"
	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/errs/grpcstatus"
	"github.com/b2bd/b2bd/internal/memguard"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/notify"
	"github.com/b2bd/b2bd/internal/peer"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/staging"
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// VerbsAcceptor is the receiving half of verbs connection set-up.
type VerbsAcceptor interface {
	AcceptVerbs(ctx context.Context, req *b2bv1.ConnectVerbsRequest) (*b2bv1.ConnectVerbsResponse, error)
	// DisconnectVerbs drops the receiving half of a sender's connection;
	// false when there is none.
	DisconnectVerbs(node string, id uint64) bool
}

// Counters are the daemon's batch statistics.
type Counters struct {
	BatchesSent, BatchesReceived, BatchesFailed atomic.Uint64
	BytesSent, BytesReceived                    atomic.Uint64
}

// Config is what the services need from the daemon.
type Config struct {
	NodeName    string
	Version     string
	PeerAddress string
	Registry    *region.Registry
	Peers       *peer.Manager
	Transports  []*b2bv1.TransportStatus // every transport, available or not
	// Live reports the resources of the running transports for Status;
	// nil reports none.
	Live           map[b2bv1.TransportKind]transport.Counter
	TCPData        string // TCP data listener address
	TCPToken       []byte
	Verbs          VerbsAcceptor // nil without RDMA
	MaxDescriptors int
	DefaultTimeout time.Duration
	CUDAAvailable  bool
	CUDADetail     string
	Counters       *Counters
	Notify         *notify.Hub
	Staging        *staging.Pool // nil without CUDA
	Log            hclog.Logger
}

// Server holds both services.
type Server struct {
	cfg Config
}

// New validates cfg and returns the services.
func New(cfg Config) *Server {
	if cfg.MaxDescriptors <= 0 {
		cfg.MaxDescriptors = desc.DefaultMaxBlocks
	}
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = time.Minute
	}
	if cfg.Counters == nil {
		cfg.Counters = &Counters{}
	}
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	if cfg.Notify == nil {
		cfg.Notify = &notify.Hub{}
	}
	return &Server{cfg: cfg}
}

// Local is the B2B service.
func (s *Server) Local() b2bv1.B2BServer { return &local{s: s} }

// Peer is the Peer service.
func (s *Server) Peer() b2bv1.PeerServer { return &peerService{s: s} }

type local struct {
	b2bv1.UnimplementedB2BServer
	s *Server
}

func (l *local) RegisterRegion(ctx context.Context, req *b2bv1.RegisterRegionRequest) (*b2bv1.RegisterRegionResponse, error) {
	who := caller(ctx)
	r, err := l.register(req, who)
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	if err := ctx.Err(); err != nil {
		// The caller gave up and will never learn the ID: release it now,
		// or its memory would stay pinned until the daemon stops.
		if derr := l.s.cfg.Registry.Deregister(r.ID, who); derr != nil {
			l.s.cfg.Log.Warn("release abandoned region", "id", r.ID, "error", derr)
		}
		return nil, grpcstatus.ToStatus(fmt.Errorf("register region: caller went away: %w", err))
	}
	l.s.cfg.Log.Info("region registered", "id", r.ID, "kind", r.Mem.Kind, "bytes", r.Mem.Len, "export", r.Export)
	return &b2bv1.RegisterRegionResponse{Region: regionProto(r, 0)}, nil
}

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

func (l *local) register(req *b2bv1.RegisterRegionRequest, who region.Caller) (*region.Region, error) {
	reg, name := l.s.cfg.Registry, region.Export{Name: req.GetExportName(), To: req.GetExportTo()}
	switch src := req.GetSource().(type) {
	case *b2bv1.RegisterRegionRequest_HostAlloc:
		return reg.AllocHost(src.HostAlloc.GetSize(), name, who)
	case *b2bv1.RegisterRegionRequest_HostFile:
		f := src.HostFile
		return reg.ImportHost(f.GetPath(), f.GetOffset(), f.GetSize(), name, who)
	case *b2bv1.RegisterRegionRequest_CudaAlloc:
		return reg.AllocCUDA(int(src.CudaAlloc.GetDevice()), src.CudaAlloc.GetSize(), name, who)
	case *b2bv1.RegisterRegionRequest_CudaIpc:
		c := src.CudaIpc
		if n := len(c.GetIpcHandle()); n != 64 {
			return nil, fmt.Errorf("%w: cuda_ipc.ipc_handle is %d bytes; a CUipcMemHandle is 64", errs.ErrInvalidArgument, n)
		}
		return reg.ImportCUDA(int(c.GetDevice()), c.GetIpcHandle(), c.GetOffset(), c.GetSize(), name, who)
	default:
		return nil, fmt.Errorf("%w: source is not set: give host_alloc, host_file, cuda_alloc or cuda_ipc", errs.ErrInvalidArgument)
	}
}

func (l *local) DeregisterRegion(ctx context.Context, req *b2bv1.DeregisterRegionRequest) (*b2bv1.DeregisterRegionResponse, error) {
	if err := l.s.cfg.Registry.Deregister(req.GetRegionId(), caller(ctx)); err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	return &b2bv1.DeregisterRegionResponse{}, nil
}

func (l *local) ListRegions(ctx context.Context, req *b2bv1.ListRegionsRequest) (*b2bv1.ListRegionsResponse, error) {
	var out []*b2bv1.Region
	for _, r := range l.s.cfg.Registry.List(caller(ctx)) {
		out = append(out, regionProto(r.Region, r.Active))
	}
	return &b2bv1.ListRegionsResponse{Regions: out}, nil
}

func (l *local) ExportRegion(ctx context.Context, req *b2bv1.ExportRegionRequest) (*b2bv1.ExportRegionResponse, error) {
	r, err := l.s.cfg.Registry.SetExport(req.GetRegionId(), region.Export{Name: req.GetExportName(), To: req.GetExportTo()}, caller(ctx))
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	return &b2bv1.ExportRegionResponse{Region: regionProto(r, 0)}, nil
}

func (l *local) BatchTransfer(ctx context.Context, req *b2bv1.BatchTransferRequest) (*b2bv1.BatchTransferResponse, error) {
	// Every batch has a deadline: the caller's, else --default-timeout.
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.s.cfg.DefaultTimeout)
		defer cancel()
	}
	resp, err := l.s.transfer(ctx, req)
	if err != nil {
		// The caller's deadline or cancellation is the outcome when it is
		// what ended the batch, whatever phase it cut off (errs.ForCaller).
		err = errs.ForCaller(ctx, err)
		l.s.cfg.Counters.BatchesFailed.Add(1)
		l.s.cfg.Log.Debug("batch failed", "peer", req.GetPeer(), "dst", req.GetDstRegion(), "error", err)
		return nil, grpcstatus.ToStatus(err)
	}
	return resp, nil
}

func (s *Server) transfer(ctx context.Context, req *b2bv1.BatchTransferRequest) (*b2bv1.BatchTransferResponse, error) {
	switch {
	case req.GetSrcRegionId() == "":
		return nil, fmt.Errorf("%w: src_region_id is empty", errs.ErrInvalidArgument)
	case req.GetPeer() == "":
		return nil, fmt.Errorf("%w: peer is empty: give the destination daemon's peer address, host:port", errs.ErrInvalidArgument)
	case req.GetDstRegion() == "":
		return nil, fmt.Errorf("%w: dst_region is empty: give the destination region's export name", errs.ErrInvalidArgument)
	case req.GetDescriptors() == nil:
		return nil, fmt.Errorf("%w: descriptors is not set", errs.ErrInvalidArgument)
	case len(req.GetNotification()) > MaxNotification:
		return nil, fmt.Errorf("%w: notification is %d bytes, over the limit of %d", errs.ErrInvalidArgument, len(req.GetNotification()), MaxNotification)
	}
	want, err := peer.KindFromProto(req.GetTransport())
	if err != nil {
		return nil, err
	}

	src, release, err := s.cfg.Registry.Acquire(req.GetSrcRegionId(), "src_region_id", caller(ctx))
	if err != nil {
		return nil, err
	}
	defer release()

	// Everything that can be checked locally is checked before we dial.
	d := desc.Pool.Get().(*desc.Decoder)
	defer desc.Pool.Put(d)
	p := req.GetDescriptors()
	batch, err := d.Decode(desc.Packed{SrcOffsets: p.GetSrcOffsets(), DstOffsets: p.GetDstOffsets(), Lengths: p.GetLengths(), BlockLength: p.GetBlockLength()},
		desc.Limits{SrcSize: src.Mem.Len, DstSize: desc.UnknownSize, MaxBlocks: s.cfg.MaxDescriptors})
	if err != nil {
		return nil, err
	}

	blocks, bytes := uint64(batch.N()), batch.Bytes()
	merged := d.Merge(batch)
	if mb := merged.Bytes(); mb != bytes {
		// Never hand a transport less than was asked for: success would lie.
		return nil, fmt.Errorf("batch: merged segments hold %d bytes, the descriptors %d (internal error)", mb, bytes)
	}
	var (
		sess  peer.Session
		st    transport.Stats
		start time.Time
	)
	// A cached resolution can be stale (the region was re-registered): its
	// size then misjudges the bounds, or the receiver refuses the key before
	// placing any byte. Either way one retry with a fresh resolution is safe.
	//
	// A connection may also break under the batch: made before it, it may
	// have died unnoticed with an idle peer (restarted, or its link flapped);
	// fresh, the wire may fail it (Soft-RoCE under load NAKs a WRITE with
	// "remote invalid request" now and then). Writes are idempotent (the
	// same bytes to the same places), so one retry on a fresh connection is
	// safe, and success still means every byte landed and was acknowledged.
	// A dead peer costs the retry one refused dial.
	var firstErr error
	for attempt := 0; ; attempt++ {
		var remote transport.RemoteRegion
		var reg transport.Registration
		var cached bool
		sess, remote, reg, cached, err = s.prepare(ctx, req, want, src)
		if err != nil {
			if firstErr != nil {
				return nil, fmt.Errorf("%w (retrying on a fresh connection; the first attempt failed: %v)", err, firstErr)
			}
			return nil, err
		}
		if err := desc.CheckDst(batch, remote.Size); err != nil {
			if cached && attempt == 0 { // the size may be stale, not the request wrong
				s.cfg.Peers.Forget(req.GetPeer(), req.GetDstRegion())
				continue
			}
			return nil, err
		}
		start = time.Now()
		st, err = sess.Conn.Write(ctx, reg, remote, &merged)
		if err == nil {
			break
		}
		broke := sess.Conn.Err() != nil
		if broke {
			s.cfg.Peers.Broken(req.GetPeer(), sess)
		}
		if cached && attempt == 0 && errors.Is(err, errs.ErrNotFound) {
			s.cfg.Peers.Forget(req.GetPeer(), req.GetDstRegion())
			continue
		}
		if memguard.IsFault(err) { // our source's memory went away under the send
			err = fmt.Errorf("src_region_id %s: %w", src.ID, err)
		}
		err = fmt.Errorf("batch of %d blocks to %s/%s over %s: %w", blocks, req.GetPeer(), req.GetDstRegion(), sess.Kind, err)
		// A fault on our own source memory would fault again: no retry.
		if broke && firstErr == nil && ctx.Err() == nil && !memguard.IsFault(err) {
			s.cfg.Log.Info("batch broke its connection; retrying once on a fresh one", "peer", req.GetPeer(), "reused", sess.Reused, "error", err)
			firstErr = err
			continue
		}
		if firstErr != nil {
			return nil, fmt.Errorf("%w (after a retry on a fresh connection; the first attempt failed: %v)", err, firstErr)
		}
		return nil, err
	}
	elapsed := time.Since(start)
	if req.GetNotification() != nil {
		_, err := sess.Control.Notify(ctx, &b2bv1.NotifyRequest{Region: req.GetDstRegion(), Sender: s.cfg.NodeName,
			Notification: req.GetNotification(), Blocks: blocks, Bytes: bytes})
		if err != nil {
			return nil, fmt.Errorf("batch of %d blocks landed at %s/%s, but its notification was not delivered: %w", blocks, req.GetPeer(), req.GetDstRegion(), grpcstatus.FromStatus(err))
		}
	}
	s.cfg.Counters.BatchesSent.Add(1)
	s.cfg.Counters.BytesSent.Add(bytes)
	return &b2bv1.BatchTransferResponse{
		Blocks: blocks, Bytes: bytes, Transport: peer.KindToProto(sess.Kind),
		Segments: st.Segments, WorkRequests: st.WorkRequests, ElapsedNs: uint64(elapsed.Nanoseconds()),
	}, nil
}

// prepare finds the data path, the source's registration with it, and the
// destination region's key.
func (s *Server) prepare(ctx context.Context, req *b2bv1.BatchTransferRequest, want transport.Kind, src *region.Region) (peer.Session, transport.RemoteRegion, transport.Registration, bool, error) {
	var none transport.RemoteRegion
	sess, err := s.cfg.Peers.Get(ctx, req.GetPeer(), want)
	if err != nil {
		return sess, none, nil, false, err
	}
	reg, ok := src.Registration(sess.Kind)
	if !ok {
		return sess, none, nil, false, fmt.Errorf("%w: src_region_id %s (%s memory) is not registered with transport %s", errs.ErrFailedPrecondition, src.ID, src.Mem.Kind, sess.Kind)
	}
	rr, cached, err := s.cfg.Peers.Resolve(ctx, req.GetPeer(), sess, req.GetDstRegion())
	if err != nil {
		if !isRequestError(err) {
			s.cfg.Peers.Broken(req.GetPeer(), sess)
		}
		return sess, none, nil, false, fmt.Errorf("peer %s: resolve dst_region %q: %w", req.GetPeer(), req.GetDstRegion(), err)
	}
	remote := transport.RemoteRegion{Name: rr.GetName(), Size: rr.GetSize()}
	for _, k := range rr.GetKeys() {
		if k.GetTransport() == peer.KindToProto(sess.Kind) {
			remote.Key = transport.RemoteKey{Key: k.GetKey(), Addr: k.GetRemoteAddr()}
			return sess, remote, reg, cached, nil
		}
	}
	return sess, none, nil, false, fmt.Errorf("%w: dst_region %q on peer %s is not registered with transport %s", errs.ErrFailedPrecondition, req.GetDstRegion(), req.GetPeer(), sess.Kind)
}

// isRequestError: the peer refused this request, the connection is fine.
func isRequestError(err error) bool {
	return errsIs(err, errs.ErrNotFound, errs.ErrInvalidArgument, errs.ErrPermissionDenied, errs.ErrFailedPrecondition)
}

func (l *local) Checksum(ctx context.Context, req *b2bv1.ChecksumRequest) (*b2bv1.ChecksumResponse, error) {
	resp, err := l.s.checksum(req, caller(ctx))
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	return resp, nil
}

func (s *Server) checksum(req *b2bv1.ChecksumRequest, who region.Caller) (*b2bv1.ChecksumResponse, error) {
	r, release, err := s.cfg.Registry.Acquire(req.GetRegionId(), "region_id", who)
	if err != nil {
		return nil, err
	}
	defer release()
	var alg checksum.Algorithm
	switch req.GetAlgorithm() {
	case b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_UNSPECIFIED, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C:
		alg = checksum.CRC32C
	case b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_XXH64:
		alg = checksum.XXH64
	default:
		return nil, fmt.Errorf("%w: algorithm %d is not a known ChecksumAlgorithm", errs.ErrInvalidArgument, req.GetAlgorithm())
	}
	d := desc.Pool.Get().(*desc.Decoder)
	defer desc.Pool.Put(d)
	b, err := d.DecodeRanges(req.GetOffsets(), req.GetLengths(), req.GetBlockLength(), r.Mem.Len, s.cfg.MaxDescriptors)
	if err != nil {
		return nil, err
	}
	digests := make([]uint64, b.N())
	if r.Mem.Kind == memory.Host {
		if err := checksum.Blocks(alg, r.Mem.Host, b.Src, b.Len, digests); err != nil {
			return nil, fmt.Errorf("checksum of region %s (%s): %w", r.ID, r.ShmPath, err)
		}
	} else if err := s.checksumDevice(alg, r.Mem, b, digests); err != nil {
		return nil, err
	}
	sum := checksum.Combine(alg, digests)
	resp := &b2bv1.ChecksumResponse{Digest: sum, Algorithm: req.GetAlgorithm(), Blocks: uint64(b.N()), Bytes: b.Bytes()}
	if resp.Algorithm == b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_UNSPECIFIED {
		resp.Algorithm = b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C
	}
	if req.GetPerBlock() {
		resp.BlockDigests = desc.Pack(digests)
	}
	return resp, nil
}

// checksumDevice stages GPU blocks to pinned host memory, in rounds, with
// the copy engines, and hashes them there.
func (s *Server) checksumDevice(alg checksum.Algorithm, mem memory.Memory, b desc.Batch, out []uint64) error {
	if s.cfg.Staging == nil {
		return fmt.Errorf("%w: region is %s memory and this daemon has no CUDA driver", errs.ErrFailedPrecondition, mem.Kind)
	}
	st, err := s.cfg.Staging.Get(mem.Device)
	if err != nil {
		return err
	}
	defer s.cfg.Staging.Put(st)
	for lo := 0; lo < b.N(); {
		n, hostOff, err := st.Read(mem, b.Src[lo:], b.Len[lo:])
		if err != nil {
			return err
		}
		if err := checksum.Blocks(alg, st.Buffer(), hostOff[:n], b.Len[lo:lo+n], out[lo:lo+n]); err != nil {
			return fmt.Errorf("checksum of staged %s memory: %w", mem.Kind, err)
		}
		lo += n
	}
	return nil
}

func (l *local) Status(ctx context.Context, req *b2bv1.StatusRequest) (*b2bv1.StatusResponse, error) {
	c, cfg := l.s.cfg.Counters, l.s.cfg
	transports := make([]*b2bv1.TransportStatus, len(cfg.Transports))
	for i, ts := range cfg.Transports {
		ts = proto.Clone(ts).(*b2bv1.TransportStatus)
		if live, ok := cfg.Live[ts.Kind]; ok {
			r := live.Resources()
			ts.Connections, ts.QueuePairs, ts.MemoryRegions = uint32(r.Connections), uint32(r.QueuePairs), uint32(r.MemoryRegions)
		}
		transports[i] = ts
	}
	return &b2bv1.StatusResponse{
		Version: cfg.Version, NodeName: cfg.NodeName, PeerAddress: cfg.PeerAddress,
		Transports: transports, CudaAvailable: cfg.CUDAAvailable, CudaDetail: cfg.CUDADetail, OpenFds: openFDs(),
		Regions: uint32(cfg.Registry.Len()), MaxDescriptors: uint32(cfg.MaxDescriptors),
		BatchesSent: c.BatchesSent.Load(), BatchesReceived: c.BatchesReceived.Load(), BatchesFailed: c.BatchesFailed.Load(),
		BytesSent: c.BytesSent.Load(), BytesReceived: c.BytesReceived.Load(),
		PeersConnected: uint32(cfg.Peers.Connected()), Goroutines: uint32(runtime.NumGoroutine()),
	}, nil
}

// openFDs counts this process's open file descriptors, or 0 where
// /proc/self/fd cannot be read.
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

// MaxNotification bounds a batch's notification.
const MaxNotification = 4096

func (l *local) WatchNotifications(req *b2bv1.WatchNotificationsRequest, stream b2bv1.B2B_WatchNotificationsServer) error {
	r, release, err := l.s.cfg.Registry.Acquire(req.GetRegionId(), "region_id", caller(stream.Context()))
	if err != nil {
		return grpcstatus.ToStatus(err)
	}
	id := r.ID
	release() // watching does not pin the region
	w := l.s.cfg.Notify.Subscribe(id)
	defer l.s.cfg.Notify.Unsubscribe(w)
	// Headers tell the client it is subscribed: batches after this are seen.
	if err := stream.SendHeader(nil); err != nil {
		return err
	}
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case n := <-w.C:
			if err := stream.Send(n); err != nil {
				return err
			}
		}
	}
}

func regionProto(r *region.Region, active int) *b2bv1.Region {
	p := &b2bv1.Region{
		Id: r.ID, ExportName: r.Export, Size: r.Mem.Len, ShmPath: r.ShmPath, ShmOffset: r.ShmOff,
		CudaIpcHandle: r.IPC, CudaIpcOffset: r.IPCOff, ActiveBatches: uint32(active), ExportTo: r.ExportTo,
	}
	switch r.Mem.Kind {
	case memory.Host:
		p.Kind = b2bv1.MemoryKind_MEMORY_KIND_HOST
	case memory.CUDA:
		p.Kind = b2bv1.MemoryKind_MEMORY_KIND_CUDA
		p.CudaDevice = int32(r.Mem.Device)
	}
	for _, k := range r.Transports() {
		p.RegisteredWith = append(p.RegisteredWith, peer.KindToProto(k))
	}
	return p
}

// ---------------------------------------------------------------------------

type peerService struct {
	b2bv1.UnimplementedPeerServer
	s *Server
}

func (p *peerService) Handshake(ctx context.Context, req *b2bv1.HandshakeRequest) (*b2bv1.HandshakeResponse, error) {
	cfg := p.s.cfg
	if v := req.GetProtocolVersion(); v != peer.ProtocolVersion {
		return nil, grpcstatus.ToStatus(fmt.Errorf("%w: protocol_version %d is not supported; this daemon speaks %d", errs.ErrFailedPrecondition, v, peer.ProtocolVersion))
	}
	resp := &b2bv1.HandshakeResponse{ProtocolVersion: peer.ProtocolVersion, NodeName: cfg.NodeName, Capabilities: capabilities}
	for _, t := range cfg.Transports {
		if t.GetAvailable() {
			resp.Transports = append(resp.Transports, t.GetKind())
		}
	}
	if cfg.TCPData != "" {
		resp.TcpDataAddress, resp.SessionToken = cfg.TCPData, cfg.TCPToken
	}
	cfg.Log.Debug("handshake", "peer", req.GetNodeName(), "transports", req.GetTransports())
	return resp, nil
}

var capabilities = []string{"merge-adjacent", "write-with-imm-completion", "packed-descriptors"}

func (p *peerService) ResolveRegion(ctx context.Context, req *b2bv1.ResolveRegionRequest) (*b2bv1.ResolveRegionResponse, error) {
	if req.GetName() == "" {
		return nil, grpcstatus.ToStatus(fmt.Errorf("%w: name is empty", errs.ErrInvalidArgument))
	}
	// Keys are only ever handed to peers allowed to write the region.
	r, release, err := p.s.cfg.Registry.Lookup(req.GetName(), auth.PeerIdentity(ctx))
	if err != nil {
		p.s.cfg.Log.Warn("region resolution refused", "name", req.GetName(), "peer", auth.PeerIdentity(ctx), "error", err)
		return nil, grpcstatus.ToStatus(err)
	}
	defer release()
	resp := &b2bv1.ResolveRegionResponse{Name: r.Export, Size: r.Mem.Len, Kind: regionProto(r, 0).Kind}
	for _, k := range r.Transports() {
		g, _ := r.Registration(k)
		key := g.Key()
		resp.Keys = append(resp.Keys, &b2bv1.RegionKey{Transport: peer.KindToProto(k), Key: key.Key, RemoteAddr: key.Addr})
	}
	return resp, nil
}

func (p *peerService) Notify(ctx context.Context, req *b2bv1.NotifyRequest) (*b2bv1.NotifyResponse, error) {
	if len(req.GetNotification()) > MaxNotification {
		return nil, grpcstatus.ToStatus(fmt.Errorf("%w: notification is %d bytes, over the limit of %d", errs.ErrInvalidArgument, len(req.GetNotification()), MaxNotification))
	}
	r, release, err := p.s.cfg.Registry.Lookup(req.GetRegion(), auth.PeerIdentity(ctx))
	if err != nil {
		return nil, grpcstatus.ToStatus(err)
	}
	release()
	n := p.s.cfg.Notify.Publish(r.ID, &b2bv1.Notification{Region: req.GetRegion(), Sender: req.GetSender(),
		Notification: req.GetNotification(), Blocks: req.GetBlocks(), Bytes: req.GetBytes()})
	return &b2bv1.NotifyResponse{Delivered: uint32(n)}, nil
}

func (p *peerService) DisconnectVerbs(ctx context.Context, req *b2bv1.DisconnectVerbsRequest) (*b2bv1.DisconnectVerbsResponse, error) {
	if p.s.cfg.Verbs == nil {
		return nil, grpcstatus.ToStatus(fmt.Errorf("%w: this daemon has no RDMA device", errs.ErrFailedPrecondition))
	}
	if req.GetNodeName() == "" || req.GetConnectionId() == 0 {
		return nil, grpcstatus.ToStatus(fmt.Errorf("%w: node_name and connection_id must both be set", errs.ErrInvalidArgument))
	}
	return &b2bv1.DisconnectVerbsResponse{Found: p.s.cfg.Verbs.DisconnectVerbs(req.GetNodeName(), req.GetConnectionId())}, nil
}

func (p *peerService) ConnectVerbs(ctx context.Context, req *b2bv1.ConnectVerbsRequest) (*b2bv1.ConnectVerbsResponse, error) {
	if p.s.cfg.Verbs == nil {
		return nil, grpcstatus.ToStatus(fmt.Errorf("%w: this daemon has no RDMA device", errs.ErrFailedPrecondition))
	}
	resp, err := p.s.cfg.Verbs.AcceptVerbs(ctx, req)
	return resp, grpcstatus.ToStatus(err)
}
