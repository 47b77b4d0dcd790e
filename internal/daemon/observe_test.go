package daemon_test

import (
	"bytes"
	"context"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/daemon"
)

// testNode is one daemon in this process with its metrics and health ports.
type testNode struct {
	d      *daemon.Daemon
	c      *client.Client
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func startNode(t *testing.T, name string, mutate ...func(*daemon.Config)) *testNode {
	t.Helper()
	dir := t.TempDir()
	cfg := daemon.Config{
		NodeName: name, Socket: filepath.Join(dir, "b2bd.sock"), SocketMode: "0660",
		PeerListen: "127.0.0.1:0", ShmDir: filepath.Join(dir, "shm"), Transport: "tcp",
		DefaultTimeout: 20 * time.Second, ShutdownGrace: 10 * time.Second, MaxDescriptors: 1 << 20, Insecure: true,
		MetricsListen: "127.0.0.1:0", HealthListen: "127.0.0.1:0",
	}
	cfg.KindFlags = map[string]string{"data-listen": "127.0.0.1:0"}
	for _, m := range mutate {
		m(&cfg)
	}
	d, err := daemon.New(cfg, hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Warn, Output: os.Stderr}))
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &testNode{d: d, cancel: cancel, done: make(chan error, 1)}
	go func() { n.done <- d.Serve(ctx) }()
	if n.c, err = client.Dial(d.APIAddr()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.stop(t) })
	return n
}

func (n *testNode) stop(t *testing.T) {
	n.once.Do(func() { n.stopOnce(t) })
}

