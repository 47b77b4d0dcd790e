package e2e

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/daemon"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// waitCalibration polls n's Status until its calibration left
// "measuring", and returns it.
func waitCalibration(ctx context.Context, t *testing.T, n *node) *b2bv1.Calibration {
	t.Helper()
	for {
		st, err := n.c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c := st.GetCalibration(); c != nil && c.GetState() != "measuring" {
			return c
		}
		select {
		case <-ctx.Done():
			t.Fatalf("calibration still measuring: %v", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestAutoFollowsCalibration: a daemon started with --calibrate start
// measures host→host over local and tcp at four block sizes, leaves none
// of its scratch regions behind and keeps the result in
// --calibration-file; a later start reads it back ("cached"). With the
// file's figures changed so that tcp is faster at 128 B and local at
// 64 KiB, auto sends a same-host peer's 128 B batches (ad hoc, block ids,
// pulls) over tcp and its 64 KiB ones over local, and every block lands.
func TestAutoFollowsCalibration(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	file := filepath.Join(t.TempDir(), "calibration.json")
	calibrated := func(c *daemon.Config) {
		c.Transport, c.Calibrate, c.CalibrationFile = "auto", "start", file
	}
	a := startNode(t, "a", calibrated)
	cal := waitCalibration(ctx, t, a)
	if cal.GetState() != "done" || len(cal.GetRows()) != 4 {
		t.Fatalf("calibration %v: want done with 4 host→host rows", cal)
	}
	for _, r := range cal.GetRows() {
		if r.GetMedianNs()["local"] == 0 || r.GetMedianNs()["tcp"] == 0 || r.GetChosen() == "" || r.GetWhy() == "" {
			t.Fatalf("row %v: want both kinds timed, a choice and why", r)
		}
	}
	if st, err := a.c.Status(ctx); err != nil || st.GetRegions() != 0 {
		t.Fatalf("after calibrating: %d regions (%v), want none left", st.GetRegions(), err)
	}
	a.stop(t)

	// Rewrite the kept figures: tcp 3× faster at 128 B, local at 64 KiB.
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	// Only the rows' medians change; every other field is kept as read.
	var kept map[string]json.RawMessage
	var rows []map[string]json.RawMessage
	if err := json.Unmarshal(b, &kept); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(kept["rows"], &rows); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		var block uint64
		if err := json.Unmarshal(r["block_bytes"], &block); err != nil {
			t.Fatal(err)
		}
		med := map[string]int64{"local": 1e6, "tcp": 3e6}
		if block <= 4096 {
			med = map[string]int64{"local": 3e6, "tcp": 1e6}
		}
		if r["median_ns"], err = json.Marshal(med); err != nil {
			t.Fatal(err)
		}
	}
	if kept["rows"], err = json.Marshal(rows); err != nil {
		t.Fatal(err)
	}
	if b, err = json.Marshal(kept); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}

	a = startNode(t, "a2", calibrated)
	peer := startNode(t, "b", autoTransport)
	if cal := waitCalibration(ctx, t, a); cal.GetState() != "cached" || cal.GetRows()[0].GetChosen() != "tcp" {
		t.Fatalf("restart: calibration %v, want cached with tcp at 128 B", cal)
	}
	r := rand.New(rand.NewPCG(7, 8))
	for _, c := range []struct {
		size uint64
		n    int
		want string
	}{{128, 10000, "tcp"}, {256, 4000, "tcp"}, {65536, 200, "local"}, {1 << 20, 8, "local"}} {
		srcOff, srcSize := layout(c.n, c.size, r)
		dstOff, dstSize := layout(c.n, c.size, r)
		src, dst := registerPair(ctx, t, a.c, peer.c, srcSize, dstSize, "dst")
		fill(src.Bytes, func(int) byte { return byte(r.Uint32()) })
		resp, err := transfer(ctx, a.c, src.Id, peer.d.PeerAddr(), "dst", srcOff, dstOff, c.size)
		if err != nil {
			t.Fatalf("%d B: %v", c.size, err)
		}
		if resp.GetTransportName() != c.want {
			t.Fatalf("%d B: auto went over %s, want %s (the calibration's choice)", c.size, resp.GetTransportName(), c.want)
		}
		sameBlocks(ctx, t, a.c, peer.c, src, dst, srcOff, dstOff, c.size)
		release(ctx, t, a.c, src)
		release(ctx, t, peer.c, dst)
	}

	// A pull: the route runs from the peer's region to ours.
	remote, err := peer.c.RegisterHost(ctx, 1<<20, "pulled", client.Readers("*"))
	if err != nil {
		t.Fatal(err)
	}
	local, err := a.c.RegisterHost(ctx, 1<<20, "")
	if err != nil {
		t.Fatal(err)
	}
	fill(remote.Bytes, func(i int) byte { return byte(i * 7) })
	offs := strided(2000, 256)
	resp, err := a.c.BatchTransfer(ctx, client.Transfer{SrcRegion: local.Id, Peer: peer.d.PeerAddr(), DstRegion: "pulled",
		Blocks: client.Descriptors{Src: offs, Dst: offs, BlockLength: 128}, Op: b2bv1.TransferOp_TRANSFER_OP_READ})
	if err != nil || resp.GetTransportName() != "tcp" {
		t.Fatalf("pull of 128 B blocks: %v over %q, want tcp", err, resp.GetTransportName())
	}
	sameBlocks(ctx, t, peer.c, a.c, remote, local, offs, offs, 128)

	// Block ids: 4 KiB blocks take the 4 KiB row (tcp).
	src := registerKV(ctx, t, a.c, "", false, "src", "", func(i int) byte { return byte(i * 13) })
	dstKV := registerKV(ctx, t, peer.c, "kv", true, "dst", "kvdst", func(int) byte { return kvUntouch })
	srcIDs, dstIDs := kvIDs(r, 64)
	resp, err = a.c.TransferBlocks(ctx, client.Blocks{LocalLayout: "src", Peer: peer.d.PeerAddr(), RemoteLayout: "kvdst", LocalIDs: srcIDs, RemoteIDs: dstIDs})
	if err != nil || resp.GetTransportName() != "tcp" {
		t.Fatalf("block ids of 4 KiB: %v over %q, want tcp", err, resp.GetTransportName())
	}
	checkKV(t, src, dstKV, srcIDs, dstIDs)
}

// TestCalibrationOffGoesByRank: --calibrate off leaves auto to the
// ranking (local on one host) and says so in Status.
func TestCalibrationOffGoesByRank(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, b := startNode(t, "a", autoTransport), startNode(t, "b", autoTransport)
	st, err := a.c.Status(ctx)
	if err != nil || st.GetCalibration().GetState() != "off" {
		t.Fatalf("status %v, %v: want calibration off", st.GetCalibration(), err)
	}
	src, dst := registerPair(ctx, t, a.c, b.c, 1<<20, 1<<20, "dst")
	offs := strided(1000, 512)
	resp, err := transfer(ctx, a.c, src.Id, b.d.PeerAddr(), "dst", offs, offs, 128)
	if err != nil || resp.GetTransportName() != "local" {
		t.Fatalf("%v over %q, want local by rank", err, resp.GetTransportName())
	}
	sameBlocks(ctx, t, a.c, b.c, src, dst, offs, offs, 128)
}
