package daemon_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/ring"
)

// TestRingArmed: a block record armed on a key note (flags arena|note)
// posts nothing until a peer's key note naming its key lands on the note
// region, then moves its blocks; a second record under its tag, a trigger
// on a region that is not there, and a trigger outside the arena are
// refused in their completions; a refused record holds nothing (the note
// region deregisters once the armed one ended); the ring serves on.
func TestRingArmed(t *testing.T) {
	p := newRingPair(t)
	rt := arenaRoute(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	mbox, err := p.a.c.RegisterHost(ctx, 4096, "mbox")
	if err != nil {
		t.Fatal(err)
	}
	p.fill(11)
	clear(p.dst.Bytes)
	_, reg := hostileRingWith(t, p.sock, ring.HelloArena, 0)
	size := uint64(len(reg.Arena))
	le := binary.LittleEndian
	le.PutUint32(reg.Arena[0:], 3) // local block 3 -> remote block 1
	le.PutUint32(reg.Arena[4:], 1)
	trig := ring.AppendTrigger(nil, mbox.Id, []byte("k1"))
	copy(reg.Arena[64:], trig)
	gone := ring.AppendTrigger(nil, "r999", []byte("k1"))
	copy(reg.Arena[256:], gone)
	armed := func(tag, off uint64, n int) ring.Request {
		return ring.Request{Tag: tag, Op: ring.OpBlocks, Handle: rt.Handle, N: 1, Arena: true, TimeoutMs: 30_000,
			Armed: true, TrigOff: off, TrigLen: uint32(n)}
	}
	recs := []ring.Request{
		armed(1, 64, len(trig)),
		armed(1, 64, len(trig)), // the same tag while the first waits
		armed(2, 256, len(gone)),
		armed(3, size-4, len(trig)),
		{Tag: 4, Op: ring.OpPing},
	}
	for i, r := range recs {
		r.Encode(reg.SQ.Slot(uint32(i)))
	}
	reg.SQ.Publish(uint32(len(recs)))
	want := []struct {
		code codes.Code
		msg  string
	}{
		{codes.InvalidArgument, "ring blocks tag 1 is already in flight"},
		{codes.NotFound, `after.note_region_id "r999"`},
		{codes.InvalidArgument, fmt.Sprintf("ring blocks trig_off 1048572 + trig_len %d ends past the arena of 1048576 bytes", len(trig))},
		{codes.OK, ""},
	}
	for i, c := range completions(t, reg, 4) {
		if codes.Code(c.Code) != want[i].code || !strings.Contains(c.Msg, want[i].msg) {
			t.Errorf("completion %d: %+v; want %v %q", i, c, want[i].code, want[i].msg)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if reg.CQ.Tail() != 4 || !bytes.Equal(p.dst.Bytes[ringBlock:2*ringBlock], make([]byte, ringBlock)) {
		t.Fatal("the armed record ran before its key note")
	}
	note, err := client.KeyNote([][]byte{[]byte("k0"), []byte("k1")}, []byte("ready"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.b.c.BatchTransfer(ctx, client.Transfer{SrcRegion: p.dst.Id, Peer: p.a.d.PeerAddr(), DstRegion: "mbox",
		Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{0}, BlockLength: 8}, Notification: note}); err != nil {
		t.Fatal(err)
	}
	c := completions(t, reg, 5)[4]
	if c.Tag != 1 || c.Code != 0 || c.Blocks != 1 {
		t.Fatalf("the armed record: %+v", c)
	}
	if !bytes.Equal(p.dst.Bytes[ringBlock:2*ringBlock], p.src.Bytes[3*ringBlock:4*ringBlock]) {
		t.Fatal("the armed record's block did not land where its ids say")
	}
	if err := p.a.c.Deregister(ctx, mbox.Id); err != nil {
		t.Fatalf("the note region is still held: %v", err)
	}
	p.healthy(t, 12)
}