func (n *testNode) stopOnce(t *testing.T) {
	n.c.Close()
	n.cancel()
	select {
	case err := <-n.done:
		if err != nil {
			t.Errorf("daemon exit: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("daemon did not stop")
	}
}

// scrape fetches and parses http://addr/metrics.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s: %s", resp.Status, body)
	}
	if os.Getenv("B2BD_METRICS_DUMP") != "" {
		t.Logf("GET http://%s/metrics:\n%s", addr, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value is the value of the series of family name with exactly labels
// (name=value pairs), and whether it exists; histograms give their count.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(want) {
			continue
		}
		for _, l := range m.GetLabel() {
			if v, ok := want[l.GetName()]; !ok || v != l.GetValue() {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

type want struct {
	name   string
	labels []string
	value  float64
}

func check(t *testing.T, who string, fams map[string]*dto.MetricFamily, ws []want) {
	t.Helper()
	for _, w := range ws {
		got, ok := value(fams, w.name, w.labels...)
		switch {
		case !ok:
			t.Errorf("%s: %s%v: no such series", who, w.name, w.labels)
		case got != w.value:
			t.Errorf("%s: %s%v = %v, want %v", who, w.name, w.labels, got, w.value)
		}
	}
}

// TestMetricsAfterTransfers: three verified batches of 100 blocks of 4 KiB
// and one that fails (unknown destination), then six prepared submits (two
// unary, three on a SubmitStream, one on the raw submit socket) and one that
// fails (unknown plan) leave exact counts in both daemons' /metrics.
func TestMetricsAfterTransfers(t *testing.T) {
	submitSock := filepath.Join(t.TempDir(), "submit.sock")
	a := startNode(t, "a", func(c *daemon.Config) { c.SubmitSocket = submitSock })
	b := startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const blocks, size = 100, 4096
	srcSize, dstSize := uint64(blocks*2*size), uint64(3*blocks*2*size)
	src, err := a.c.RegisterHost(ctx, srcSize, "")
	if err != nil {
		t.Fatal(err)
	}
	dst, err := b.c.RegisterHost(ctx, dstSize, "kv")
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range src.Bytes {
		src.Bytes[i] = byte(r.Uint32())
	}
	srcOff := make([]uint64, blocks)
	for i := range srcOff {
		srcOff[i] = uint64(i) * 2 * size // every other slot: nothing merges
	}
	for k := 0; k < 3; k++ {
		dstOff := make([]uint64, blocks)
		for i := range dstOff {
			dstOff[i] = uint64(k*blocks+blocks-1-i) * 2 * size
		}
		resp, err := a.c.BatchTransfer(ctx, client.Transfer{SrcRegion: src.Id, Peer: b.d.PeerAddr(), DstRegion: "kv",
			Blocks: client.Descriptors{Src: srcOff, Dst: dstOff, BlockLength: size}})
		if err != nil {
			t.Fatalf("batch %d: %v", k, err)
		}
		if resp.GetBlocks() != blocks || resp.GetBytes() != blocks*size {
			t.Fatalf("batch %d: response says %d blocks, %d bytes", k, resp.GetBlocks(), resp.GetBytes())
		}
		for i := range srcOff {
			if !bytes.Equal(src.Bytes[srcOff[i]:srcOff[i]+size], dst.Bytes[dstOff[i]:dstOff[i]+size]) {
				t.Fatalf("batch %d block %d: bytes differ at the destination", k, i)
			}
		}
	}
	_, err = a.c.BatchTransfer(ctx, client.Transfer{SrcRegion: src.Id, Peer: b.d.PeerAddr(), DstRegion: "no-such-export",
		Blocks: client.Descriptors{Src: srcOff, Dst: srcOff, BlockLength: size}})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("batch to an unknown export: %v, want NotFound", err)
	}

	// Two prepared submits of the first layout count as batches too, with
	// their phases.
	plan, err := a.c.Prepare(ctx, client.Transfer{SrcRegion: src.Id, Peer: b.d.PeerAddr(), DstRegion: "kv",
		Blocks: client.Descriptors{Src: srcOff, Dst: srcOff, BlockLength: size}})
	if err != nil {
		t.Fatal(err)
	}
	for k := 0; k < 2; k++ {
		if _, err := plan.Submit(ctx); err != nil {
			t.Fatalf("submit %d: %v", k, err)
		}
	}
	// So do submits that no unary interceptor sees: three on a stream
	// (and one there for a plan that does not exist) and one on the raw
	// submit socket.
	st, err := a.c.OpenStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := 0; k < 3; k++ {
		if _, err := st.Submit(plan); err != nil {
			t.Fatalf("stream submit %d: %v", k, err)
		}
	}
	if _, err := st.Submit(&client.Plan{Handle: plan.Handle + 1000}); err != nil {
		t.Fatal(err)
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	var streamOK, streamNotFound int
	for r := range st.Results() {
		switch {
		case r.Err == nil:
			streamOK++
		case status.Code(r.Err) == codes.NotFound:
			streamNotFound++
		default:
			t.Errorf("stream submit %d: %v", r.Tag, r.Err)
		}
	}
	if streamOK != 3 || streamNotFound != 1 {
		t.Fatalf("stream: %d ok and %d NotFound, want 3 and 1", streamOK, streamNotFound)
	}
	raw, err := client.DialSubmit(submitSock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Submit(plan); err != nil {
		t.Fatalf("raw submit: %v", err)
	}
	raw.Close()
	if err := plan.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Block-id transfers (a call, and one started) and a started batch
	// count as batches too, as they end; so does a started one that fails.
	if _, err := a.c.RegisterLayout(ctx, client.Layout{Name: "srcl", NumBlocks: blocks,
		Segments: []client.Segment{{RegionID: src.Id, BlockLen: size, Stride: 2 * size}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.RegisterLayout(ctx, client.Layout{Name: "kvl", Export: "kvl", NumBlocks: blocks,
		Segments: []client.Segment{{RegionID: dst.Id, BlockLen: size, Stride: 2 * size}}}); err != nil {
		t.Fatal(err)
	}
	ids := []uint32{0, 1, 2, 3}
	blk := client.Blocks{LocalLayout: "srcl", Peer: b.d.PeerAddr(), RemoteLayout: "kvl", LocalIDs: ids, RemoteIDs: ids}
	if _, err := a.c.TransferBlocks(ctx, blk); err != nil {
		t.Fatalf("block transfer: %v", err)
	}
	started := func(h *client.TransferHandle, err error) *b2bv1.TransferOutcome {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		o, err := h.Wait(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	if o := started(a.c.StartBlocks(ctx, blk, 0)); o.GetState() != b2bv1.TransferState_TRANSFER_STATE_DONE {
		t.Fatalf("started block transfer: %v", o)
	}
	if o := started(a.c.StartTransfer(ctx, client.Transfer{SrcRegion: src.Id, Peer: b.d.PeerAddr(), DstRegion: "kv",
		Blocks: client.Descriptors{Src: srcOff, Dst: srcOff, BlockLength: size}}, 0)); o.GetState() != b2bv1.TransferState_TRANSFER_STATE_DONE {
		t.Fatalf("started batch: %v", o)
	}
	missing := blk
	missing.RemoteLayout = "no-such-layout"
	if o := started(a.c.StartBlocks(ctx, missing, 0)); codes.Code(o.GetCode()) != codes.NotFound {
		t.Fatalf("started block transfer to an unknown layout: %v, want NotFound", o)
	}

	fa := scrape(t, a.d.MetricsAddr())
	check(t, "sender", fa, []want{
		// 9 batches above, 2 block transfers of 4 blocks, 1 started batch
		{"b2bd_batches_total", []string{"transport", "tcp", "outcome", "ok"}, 12},
		{"b2bd_batch_blocks_total", []string{"transport", "tcp", "outcome", "ok"}, 1008},
		{"b2bd_batch_bytes_total", []string{"transport", "tcp", "outcome", "ok"}, 4128768},
		{"b2bd_batch_phase_duration_seconds", []string{"transport", "tcp", "phase", "wire"}, 12},
		{"b2bd_api_requests_total", []string{"method", "SubmitTransfer", "code", "OK"}, 2},
		{"b2bd_batches_total", []string{"transport", "auto", "outcome", "error"}, 3},
		{"b2bd_batch_blocks_total", []string{"transport", "auto", "outcome", "error"}, 100},
		{"b2bd_batch_bytes_total", []string{"transport", "auto", "outcome", "error"}, 409600},
		{"b2bd_batch_duration_seconds", []string{"transport", "tcp", "outcome", "ok", "size_class", "le_4KiB"}, 12},
		{"b2bd_batch_errors_total", []string{"transport", "auto", "code", "NotFound"}, 3}, // the export, the stream's unknown plan, the started one's layout
		{"b2bd_batch_duration_seconds", []string{"transport", "auto", "outcome", "error", "size_class", "le_4KiB"}, 3},
		{"b2bd_batches_in_flight", nil, 0},
		{"b2bd_api_requests_total", []string{"method", "BatchTransfer", "code", "OK"}, 3},
		{"b2bd_api_requests_total", []string{"method", "BatchTransfer", "code", "NotFound"}, 1},
		{"b2bd_api_requests_total", []string{"method", "RegisterRegion", "code", "OK"}, 1},
		{"b2bd_regions", []string{"kind", "host"}, 1},
		{"b2bd_region_bytes", []string{"kind", "host"}, float64(srcSize)},
		{"b2bd_regions", []string{"kind", "cuda"}, 0},
		{"b2bd_received_batches_total", nil, 0},
		{"b2bd_verbs_queue_pairs", nil, 0},
		{"b2bd_rdma_rails_up", nil, 0},
		{"b2bd_build_info", []string{"version", daemon.Version, "goversion", runtime.Version()}, 1},
	})
	fb := scrape(t, b.d.MetricsAddr())
	check(t, "receiver", fb, []want{
		{"b2bd_received_batches_total", nil, 12},
		{"b2bd_received_bytes_total", nil, 4128768},
		{"b2bd_regions", []string{"kind", "host"}, 1},
		{"b2bd_region_bytes", []string{"kind", "host"}, float64(dstSize)},
		{"b2bd_transport_connections", []string{"transport", "tcp"}, 4}, // --tcp-streams' default, accepted from a
	})
	if _, ok := value(fb, "b2bd_batches_total", "transport", "tcp", "outcome", "ok"); ok {
		t.Errorf("receiver: b2bd_batches_total{tcp,ok} exists; it sent nothing")
	}
	if _, ok := fa["process_open_fds"]; !ok {
		t.Errorf("sender: no process collector (process_open_fds)")
	}
}

// healthOf asks addr's grpc.health.v1 for the overall status.
func healthOf(ctx context.Context, target string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return 0, err
	}
	return resp.GetStatus(), nil
}

func httpStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// readNotify reads one datagram from the fake systemd socket.
func readNotify(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 256)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("read NOTIFY_SOCKET: %v", err)
	}
	return string(buf[:n])
}

// TestHealthWhileDraining: the health port, the local API and the peer
// listener say SERVING while the daemon serves; on shutdown the health
// port says NOT_SERVING (gRPC and /healthz) while a batch is still in
// flight, and systemd is told READY=1 and then STOPPING=1.
func TestHealthWhileDraining(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify.sock")
	ns, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	t.Setenv("NOTIFY_SOCKET", sock)

	// A peer that accepts connections and never answers: a batch to it
	// stays in flight until its deadline.
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()

	a := startNode(t, "a")
	if got := readNotify(t, ns); got != "READY=1\nSTATUS=serving" {
		t.Fatalf("first notification %q, want READY=1", got)
	}
	ctx := context.Background()
	hp := a.d.HealthAddr()
	for _, target := range []string{hp, a.d.APIAddr(), a.d.PeerAddr()} {
		st, err := healthOf(ctx, target)
		if err != nil || st != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health of %s while serving: %v %v, want SERVING", target, st, err)
		}
	}
	if code := httpStatus(t, "http://"+hp+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz while serving: %d", code)
	}

	src, err := a.c.RegisterHost(ctx, 1<<20, "")
	if err != nil {
		t.Fatal(err)
	}
	// The batch has its own connection: stop closes a.c.
	bc, err := client.Dial(a.d.APIAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	const batchTimeout = 4 * time.Second
	batchDone := make(chan error, 1)
	go func() {
		bctx, cancel := context.WithTimeout(ctx, batchTimeout)
		defer cancel()
		_, err := bc.BatchTransfer(bctx, client.Transfer{SrcRegion: src.Id, Peer: mute.Addr().String(), DstRegion: "x",
			Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{0}, BlockLength: 4096}})
		batchDone <- err
	}()
	deadline := time.Now().Add(3 * time.Second)
	for {
		if v, _ := value(scrape(t, a.d.MetricsAddr()), "b2bd_batches_in_flight"); v == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the batch never showed in b2bd_batches_in_flight")
		}
		time.Sleep(10 * time.Millisecond)
	}

	stopped := make(chan struct{})
	go func() { a.stop(t); close(stopped) }()
	if got := readNotify(t, ns); got != "STOPPING=1\nSTATUS=draining" {
		t.Fatalf("notification on shutdown %q, want STOPPING=1", got)
	}
	st, err := healthOf(ctx, hp)
	if err != nil || st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health port while draining: %v %v, want NOT_SERVING", st, err)
	}
	if code := httpStatus(t, "http://"+hp+"/healthz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/healthz while draining: %d, want 503", code)
	}
	select {
	case err := <-batchDone:
		t.Fatalf("the batch ended (%v) before NOT_SERVING was checked: the drain window was not observed", err)
	default:
	}
	err = <-batchDone
	if c := status.Code(err); c != codes.DeadlineExceeded && c != codes.Unavailable {
		t.Errorf("the held batch ended with %v, want its deadline", err)
	}
	<-stopped
	if _, err := healthOf(ctx, hp); err == nil {
		t.Errorf("the health port still answers after the daemon stopped")
	}
}

// TestObservabilityListenErrors: a bad --metrics-listen or --health-listen
// fails at start, naming the flag.
func TestObservabilityListenErrors(t *testing.T) {
	for _, tc := range []struct{ flag, addr string }{
		{"--metrics-listen", "256.0.0.1:1"},
		{"--health-listen", "no-port"},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			dir := t.TempDir()
			cfg := daemon.Config{NodeName: "x", Socket: filepath.Join(dir, "s.sock"), SocketMode: "0660",
				PeerListen: "127.0.0.1:0", ShmDir: filepath.Join(dir, "shm"), Transport: "tcp", Insecure: true,
				DefaultTimeout: time.Second, ShutdownGrace: time.Second, MaxDescriptors: 16}
			cfg.KindFlags = map[string]string{"data-listen": "127.0.0.1:0"}
			if tc.flag == "--metrics-listen" {
				cfg.MetricsListen = tc.addr
			} else {
				cfg.HealthListen = tc.addr
			}
			_, err := daemon.New(cfg, hclog.NewNullLogger())
			if err == nil || !strings.Contains(err.Error(), tc.flag) {
				t.Fatalf("New with %s %q: %v, want an error naming the flag", tc.flag, tc.addr, err)
			}
		})
	}
}
