package server_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/b2bd/b2bd/internal/auth"
	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/notify"
	"github.com/b2bd/b2bd/internal/peer"
	"github.com/b2bd/b2bd/internal/region"
	"github.com/b2bd/b2bd/internal/transport"
	"github.com/b2bd/b2bd/internal/transport/tcp"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
	"github.com/b2bd/b2bd/server"
)

// bufNet routes peer addresses to in-memory gRPC listeners.
// bufNet is the nodes' peer listeners by node name; a peer address is
// name:7470 (the manager takes host:port only).
type bufNet map[string]*bufconn.Listener

func (n bufNet) dial(ctx context.Context, addr string) (net.Conn, error) {
	if l, ok := n[strings.TrimSuffix(addr, ":7470")]; ok {
		return l.DialContext(ctx)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

type node struct {
	api b2bv1.B2BClient
	reg *region.Registry
	srv *server.Server
	// dial opens another client connection to the local API.
	dial func() *grpc.ClientConn
	// apiLn is the local API's listener (for the Go client's dialer).
	apiLn *bufconn.Listener
	in    *inbound
}

// newNode wires one daemon's services over bufconn, with a real TCP data
// plane on loopback.
func newNode(t *testing.T, name string, bn bufNet) *node {
	t.Helper()
	return newNodeWith(t, name, bn, nil)
}

// newNodeWith is newNode with set changing the server's Config.
func newNodeWith(t *testing.T, name string, bn bufNet, set func(*server.Config)) *node {
	t.Helper()
	log := hclog.NewNullLogger()
	in := &inbound{}
	tt, err := tcp.New(tcp.Config{Listen: "127.0.0.1:0"}, in, log)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := region.New(region.Config{ShmDir: t.TempDir(), Transports: []transport.Transport{tt}, CUDAWhy: "no GPU in this test", Log: log})
	if err != nil {
		t.Fatal(err)
	}
	in.reg = reg
	self := &b2bv1.HandshakeRequest{ProtocolVersion: peer.ProtocolVersion, NodeName: name, Kinds: []string{"tcp"}}
	pm := peer.New(self, []transport.Transport{tt}, log, false,
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(bn.dial))
	scfg := server.Config{
		NodeName: name, Registry: reg, Peers: pm, Adverts: []transport.Advert{tt.Advertise()}, MaxDescriptors: 1000,
		Transports: []*b2bv1.TransportStatus{{Kind: b2bv1.TransportKind_TRANSPORT_KIND_TCP, Available: true}},
	}
	if set != nil {
		set(&scfg)
	}
	srv := server.New(scfg)
	api, peerLn := bufconn.Listen(1<<20), bufconn.Listen(1<<20)
	bn[name] = peerLn
	gs := grpc.NewServer(append([]grpc.ServerOption{grpc.Creds(localCaller{})}, srv.APIOptions()...)...)
	b2bv1.RegisterB2BServer(gs, srv.Local())
	ps := grpc.NewServer()
	b2bv1.RegisterPeerServer(ps, srv.Peer())
	go gs.Serve(api)
	go ps.Serve(peerLn)
	dial := func() *grpc.ClientConn {
		cc, err := grpc.NewClient("passthrough:///api", grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return api.DialContext(ctx) }))
		if err != nil {
			t.Fatal(err)
		}
		return cc
	}
	cc := dial()
	t.Cleanup(func() {
		cc.Close()
		gs.Stop()
		ps.Stop()
		srv.Close()
		pm.Close()
		reg.Close()
		tt.Close()
	})
	return &node{api: b2bv1.NewB2BClient(cc), reg: reg, srv: srv, dial: dial, apiLn: api, in: in}
}

// localCaller makes every bufconn caller a local process of uid 1000, as
// SO_PEERCRED would on the Unix socket.
type localCaller struct{ auth.PeerCred }

const callerUID = 1000

func (localCaller) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, auth.Local{UID: callerUID, GID: callerUID}, nil
}
func (l localCaller) Clone() credentials.TransportCredentials { return l }

