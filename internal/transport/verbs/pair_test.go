package verbs

// TestHWPair runs the transport between the two testbed VMs without the
// daemon: VM A (B2B_ROLE=a) is the receiver, VM B (B2B_ROLE=b) the sender.
// A tiny TCP side channel stands in for the Peer gRPC service (it carries
// ConnectVerbs and "verify" requests). B sweeps block sizes and transport
// configurations (B2B_PAIR_CONFIGS), A verifies every block of every batch
// by checksum. It prints one "PAIR" line per (config, size) for the tuning
// table. It runs only when B2B_PAIR=1 (besides B2B_ROLE, B2B_PEER_IP and
// B2B_RDMA_DEV), so a plain hardware test run in one VM does not wait for
// a peer that never comes.
//
//	B2B_PAIR_SIZES    block sizes (default 128,4096,65536,2097152)
//	B2B_PAIR_BLOCKS   blocks per batch at 128 B; fewer for big blocks so a
//	                  batch stays under B2B_PAIR_MAXBYTES (default 2000, 24 MiB)
//	B2B_PAIR_ITERS    timed batches per point (default 3)
//	B2B_PAIR_CONFIGS  ";"-separated "qps=2,signal=16,chain=64,chainbytes=1048576,sge=16,inline=0"
//	B2B_PAIR_MODE     "deadline": instead of the sweep, pairDeadline (a batch
//	                  cut off by its deadline stops landing; first config)

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"google.golang.org/protobuf/proto"
	"math/rand"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/hashicorp/go-hclog"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
	verbsv1 "github.com/b2bd/b2bd/proto/b2b/transport/verbs/v1"
)

const pairPort = "18600"

type pairMsg struct {
	Op      string // "connect", "verify", "done"
	Payload []byte // a verbs signal and its reply (proto/b2b/transport/verbs/v1)
	Seed    int64
	Size    uint64
	N       int
	Err     string
	Key     uint64
	Addr    uint64
	DstSize uint64
}

func envInt(k string, d int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil {
		return v
	}
	return d
}

// pairLayout places n blocks of sz at random distinct slots of both
// regions; pairFill makes the source bytes from the seed. Both sides
// compute them, so only (seed, size, n) travels.
func pairLayout(seed int64, sz uint64, n int, region uint64) *desc.Batch {
	r := rand.New(rand.NewSource(seed))
	slots := int(region / sz)
	ps, pd := r.Perm(slots), r.Perm(slots)
	b := &desc.Batch{}
	for i := 0; i < n; i++ {
		b.Src, b.Dst, b.Len = append(b.Src, uint64(ps[i])*sz), append(b.Dst, uint64(pd[i])*sz), append(b.Len, sz)
	}
	return b
}

// pairFill is splitmix64: cheap enough for tens of MiB under emulation.
func pairFill(seed int64, buf []byte) {
	x := uint64(seed) * 0x9E3779B97F4A7C15
	for k := 0; k+8 <= len(buf); k += 8 {
		x += 0x9E3779B97F4A7C15
		z := x
		z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
		z = (z ^ z>>27) * 0x94D049BB133111EB
		binary.LittleEndian.PutUint64(buf[k:], z^z>>31)
	}
}

func TestHWPair(t *testing.T) {
	role, peerIP := os.Getenv("B2B_ROLE"), os.Getenv("B2B_PEER_IP")
	dev := os.Getenv("B2B_RDMA_DEV")
	if os.Getenv("B2B_PAIR") != "1" || role == "" || dev == "" || peerIP == "" {
		t.Skip("B2B_PAIR=1, B2B_ROLE, B2B_PEER_IP and B2B_RDMA_DEV not all set: not a two-VM pair run")
	}
	region := uint64(envInt("B2B_PAIR_REGION", 32<<20))
	log := hclog.New(&hclog.LoggerOptions{Name: "verbs", Level: hclog.Warn, Output: os.Stderr})
	if role == "a" {
		pairReceiver(t, dev, region, log)
	} else {
		pairSender(t, dev, peerIP, region, log)
	}
}

