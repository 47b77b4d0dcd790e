// Command gobench is the Go side of client/python/bench_vs_go.py's prepared
// comparison: against two running daemons it times, with the Go client and
// the same layout rules as the Python side (10,000 x 128 B at random slots
// of block + min(block, 4096) bytes), a prepared SubmitTransfer, an ad hoc
// BatchTransfer and an empty Ping, verifies the last submit's blocks by
// both daemons' per-block checksums, and prints one JSON object.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/b2bd/b2bd/client"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

type summary struct {
	MedianUS float64 `json:"median_us"`
	P10US    float64 `json:"p10_us"`
	P90US    float64 `json:"p90_us"`
	MinUS    float64 `json:"min_us"`
}

func summarize(d []time.Duration) summary {
	s := slices.Clone(d)
	slices.Sort(s)
	us := func(q float64) float64 { return float64(s[int(q*float64(len(s)-1)+0.5)]) / 1e3 }
	return summary{MedianUS: us(0.5), P10US: us(0.1), P90US: us(0.9), MinUS: us(0)}
}

type report struct {
	Blocks    int     `json:"blocks"`
	BlockSize int     `json:"block_size"`
	Iters     int     `json:"iters"`
	Verified  bool    `json:"verified"`
	Submit    summary `json:"submit"`
	Adhoc     summary `json:"adhoc"`
	Ping      summary `json:"ping"`
	// The daemon's own time for a submit (PhaseTimings.total_ns), median.
	SubmitDaemonUS float64 `json:"submit_daemon_us"`
}

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "gobench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	srcAPI := flag.String("src-api", "", "source daemon's local API socket")
	dstAPI := flag.String("dst-api", "", "destination daemon's local API socket")
	peer := flag.String("dst-peer", "", "destination daemon's peer address")
	n := flag.Int("blocks", 10000, "blocks per batch")
	bs := flag.Int("block-size", 128, "bytes per block")
	iters := flag.Int("iters", 50, "timed calls of each kind")
	warmup := flag.Int("warmup", 5, "untimed calls first")
	seed := flag.Uint64("seed", 1, "layout seed")
	flag.Parse()
	if *srcAPI == "" || *dstAPI == "" || *peer == "" || *n <= 0 || *bs <= 0 || *iters <= 0 {
		return errors.New("need --src-api, --dst-api, --dst-peer and positive --blocks, --block-size, --iters")
	}
	a, err := client.Dial(*srcAPI)
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := client.Dial(*dstAPI)
	if err != nil {
		return err
	}
	defer b.Close()
	slot := uint64(*bs + min(*bs, 4096))
	size := uint64(*n) * slot
	r := rand.New(rand.NewPCG(*seed, 2))
	layout := func() []uint64 {
		o := make([]uint64, *n)
		for i, p := range r.Perm(*n) {
			o[i] = uint64(p) * slot
		}
		return o
	}
	so, do := layout(), layout()
	name := fmt.Sprintf("gobench-%d", os.Getpid())
	src, err := a.RegisterHost(ctx, size, "")
	if err != nil {
		return err
	}
	defer a.Deregister(context.Background(), src.Id)
	defer src.Unmap()
	dst, err := b.RegisterHost(ctx, size, name)
	if err != nil {
		return err
	}
	defer b.Deregister(context.Background(), dst.Id)
	defer dst.Unmap()
	for i := range src.Bytes {
		src.Bytes[i] = byte(r.Uint32())
	}
	t := client.Transfer{SrcRegion: src.Id, Peer: *peer, DstRegion: name, Transport: b2bv1.TransportKind_TRANSPORT_KIND_TCP,
		Blocks: client.Descriptors{Src: so, Dst: do, BlockLength: uint64(*bs)}}
	plan, err := a.Prepare(ctx, t)
	if err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	defer plan.Release(context.Background())
	// Every call with a deadline, as the Python side's timeout=60.
	call := func(f func(context.Context) error) (time.Duration, error) {
		c, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		t0 := time.Now()
		err := f(c)
		return time.Since(t0), err
	}
	var daemonNS []time.Duration
	submit := func(c context.Context) error {
		resp, err := plan.Submit(c)
		if err == nil {
			daemonNS = append(daemonNS, time.Duration(resp.GetPhases().GetTotalNs()))
		}
		return err
	}
	adhoc := func(c context.Context) error { _, err := a.BatchTransfer(c, t); return err }
	ping := func(c context.Context) error { return a.Ping(c) }
	for range *warmup {
		for _, f := range []func(context.Context) error{submit, adhoc, ping} {
			if _, err := call(f); err != nil {
				return err
			}
		}
	}
	daemonNS = daemonNS[:0]
	var ds, da, dp []time.Duration
	for range *iters { // interleaved, so that load changes hit all three alike
		for _, x := range []struct {
			f   func(context.Context) error
			out *[]time.Duration
		}{{submit, &ds}, {adhoc, &da}, {ping, &dp}} {
			d, err := call(x.f)
			if err != nil {
				return err
			}
			*x.out = append(*x.out, d)
		}
	}
	// Verify the last submit: new bytes, one more submit, per-block checksums.
	for i := range src.Bytes {
		src.Bytes[i] = byte(r.Uint32())
	}
	if _, err := call(submit); err != nil {
		return err
	}
	cs, err := a.Checksum(ctx, src.Id, so, nil, uint64(*bs), b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, true)
	if err != nil {
		return err
	}
	cd, err := b.Checksum(ctx, dst.Id, do, nil, uint64(*bs), b2bv1.ChecksumAlgorithm_CHECKSUM_ALGORITHM_CRC32C, true)
	if err != nil {
		return err
	}
	rep := report{Blocks: *n, BlockSize: *bs, Iters: *iters,
		Verified: len(cs.GetBlockDigests()) == 8**n && string(cs.GetBlockDigests()) == string(cd.GetBlockDigests()),
		Submit:   summarize(ds), Adhoc: summarize(da), Ping: summarize(dp),
		SubmitDaemonUS: summarize(daemonNS).MedianUS}
	return json.NewEncoder(os.Stdout).Encode(rep)
}
