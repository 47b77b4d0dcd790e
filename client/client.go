// Package client is the Go API for applications that talk to their local
// b2bd: register memory, transfer a batch of blocks to a peer, checksum.
package client

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Client is a connection to the local daemon.
type Client struct {
	cc  *grpc.ClientConn
	api b2bv1.B2BClient
}

// maxMsg allows descriptor lists of a million blocks.
const maxMsg = 128 << 20

// Dial connects to a daemon's local API: "unix:///run/b2bd/b2bd.sock", a
// socket path ("/run/b2bd/b2bd.sock", or relative to the working
// directory: "a/b2bd.sock", "./b2bd.sock", "b2bd.sock"), or "host:port".
// A target without a colon cannot be a host:port, so it is a path.
func Dial(target string, opts ...grpc.DialOption) (*Client, error) {
	if target == "" {
		return nil, status.Error(codes.InvalidArgument, "b2b client: dial: the target is empty: give the daemon's socket path or host:port")
	}
	if !strings.HasPrefix(target, "/") && !strings.Contains(target, ":") {
		abs, err := filepath.Abs(target)
		if err != nil {
			return nil, fmt.Errorf("b2b client: dial %s: %w", target, err)
		}
		target = abs
	}
	if strings.HasPrefix(target, "/") {
		target = "unix://" + target
	}
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// The daemon ties the regions this client registers (and its
		// prepared plans) to its connection: an idle channel must not
		// close it (gRPC's default closes it after 30 idle minutes).
		grpc.WithIdleTimeout(0),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg), grpc.MaxCallSendMsgSize(maxMsg)),
		// Transfers answer at the caller's deadline from the daemon, after
		// its data path stopped (deadline.go).
		grpc.WithChainUnaryInterceptor(unaryCallerDeadline),
		grpc.WithChainStreamInterceptor(streamCallerDeadline),
	}, opts...)
	cc, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("b2b client: dial %s: %w", target, err)
	}
	return &Client{cc: cc, api: b2bv1.NewB2BClient(cc)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.cc.Close() }

// API is the raw generated client, for calls this package does not wrap.
func (c *Client) API() b2bv1.B2BClient { return c.api }

// HostRegion is a host region mapped into this process.
type HostRegion struct {
	*b2bv1.Region
	// Bytes is the region's memory, shared with the daemon.
	Bytes []byte
}

// Unmap releases this process's mapping; the daemon keeps the region until
// Deregister.
func (h *HostRegion) Unmap() error {
	if h.Bytes == nil {
		return nil
	}
	err := unix.Munmap(h.Bytes)
	h.Bytes = nil
	return err
}

// RegisterOption changes how a region is registered.
type RegisterOption func(*b2bv1.RegisterRegionRequest)

// Persist keeps the region registered after this client is gone, until
// Deregister or the daemon stops. Without it a region is leased to this
// client: when the process's last connection to the daemon closes (Close,
// exit, crash, kill -9), the daemon deregisters it and frees its memory,
// after the batches using it end.
func Persist() RegisterOption {
	return func(r *b2bv1.RegisterRegionRequest) { r.Persist = true }
}

// Readers lets the named peers read (pull from) the region's export;
// "*" grants every authenticated peer. Without it an export is write-only.
func Readers(peers ...string) RegisterOption {
	return func(r *b2bv1.RegisterRegionRequest) { r.Readers = append(r.Readers, peers...) }
}

// ReadOnly exports the region with no writers (combine with Readers).
func ReadOnly() RegisterOption {
	return func(r *b2bv1.RegisterRegionRequest) { r.ReadOnly = true }
}

// ExportTo limits the region's writers to the named peers.
func ExportTo(peers ...string) RegisterOption {
	return func(r *b2bv1.RegisterRegionRequest) { r.ExportTo = append(r.ExportTo, peers...) }
}

func registerRequest(r *b2bv1.RegisterRegionRequest, opts []RegisterOption) *b2bv1.RegisterRegionRequest {
	for _, o := range opts {
		o(r)
	}
	return r
}

// RegisterHost asks the daemon for size bytes of shared host memory, exported
// as export when not empty, and maps it here. The region is leased to this
// client unless opts has Persist.
func (c *Client) RegisterHost(ctx context.Context, size uint64, export string, opts ...RegisterOption) (*HostRegion, error) {
	resp, err := c.api.RegisterRegion(ctx, registerRequest(&b2bv1.RegisterRegionRequest{
		Source:     &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: size}},
		ExportName: export,
	}, opts))
	if err != nil {
		return nil, err
	}
	return c.mapRegion(ctx, resp.GetRegion())
}