func pairReceiver(t *testing.T, dev string, region uint64, log hclog.Logger) {
	in := &inbound{}
	in.unpin = func() { in.unpins.Add(1) }
	cfg := DefaultConfig()
	cfg.Device = dev
	tr, err := New(cfg, in, log)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	dm := mmapHost(t, int(region))
	reg, err := tr.Register(dm)
	if err != nil {
		t.Fatal(err)
	}
	expect := make([]byte, region)
	ln, err := net.Listen("tcp", ":"+pairPort)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(120 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rd, enc := json.NewDecoder(bufio.NewReader(c)), json.NewEncoder(c)
	if err := enc.Encode(pairMsg{Op: "hello", Key: reg.Key().Key, Addr: reg.Key().Addr, DstSize: region}); err != nil {
		t.Fatal(err)
	}
	for {
		var m pairMsg
		if err := rd.Decode(&m); err != nil {
			t.Fatalf("side channel: %v", err)
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
		case "verify":
			pairFill(m.Seed, expect)
			b := pairLayout(m.Seed, m.Size, m.N, region)
			for i := range b.Src {
				s, d, l := b.Src[i], b.Dst[i], b.Len[i]
				if xxhash.Sum64(expect[s:s+l]) != xxhash.Sum64(dm.Host[d:d+l]) {
					reply.Err = fmt.Sprintf("block %d (size %d, seed %d) differs", i, m.Size, m.Seed)
					break
				}
			}
			clear(dm.Host)
		case "digest": // xxhash of every MiB of the region, for "did anything change"
			for off := 0; off < len(dm.Host); off += 1 << 20 {
				reply.Payload = binary.LittleEndian.AppendUint64(reply.Payload, xxhash.Sum64(dm.Host[off:min(off+1<<20, len(dm.Host))]))
			}
		case "clear":
			clear(dm.Host)
		case "done":
			t.Logf("receiver: %d batches landed, %d bytes", in.batches.Load(), in.bytes.Load())
			enc.Encode(reply)
			return
		}
		if err := enc.Encode(reply); err != nil {
			t.Fatal(err)
		}
	}
}

// sideChannel is the sender's stand-in for the peer's control plane.
type sideChannel struct {
	rd  *json.Decoder
	enc *json.Encoder
}

func (s *sideChannel) call(m pairMsg) (pairMsg, error) {
	if err := s.enc.Encode(m); err != nil {
		return pairMsg{}, err
	}
	var r pairMsg
	if err := s.rd.Decode(&r); err != nil {
		return pairMsg{}, err
	}
	if r.Err != "" {
		return r, fmt.Errorf("receiver: %s", r.Err)
	}
	return r, nil
}

// signal carries the transport's connect signal to the receiver. A
// disconnect from the transport's background goroutine is refused: the side
// channel is strictly request/answer, so the receiver's keepalive frees the
// set instead.
func (s *sideChannel) signal(ctx context.Context, payload []byte) ([]byte, error) {
	var m verbsv1.Signal
	if err := proto.Unmarshal(payload, &m); err != nil || m.GetConnect() == nil {
		return nil, fmt.Errorf("%w: only connect goes over the pair side channel", errs.ErrUnimplemented)
	}
	r, err := s.call(pairMsg{Op: "signal", Payload: payload})
	if err != nil {
		return nil, err
	}
	return r.Payload, nil
}

func parsePairConfig(s string, dev string) (Config, error) {
	c := DefaultConfig()
	c.Device = dev
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return c, fmt.Errorf("%s: %w", kv, err)
		}
		switch k {
		case "qps":
			c.QPsPerPeer = n
		case "signal":
			c.SignalEvery = n
		case "chain":
			c.MaxChain = n
		case "chainbytes":
			c.ChainBytes = n
		case "sge":
			c.MaxSGE = n
		case "inline":
			c.InlineBytes = n
		case "minqp":
			c.MinQPBytes = n
		case "sq":
			c.SQDepth = n
		case "spinus":
			c.PollSpin = time.Duration(n) * time.Microsecond
		default:
			return c, fmt.Errorf("unknown key %q", k)
		}
	}
	return c, nil
}

