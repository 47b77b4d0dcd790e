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
}

// RegisterLayout registers l with the daemon; its regions are held until
// DeregisterLayout.
func (c *Client) RegisterLayout(ctx context.Context, l Layout) (*b2bv1.Layout, error) {
	req := &b2bv1.RegisterLayoutRequest{Name: l.Name, NumBlocks: l.NumBlocks, ExportName: l.Export, ExportTo: l.ExportTo}
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
	Transport                       b2bv1.TransportKind
}

// TransferBlocks runs b and returns once every byte landed.
func (c *Client) TransferBlocks(ctx context.Context, b Blocks) (*b2bv1.BatchTransferResponse, error) {
	return c.api.TransferBlocks(ctx, b.request())
}

func (b Blocks) request() *b2bv1.TransferBlocksRequest {
	return &b2bv1.TransferBlocksRequest{LocalLayout: b.LocalLayout, Peer: b.Peer, RemoteLayout: b.RemoteLayout,
		LocalIds: PackIDs(b.LocalIDs), RemoteIds: PackIDs(b.RemoteIDs), Notification: b.Notification, Transport: b.Transport}
}

// PackIDs encodes block ids as packed little-endian uint32s.
func PackIDs(ids []uint32) []byte {
	out := make([]byte, 4*len(ids))
	for i, x := range ids {
		binary.LittleEndian.PutUint32(out[4*i:], x)
	}
	return out
}