type inbound struct {
	reg *region.Registry
	// readGate, when set, holds every PinRead (the serving side of a
	// pull) until it opens.
	readGate atomic.Pointer[pinGate]
}

// pinGate holds pins: entered closes when the first one waits, open lets
// them go, released closes when the first one was let go of.
type pinGate struct {
	entered, open, released chan struct{}
	enter, release          sync.Once
}

func newPinGate() *pinGate {
	return &pinGate{entered: make(chan struct{}), open: make(chan struct{}), released: make(chan struct{})}
}

func (i *inbound) PinRead(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	g := i.readGate.Load()
	if g == nil {
		return i.reg.Pins().PinRead(k, key)
	}
	g.enter.Do(func() { close(g.entered) })
	<-g.open
	m, rel, err := i.reg.Pins().PinRead(k, key)
	if err != nil {
		return m, rel, err
	}
	return m, func() { rel(); g.release.Do(func() { close(g.released) }) }, nil
}

func (i *inbound) Pin(k transport.Kind, key uint64) (m memory.Memory, rel func(), err error) {
	return i.reg.Pins().Pin(k, key)
}
func (i *inbound) Landed(transport.Kind, uint64, uint64) {}

func hostAlloc(size uint64, export string) *b2bv1.RegisterRegionRequest {
	return &b2bv1.RegisterRegionRequest{Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: size}}, ExportName: export}
}

