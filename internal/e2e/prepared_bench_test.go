package e2e

import (
	"context"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/b2bd/b2bd/client"
)

// BenchmarkPrepared compares, between two b2bd processes on loopback TCP,
// one batch of 10,000 blocks of 128 B at random gapped slots sent ad hoc
// (BatchTransfer) and prepared (SubmitTransfer of one plan), next to the
// floor of an empty call (Ping) on the same socket, interleaved so that all
// three see the same machine. It reports medians:
//
//	ping_us          the empty call, client-observed
//	adhoc_us         BatchTransfer, client-observed
//	prepared_us      SubmitTransfer, client-observed
//	prepared/adhoc   their ratio (target <= 0.5)
//	nonwire_us       the daemon's own time in a submit: total_ns - wire_ns (target <= 50)
//	submit_decode_us of which receiving and unmarshalling the request
//	submit_wire_us   a submit's wire_ns
//	adhoc_nonwire_us the daemon's own time in a BatchTransfer
//	submit-wire/ping SubmitTransfer less its wire_ns, over the floor
//	submit-wire-post/ping  less its post_ns as well (TCP's payload gather, a NIC's
//	                 DMA): the submit path's own cost over the floor (target <= 1.2)
//	submit_outside_us the call less the daemon's total: gRPC both ways
//	stream_us        per submit, 64 in flight on one SubmitStream
//	raw_us           a submit on the raw submit socket (--submit-socket), client-observed
//	raw-wire_us      the same less its wire time
//	raw-wire/ping    that over the gRPC floor
//
// go test -run XXX -bench BenchmarkPrepared -benchtime 200x ./internal/e2e/
// (B2BD_BIN=path/to/b2bd e2e.test -test.run XXX -test.bench BenchmarkPrepared ...
// where there is no Go toolchain)
func BenchmarkPrepared(b *testing.B) {
	const n, size = 10000, 128
	// B2BD_BIN names a prebuilt daemon (a host without Go, e.g. a GPU host).
	bin := os.Getenv("B2BD_BIN")
	if bin == "" {
		bin = filepath.Join(b.TempDir(), "b2bd")
		cmd := exec.Command("go", "build", "-o", bin, "github.com/b2bd/b2bd/cmd/b2bd")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("build b2bd: %v\n%s", err, out)
		}
	}
	start := func(name string) (sock, peer string) {
		dir := b.TempDir()
		sock, peer = filepath.Join(dir, "b2bd.sock"), freeAddr(b)
		c := exec.Command(bin, "--node-name", name, "--socket", sock, "--shm-dir", filepath.Join(dir, "shm"),
			"--peer-listen", peer, "--data-listen", freeAddr(b), "--transport", "tcp", "--insecure", "--log-level", "warn",
			"--submit-socket", filepath.Join(dir, "submit.sock"))
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if conn, err := net.Dial("unix", sock); err == nil {
				conn.Close()
				return sock, peer
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s did not start", name)
			}
		}
	}
	sa, _ := start("a")
	sb, pb := start("b")
	ca, err := client.Dial(sa)
	if err != nil {
		b.Fatal(err)
	}
	defer ca.Close()
	cb, err := client.Dial(sb)
	if err != nil {
		b.Fatal(err)
	}
	defer cb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	r := rand.New(rand.NewPCG(1, 2))
	srcOff, srcSize := layout(n, size, r)
	dstOff, dstSize := layout(n, size, r)
	src, err := ca.RegisterHost(ctx, srcSize, "")
	if err != nil {
		b.Fatal(err)
	}
	dst, err := cb.RegisterHost(ctx, dstSize, "dst")
	if err != nil {
		b.Fatal(err)
	}
	fill(src.Bytes, func(int) byte { return byte(r.Uint32()) })
	tr := client.Transfer{SrcRegion: src.Id, Peer: pb, DstRegion: "dst", Blocks: client.Descriptors{Src: srcOff, Dst: dstOff, BlockLength: size}}
	plan, err := ca.Prepare(ctx, tr)
	if err != nil {
		b.Fatal(err)
	}
	raw, err := client.DialSubmit(filepath.Join(filepath.Dir(sa), "submit.sock"))
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	// Warm up: connections, caches, the first page faults.
	for i := 0; i < 20; i++ {
		if _, err := ca.BatchTransfer(ctx, tr); err != nil {
			b.Fatal(err)
		}
		if _, err := plan.Submit(ctx); err != nil {
			b.Fatal(err)
		}
		if err := ca.Ping(ctx); err != nil {
			b.Fatal(err)
		}
		if _, err := raw.Submit(plan); err != nil {
			b.Fatal(err)
		}
	}
	var outside, control []float64
	var ping, adhoc, prep, nonwire, overWire, adhocNonwire, decode, wire, rawT, rawOver []float64
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := ca.Ping(ctx); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		ra, err := ca.BatchTransfer(ctx, tr)
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		rp, err := plan.Submit(ctx)
		if err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		rr, err := raw.Submit(plan)
		if err != nil {
			b.Fatal(err)
		}
		t4 := time.Now()
		rawT = append(rawT, us(t4.Sub(t3)))
		rawOver = append(rawOver, us(t4.Sub(t3)-rr.Wire))
		ping = append(ping, us(t1.Sub(t0)))
		adhoc = append(adhoc, us(t2.Sub(t1)))
		prep = append(prep, us(t3.Sub(t2)))
		ph := rp.GetPhases()
		nonwire = append(nonwire, float64(ph.GetTotalNs()-ph.GetWireNs())/1e3)
		overWire = append(overWire, us(t3.Sub(t2))-float64(ph.GetWireNs())/1e3)
		decode = append(decode, float64(ph.GetDecodeNs())/1e3)
		control = append(control, us(t3.Sub(t2))-float64(ph.GetWireNs()+ph.GetPostNs())/1e3)
		outside = append(outside, us(t3.Sub(t2))-float64(ph.GetTotalNs())/1e3)
		wire = append(wire, float64(ph.GetWireNs())/1e3)
		pa := ra.GetPhases()
		adhocNonwire = append(adhocNonwire, float64(pa.GetTotalNs()-pa.GetWireNs())/1e3)
	}
	b.StopTimer()
	// Pipelined: 64 submits in flight on one stream.
	st, err := ca.OpenStream(ctx)
	if err != nil {
		b.Fatal(err)
	}
	const streamN = 640
	t0 := time.Now()
	go func() {
		for i := 0; i < streamN; i++ {
			if _, err := st.Submit(plan); err != nil {
				return
			}
		}
		st.CloseSend()
	}()
	got := 0
	for res := range st.Results() {
		if res.Err != nil {
			b.Fatal(res.Err)
		}
		got++
	}
	streamUS := us(time.Since(t0)) / streamN
	if got != streamN {
		b.Fatalf("%d stream results, want %d (%v)", got, streamN, st.Err())
	}
	if i := badBlock(src.Bytes, dst.Bytes, srcOff, dstOff, size); i >= 0 {
		b.Fatalf("block %d differs", i)
	}
	med := func(v []float64) float64 { v = slices.Clone(v); slices.Sort(v); return v[len(v)/2] }
	b.ReportMetric(med(ping), "ping_us")
	b.ReportMetric(med(adhoc), "adhoc_us")
	b.ReportMetric(med(prep), "prepared_us")
	b.ReportMetric(med(prep)/med(adhoc), "prepared/adhoc")
	b.ReportMetric(med(nonwire), "nonwire_us")
	b.ReportMetric(med(adhocNonwire), "adhoc_nonwire_us")
	b.ReportMetric(med(decode), "submit_decode_us")
	b.ReportMetric(med(outside), "submit_outside_us")
	b.ReportMetric(med(wire), "submit_wire_us")
	b.ReportMetric(med(overWire)/med(ping), "submit-wire/ping")
	b.ReportMetric(med(control)/med(ping), "submit-wire-post/ping")
	b.ReportMetric(streamUS, "stream_us")
	b.ReportMetric(med(rawT), "raw_us")
	b.ReportMetric(med(rawOver), "raw-wire_us")
	b.ReportMetric(med(rawOver)/med(ping), "raw-wire/ping")
	b.ReportMetric(0, "ns/op")
}

func freeAddr(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
