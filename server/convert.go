package server

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/b2bd/b2bd/internal/batch"
	"github.com/b2bd/b2bd/internal/checksum"
	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/notify"
	"github.com/b2bd/b2bd/internal/peer"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/ring"
	"github.com/b2bd/b2bd/internal/transport"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Conversions between the wire API and the domain, in one place.

func exportOf(name string, to, readers []string, readOnly bool) region.Export {
	return region.Export{Name: name, To: to, Readers: readers, ReadOnly: readOnly}
}

// opOf is a transfer's op; a value the wire names no op for is refused
// after the field checks (BadOp).
func opOf(op b2bv1.TransferOp) (batch.Op, error) {
	switch op {
	case b2bv1.TransferOp_TRANSFER_OP_WRITE:
		return batch.OpWrite, nil
	case b2bv1.TransferOp_TRANSFER_OP_READ:
		return batch.OpRead, nil
	}
	return 0, fmt.Errorf("%w: op %d is not a TransferOp (0 WRITE, 1 READ)", errs.ErrInvalidArgument, op)
}

// accessOf is the access a peer's resolution asks for.
func accessOf(a b2bv1.Access) (transport.Access, error) {
	switch a {
	case b2bv1.Access_ACCESS_WRITE:
		return transport.AccessWrite, nil
	case b2bv1.Access_ACCESS_READ:
		return transport.AccessRead, nil
	}
	return 0, fmt.Errorf("%w: access %d is not an Access (0 WRITE, 1 READ)", errs.ErrInvalidArgument, a)
}

// kindOf is a request's data path: its transport_name, or where that is
// empty its deprecated enum; "" (or "auto") lets the daemons choose. A
// name and an enum that disagree are refused, naming both.
func kindOf(k b2bv1.TransportKind, name string) (transport.Kind, error) {
	byEnum, err := peer.KindFromProto(k)
	if err != nil || name == "" {
		return byEnum, err
	}
	if n := len(name); n > maxKindName {
		return "", fmt.Errorf("%w: transport_name is %d bytes, over the limit of %d", errs.ErrInvalidArgument, n, maxKindName)
	}
	if err := transport.CheckName(name); err != nil {
		return "", fmt.Errorf("%w: transport_name: %v", errs.ErrInvalidArgument, err)
	}
	byName := transport.Kind(name)
	if name == transport.Auto {
		byName = ""
	}
	if k != b2bv1.TransportKind_TRANSPORT_KIND_UNSPECIFIED && byEnum != byName {
		return "", fmt.Errorf("%w: transport_name %q and transport %s disagree: set one of them", errs.ErrInvalidArgument, name, byEnum)
	}
	return byName, nil
}

func transferRequest(req *b2bv1.BatchTransferRequest, who region.Caller) batch.Request {
	r := batch.Request{Src: req.GetSrcRegionId(), Caller: who, Peer: req.GetPeer(), Dst: req.GetDstRegion(), Notification: req.GetNotification()}
	r.Transport, r.BadTransport = kindOf(req.GetTransport(), req.GetTransportName())
	r.Op, r.BadOp = opOf(req.GetOp())
	if p := req.GetDescriptors(); p != nil {
		r.Descriptors = &desc.Packed{SrcOffsets: p.GetSrcOffsets(), DstOffsets: p.GetDstOffsets(), Lengths: p.GetLengths(), BlockLength: p.GetBlockLength()}
	}
	return r
}

// ringBatchRequest is a ring batch record's request as BatchTransfer's
// would be: the same fields, checked by the same code.
func ringBatchRequest(b ring.Batch, who region.Caller) batch.Request {
	r := batch.Request{Src: b.Src, Caller: who, Peer: b.Peer, Dst: b.Dst, Notification: b.Note,
		Descriptors: &desc.Packed{SrcOffsets: b.SrcOffsets, DstOffsets: b.DstOffsets, Lengths: b.Lengs, BlockLength: b.BlockLength}}
	r.Transport, r.BadTransport = kindOf(b2bv1.TransportKind_TRANSPORT_KIND_UNSPECIFIED, b.Transport)
	r.Op, r.BadOp = opOf(b2bv1.TransferOp(b.Op))
	return r
}

func transferResponse(r batch.Result) *b2bv1.BatchTransferResponse {
	return &b2bv1.BatchTransferResponse{
		Blocks: r.Blocks, Bytes: r.Bytes, Transport: peer.KindToProto(r.Kind), TransportName: string(r.Kind),
		Segments: r.Stats.Segments, WorkRequests: r.Stats.WorkRequests, ElapsedNs: uint64(r.Elapsed.Nanoseconds()),
		Phases: phasesProto(r.Phases),
	}
}

