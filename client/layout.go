package client

import (
	"context"
	"encoding/binary"

	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// Segment is one strided array of blocks in a region: block b is the
// BlockLen bytes at Offset + b*Stride of region RegionID.
type Segment struct {
	RegionID                 string
	Offset, BlockLen, Stride uint64
}

// Layout describes a block table to register (docs/kv.md).
type Layout struct {
	Name      string
	Segments  []Segment
	NumBlocks uint64
	Export    string   // "": not exported
	ExportTo  []string // peer identities; empty: every peer
	// Persist keeps the layout after this client is gone (see Persist for
	// regions); without it the daemon deregisters it then.
	Persist  bool
	Readers  []string // peers that may read it; "*": every peer; empty: none
	ReadOnly bool     // no peer may write it
}

// RegisterLayout registers l with the daemon; its regions are held until
// DeregisterLayout.
func (c *Client) RegisterLayout(ctx context.Context, l Layout) (*b2bv1.Layout, error) {
	req := &b2bv1.RegisterLayoutRequest{Name: l.Name, NumBlocks: l.NumBlocks, ExportName: l.Export, ExportTo: l.ExportTo, Readers: l.Readers, ReadOnly: l.ReadOnly, Persist: l.Persist}
	for _, s := range l.Segments {
		req.Segments = append(req.Segments, &b2bv1.LayoutSegment{RegionId: s.RegionID, Offset: s.Offset, BlockLen: s.BlockLen, Stride: s.Stride})
	}
	resp, err := c.api.RegisterLayout(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.GetLayout(), nil
}

// DeregisterLayout releases a layout.
func (c *Client) DeregisterLayout(ctx context.Context, name string) error {
	_, err := c.api.DeregisterLayout(ctx, &b2bv1.DeregisterLayoutRequest{Name: name})
	return err
}

// Blocks is one TransferBlocks request: block LocalIDs[i] of every
// segment of LocalLayout goes to block RemoteIDs[i] of the peer's
// RemoteLayout.
type Blocks struct {
	LocalLayout, Peer, RemoteLayout string
	LocalIDs, RemoteIDs             []uint32
	Notification                    []byte
	Transport                       b2bv1.TransportKind // deprecated: TransportName
	TransportName                   string              // by kind name; empty: Transport, else the daemons' choice
	// Op READ pulls: block RemoteIDs[i] of the peer's layout into block
	// LocalIDs[i] (LocalIDs unique, RemoteIDs may repeat).
	Op b2bv1.TransferOp
}

// TransferBlocks runs b and returns once every byte landed.
func (c *Client) TransferBlocks(ctx context.Context, b Blocks) (*b2bv1.BatchTransferResponse, error) {
	return c.api.TransferBlocks(ctx, b.request())
}

func (b Blocks) request() *b2bv1.TransferBlocksRequest {
	return &b2bv1.TransferBlocksRequest{LocalLayout: b.LocalLayout, Peer: b.Peer, RemoteLayout: b.RemoteLayout,
		LocalIds: PackIDs(b.LocalIDs), RemoteIds: PackIDs(b.RemoteIDs), Notification: b.Notification, Transport: b.Transport, TransportName: b.TransportName, Op: b.Op}
}

// PackIDs encodes block ids as packed little-endian uint32s.
func PackIDs(ids []uint32) []byte {
	out := make([]byte, 4*len(ids))
	for i, x := range ids {
		binary.LittleEndian.PutUint32(out[4*i:], x)
	}
	return out
}

// ListLayouts lists this caller's layouts.
func (c *Client) ListLayouts(ctx context.Context) ([]*b2bv1.Layout, error) {
	resp, err := c.api.ListLayouts(ctx, &b2bv1.ListLayoutsRequest{})
	if err != nil {
		return nil, err
	}
	return resp.GetLayouts(), nil
}
