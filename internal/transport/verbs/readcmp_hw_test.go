package verbs

// The READ half of the Soft-RoCE comparison (deploy/rdma-testbed/
// test-rdma-vm.sh), driving Conn.Read directly until b2b-bench pulls
// through the daemons (--op read, the daemons' control plane): VM A runs
// TestHWReadSource for the whole comparison, VM B runs TestHWReadSink once
// per (size, round), between its ib_read_bw runs of the same round.
//
//	A: B2B_READ_SOURCE=1 B2B_RDMA_DEV=rxe0 [B2B_READ_REGION=bytes]
//	B: B2B_READ_SINK=1 B2B_RDMA_DEV=rxe0 B2B_PEER_IP=A B2B_READ_SIZE=bytes
//	   B2B_READ_BLOCKS=n B2B_READ_ITERS=k B2B_READ_JSON=path
//	   [B2B_READ_CONFIG="qps=4,..." as B2B_PAIR_CONFIGS' entries]
//
// The source fills its region once from readSeed and hands out its read
// key (KeyFor(AccessRead)); each batch of the sink reads n blocks of the
// size from random slots into random slots (a new layout per batch) and
// is verified block by block against the same fill. The JSON is the
// median batch's GB/s, as b2b-bench reports a mode.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/transport"
)

const (
	readPort = "18601"
	readSeed = 2424
)

// readResult is one TestHWReadSink run, as test-rdma.sh reads it.
type readResult struct {
	Op         string    `json:"op"`
	BlockBytes uint64    `json:"block_bytes"`
	Blocks     int       `json:"blocks"`
	GBps       float64   `json:"gbps"` // the median batch
	Batches    []float64 `json:"batches_gbps"`
	Verified   bool      `json:"verified"`
	Error      string    `json:"error,omitempty"`
}

func TestHWReadSource(t *testing.T) {
	dev := os.Getenv("B2B_RDMA_DEV")
	if os.Getenv("B2B_READ_SOURCE") != "1" || dev == "" {
		t.Skip("B2B_READ_SOURCE=1 and B2B_RDMA_DEV not set: not the READ comparison's source VM")
	}
	region := uint64(envInt("B2B_READ_REGION", 32<<20))
	log := hclog.New(&hclog.LoggerOptions{Name: "verbs", Level: hclog.Warn, Output: os.Stderr})
	cfg := DefaultConfig()
	cfg.Device = dev
	tr, err := New(cfg, &inbound{unpin: func() {}}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	sm := mmapHost(t, int(region))
	pairFill(readSeed, sm.Host)
	reg, err := tr.Register(sm)
	if err != nil {
		t.Fatal(err)
	}
	key, err := reg.KeyFor(transport.AccessRead)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("source: %s; %d bytes, read key %#x", tr.Describe(), region, key.Key)
	ln, err := net.Listen("tcp", ":"+readPort)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for served := 0; ; served++ {
		// Bounded: the comparison asks at least once an hour.
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(time.Hour))
		c, err := ln.Accept()
		if err != nil {
			t.Fatalf("after %d sinks: %v", served, err)
		}
		if stop := readServe(t, tr, c, key, region); stop {
			t.Logf("source: served %d sinks", served+1)
			return
		}
	}
}

// readServe answers one sink: hello, its connect signals, then "bye" (the
// sink is done) or "done" (the comparison is: stop serving).
func readServe(t *testing.T, tr *Transport, c net.Conn, key transport.RemoteKey, region uint64) (stop bool) {
	defer c.Close()
	rd, enc := json.NewDecoder(bufio.NewReader(c)), json.NewEncoder(c)
	if err := enc.Encode(pairMsg{Op: "hello", Key: key.Key, Addr: key.Addr, DstSize: region}); err != nil {
		t.Logf("source: hello: %v", err)
		return false
	}
	for {
		var m pairMsg
		if err := rd.Decode(&m); err != nil {
			return false // the sink went away; the next one may come
		}
		reply := pairMsg{Op: m.Op}
		switch m.Op {
		case "signal":
			resp, err := tr.HandleSignal(context.Background(), m.Payload)
			if err != nil {
				reply.Err = err.Error()
			} else {
				reply.Payload = resp
			}
		case "bye", "done":
			enc.Encode(reply)
			return m.Op == "done"
		}
		if err := enc.Encode(reply); err != nil {
			return false
		}
	}
}