func TestBadInput(t *testing.T) {
	bn := bufNet{}
	a, b := newNode(t, "a", bn), newNode(t, "b", bn)
	ctx := context.Background()
	must := func(r *b2bv1.RegisterRegionResponse, err error) *b2bv1.Region {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return r.GetRegion()
	}
	src := must(a.api.RegisterRegion(ctx, hostAlloc(4096, "")))
	must(b.api.RegisterRegion(ctx, hostAlloc(1024, "dst")))

	// A peer that accepts TCP but never speaks gRPC: calls to it can only time out.
	silent, err := listenSilent()
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	// Files in a's shm directory for the import cases.
	shm := a.reg.ShmDir()
	linkOut := filepath.Join(shm, "link")
	othersFile := filepath.Join(shm, "others")
	subdir := filepath.Join(shm, "dir")
	if err := os.Symlink("/etc/hostname", linkOut); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(othersFile, make([]byte, 4096), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(othersFile, 4242, 4242); err != nil {
		t.Skipf("cannot chown (not root?): %v", err)
	}
	if err := os.Mkdir(subdir, 0o777); err != nil {
		t.Fatal(err)
	}
	importFile := func(path string) *b2bv1.RegisterRegionRequest {
		return &b2bv1.RegisterRegionRequest{Source: &b2bv1.RegisterRegionRequest_HostFile{HostFile: &b2bv1.HostFile{Path: path}}}
	}

	u := desc.Pack
	descs := func(src, dst []uint64, l uint64) *b2bv1.Descriptors {
		return &b2bv1.Descriptors{SrcOffsets: u(src), DstOffsets: u(dst), BlockLength: l}
	}
	good := descs([]uint64{0}, []uint64{0}, 64)
	xfer := func(mut func(*b2bv1.BatchTransferRequest)) func() error {
		return func() error {
			r := &b2bv1.BatchTransferRequest{SrcRegionId: src.Id, Peer: "b:7470", DstRegion: "dst", Descriptors: good}
			mut(r)
			c, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err := a.api.BatchTransfer(c, r)
			return err
		}
	}
	reg := func(req *b2bv1.RegisterRegionRequest) func() error {
		return func() error { _, err := a.api.RegisterRegion(ctx, req); return err }
	}
	many := make([]uint64, 1001)
	for i := range many {
		many[i] = uint64(i)
	}
	cases := []struct {
		name string
		call func() error
		code codes.Code
		msg  string
	}{
		{"empty src region", xfer(func(r *b2bv1.BatchTransferRequest) { r.SrcRegionId = "" }), codes.InvalidArgument, "src_region_id is empty"},
		{"empty peer", xfer(func(r *b2bv1.BatchTransferRequest) { r.Peer = "" }), codes.InvalidArgument, "peer is empty"},
		{"empty dst region", xfer(func(r *b2bv1.BatchTransferRequest) { r.DstRegion = "" }), codes.InvalidArgument, "dst_region is empty"},
		{"no descriptors", xfer(func(r *b2bv1.BatchTransferRequest) { r.Descriptors = nil }), codes.InvalidArgument, "descriptors is not set"},
		{"unknown src region", xfer(func(r *b2bv1.BatchTransferRequest) { r.SrcRegionId = "r999" }), codes.NotFound, `src_region_id "r999" is not a registered region`},
		{"unknown dst export", xfer(func(r *b2bv1.BatchTransferRequest) { r.DstRegion = "nope" }), codes.NotFound, `no region is exported as "nope"`},
		{"unreachable peer", xfer(func(r *b2bv1.BatchTransferRequest) { r.Peer = "127.0.0.1:1" }), codes.Unavailable, "handshake"},
		{"silent peer", xfer(func(r *b2bv1.BatchTransferRequest) { r.Peer = silent.Addr().String() }), codes.DeadlineExceeded, ""},
		{"zero length", xfer(func(r *b2bv1.BatchTransferRequest) {
			r.Descriptors = &b2bv1.Descriptors{SrcOffsets: u([]uint64{0, 8}), DstOffsets: u([]uint64{0, 8}), Lengths: u([]uint64{8, 0})}
		}), codes.InvalidArgument, "descriptors.lengths[1] is 0"},
		{"ragged offsets", xfer(func(r *b2bv1.BatchTransferRequest) {
			r.Descriptors = &b2bv1.Descriptors{SrcOffsets: make([]byte, 12), DstOffsets: u([]uint64{0}), BlockLength: 8}
		}), codes.InvalidArgument, "descriptors.src_offsets is 12 bytes"},
		{"count mismatch", xfer(func(r *b2bv1.BatchTransferRequest) { r.Descriptors = descs([]uint64{0, 8}, []uint64{0}, 8) }), codes.InvalidArgument, "dst_offsets has 1 entries, src_offsets has 2"},
		{"both lengths", xfer(func(r *b2bv1.BatchTransferRequest) {
			r.Descriptors = &b2bv1.Descriptors{SrcOffsets: u([]uint64{0}), DstOffsets: u([]uint64{0}), Lengths: u([]uint64{8}), BlockLength: 8}
		}), codes.InvalidArgument, "lengths and block_length are both set"},
		{"src past end", xfer(func(r *b2bv1.BatchTransferRequest) { r.Descriptors = descs([]uint64{4090}, []uint64{0}, 8) }), codes.InvalidArgument, "descriptors.src_offsets[0] = 4090 with length 8 runs past the source region's 4096 bytes"},
		{"dst past end", xfer(func(r *b2bv1.BatchTransferRequest) { r.Descriptors = descs([]uint64{0, 8}, []uint64{0, 1020}, 8) }), codes.InvalidArgument, "descriptors.dst_offsets[1] = 1020 with length 8 runs past the destination region's 1024 bytes"},
		{"overlapping dst", xfer(func(r *b2bv1.BatchTransferRequest) { r.Descriptors = descs([]uint64{0, 64}, []uint64{100, 96}, 8) }), codes.InvalidArgument, "overlap"},
		{"too many blocks", xfer(func(r *b2bv1.BatchTransferRequest) { r.Descriptors = descs(many, many, 1) }), codes.ResourceExhausted, "1001 blocks exceeds the limit of 1000"},
		{"unknown transport", xfer(func(r *b2bv1.BatchTransferRequest) { r.Transport = 9 }), codes.InvalidArgument, "transport 9 is not a known TransportKind"},
		{"verbs unavailable", xfer(func(r *b2bv1.BatchTransferRequest) { r.Transport = b2bv1.TransportKind_TRANSPORT_KIND_VERBS }), codes.FailedPrecondition, "transport verbs was requested but is not available"},
		{"no source", reg(&b2bv1.RegisterRegionRequest{}), codes.InvalidArgument, "source is not set"},
		{"zero size", reg(hostAlloc(0, "")), codes.InvalidArgument, "host_alloc.size is 0"},
		{"bad export name", reg(hostAlloc(8, "a b")), codes.InvalidArgument, "export_name \"a b\" has ' '"},
		{"duplicate export", func() error {
			if _, err := a.api.RegisterRegion(ctx, hostAlloc(8, "dup")); err != nil {
				return err
			}
			return reg(hostAlloc(8, "dup"))()
		}, codes.AlreadyExists, `export_name "dup" is already used`},
		{"shm import outside dir", reg(&b2bv1.RegisterRegionRequest{Source: &b2bv1.RegisterRegionRequest_HostFile{HostFile: &b2bv1.HostFile{Path: "/etc/passwd"}}}), codes.PermissionDenied, "outside the shm directory"},
		{"shm import symlink out", reg(importFile(linkOut)), codes.PermissionDenied, "resolves to /etc/hostname, outside the shm directory"},
		{"shm import other user's file", reg(importFile(othersFile)), codes.PermissionDenied, "belongs to uid 4242, not to the caller (uid 1000)"},
		{"shm import directory", reg(importFile(subdir)), codes.InvalidArgument, "is not a regular file"},
		{"shm import missing", reg(&b2bv1.RegisterRegionRequest{Source: &b2bv1.RegisterRegionRequest_HostFile{HostFile: &b2bv1.HostFile{Path: "nonexistent"}}}), codes.NotFound, "does not exist"},
		{"gpu on host without gpu", reg(&b2bv1.RegisterRegionRequest{Source: &b2bv1.RegisterRegionRequest_CudaAlloc{CudaAlloc: &b2bv1.CudaAlloc{Size: 8}}}), codes.FailedPrecondition, "no usable GPU"},
		{"malformed ipc handle", reg(&b2bv1.RegisterRegionRequest{Source: &b2bv1.RegisterRegionRequest_CudaIpc{CudaIpc: &b2bv1.CudaIpc{IpcHandle: []byte{1, 2}, Size: 8}}}), codes.InvalidArgument, "cuda_ipc.ipc_handle is 2 bytes; a CUipcMemHandle is 64"},
		{"deregister unknown", func() error {
			_, err := a.api.DeregisterRegion(ctx, &b2bv1.DeregisterRegionRequest{RegionId: "r42"})
			return err
		}, codes.NotFound, `region_id "r42" is not registered`},
		{"checksum out of range", func() error {
			_, err := a.api.Checksum(ctx, &b2bv1.ChecksumRequest{RegionId: src.Id, Offsets: u([]uint64{4095}), BlockLength: 2})
			return err
		}, codes.InvalidArgument, "offsets[0] = 4095 with length 2 runs past the region's 4096 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			st, _ := status.FromError(err)
			if st.Code() != c.code || !strings.Contains(st.Message(), c.msg) {
				t.Fatalf("got %v %q, want %v containing %q", st.Code(), st.Message(), c.code, c.msg)
			}
		})
	}
	// Nothing above may have moved a byte or left a batch holding a region.
	for _, r := range a.reg.List(region.Root) {
		if r.Active != 0 {
			t.Errorf("region %s still has %d active batches", r.ID, r.Active)
		}
	}
}