func phasesProto(p batch.Phases) *b2bv1.PhaseTimings {
	ns := func(d time.Duration) uint64 { return uint64(max(d, 0)) }
	return &b2bv1.PhaseTimings{
		DecodeNs: ns(p.Decode), ValidateNs: ns(p.Validate), ResolveNs: ns(p.Resolve), PlanNs: ns(p.Plan),
		PostNs: ns(p.Post), WireNs: ns(p.Wire), NotifyNs: ns(p.Notify), TotalNs: ns(p.Total),
		ArmedNs: ns(p.Armed), TriggerSeenUnixNs: unixNs(p.TriggerSeen), PostedUnixNs: unixNs(p.Posted), LandedUnixNs: unixNs(p.Landed),
	}
}

// unixNs is t in Unix ns; 0 for the zero time.
func unixNs(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	return uint64(t.UnixNano())
}

func prepareRequest(req *b2bv1.PrepareTransferRequest, who region.Caller) batch.Request {
	r := batch.Request{Src: req.GetSrcRegionId(), Caller: who, Peer: req.GetPeer(), Dst: req.GetDstRegion(), Notification: req.GetNotification()}
	r.Transport, r.BadTransport = kindOf(req.GetTransport(), req.GetTransportName())
	r.Op, r.BadOp = opOf(req.GetOp())
	if p := req.GetDescriptors(); p != nil {
		r.Descriptors = &desc.Packed{SrcOffsets: p.GetSrcOffsets(), DstOffsets: p.GetDstOffsets(), Lengths: p.GetLengths(), BlockLength: p.GetBlockLength()}
	}
	return r
}

func prepareResponse(i batch.PlanInfo) *b2bv1.PrepareTransferResponse {
	return &b2bv1.PrepareTransferResponse{
		Handle: i.Handle, Blocks: i.Blocks, Bytes: i.Bytes, Transport: peer.KindToProto(i.Kind), TransportName: string(i.Kind),
		Segments: i.Segments, WorkRequests: i.WorkRequests, Phases: phasesProto(i.Phases),
	}
}

func checksumAlgorithm(a b2bv1.ChecksumAlgorithm) (checksum.Algorithm, error) {
	switch a {
	case b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_UNSPECIFIED, b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C:
		return checksum.CRC32C, nil
	case b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_XXH64:
		return checksum.XXH64, nil
	}
	return 0, fmt.Errorf("%w: algorithm %d is not a known ChecksumAlgorithm", errs.ErrInvalidArgument, a)
}

func checksumResponse(req *b2bv1.ChecksumRequest, alg checksum.Algorithm, b desc.Batch, digests []uint64) *b2bv1.ChecksumResponse {
	resp := &b2bv1.ChecksumResponse{Digest: checksum.Combine(alg, digests), Algorithm: req.GetAlgorithm(), Blocks: uint64(b.N()), Bytes: b.Bytes()}
	if resp.Algorithm == b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_UNSPECIFIED {
		resp.Algorithm = b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C
	}
	if req.GetPerBlock() {
		resp.BlockDigests = desc.Pack(digests)
	}
	return resp
}

func transportStatuses(all []*b2bv1.TransportStatus, live map[b2bv1.TransportKind]transport.Transport) []*b2bv1.TransportStatus {
	out := make([]*b2bv1.TransportStatus, len(all))
	for i, ts := range all {
		ts = proto.Clone(ts).(*b2bv1.TransportStatus)
		if l, ok := live[ts.Kind]; ok {
			st := l.Status()
			r := st.Resources
			ts.Connections, ts.QueuePairs, ts.MemoryRegions = uint32(r.Connections), uint32(r.QueuePairs), uint32(r.MemoryRegions)
			for _, x := range st.Rails {
				ts.Rails = append(ts.Rails, &b2bv1.RailStatus{Rail: uint32(x.Rail), Device: x.Device, Detail: x.Detail, Up: x.Up,
					LastError: x.LastError, Failovers: x.Failovers, Reconnects: x.Reconnects, BytesSent: x.BytesSent})
			}
		}
		out[i] = ts
	}
	return out
}

func notificationOf(req *b2bv1.NotifyRequest) notify.Notification {
	return notify.Notification{Region: req.GetRegion(), Sender: req.GetSender(), Notification: req.GetNotification(), Blocks: req.GetBlocks(), Bytes: req.GetBytes()}
}

