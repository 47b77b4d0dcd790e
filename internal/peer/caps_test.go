package peer

import (
	"bytes"
	"context"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
	"github.com/b2bd/b2bd/internal/transport/tcp"
	"github.com/b2bd/b2bd/internal/transport/transporttest"
	b2bv1 "github.com/b2bd/b2bd/proto/b2b/v1"
)

// The fake kind tests' fakeTransport is tcp: importing the real tcp
// package registers its driver, whose Caps the manager reads for it.

// writeOnly is a kind ranked above tcp that can only write, as verbs over
// several devices (rails) is.
type writeOnly struct{ fakeTransport }

func (*writeOnly) Kind() transport.Kind { return "wonly" }

// advertPeer answers handshakes with fixed adverts.
type advertPeer struct {
	b2bv1.UnimplementedPeerServer
	adverts map[string][]byte
}

func (p *advertPeer) Handshake(context.Context, *b2bv1.HandshakeRequest) (*b2bv1.HandshakeResponse, error) {
	return &b2bv1.HandshakeResponse{ProtocolVersion: ProtocolVersion, NodeName: "b", Adverts: p.adverts}, nil
}

// keyedInbound pins memory by key, for writes and reads alike.
type keyedInbound struct {
	mu sync.Mutex
	m  map[uint64]memory.Memory
}

func (in *keyedInbound) add(key uint64, m memory.Memory) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.m == nil {
		in.m = map[uint64]memory.Memory{}
	}
	in.m[key] = m
}

func (in *keyedInbound) Pin(_ transport.Kind, key uint64) (memory.Memory, func(), error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	m, ok := in.m[key]
	if !ok {
		return memory.Memory{}, nil, errs.ErrNotFound
	}
	return m, func() {}, nil
}

func (in *keyedInbound) PinRead(k transport.Kind, key uint64) (memory.Memory, func(), error) {
	return in.Pin(k, key)
}

func (in *keyedInbound) Landed(transport.Kind, uint64, uint64) {}

// TestPullByCaps: a peer offers a write-only kind ranked above tcp. An
// automatic pull passes it over (its Caps lack read) and moves every byte
// over tcp; the same pull with the write-only kind asked for by name is
// refused with FailedPrecondition naming the kind and the capability it
// lacks; an automatic push still takes the higher-ranked kind.
func TestPullByCaps(t *testing.T) {
	const blk, n = 4096, 16
	log := hclog.NewNullLogger()
	rin := &keyedInbound{}
	recv, err := tcp.New(tcp.Config{Listen: "127.0.0.1:0"}, rin, log)
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	send, err := tcp.New(tcp.Config{Listen: "127.0.0.1:0"}, &keyedInbound{}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer send.Close()

	// The peer's region, the pull's source, exported for reading.
	src := transporttest.AnonMemory(t, n*blk)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range src.Host {
		src.Host[i] = byte(rng.Uint32())
	}
	sreg, err := recv.Register(src)
	if err != nil {
		t.Fatal(err)
	}
	defer sreg.Close()
	rk, err := sreg.KeyFor(transport.AccessRead)
	if err != nil {
		t.Fatal(err)
	}
	rin.add(rk.Key, src)
	dst := transporttest.AnonMemory(t, n*blk)
	dreg, err := send.Register(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer dreg.Close()

	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	b2bv1.RegisterPeerServer(srv, &advertPeer{adverts: map[string][]byte{"tcp": recv.Advertise().Data, "wonly": nil}})
	go srv.Serve(lis)
	defer srv.Stop()
	m := New(&b2bv1.HandshakeRequest{ProtocolVersion: ProtocolVersion, NodeName: "a"}, []transport.Transport{send, &writeOnly{}}, log, false,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(context.Context, string) (net.Conn, error) { return lis.Dial() }))
	defer m.Close()
	tcpDriver, ok := transport.Lookup(transport.TCP)
	if !ok {
		t.Fatal("the tcp driver is not registered")
	}
	drivers := map[transport.Kind]transport.Driver{
		transport.TCP: tcpDriver,
		"wonly":       {Kind: "wonly", Caps: transport.Caps{Rank: 50, Ops: transport.OpWrite, Memory: []memory.Kind{memory.Host}}},
	}
	m.SetDrivers(func(k transport.Kind) (transport.Driver, bool) { d, ok := drivers[k]; return d, ok })

	ctx := context.Background()
	const addr = "127.0.0.1:7470"
	pull := transport.Need{Op: transport.OpRead, Memory: memory.Host}
	t.Run("automatic pull falls back to tcp", func(t *testing.T) {
		s, err := m.Get(ctx, addr, "", pull)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if s.Kind != transport.TCP || s.Caps.Ops&transport.OpRead == 0 {
			t.Fatalf("chose %s with caps %+v, want tcp, which reads", s.Kind, s.Caps)
		}
		var b desc.Batch
		for i := uint64(0); i < n; i++ { // block i of the peer's into block n-1-i of ours
			b.Src, b.Dst, b.Len = append(b.Src, i*blk), append(b.Dst, (n-1-i)*blk), append(b.Len, blk)
		}
		if _, err := transport.Read(ctx, s.Conn, dreg, transport.RemoteRegion{Name: "src", Size: n * blk, Key: rk}, &b); err != nil {
			t.Fatalf("Read: %v", err)
		}
		for i := 0; i < n; i++ {
			want, got := src.Host[i*blk:(i+1)*blk], dst.Host[(n-1-i)*blk:(n-i)*blk]
			if crc32.ChecksumIEEE(got) != crc32.ChecksumIEEE(want) || !bytes.Equal(got, want) {
				t.Fatalf("block %d did not land", i)
			}
		}
	})
	t.Run("forced write-only kind refuses a pull", func(t *testing.T) {
		_, err := m.Get(ctx, addr, "wonly", pull)
		if !errors.Is(err, errs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "transport wonly cannot read (pull)") {
			t.Fatalf("Get = %v, want FailedPrecondition naming wonly and read", err)
		}
	})
	t.Run("automatic push takes the higher rank", func(t *testing.T) {
		s, err := m.Get(ctx, addr, "", transport.Need{Op: transport.OpWrite, Memory: memory.Host})
		if err != nil || s.Kind != "wonly" {
			t.Fatalf("Get = %v, %v; want wonly", s.Kind, err)
		}
	})
}
