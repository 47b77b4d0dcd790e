package e2e

import (
	"context"
	"google.golang.org/protobuf/proto"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/daemon"
	"github.com/b2bd/b2bd/internal/peer"
	tcpv1 "github.com/b2bd/b2bd/proto/b2b/transport/tcp/v1"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// The caller's own deadline or cancellation is what BatchTransfer reports,
// whichever phase of the batch it cut off: resolve, connect (dial, hello),
// post, the wait for the ack, notify. The rig: a real sender daemon A, a
// real destination daemon B, and between them a fake Peer service that
// forwards to B's but can stall an RPC or advertise another data address,
// plus a TCP proxy in front of B's data port that can stop forwarding
// either direction.

// fakePeer forwards the Peer service to a real daemon's.
type fakePeer struct {
	b2bv1.UnimplementedPeerServer
	real     b2bv1.PeerClient
	dataAddr string // advertised instead of the real daemon's, when set
	stall    string // "resolve" or "notify": that RPC waits for its caller to give up
	reached  chan string
}

func (f *fakePeer) hold(ctx context.Context, what string) error {
	select {
	case f.reached <- what:
	default:
	}
	<-ctx.Done()
	return status.FromContextError(ctx.Err()).Err()
}

func (f *fakePeer) Handshake(ctx context.Context, req *b2bv1.HandshakeRequest) (*b2bv1.HandshakeResponse, error) {
	resp, err := f.real.Handshake(ctx, req)
	if err == nil && f.dataAddr != "" { // the tcp advert names f's data address instead
		var a tcpv1.Advert
		if err := proto.Unmarshal(resp.GetAdverts()["tcp"], &a); err != nil {
			return nil, err
		}
		a.DataAddress = f.dataAddr
		resp.Adverts["tcp"], _ = proto.Marshal(&a)
	}
	return resp, err
}

func (f *fakePeer) ResolveRegion(ctx context.Context, req *b2bv1.ResolveRegionRequest) (*b2bv1.ResolveRegionResponse, error) {
	if f.stall == "resolve" {
		return nil, f.hold(ctx, "resolve")
	}
	return f.real.ResolveRegion(ctx, req)
}

func (f *fakePeer) Notify(ctx context.Context, req *b2bv1.NotifyRequest) (*b2bv1.NotifyResponse, error) {
	if f.stall == "notify" {
		return nil, f.hold(ctx, "notify")
	}
	return f.real.Notify(ctx, req)
}

func serveFake(t *testing.T, f *fakePeer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	b2bv1.RegisterPeerServer(s, f)
	go s.Serve(ln)
	t.Cleanup(s.Stop)
	return ln.Addr().String()
}

// proxy forwards TCP connections to target. It forwards the first fwdBytes
// bytes client->server and the first retBytes server->client, then stops
// reading that direction (a negative limit: no limit), so the other side's
// writes fill the socket buffers and stall.
type proxy struct {
	ln                 net.Listener
	target             string
	fwdBytes, retBytes int64
	reached            chan string
	mu                 sync.Mutex
	conns              []net.Conn
}

func startProxy(t *testing.T, target string, fwd, ret int64, reached chan string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, fwdBytes: fwd, retBytes: ret, reached: reached}
	go p.loop()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
}

func (p *proxy) loop() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go p.pipe(s, c, p.fwdBytes, "post")
		go p.pipe(c, s, p.retBytes, "ack")
	}
}

// pipe copies src to dst, up to limit bytes, then holds: stops reading src.
func (p *proxy) pipe(dst, src net.Conn, limit int64, what string) {
	if limit < 0 {
		io.Copy(dst, src)
		return
	}
	if _, err := io.CopyN(dst, src, limit); err != nil {
		return
	}
	select {
	case p.reached <- what:
	default:
	}
}