func notificationProto(n notify.Notification) *b2bv1.Notification {
	return &b2bv1.Notification{Region: n.Region, Sender: n.Sender, Notification: n.Notification, Blocks: n.Blocks, Bytes: n.Bytes, Dropped: n.Dropped}
}

func handshakeResponse(cfg Config) *b2bv1.HandshakeResponse {
	resp := &b2bv1.HandshakeResponse{ProtocolVersion: peer.ProtocolVersion, NodeName: cfg.NodeName, InstanceId: cfg.InstanceID,
		Adverts: make(map[string][]byte, len(cfg.Adverts))}
	for _, a := range cfg.Adverts {
		resp.Adverts[string(a.Kind)] = a.Data
	}
	return resp
}

// resolveResponse is the region's resolution for a peer granted access
// a: its keys (region.Region.KeysFor) in the encoding every kind reads
// (transport.MarshalRegionKey).
func resolveResponse(g *region.Registry, r *region.Region, a transport.Access) *b2bv1.ResolveRegionResponse {
	resp := &b2bv1.ResolveRegionResponse{Name: r.Export, Size: r.Mem.Len, Kind: memoryKind(r.Mem.Kind), Device: int32(r.Mem.Device), Keys: map[string][]byte{},
		BoundAgeNs: ageNs(g.ExportedAt(r))}
	for k, key := range r.KeysFor(a) {
		resp.Keys[string(k)] = transport.MarshalRegionKey(key)
	}
	return resp
}

// ageNs is how long ago t was (0: t unknown; at least 1 otherwise).
func ageNs(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	return uint64(max(time.Since(t), 1))
}

func memoryKind(k memory.Kind) b2bv1.MemoryKind {
	switch k {
	case memory.Host:
		return b2bv1.MemoryKind_MEMORY_KIND_HOST
	case memory.CUDA:
		return b2bv1.MemoryKind_MEMORY_KIND_CUDA
	}
	return b2bv1.MemoryKind_MEMORY_KIND_UNSPECIFIED
}

func regionProto(r *region.Region, active int) *b2bv1.Region {
	p := &b2bv1.Region{
		Id: r.ID, ExportName: r.Export, Size: r.Mem.Len, ShmPath: r.ShmPath, ShmOffset: r.ShmOff,
		CudaIpcHandle: r.IPC, CudaIpcOffset: r.IPCOff, ActiveBatches: uint32(active), ExportTo: r.ExportTo, Readers: r.Readers, ReadOnly: r.ReadOnly,
		Kind: memoryKind(r.Mem.Kind), Owner: r.Owner.String(), Pid: r.PID, Persist: r.Persist,
		AgeNs: uint64(max(time.Since(r.Created), 0)),
	}
	if r.Mem.Kind == memory.CUDA {
		p.CudaDevice = int32(r.Mem.Device)
	}
	for _, k := range r.Transports() {
		p.RegisteredWith = append(p.RegisteredWith, peer.KindToProto(k))
		p.RegisteredWithNames = append(p.RegisteredWithNames, string(k))
		g, _ := r.Registration(k)
		for _, x := range g.Rails() {
			p.Rails = append(p.Rails, &b2bv1.RailRegistration{Rail: uint32(x.Rail), Device: x.Device, Rkey: x.Key.Key,
				Path: x.Path, Affinity: x.Affinity, Preferred: x.Preferred})
		}
	}
	return p
}

// calibrationProto is the daemon's calibration as Status says it.
func calibrationProto(of func() *transport.Calibration) *b2bv1.Calibration {
	if of == nil {
		return nil
	}
	c := of()
	if c == nil {
		return nil
	}
	out := &b2bv1.Calibration{State: c.State, ElapsedNs: uint64(c.Elapsed), File: c.File}
	for _, r := range c.Rows {
		row := &b2bv1.CalibrationRow{From: memoryKind(r.Route.From), To: memoryKind(r.Route.To), SameDevice: r.Route.SameDevice,
			BlockBytes: r.BlockBytes, Blocks: uint32(r.Blocks), MedianNs: map[string]uint64{}, Chosen: string(r.Chosen), Why: r.Why}
		for k, t := range r.Median {
			row.MedianNs[string(k)] = uint64(t)
		}
		if len(r.Failed) > 0 {
			row.Failed = map[string]string{}
			for k, why := range r.Failed {
				row.Failed[string(k)] = why
			}
		}
		out.Rows = append(out.Rows, row)
	}
	return out
}
