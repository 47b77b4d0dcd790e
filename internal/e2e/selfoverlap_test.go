package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/daemon"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// TestSelfOverlapRefused: a batch from a daemon to itself whose source and
// destination overlap in one memory (a region into its own export, or two
// registrations of one file) is refused InvalidArgument naming both
// blocks, over tcp and local, push and pull, and changes no byte (the
// same-host path used to copy it forward and answer OK over wrong bytes).
// The same batch without the overlap lands every byte.
func TestSelfOverlapRefused(t *testing.T) {
	var shm string
	n := startNode(t, "self", func(c *daemon.Config) { c.Transport = "auto"; shm = c.ShmDir })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const size = 1 << 20
	r, err := n.c.RegisterHost(ctx, size, "self", client.Readers("*"))
	if err != nil {
		t.Fatal(err)
	}
	// One client file registered twice: "alias" starts 64 KiB into it.
	file := filepath.Join(shm, "client-file.bin")
	if err := os.WriteFile(file, make([]byte, 2*size), 0o600); err != nil {
		t.Fatal(err)
	}
	f1, err := n.c.ImportHostFile(ctx, file, 0, size, "")
	if err != nil {
		t.Fatal(err)
	}
	f2, err := n.c.ImportHostFile(ctx, file, 64<<10, size, "alias", client.Readers("*"))
	if err != nil {
		t.Fatal(err)
	}
	pattern := func(b []byte) {
		for i := range b {
			b[i] = byte(i*7 + i/251)
		}
	}
	type tc struct {
		name     string
		src      *client.HostRegion
		dst      string
		srcOff   []uint64
		dstOff   []uint64
		overlaps bool
	}
	const blk = 16 << 10
	cases := []tc{
		{"region into its own export, forward by 1000", r, "self", []uint64{0}, []uint64{1000}, true},
		{"region into its own export, one block over another's", r, "self", []uint64{0, 3 * blk}, []uint64{8 * blk, 3*blk + 8}, true},
		{"region into its own export, apart", r, "self", []uint64{0, blk}, []uint64{4 * blk, 6 * blk}, false},
		// f1 offset x is the file's byte x; alias offset y is byte 64 KiB + y.
		{"one file twice, overlapping", f1, "alias", []uint64{64<<10 + 4096}, []uint64{0}, true},
		{"one file twice, apart", f1, "alias", []uint64{0}, []uint64{128 << 10}, false},
	}
	for _, c := range cases {
		for _, tr := range []string{"tcp", "local"} {
			for _, op := range []b2bv1.TransferOp{b2bv1.TransferOp_TRANSFER_OP_WRITE, b2bv1.TransferOp_TRANSFER_OP_READ} {
				pattern(c.src.Bytes)
				if c.src == f1 {
					pattern(f2.Bytes[size-(64<<10):]) // the file's tail past f1
				}
				before := append([]byte(nil), c.src.Bytes...)
				_, err = n.c.BatchTransfer(ctx, client.Transfer{SrcRegion: c.src.Id, Peer: n.d.PeerAddr(), DstRegion: c.dst,
					Blocks: client.Descriptors{Src: c.srcOff, Dst: c.dstOff, BlockLength: blk}, TransportName: tr, Op: op})
				what := c.name + " over " + tr + " " + op.String()
				if c.overlaps {
					if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "overlaps") || !strings.Contains(err.Error(), "same memory") {
						t.Fatalf("%s: %v, want InvalidArgument naming the overlap", what, err)
					}
					if !bytes.Equal(c.src.Bytes, before) {
						t.Fatalf("%s: refused, yet bytes changed", what)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				// Where the bytes went: the source (pushed) or destination
				// (pulled) side's view of the moved blocks.
				dstView := r.Bytes
				if c.dst == "alias" {
					dstView = f2.Bytes
				}
				for i := range c.srcOff {
					from, to := before[c.srcOff[i]:c.srcOff[i]+blk], dstView[c.dstOff[i]:c.dstOff[i]+blk]
					if op == b2bv1.TransferOp_TRANSFER_OP_READ {
						from, to = c.src.Bytes[c.srcOff[i]:c.srcOff[i]+blk], dstView[c.dstOff[i]:c.dstOff[i]+blk]
					}
					if !bytes.Equal(from, to) {
						t.Fatalf("%s: block %d differs", what, i)
					}
				}
			}
		}
	}
}

// TestSelfOverlapPlanRefused: a prepared plan of the same overlapping
// batch is refused at PrepareTransfer, before any submit.
func TestSelfOverlapPlanRefused(t *testing.T) {
	n := startNode(t, "self", func(c *daemon.Config) { c.Transport = "auto" })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := n.c.RegisterHost(ctx, 1<<20, "self")
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range []string{"tcp", "local"} {
		_, err := n.c.Prepare(ctx, client.Transfer{SrcRegion: r.Id, Peer: n.d.PeerAddr(), DstRegion: "self",
			Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{4096}, BlockLength: 8192}, TransportName: tr})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "overlaps") {
			t.Fatalf("prepare over %s: %v, want InvalidArgument naming the overlap", tr, err)
		}
	}
}

