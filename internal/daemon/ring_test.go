package daemon_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/daemon"
	"github.com/b2bd/b2bd/internal/ring"
)

// ringPair is two daemons, a with a submit socket, and a prepared plan of
// 64 blocks of 4 KiB from a's src to b's "kv".
type ringPair struct {
	a, b     *testNode
	sock     string
	src, dst *client.HostRegion
	plan     *client.Plan
	srcOff   []uint64
}

const ringBlocks, ringBlock = 64, 4096

func newRingPair(t *testing.T) *ringPair {
	t.Helper()
	p := &ringPair{sock: filepath.Join(t.TempDir(), "submit.sock")}
	p.a = startNode(t, "a", func(c *daemon.Config) { c.SubmitSocket = p.sock })
	p.b = startNode(t, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	if p.src, err = p.a.c.RegisterHost(ctx, 2*ringBlocks*ringBlock, ""); err != nil {
		t.Fatal(err)
	}
	if p.dst, err = p.b.c.RegisterHost(ctx, 2*ringBlocks*ringBlock, "kv"); err != nil {
		t.Fatal(err)
	}
	p.srcOff = make([]uint64, ringBlocks)
	for i := range p.srcOff {
		p.srcOff[i] = uint64(i) * 2 * ringBlock
	}
	if p.plan, err = p.a.c.Prepare(ctx, client.Transfer{SrcRegion: p.src.Id, Peer: p.b.d.PeerAddr(), DstRegion: "kv",
		Blocks: client.Descriptors{Src: p.srcOff, Dst: p.srcOff, BlockLength: ringBlock}}); err != nil {
		t.Fatal(err)
	}
	return p
}

// fill writes fresh random bytes into the source blocks.
func (p *ringPair) fill(seed uint64) {
	r := rand.New(rand.NewPCG(seed, 7))
	for i := range p.src.Bytes {
		p.src.Bytes[i] = byte(r.Uint32())
	}
}

// landed checks that every source block arrived.
func (p *ringPair) landed(t *testing.T, what string) {
	t.Helper()
	for i, o := range p.srcOff {
		if !bytes.Equal(p.src.Bytes[o:o+ringBlock], p.dst.Bytes[o:o+ringBlock]) {
			t.Fatalf("%s: block %d differs at the destination", what, i)
		}
	}
}

// healthy: a fresh ring pings and submits (bytes checked), and gRPC works.
func (p *ringPair) healthy(t *testing.T, seed uint64) {
	t.Helper()
	r, err := client.DialRing(p.sock)
	if err != nil {
		t.Fatalf("a fresh ring: %v", err)
	}
	defer r.Close()
	if err := r.Ping(); err != nil {
		t.Fatalf("ring ping: %v", err)
	}
	p.fill(seed)
	res, err := r.Submit(p.plan)
	if err != nil || res.Blocks != ringBlocks || res.Bytes != ringBlocks*ringBlock {
		t.Fatalf("ring submit: %+v, %v", res, err)
	}
	p.landed(t, "ring submit")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.a.c.Ping(ctx); err != nil {
		t.Fatalf("gRPC ping: %v", err)
	}
}

// TestRingSubmit: pings and submits over the ring, also concurrent ones,
// land the bytes; a refused submit carries SubmitTransfer's code and message.
func TestRingSubmit(t *testing.T) {
	p := newRingPair(t)
	p.healthy(t, 1)
	r, err := client.DialRing(p.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p.fill(2)
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 20 {
				if k%2 == 0 {
					if err := r.Ping(); err != nil {
						errc <- fmt.Errorf("goroutine %d ping %d: %w", g, k, err)
						return
					}
					continue
				}
				tag, err := r.Start(p.plan)
				if err == nil {
					_, err = r.Wait(tag)
				}
				if err != nil {
					errc <- fmt.Errorf("goroutine %d submit %d: %w", g, k, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	p.landed(t, "concurrent ring submits")

	// Far more started than the completion ring holds, before any Wait:
	// the client must keep draining, or the daemon drops the ring.
	tags := make([]uint64, 3*ring.DefaultEntries)
	for i := range tags {
		if tags[i], err = r.Start(p.plan); err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
	}
	for i, tag := range tags {
		if res, err := r.Wait(tag); err != nil || res.Blocks != ringBlocks {
			t.Fatalf("wait %d: %+v, %v", i, res, err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bogus := *p.plan
	bogus.Handle += 1000
	_, gerr := bogus.Submit(ctx)
	_, rerr := r.Submit(&bogus)
	if status.Code(rerr) != codes.NotFound || status.Code(gerr) != status.Code(rerr) ||
		status.Convert(gerr).Message() != status.Convert(rerr).Message() {
		t.Fatalf("unknown plan: ring says %v, gRPC says %v", rerr, gerr)
	}
	if _, err := r.Wait(12345); err == nil {
		t.Fatal("Wait on a tag never started returned no error")
	}
}

// hostileRing is a client that speaks the ring handshake itself and then
// does what it likes with the mapping.
func hostileRing(t *testing.T, sock string) (*net.UnixConn, *ring.Region) {
	t.Helper()
	return hostileRingWith(t, sock, ring.Hello, 8|8<<32) // small rings: easy to overrun
}

// hostileRingWith asks with a Hello tagged tag and the given sizes field.
func hostileRingWith(t *testing.T, sock string, tag, sizes uint64) (*net.UnixConn, *ring.Region) {
	t.Helper()
	uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	var hello [16]byte
	binary.LittleEndian.PutUint64(hello[:], tag)
	binary.LittleEndian.PutUint64(hello[8:], sizes)
	if _, err := uc.Write(hello[:]); err != nil {
		t.Fatal(err)
	}
	var ans [48]byte
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := uc.ReadMsgUnix(ans[:], oob)
	if err != nil {
		t.Fatal(err)
	}
	cms, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(cms) != 1 {
		t.Fatalf("control messages %v, %v", cms, err)
	}
	fds, err := unix.ParseUnixRights(&cms[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("rights %v, %v", fds, err)
	}
	reg, err := ring.Map(fds[0])
	unix.Close(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uc.Close(); reg.Close() })
	return uc, reg
}

// dropped waits for the daemon's parting frame and returns its code and
// message; the socket must close after it.
func dropped(t *testing.T, uc *net.UnixConn) (codes.Code, string) {
	t.Helper()
	uc.SetReadDeadline(time.Now().Add(20 * time.Second))
	var ans [48]byte
	if _, err := io.ReadFull(uc, ans[:]); err != nil {
		t.Fatalf("no parting frame: %v", err)
	}
	msg := make([]byte, binary.LittleEndian.Uint32(ans[12:]))
	if _, err := io.ReadFull(uc, msg); err != nil {
		t.Fatal(err)
	}
	if _, err := uc.Read(ans[:]); err != io.EOF {
		t.Fatalf("socket after the parting frame: %v, want EOF", err)
	}
	return codes.Code(binary.LittleEndian.Uint32(ans[8:])), string(msg)
}

// TestRingHostile: garbage records are refused one by one; broken indices
// and a client that stops reading its completions lose their ring, and
// the daemon serves a fresh ring and gRPC after each.
func TestRingHostile(t *testing.T) {
	p := newRingPair(t)
	le := binary.LittleEndian
	t.Run("garbage records", func(t *testing.T) {
		_, reg := hostileRing(t, p.sock)
		recs := [][]byte{make([]byte, ring.RecLen), make([]byte, ring.RecLen), make([]byte, ring.RecLen)}
		le.PutUint64(recs[0], 11)
		le.PutUint16(recs[0][8:], 77) // op 77
		le.PutUint64(recs[1], 12)
		le.PutUint16(recs[1][8:], uint16(ring.OpSubmit))
		le.PutUint32(recs[1][12:], 1<<30) // length
		ring.Request{Tag: 13, Op: ring.OpSubmit, Handle: p.plan.Handle, Patch: 8}.Encode(recs[2])
		for i, r := range recs {
			copy(reg.SQ.Slot(uint32(i)), r)
		}
		reg.SQ.Publish(3)
		want := []struct {
			tag  uint64
			code codes.Code
			msg  string
		}{{11, codes.InvalidArgument, "op 77 unknown"}, {12, codes.InvalidArgument, "length 1073741824"}, {13, codes.Unimplemented, "offset patch 8"}}
		deadline := time.Now().Add(20 * time.Second)
		for reg.CQ.Tail() < 3 && time.Now().Before(deadline) {
			reg.CQ.Wait(reg.CQ.Tail(), 0, 100*time.Millisecond)
		}
		for i, w := range want {
			c, err := ring.DecodeCompletion(reg.CQ.Slot(uint32(i)))
			if err != nil || c.Tag != w.tag || codes.Code(c.Code) != w.code || !strings.Contains(c.Msg, w.msg) {
				t.Errorf("completion %d: %+v, %v; want tag %d %v %q", i, c, err, w.tag, w.code, w.msg)
			}
		}
	})
	t.Run("full ring left unread", func(t *testing.T) {
		// Both rings full and never read: the ring stays (its owner may
		// come back), and other clients are served meanwhile.
		_, reg := hostileRing(t, p.sock)
		for tail := uint32(0); tail < 16; tail++ {
			for {
				if f, err := reg.SQ.Free(tail); err == nil && f > 0 {
					break
				}
				time.Sleep(time.Millisecond)
			}
			ring.Request{Tag: uint64(tail + 1), Op: ring.OpPing}.Encode(reg.SQ.Slot(tail))
			reg.SQ.Publish(tail + 1)
		}
		p.healthy(t, 4)
		if got := reg.CQ.Tail(); got != 8 {
			t.Fatalf("completion tail %d, want 8 (the ring full, the rest parked)", got)
		}
		reg.CQ.Consumed(8) // read them: the parked ones follow
		deadline := time.Now().Add(20 * time.Second)
		for reg.CQ.Tail() != 16 && time.Now().Before(deadline) {
			reg.CQ.Wait(reg.CQ.Tail(), 0, 100*time.Millisecond)
		}
		if c, err := ring.DecodeCompletion(reg.CQ.Slot(15)); reg.CQ.Tail() != 16 || err != nil || c.Tag != 16 || c.Code != 0 {
			t.Fatalf("after reading: completion tail %d, last %+v, %v", reg.CQ.Tail(), c, err)
		}
	})
	for _, tc := range []struct {
		name string
		do   func(reg *ring.Region)
		code codes.Code
		msg  string
	}{
		{"tail beyond the ring", func(reg *ring.Region) { reg.SQ.Publish(1000) }, codes.InvalidArgument, "beyond the ring"},
		{"tail backwards", func(reg *ring.Region) {
			ring.Request{Tag: 1, Op: ring.OpPing}.Encode(reg.SQ.Slot(0))
			reg.SQ.Publish(1)
			for reg.CQ.Tail() == 0 {
				reg.CQ.Wait(0, 0, 100*time.Millisecond)
			}
			reg.SQ.Publish(0)
		}, codes.InvalidArgument, "moved backwards"},
		{"completion head past tail", func(reg *ring.Region) {
			reg.CQ.Consumed(99)
			ring.Request{Tag: 1, Op: ring.OpPing}.Encode(reg.SQ.Slot(0))
			reg.SQ.Publish(1)
		}, codes.InvalidArgument, "moved past the tail"},
		{"completions never read", func(reg *ring.Region) {
			// Overrun: post pings as fast as the ring takes them, never
			// consuming a completion, until the daemon stops taking them.
			stuck := time.Now()
			for tail := uint32(0); tail < 10000 && time.Since(stuck) < 2*time.Second; {
				if f, err := reg.SQ.Free(tail); err != nil || f == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				ring.Request{Tag: uint64(tail + 1), Op: ring.OpPing}.Encode(reg.SQ.Slot(tail))
				tail++
				reg.SQ.Publish(tail)
				stuck = time.Now()
			}
		}, codes.ResourceExhausted, "stopped reading"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			uc, reg := hostileRing(t, p.sock)
			did := make(chan struct{})
			go func() { defer close(did); tc.do(reg) }()
			code, msg := dropped(t, uc)
			<-did // before the mapping goes
			if code != tc.code || !strings.Contains(msg, tc.msg) {
				t.Fatalf("dropped with %v %q, want %v containing %q", code, msg, tc.code, tc.msg)
			}
			p.healthy(t, 3)
		})
	}
}

// TestRingKilled: a client killed -9 while posting leaves a daemon that
// serves another client's ring and gRPC.
func TestRingKilled(t *testing.T) {
	if sock := os.Getenv("B2B_RING_CHILD"); sock != "" {
		ringChild(sock)
		return
	}
	p := newRingPair(t)
	for k := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRingKilled$")
		cmd.Env = append(os.Environ(), "B2B_RING_CHILD="+p.sock)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line := make([]byte, 6)
		if _, err := io.ReadFull(out, line); err != nil || string(line) != "ready\n" {
			t.Fatalf("child %d: %q, %v", k, line, err)
		}
		time.Sleep(time.Duration(k) * 5 * time.Millisecond) // mid-post, at varied points
		cmd.Process.Kill()
		cmd.Wait()
		p.healthy(t, uint64(10+k))
	}
}

// ringChild posts pings and half-written records without end.
func ringChild(sock string) {
	r, err := client.DialRing(sock)
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	fmt.Print("ready\n")
	for {
		tag, err := r.Start(&client.Plan{Handle: 1 << 40})
		if err != nil {
			os.Exit(1)
		}
		r.Ping()
		r.Wait(tag)
	}
}