// TestDeregisterWhileInUse: a region held by a batch refuses deregistration.
func TestDeregisterWhileInUse(t *testing.T) {
	n := newNode(t, "a", bufNet{})
	ctx := context.Background()
	r, err := n.api.RegisterRegion(ctx, hostAlloc(64, ""))
	if err != nil {
		t.Fatal(err)
	}
	_, release, err := n.reg.Acquire(r.Region.Id, "src_region_id", region.Root)
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.api.DeregisterRegion(ctx, &b2bv1.DeregisterRegionRequest{RegionId: r.Region.Id})
	if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "in use by 1 batch") {
		t.Fatalf("got %v", err)
	}
	release()
	if _, err := n.api.DeregisterRegion(ctx, &b2bv1.DeregisterRegionRequest{RegionId: r.Region.Id}); err != nil {
		t.Fatal(err)
	}
}

// listenSilent accepts TCP connections and never answers them.
func listenSilent() (net.Listener, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() {
		// Held, never answered. They must stay referenced: an unreferenced
		// net.Conn is closed by its finalizer at the next GC, which resets
		// the dialler's handshake ("connection reset by peer") and made
		// the transfers meant to hang fail now and then.
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	return l, nil
}

// TestNotifyStreamAnswersAndDrains: a peer's note stream answers each
// note with its seq (a refusal as Notify's code and message), and Drain
// ends it at once, so that the peer server's graceful stop is not held.
func TestNotifyStreamAnswersAndDrains(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bn := bufNet{}
	b := newNode(t, "b", bn)
	if _, err := b.api.RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
		Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: 4096}}, ExportName: "inbox"}); err != nil {
		t.Fatal(err)
	}
	s := notifyStream(ctx, t, bn, "b")
	for i, c := range []struct {
		region string
		code   codes.Code
	}{{"inbox", codes.OK}, {"nowhere", codes.NotFound}, {"inbox", codes.OK}} {
		if err := s.Send(&b2bv1.NotifyRequest{Region: c.region, Sender: "a", Notification: []byte("n"), Seq: uint64(10 + i)}); err != nil {
			t.Fatal(err)
		}
		resp, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetSeq() != uint64(10+i) || codes.Code(resp.GetCode()) != c.code || (c.code != codes.OK) != strings.Contains(resp.GetMessage(), c.region) {
			t.Fatalf("note %d to %q: answer %v, want seq %d, code %v, and a message naming the region when refused", i, c.region, resp, 10+i, c.code)
		}
	}
	b.srv.Drain()
	if _, err := s.Recv(); err == nil {
		t.Fatal("the stream still answers after Drain")
	}
}