// TestSelfOverlapBlocksRefused: a block-id transfer from a layout into its
// own export whose entries move a block onto another's place (a swap) or
// onto itself is refused naming the entries, over tcp and local, push and
// pull; disjoint blocks land.
func TestSelfOverlapBlocksRefused(t *testing.T) {
	n := startNode(t, "self", func(c *daemon.Config) { c.Transport = "auto" })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const blk, nb = 4096, 8
	r, err := n.c.RegisterHost(ctx, blk*nb, "selfkv", client.Readers("*"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.c.RegisterLayout(ctx, client.Layout{Name: "selfkv", Export: "selfkv", Readers: []string{"*"}, NumBlocks: nb,
		Segments: []client.Segment{{RegionID: r.Id, BlockLen: blk, Stride: blk}}}); err != nil {
		t.Fatal(err)
	}
	for _, tr := range []string{"tcp", "local"} {
		for _, op := range []b2bv1.TransferOp{b2bv1.TransferOp_TRANSFER_OP_WRITE, b2bv1.TransferOp_TRANSFER_OP_READ} {
			for _, c := range []struct {
				name          string
				local, remote []uint32
				overlaps      bool
			}{
				{"a swap", []uint32{0, 1}, []uint32{1, 0}, true},
				{"a block onto itself", []uint32{3}, []uint32{3}, true},
				{"a shift by one", []uint32{4, 5}, []uint32{5, 6}, true},
				{"apart", []uint32{0, 1}, []uint32{6, 7}, false},
			} {
				what := c.name + " over " + tr + " " + op.String()
				for i := range r.Bytes {
					r.Bytes[i] = byte(i / blk)
				}
				before := append([]byte(nil), r.Bytes...)
				_, err := n.c.TransferBlocks(ctx, client.Blocks{LocalLayout: "selfkv", Peer: n.d.PeerAddr(), RemoteLayout: "selfkv",
					LocalIDs: c.local, RemoteIDs: c.remote, TransportName: tr, Op: op})
				if c.overlaps {
					if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "same memory") {
						t.Fatalf("%s: %v, want InvalidArgument naming the overlap", what, err)
					}
					if !bytes.Equal(r.Bytes, before) {
						t.Fatalf("%s: refused, yet bytes changed", what)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				for i := range c.local {
					from, to := c.local[i], c.remote[i]
					if op == b2bv1.TransferOp_TRANSFER_OP_READ {
						from, to = to, from
					}
					if !bytes.Equal(r.Bytes[to*blk:(to+1)*blk], before[from*blk:(from+1)*blk]) {
						t.Fatalf("%s: block %d did not land as block %d", what, from, to)
					}
				}
			}
		}
	}
}