// blackHole is a listener whose accept queue is full: further connection
// attempts get no SYN-ACK and a dial hangs until its deadline.
func blackHole(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", itoa(sa.(*syscall.SockaddrInet4).Port))
	// Fill the accept queue (backlog 0 holds one connection or two).
	for i := 0; i < 4; i++ {
		d := net.Dialer{Timeout: 300 * time.Millisecond}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
	}
	return addr
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// TestDeadlineEveryPhase cuts each phase off three ways: the daemon's
// --default-timeout for a caller that set no deadline (the answer is then
// the daemon's own, deterministically), the caller's deadline, and the
// caller's cancellation.
func TestDeadlineEveryPhase(t *testing.T) {
	const batchTimeout = 3 * time.Second
	a := startNode(t, "a", func(c *daemon.Config) { c.DefaultTimeout = batchTimeout })
	b := startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cc, err := grpc.NewClient("passthrough:///"+b.d.PeerAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	realPeer := b2bv1.NewPeerClient(cc)
	hs, err := realPeer.Handshake(ctx, &b2bv1.HandshakeRequest{ProtocolVersion: peer.ProtocolVersion, NodeName: "probe"})
	if err != nil {
		t.Fatal(err)
	}
	var tcpAdvert tcpv1.Advert
	if err := proto.Unmarshal(hs.GetAdverts()["tcp"], &tcpAdvert); err != nil {
		t.Fatal(err)
	}
	dataAddr := tcpAdvert.GetDataAddress()

	// Big enough to fill the socket buffers of a stalled proxy many times.
	const bigN, bigSize = 64, 1 << 20
	r := rand.New(rand.NewPCG(5, 6))
	srcOff, srcSize := layout(bigN, bigSize, r)
	dstOff, dstSize := layout(bigN, bigSize, r)
	src, err := a.c.RegisterHost(ctx, srcSize, "")
	if err != nil {
		t.Fatal(err)
	}
	for i := range src.Bytes {
		src.Bytes[i] = byte(r.Uint32())
	}
	dst, err := b.c.RegisterHost(ctx, dstSize, "dl")
	if err != nil {
		t.Fatal(err)
	}

	phases := []struct {
		name  string
		setup func(t *testing.T, f *fakePeer) // before the fake serves
		small bool                            // a batch of one block (fits any socket buffer)
		note  bool                            // carry a notification
		// msg: the message names the phase it cut off.
		msg string
	}{
		{name: "resolve", setup: func(t *testing.T, f *fakePeer) { f.stall = "resolve" }, msg: "resolve dst_region"},
		{name: "connect-dial", setup: func(t *testing.T, f *fakePeer) { f.dataAddr = blackHole(t) }, msg: "dial data stream"},
		{name: "connect-hello", setup: func(t *testing.T, f *fakePeer) {
			// Accepts, takes the hello, never welcomes.
			f.dataAddr = startProxy(t, dataAddr, 0, 0, f.reached).ln.Addr().String()
		}, msg: "hello on data stream"},
		{name: "post", setup: func(t *testing.T, f *fakePeer) {
			// Hellos and welcomes pass, then nothing more reaches B.
			f.dataAddr = startProxy(t, dataAddr, 40, -1, f.reached).ln.Addr().String()
		}, msg: "tcp: batch"},
		{name: "ack", small: true, setup: func(t *testing.T, f *fakePeer) {
			// Everything reaches B; nothing after the welcome comes back.
			f.dataAddr = startProxy(t, dataAddr, -1, 8, f.reached).ln.Addr().String()
		}, msg: "tcp: batch"},
		{name: "notify", small: true, note: true, setup: func(t *testing.T, f *fakePeer) { f.stall = "notify" }, msg: "notification"},
	}
	parent := t
	for _, ph := range phases {
		for _, how := range []string{"default-timeout", "deadline", "cancel"} {
			t.Run(ph.name+"/"+how, func(t *testing.T) {
				f := &fakePeer{real: realPeer, reached: make(chan string, 16)}
				ph.setup(t, f)
				// Every fake listens until the whole test ends: a later
				// subtest's fake on a port an earlier one let go would be,
				// to A, the same peer (same address, B's instance behind
				// it), and A would send over the session it keeps for it,
				// straight to B's data port, past this subtest's proxy.
				fake := serveFake(parent, f)
				bctx, bcancel := context.WithCancel(context.Background())
				switch how {
				case "deadline":
					bctx, bcancel = context.WithTimeout(ctx, batchTimeout)
				case "cancel":
					// A caller deadline far off, so that the daemon's default
					// timeout does not race the cancel.
					bctx, bcancel = context.WithTimeout(ctx, time.Minute)
					time.AfterFunc(batchTimeout, bcancel)
				}
				defer bcancel()
				tr := client.Transfer{SrcRegion: src.Id, Peer: fake, DstRegion: "dl",
					Blocks: client.Descriptors{Src: srcOff, Dst: dstOff, BlockLength: bigSize}}
				if ph.small {
					tr.Blocks = client.Descriptors{Src: srcOff[:1], Dst: dstOff[:1], BlockLength: 4096}
				}
				if ph.note {
					tr.Notification = []byte("n")
				}
				start := time.Now()
				_, err := a.c.BatchTransfer(bctx, tr)
				want := codes.DeadlineExceeded
				if how == "cancel" {
					want = codes.Canceled
				}
				if status.Code(err) != want {
					t.Fatalf("after %v: got %v (code %v), want %v", time.Since(start).Round(time.Millisecond), err, status.Code(err), want)
				}
				// With the daemon's default timeout, the answer is the
				// daemon's: it names the phase it cut off.
				if msg := status.Convert(err).Message(); how == "default-timeout" && (!strings.Contains(msg, ph.msg) || !strings.Contains(msg, "deadline")) {
					t.Errorf("message %q does not name the phase (%q) and the deadline", msg, ph.msg)
				}
				t.Logf("%v", err)
				// The daemon keeps working: the next batch, straight to B, lands.
				checkNext(ctx, t, a, b, src, dst, srcOff, dstOff)
			})
		}
	}
}

// checkNext sends a small batch from src straight to B's "dl" and verifies it.
func checkNext(ctx context.Context, t *testing.T, a, b *node, src, dst *client.HostRegion, srcOff, dstOff []uint64) {
	t.Helper()
	const n, size = 8, 4096
	for i := range n {
		src.Bytes[srcOff[i]] ^= 0xff // fresh content each time
	}
	if _, err := transfer(ctx, a.c, src.Id, b.d.PeerAddr(), "dl", srcOff[:n], dstOff[:n], size); err != nil {
		t.Fatalf("next batch: %v", err)
	}
	if i := badBlock(src.Bytes, dst.Bytes, srcOff[:n], dstOff[:n], size); i >= 0 {
		t.Fatalf("next batch: block %d differs", i)
	}
}