// ImportHostFile registers a file the caller created in the daemon's shm
// directory, and maps it here too. Leased to this client unless opts has
// Persist (the file itself stays either way: it is the caller's).
func (c *Client) ImportHostFile(ctx context.Context, path string, offset, size uint64, export string, opts ...RegisterOption) (*HostRegion, error) {
	resp, err := c.api.RegisterRegion(ctx, registerRequest(&b2bv1.RegisterRegionRequest{
		Source:     &b2bv1.RegisterRegionRequest_HostFile{HostFile: &b2bv1.HostFile{Path: path, Offset: offset, Size: size}},
		ExportName: export,
	}, opts))
	if err != nil {
		return nil, err
	}
	return c.mapRegion(ctx, resp.GetRegion())
}

// MapHostRegion maps a host region registered through the raw API. On
// failure the region is left registered: the caller owns it.
func (c *Client) MapHostRegion(ctx context.Context, r *b2bv1.Region) (*HostRegion, error) {
	f, err := os.OpenFile(r.GetShmPath(), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("b2b client: open region %s (%s): %w", r.GetId(), r.GetShmPath(), err)
	}
	defer f.Close()
	b, err := unix.Mmap(int(f.Fd()), int64(r.GetShmOffset()), int(r.GetSize()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("b2b client: map region %s (%s): %w", r.GetId(), r.GetShmPath(), err)
	}
	return &HostRegion{Region: r, Bytes: b}, nil
}

// mapRegion maps a region this client just registered, releasing it in the
// daemon if it cannot be mapped.
func (c *Client) mapRegion(ctx context.Context, r *b2bv1.Region) (*HostRegion, error) {
	h, err := c.MapHostRegion(ctx, r)
	if err != nil {
		_, _ = c.api.DeregisterRegion(ctx, &b2bv1.DeregisterRegionRequest{RegionId: r.GetId()})
		return nil, err
	}
	return h, nil
}

// Deregister releases a region in the daemon.
func (c *Client) Deregister(ctx context.Context, regionID string) error {
	_, err := c.api.DeregisterRegion(ctx, &b2bv1.DeregisterRegionRequest{RegionId: regionID})
	return err
}

// Export sets or clears a region's export name, and sets its grants
// anew, as ExportRegion does: the export's writers (ExportTo; none: every
// peer), readers (Readers; none: no peer) and ReadOnly are opts' alone,
// not the region's earlier ones. So renaming a read-only export with
// readers keeps it so only when given ReadOnly() and Readers(...) again;
// without them the new export is writable by every peer and readable by
// none. Options other than those three (Persist) are refused.
func (c *Client) Export(ctx context.Context, regionID, name string, opts ...RegisterOption) error {
	r := registerRequest(&b2bv1.RegisterRegionRequest{}, opts)
	if r.GetPersist() {
		return status.Error(codes.InvalidArgument, "b2b client: Export takes ExportTo, Readers and ReadOnly; persist is a registration's (RegisterHost)")
	}
	_, err := c.api.ExportRegion(ctx, &b2bv1.ExportRegionRequest{RegionId: regionID, ExportName: name,
		ExportTo: r.GetExportTo(), Readers: r.GetReaders(), ReadOnly: r.GetReadOnly()})
	return err
}

// Descriptors lists blocks: block i copies Len[i] (or BlockLength) bytes from
// Src[i] to Dst[i].
type Descriptors struct {
	Src, Dst, Len []uint64
	BlockLength   uint64
}

// Transfer is one BatchTransfer.
type Transfer struct {
	SrcRegion string // local region ID
	Peer      string // destination daemon's peer address
	DstRegion string // destination export name
	Blocks    Descriptors
	Transport b2bv1.TransportKind // 0: the daemons choose (deprecated: TransportName)
	// TransportName is the data path by kind name ("tcp", "verbs",
	// "local"); empty: Transport, else the daemons' choice.
	TransportName string
	// Notification, when set, is delivered to the destination region's
	// watchers after the batch landed.
	Notification []byte
	// Op: b2bv1.TransferOp_TRANSFER_OP_READ pulls: the peer's DstRegion
	// blocks (at Blocks.Dst) are copied into SrcRegion (at Blocks.Src).
	Op b2bv1.TransferOp
}

// BatchTransfer moves the blocks and returns once all landed at the peer.
// Use ctx's deadline to bound it: the daemon answers DeadlineExceeded at it,
// once the transfer stopped (no byte of a pull lands after the answer).
// Cancelling ctx stops it through the daemon the same way (CancelCall), and
// the call returns the daemon's Canceled.
func (c *Client) BatchTransfer(ctx context.Context, t Transfer) (*b2bv1.BatchTransferResponse, error) {
	return c.api.BatchTransfer(ctx, t.request())
}

func (t Transfer) request() *b2bv1.BatchTransferRequest {
	return &b2bv1.BatchTransferRequest{
		SrcRegionId: t.SrcRegion, Peer: t.Peer, DstRegion: t.DstRegion, Transport: t.Transport, TransportName: t.TransportName, Notification: t.Notification, Op: t.Op,
		Descriptors: &b2bv1.Descriptors{
			SrcOffsets: Pack(t.Blocks.Src), DstOffsets: Pack(t.Blocks.Dst), Lengths: Pack(t.Blocks.Len),
			BlockLength: t.Blocks.BlockLength,
		},
	}
}

// Warm makes ready what the first BatchTransfer of t.Op between
// t.SrcRegion and the peer's t.DstRegion would otherwise build (the
// connection, the destination's resolution and mapping), moving no byte;
// t.Blocks and t.Notification are not sent. Call it when the peer's region
// becomes known, so that the first batch costs what the later ones do.
func (c *Client) Warm(ctx context.Context, t Transfer) (*b2bv1.WarmTransferResponse, error) {
	name, ok := transportName(t)
	if !ok {
		// InvalidArgument, as BatchTransfer refuses the same fields.
		return nil, status.Errorf(codes.InvalidArgument, "b2b client: Warm names its transport by TransportName; transport %v is not a known TransportKind, or transport_name %q disagrees with it", t.Transport, t.TransportName)
	}
	return c.api.WarmTransfer(ctx, &b2bv1.WarmTransferRequest{SrcRegionId: t.SrcRegion, Peer: t.Peer, DstRegion: t.DstRegion, Op: t.Op, TransportName: name})
}

// Checksum hashes blocks of a local region; perBlock also returns one digest
// per block.
func (c *Client) Checksum(ctx context.Context, regionID string, offsets, lengths []uint64, blockLength uint64, alg b2bv1.ChecksumAlgorithm, perBlock bool) (*b2bv1.ChecksumResponse, error) {
	return c.api.Checksum(ctx, &b2bv1.ChecksumRequest{
		RegionId: regionID, Offsets: Pack(offsets), Lengths: Pack(lengths), BlockLength: blockLength,
		Algorithm: alg, PerBlock: perBlock,
	})
}

// Status reports the daemon's transports and counters.
func (c *Client) Status(ctx context.Context) (*b2bv1.StatusResponse, error) {
	return c.api.Status(ctx, &b2bv1.StatusRequest{})
}

// Regions lists the daemon's regions.
func (c *Client) Regions(ctx context.Context) ([]*b2bv1.Region, error) {
	r, err := c.api.ListRegions(ctx, &b2bv1.ListRegionsRequest{})
	return r.GetRegions(), err
}

// Pack encodes a descriptor array as the wire's little-endian bytes, without
// copying on little-endian hosts (the bytes alias v).
func Pack(v []uint64) []byte {
	if len(v) == 0 {
		return nil
	}
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 8*len(v))
	}
	out := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(out[8*i:], x)
	}
	return out
}

// Unpack decodes little-endian uint64s (per-block digests, say).
func Unpack(b []byte) []uint64 {
	out := make([]uint64, len(b)/8)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return out
}

var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// NotifyRegion delivers note to one of the caller's regions, as a peer's
// batch would: to its watchers (sender "local"), and a key note (KeyNote)
// fires the transfers armed there on its keys (AfterNote). It returns the
// watchers that got it.
func (c *Client) NotifyRegion(ctx context.Context, regionID string, note []byte) (int, error) {
	resp, err := c.api.NotifyRegion(ctx, &b2bv1.NotifyRegionRequest{RegionId: regionID, Notification: note})
	if err != nil {
		return 0, err
	}
	return int(resp.GetDelivered()), nil
}

// Watch streams the notifications attached to batches landing in a local
// region; each arrives after its batch's bytes are in place. Cancel ctx to stop.
func (c *Client) Watch(ctx context.Context, regionID string) (b2bv1.B2B_WatchNotificationsClient, error) {
	return c.api.WatchNotifications(ctx, &b2bv1.WatchNotificationsRequest{RegionId: regionID})
}