func TestHWReadSink(t *testing.T) {
	dev, peerIP := os.Getenv("B2B_RDMA_DEV"), os.Getenv("B2B_PEER_IP")
	out := os.Getenv("B2B_READ_JSON")
	if os.Getenv("B2B_READ_SINK") != "1" || dev == "" || peerIP == "" || out == "" {
		t.Skip("B2B_READ_SINK=1, B2B_RDMA_DEV, B2B_PEER_IP and B2B_READ_JSON not all set: not the READ comparison's sink VM")
	}
	size := uint64(envInt("B2B_READ_SIZE", 4096))
	res := readResult{Op: "read", BlockBytes: size, Blocks: envInt("B2B_READ_BLOCKS", 1000)}
	err := readSink(t, dev, peerIP, &res)
	if err != nil {
		res.Error, res.Verified = err.Error(), false
	}
	b, _ := json.Marshal(res)
	if werr := os.WriteFile(out, append(b, '\n'), 0o644); werr != nil {
		t.Fatal(werr)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("READ %d x %d B: median %.4f GB/s of %v", res.Blocks, size, res.GBps, res.Batches)
}

func readSink(t *testing.T, dev, peerIP string, res *readResult) error {
	if os.Getenv("B2B_READ_DONE") == "1" { // tells the source the comparison is over
		sc, c, err := dialSide(peerIP, readPort)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = sc.call(pairMsg{Op: "done"})
		return err
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "verbs", Level: hclog.Warn, Output: os.Stderr})
	cfg, err := parsePairConfig(envOr("B2B_READ_CONFIG", ""), dev)
	if err != nil {
		return err
	}
	sc, c, err := dialSide(peerIP, readPort)
	if err != nil {
		return err
	}
	defer c.Close()
	defer sc.call(pairMsg{Op: "bye"})
	var hello pairMsg
	if err := sc.rd.Decode(&hello); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	region := hello.DstSize
	remote := transport.RemoteRegion{Name: "read-source", Size: region, Key: transport.RemoteKey{Key: hello.Key, Addr: hello.Addr}}
	size, n := res.BlockBytes, res.Blocks
	if size == 0 || uint64(n)*size > region {
		return fmt.Errorf("%d blocks of %d B do not fit the source's %d-byte region", n, size, region)
	}
	tr, err := New(cfg, nil, log)
	if err != nil {
		return err
	}
	defer tr.Close()
	dm := mmapHost(t, int(region))
	expect := make([]byte, region)
	pairFill(readSeed, expect)
	dst, err := tr.Register(dm)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	conn, err := tr.Connect(ctx, transport.Peer{Address: peerIP, Signal: sc.signal})
	if err != nil {
		return err
	}
	defer conn.Close()
	rd := conn
	iters := envInt("B2B_READ_ITERS", 3)
	for it := 0; it <= iters; it++ { // batch 0 warms up, untimed
		b := pairLayout(int64(readSeed+it), size, n, region)
		clear(dm.Host)
		start := time.Now()
		if _, err := transport.Read(ctx, rd, dst, remote, b); err != nil {
			return fmt.Errorf("batch %d: %w", it, err)
		}
		el := time.Since(start)
		for i := range b.Src {
			s, d, l := b.Src[i], b.Dst[i], b.Len[i]
			if xxhash.Sum64(expect[s:s+l]) != xxhash.Sum64(dm.Host[d:d+l]) {
				return fmt.Errorf("batch %d block %d (remote %d, local %d, %d B): checksum mismatch", it, i, s, d, l)
			}
		}
		if it > 0 {
			res.Batches = append(res.Batches, float64(uint64(n)*size)/el.Seconds()/1e9)
		}
	}
	sorted := slices.Clone(res.Batches)
	slices.Sort(sorted)
	res.GBps, res.Verified = sorted[len(sorted)/2], true
	return nil
}

// dialSide connects to a side channel at peerIP:port, retrying while the
// peer starts (at most 120 s).
func dialSide(peerIP, port string) (*sideChannel, net.Conn, error) {
	deadline := time.Now().Add(120 * time.Second)
	for {
		c, err := net.Dial("tcp", net.JoinHostPort(peerIP, port))
		if err == nil {
			return &sideChannel{rd: json.NewDecoder(bufio.NewReader(c)), enc: json.NewEncoder(c)}, c, nil
		}
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("side channel %s:%s never answered: %w", peerIP, port, err)
		}
		time.Sleep(300 * time.Millisecond)
	}
}