func pairSender(t *testing.T, dev, peerIP string, region uint64, log hclog.Logger) {
	var c net.Conn
	var err error
	for deadline := time.Now().Add(120 * time.Second); ; {
		if c, err = net.Dial("tcp", net.JoinHostPort(peerIP, pairPort)); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("receiver never answered: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	defer c.Close()
	sc := &sideChannel{rd: json.NewDecoder(bufio.NewReader(c)), enc: json.NewEncoder(c)}
	var hello pairMsg
	if err := sc.rd.Decode(&hello); err != nil {
		t.Fatal(err)
	}
	remote := transport.RemoteRegion{Name: "pair", Size: hello.DstSize, Key: transport.RemoteKey{Key: hello.Key, Addr: hello.Addr}}

	var sizes []uint64
	for _, f := range strings.Split(envOr("B2B_PAIR_SIZES", "128,4096,65536,2097152"), ",") {
		v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, v)
	}
	blocks := envInt("B2B_PAIR_BLOCKS", 2000)
	maxBytes := uint64(envInt("B2B_PAIR_MAXBYTES", 16<<20))
	iters := envInt("B2B_PAIR_ITERS", 3)
	configs := strings.Split(envOr("B2B_PAIR_CONFIGS", "qps=2"), ";")

	sm := mmapHost(t, int(region))
	if os.Getenv("B2B_PAIR_MODE") == "deadline" {
		cfg, err := parsePairConfig(configs[0], dev)
		if err != nil {
			t.Fatal(err)
		}
		pairDeadline(t, cfg, sc, remote, sm, region, sizes[0], peerIP, log)
		sc.call(pairMsg{Op: "done"})
		return
	}
	seed := int64(1)
	for _, cs := range configs {
		cfg, err := parsePairConfig(cs, dev)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := New(cfg, nil, log)
		if err != nil {
			t.Fatal(err)
		}
		src, err := tr.Register(sm)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := tr.Connect(context.Background(), transport.Peer{Address: peerIP, Signal: sc.signal})
		if err != nil {
			t.Fatal(err)
		}
		for _, sz := range sizes {
			n := blocks
			if uint64(n)*sz > maxBytes {
				n = int(max(maxBytes/sz, 4))
			}
			if uint64(n)*sz > region/2 {
				n = int(region / 2 / sz)
			}
			var best, total time.Duration
			var st transport.Stats
			for it := 0; it <= iters; it++ { // iteration 0 warms up
				seed++
				pairFill(seed, sm.Host)
				b := pairLayout(seed, sz, n, region)
				ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
				start := time.Now()
				st, err = transport.Write(ctx, conn, src, remote, b)
				el := time.Since(start)
				cancel()
				if err != nil {
					t.Fatalf("config %q size %d: %v", cs, sz, err)
				}
				if _, err := sc.call(pairMsg{Op: "verify", Seed: seed, Size: sz, N: n}); err != nil {
					t.Fatalf("config %q size %d: %v", cs, sz, err)
				}
				if it == 0 {
					continue
				}
				total += el
				if best == 0 || el < best {
					best = el
				}
			}
			bytes := float64(uint64(n) * sz)
			avg := total / time.Duration(iters)
			fmt.Printf("PAIR config=%q size=%d blocks=%d wrs=%d avg_ms=%.2f best_ms=%.2f avg_MBps=%.2f best_MBps=%.2f kblocks_s=%.1f\n",
				cs, sz, n, st.WorkRequests, avg.Seconds()*1e3, best.Seconds()*1e3, bytes/avg.Seconds()/1e6, bytes/best.Seconds()/1e6,
				float64(n)/avg.Seconds()/1e3)
		}
		conn.Close()
		src.Close()
		tr.Close()
	}
	sc.call(pairMsg{Op: "done"})
}

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

// pairDeadline: a batch far bigger than the send queues (B2B_PAIR_SIZES'
// first size per block, one WR each; "sq=64" in the config keeps the queues
// short so the writer waits for credits, where it looks at the deadline),
// cut off by a
// 150 ms deadline between two hosts (acks take a network round trip, so WRs
// are really in flight), fails with DeadlineExceeded; the receiver's bytes
// sampled right after the error and 2 s later are the same (the QPs were
// moved to ERROR before the error was returned); the next batch, on a fresh
// connection, lands every block.
func pairDeadline(t *testing.T, cfg Config, sc *sideChannel, remote transport.RemoteRegion, sm memory.Memory, region, sz uint64, peerIP string, log hclog.Logger) {
	tr, err := New(cfg, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	src, err := tr.Register(sm)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	connect := func() transport.Conn {
		c, err := tr.Connect(context.Background(), transport.Peer{Address: peerIP, Signal: sc.signal})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	conn := connect()
	const seed = 77
	n := int(region / sz)
	pairFill(seed, sm.Host)
	b := pairLayout(seed, sz, n, region) // one WR per block, scattered
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	start := time.Now()
	_, err = transport.Write(ctx, conn, src, remote, b)
	werr := err
	el := time.Since(start)
	cancel()
	d1, derr := sc.call(pairMsg{Op: "digest"})
	if err == nil {
		t.Skipf("%d bytes landed within the 150 ms deadline (%v): the link is too fast for this test", region, el)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want DeadlineExceeded", err)
	}
	if derr != nil {
		t.Fatal(derr)
	}
	t.Logf("cut off after %v: %v", el, err)
	time.Sleep(2 * time.Second)
	d2, err := sc.call(pairMsg{Op: "digest"})
	if err != nil {
		t.Fatal(err)
	}
	changed := 0
	for k := 0; k+8 <= len(d1.Payload); k += 8 {
		if !bytes.Equal(d1.Payload[k:k+8], d2.Payload[k:k+8]) {
			changed++
		}
	}
	fmt.Printf("DEADLINE cut_off_after_ms=%.0f mib_changed_after_error=%d of %d\n", el.Seconds()*1e3, changed, len(d1.Payload)/8)
	if changed > 0 {
		t.Fatalf("%d of %d MiB of the destination changed in the 2 s after DeadlineExceeded was returned: WRITEs went on landing", changed, len(d1.Payload)/8)
	}
	if conn.Err() != nil { // the stop's fallback (see afterStop)
		if !errors.Is(werr, errs.ErrAborted) {
			t.Fatalf("the connection broke but the batch's error does not say so: %v", werr)
		}
		conn.Close()
		conn = connect()
	}
	defer conn.Close()
	if _, err := sc.call(pairMsg{Op: "clear"}); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Second)
	defer cancel2()
	if _, err := transport.Write(ctx2, conn, src, remote, b); err != nil {
		t.Fatalf("the batch after the cut-off one: %v", err)
	}
	if _, err := sc.call(pairMsg{Op: "verify", Seed: seed, Size: sz, N: n}); err != nil {
		t.Fatalf("the batch after the cut-off one: %v", err)
	}
	t.Logf("the next batch landed and verified all %d blocks", n)
}