// notifyStream opens a peer's note stream to node name on bn, as another
// daemon does; it ends with the test.
func notifyStream(ctx context.Context, t *testing.T, bn bufNet, name string) b2bv1.Peer_NotifyStreamClient {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+name, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(bn.dial))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	s, err := b2bv1.NewPeerClient(cc).NotifyStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestNotifyStreamPipelined: notes a peer sends back to back, before any
// answer, reach the region's watchers in order, each answered in order
// with its seq (the stream delivers each note as it reads it).
func TestNotifyStreamPipelined(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bn := bufNet{}
	hub := &notify.Hub{}
	b := newNodeWith(t, "b", bn, func(c *server.Config) { c.Notify = hub })
	r, err := b.api.RegisterRegion(ctx, &b2bv1.RegisterRegionRequest{
		Source: &b2bv1.RegisterRegionRequest_HostAlloc{HostAlloc: &b2bv1.HostAlloc{Size: 4096}}, ExportName: "inbox"})
	if err != nil {
		t.Fatal(err)
	}
	w := hub.Subscribe(r.GetRegion().GetId())
	defer hub.Unsubscribe(w)
	s := notifyStream(ctx, t, bn, "b")
	const n = 64
	for i := range n {
		if err := s.Send(&b2bv1.NotifyRequest{Region: "inbox", Sender: "a", Notification: []byte(strconv.Itoa(i)), Seq: uint64(i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		resp, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetSeq() != uint64(i+1) || resp.GetCode() != 0 || resp.GetDelivered() != 1 {
			t.Fatalf("answer %d: %v, want seq %d, delivered to the one watcher", i, resp, i+1)
		}
	}
	for i := range n {
		select {
		case got := <-w.C:
			if string(got.Notification) != strconv.Itoa(i) || got.Sender != "a" {
				t.Fatalf("note %d: got %q from %q", i, got.Notification, got.Sender)
			}
		case <-ctx.Done():
			t.Fatalf("note %d never reached the watcher", i)
		}
	}
}
