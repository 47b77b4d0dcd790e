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
	"google.golang.org/grpc/status"

	"github.com/b2bd/b2bd/client"
	"github.com/b2bd/b2bd/internal/ring"
)

// arenaRoute binds a route between layouts over the pair's regions: a's
// src and b's "kv" as 2*ringBlocks blocks of ringBlock bytes.
func arenaRoute(t *testing.T, p *ringPair) *client.Route {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seg := func(id string) []client.Segment {
		return []client.Segment{{RegionID: id, BlockLen: ringBlock, Stride: ringBlock}}
	}
	if _, err := p.a.c.RegisterLayout(ctx, client.Layout{Name: "ls", Segments: seg(p.src.Id), NumBlocks: 2 * ringBlocks}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.b.c.RegisterLayout(ctx, client.Layout{Name: "ld", Segments: seg(p.dst.Id), NumBlocks: 2 * ringBlocks, Export: "ld"}); err != nil {
		t.Fatal(err)
	}
	rt, err := p.a.c.BindRoute(ctx, client.Blocks{LocalLayout: "ls", Peer: p.b.d.PeerAddr(), RemoteLayout: "ld"})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// publish writes recs into reg's submission ring from its first slot and
// publishes them.
func publish(reg *ring.Region, recs []ring.Request) {
	for i, r := range recs {
		r.Encode(reg.SQ.Slot(uint32(i)))
	}
	reg.SQ.Publish(uint32(len(recs)))
}

// wantCompletion is a record's expected answer: its code and a part of
// its message.
type wantCompletion struct {
	code codes.Code
	msg  string
}

// completions waits for n completions of reg and returns them.
func completions(t *testing.T, reg *ring.Region, n uint32) []ring.Completion {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for reg.CQ.Tail() < n && time.Now().Before(deadline) {
		reg.CQ.Wait(reg.CQ.Tail(), 0, 100*time.Millisecond)
	}
	if got := reg.CQ.Tail(); got < n {
		t.Fatalf("%d completions in 20 s, want %d", got, n)
	}
	var out []ring.Completion
	for i := range n {
		c, err := ring.DecodeCompletion(reg.CQ.Slot(i))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// TestRingArenaHostile: a block record that points outside the arena is
// refused in its completion, naming the field, its value and the arena's
// size; the ring serves on.
func TestRingArenaHostile(t *testing.T) {
	p := newRingPair(t)
	_, reg := hostileRingWith(t, p.sock, ring.HelloArena, 0)
	size := uint64(len(reg.Arena))
	if size != ring.DefaultArena {
		t.Fatalf("arena of %d bytes, want the default %d", size, ring.DefaultArena)
	}
	recs := []ring.Request{
		{Tag: 1, Op: ring.OpBlocks, Handle: 5, N: 1, Arena: true, IDsOff: size - 4},
		{Tag: 2, Op: ring.OpBlocks, Handle: 5, N: 1, Arena: true, IDsOff: 1<<64 - 4},
		{Tag: 3, Op: ring.OpBlocks, Handle: 5, N: 1, Arena: true, NoteOff: size - 10, NoteLen: 11},
		{Tag: 4, Op: ring.OpBlocks, Handle: 5, N: ring.MaxArenaIDs, Arena: true},
		{Tag: 5, Op: ring.OpBlocks, Handle: 5, N: ring.MaxArenaIDs + 1, Arena: true},
		{Tag: 6, Op: ring.OpPing},
	}
	publish(reg, recs)
	want := []wantCompletion{
		{codes.InvalidArgument, "ring blocks ids_off 1048572 + 8 bytes of ids (count 1) ends past the arena of 1048576 bytes"},
		{codes.InvalidArgument, "ids_off 18446744073709551612"},
		{codes.InvalidArgument, "note_off 1048566 + note_len 11 ends past the arena of 1048576 bytes"},
		{codes.InvalidArgument, "ids_off 0 + 134217728 bytes of ids (count 16777216) ends past the arena of 1048576 bytes"},
		{codes.InvalidArgument, "count 16777217: want 1 to 16777216 id pairs"},
		{codes.OK, ""},
	}
	for i, c := range completions(t, reg, uint32(len(recs))) {
		if c.Tag != uint64(i+1) || codes.Code(c.Code) != want[i].code || !strings.Contains(c.Msg, want[i].msg) {
			t.Errorf("completion %d: %+v; want %v %q", i, c, want[i].code, want[i].msg)
		}
	}
	p.healthy(t, 9)
}

// TestRingWithoutArena: an older client's Hello gets the ring laid out as
// before (no arena); its arena records are refused, and it serves on.
func TestRingWithoutArena(t *testing.T) {
	p := newRingPair(t)
	_, reg := hostileRing(t, p.sock)
	if len(reg.Arena) != 0 {
		t.Fatalf("a Hello without an arena got %d arena bytes", len(reg.Arena))
	}
	ring.Request{Tag: 1, Op: ring.OpBlocks, Handle: 5, N: 1, Arena: true}.Encode(reg.SQ.Slot(0))
	reg.SQ.Publish(1)
	if c := completions(t, reg, 1)[0]; codes.Code(c.Code) != codes.InvalidArgument || !strings.Contains(c.Msg, "past the arena of 0 bytes") {
		t.Fatalf("completion %+v", c)
	}
	p.healthy(t, 5)
}

// TestRingArenaRewrite: once the daemon took a record (its head passed
// it), rewriting the arena cannot change what it moves.
func TestRingArenaRewrite(t *testing.T) {
	p := newRingPair(t)
	rt := arenaRoute(t, p)
	p.fill(3)
	clear(p.dst.Bytes)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w, err := p.b.c.Watch(ctx, p.dst.Id)
	if err != nil {
		t.Fatal(err)
	}
	_, reg := hostileRingWith(t, p.sock, ring.HelloArena, 0)
	le := binary.LittleEndian
	const n = 8
	put := func(first uint32) { // local ids first.., remote ids 0..n-1
		for i := range uint32(n) {
			le.PutUint32(reg.Arena[4*i:], first+i)
			le.PutUint32(reg.Arena[4*(n+i):], i)
		}
	}
	put(0)
	copy(reg.Arena[8*n:], "note")
	ring.Request{Tag: 1, Op: ring.OpBlocks, Handle: rt.Handle, N: n, Arena: true, NoteOff: 8 * n, NoteLen: 4}.Encode(reg.SQ.Slot(0))
	reg.SQ.Publish(1)
	for deadline := time.Now().Add(20 * time.Second); reg.SQ.Head() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the daemon never took the record")
		}
		time.Sleep(10 * time.Microsecond)
	}
	put(n) // too late: the daemon copied the ids before its head moved
	clear(reg.Arena[8*n : 8*n+4])
	c := completions(t, reg, 1)[0]
	if c.Code != 0 || c.Blocks != n || c.Bytes != n*ringBlock {
		t.Fatalf("completion %+v", c)
	}
	for i := range n {
		got, want := p.dst.Bytes[i*ringBlock:(i+1)*ringBlock], p.src.Bytes[i*ringBlock:(i+1)*ringBlock]
		if !bytes.Equal(got, want) {
			t.Fatalf("block %d: not source block %d: the rewrite reached the transfer", i, i)
		}
	}
	if got, err := w.Recv(); err != nil || string(got.Notification) != "note" {
		t.Fatalf("notification %v, %v; want the one of the record as taken", got, err)
	}
}

// TestRingBatchHostile: batch records whose blob lies outside the arena or
// whose header does not add up are refused in their completion, naming
// the field, its value and the limit; a ring without an arena refuses
// them; a well-formed batch among them lands, and the ring serves on.
func TestRingBatchHostile(t *testing.T) {
	p := newRingPair(t)
	_, reg := hostileRingWith(t, p.sock, ring.HelloArena, 0)
	size := uint64(len(reg.Arena))
	good := ring.BatchOut{Src: p.src.Id, Peer: p.b.d.PeerAddr(), Dst: "kv", BlockLength: ringBlock,
		SrcOffsets: []uint64{0, ringBlock}, DstOffsets: []uint64{ringBlock, 0}}
	n := good.Len()
	good.Put(reg.Arena[4096:])
	bad := reg.Arena[8192 : 8192+n]
	copy(bad, reg.Arena[4096:4096+n])
	binary.LittleEndian.PutUint32(bad[24:], 9) // src_offsets 9 bytes: the header no longer adds up
	long := reg.Arena[12288 : 12288+n]
	copy(long, reg.Arena[4096:4096+n])
	binary.LittleEndian.PutUint16(long[6:], 2000) // a 2000-byte peer
	p.fill(4)
	clear(p.dst.Bytes)
	recs := []ring.Request{
		{Tag: 1, Op: ring.OpBatch, BlobOff: size - 8, BlobLen: 40},
		{Tag: 2, Op: ring.OpBatch, BlobOff: 1<<64 - 8, BlobLen: 40},
		{Tag: 3, Op: ring.OpBatch, BlobOff: 8192, BlobLen: uint32(n)},
		{Tag: 4, Op: ring.OpBatch, BlobOff: 12288, BlobLen: uint32(n)},
		{Tag: 5, Op: ring.OpBatch, BlobOff: 4096, BlobLen: uint32(n)},
		{Tag: 6, Op: ring.OpPing},
	}
	publish(reg, recs)
	want := []wantCompletion{
		{codes.InvalidArgument, "ring batch blob_off 1048568 + blob_len 40 ends past the arena of 1048576 bytes"},
		{codes.InvalidArgument, "blob_off 18446744073709551608"},
		{codes.InvalidArgument, "but its header adds up to"},
		{codes.InvalidArgument, "peer is 2000 bytes, over the limit of 1024"},
		{codes.OK, "tcp"},
		{codes.OK, ""},
	}
	got := map[uint64]ring.Completion{} // in completion order: the batch ends after the ping
	for _, c := range completions(t, reg, uint32(len(recs))) {
		got[c.Tag] = c
	}
	for i, w := range want {
		c, ok := got[uint64(i+1)]
		if !ok || codes.Code(c.Code) != w.code || !strings.Contains(c.Msg, w.msg) {
			t.Errorf("tag %d: %+v (seen %t); want %v %q", i+1, c, ok, w.code, w.msg)
		}
	}
	if c := got[5]; c.Blocks != 2 {
		t.Errorf("the good batch: %d blocks, want 2", c.Blocks)
	}
	if !bytes.Equal(p.dst.Bytes[ringBlock:2*ringBlock], p.src.Bytes[:ringBlock]) || !bytes.Equal(p.dst.Bytes[:ringBlock], p.src.Bytes[ringBlock:2*ringBlock]) {
		t.Error("the good batch's blocks did not land where its descriptors say")
	}
	p.healthy(t, 9)

	// A ring without an arena: a batch record has nowhere to point.
	_, bare := hostileRing(t, p.sock)
	ring.Request{Tag: 1, Op: ring.OpBatch, BlobLen: 40}.Encode(bare.SQ.Slot(0))
	bare.SQ.Publish(1)
	if c := completions(t, bare, 1)[0]; codes.Code(c.Code) != codes.InvalidArgument || !strings.Contains(c.Msg, "past the arena of 0 bytes") {
		t.Fatalf("batch on a ring without an arena: %+v", c)
	}
	p.healthy(t, 10)
}

// TestRingArmed: a block record armed on a key note (flags arena|note)
// posts nothing until a peer's key note naming its key lands on the note
// region, then moves its blocks; a second record under its tag, a trigger
// on a region that is not there, and a trigger outside the arena are
// refused in their completions; a refused record holds nothing (the note
// region deregisters once the armed one ended); the ring serves on.
// armedRing is what the armed-record tests share: a ring pair and its
// route, a note region of a's (exported as export; "" none), fresh source
// bytes and an empty destination, and a raw ring with one id pair in its
// arena at 0 (local block local -> remote block 1) and a trigger on key
// at 64.
func armedRing(t *testing.T, ctx context.Context, export string, key string, local uint32, seed uint64) (*ringPair, *client.Route, *client.HostRegion, *ring.Region, []byte) {
	t.Helper()
	p := newRingPair(t)
	rt := arenaRoute(t, p)
	note, err := p.a.c.RegisterHost(ctx, 4096, export)
	if err != nil {
		t.Fatal(err)
	}
	p.fill(seed)
	clear(p.dst.Bytes)
	_, reg := hostileRingWith(t, p.sock, ring.HelloArena, 0)
	binary.LittleEndian.PutUint32(reg.Arena[0:], local)
	binary.LittleEndian.PutUint32(reg.Arena[4:], 1)
	trig := ring.AppendTrigger(nil, note.Id, []byte(key))
	copy(reg.Arena[64:], trig)
	return p, rt, note, reg, trig
}

func TestRingArmed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, rt, mbox, reg, trig := armedRing(t, ctx, "mbox", "k1", 3, 11)
	size := uint64(len(reg.Arena))
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
	publish(reg, recs)
	want := []wantCompletion{
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

// TestRingNotify: a notify record delivers a note to one of the caller's
// regions: its key note fires a transfer armed there on the key, on the
// same ring; a region that is not there and a blob past the arena are
// refused in their completions. NotifyRegion over gRPC reaches the
// region's watchers with sender "local".
func TestRingNotify(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, rt, sig, reg, trig := armedRing(t, ctx, "", "go", 2, 21)
	size := uint64(len(reg.Arena))
	note, err := client.KeyNote([][]byte{[]byte("go")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	fire, err := ring.AppendNotify(nil, sig.Id, note)
	if err != nil {
		t.Fatal(err)
	}
	copy(reg.Arena[256:], fire)
	gone, _ := ring.AppendNotify(nil, "r999", note)
	copy(reg.Arena[512:], gone)
	recs := []ring.Request{
		{Tag: 1, Op: ring.OpBlocks, Handle: rt.Handle, N: 1, Arena: true, TimeoutMs: 30_000, Armed: true, TrigOff: 64, TrigLen: uint32(len(trig))},
		{Tag: 2, Op: ring.OpNotify, BlobOff: 256, BlobLen: uint32(len(fire))},
		{Tag: 3, Op: ring.OpNotify, BlobOff: 512, BlobLen: uint32(len(gone))},
		{Tag: 4, Op: ring.OpNotify, BlobOff: size - 4, BlobLen: uint32(len(fire))},
		{Tag: 5, Op: ring.OpPing},
	}
	publish(reg, recs)
	want := map[uint64]wantCompletion{
		1: {codes.OK, ""}, 2: {codes.OK, ""}, 3: {codes.NotFound, `"r999"`},
		4: {codes.InvalidArgument, fmt.Sprintf("ring notify blob_off %d + blob_len %d ends past the arena of %d bytes", size-4, len(fire), size)},
		5: {codes.OK, ""},
	}
	for _, c := range completions(t, reg, 5) {
		w := want[c.Tag]
		if codes.Code(c.Code) != w.code || !strings.Contains(c.Msg, w.msg) {
			t.Errorf("completion of tag %d: %+v; want %v %q", c.Tag, c, w.code, w.msg)
		}
		delete(want, c.Tag)
	}
	if len(want) != 0 {
		t.Fatalf("no completion for %v", want)
	}
	if !bytes.Equal(p.dst.Bytes[ringBlock:2*ringBlock], p.src.Bytes[2*ringBlock:3*ringBlock]) {
		t.Fatal("the transfer armed on the local key did not land")
	}
	// Over gRPC, to a watched region: its watcher gets the note as "local".
	box, err := p.a.c.RegisterHost(ctx, 4096, "box")
	if err != nil {
		t.Fatal(err)
	}
	w, err := p.a.c.Watch(ctx, box.Id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Header(); err != nil {
		t.Fatal(err)
	}
	if n, err := p.a.c.NotifyRegion(ctx, box.Id, []byte("hi")); err != nil || n != 1 {
		t.Fatalf("NotifyRegion: %d watchers, %v", n, err)
	}
	got, err := w.Recv()
	if err != nil || string(got.GetNotification()) != "hi" || got.GetSender() != "local" || got.GetRegion() != "box" {
		t.Fatalf("watcher got %v, %v", got, err)
	}
	if _, err := p.a.c.NotifyRegion(ctx, box.Id, nil); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "notification is 0 bytes: want 1 to 4096") {
		t.Fatalf("an empty note: %v", err)
	}
	p.healthy(t, 22)
}

// TestRingWatch: a watch record subscribes to an exported region of the
// caller's: an empty note record says so, then each peer's note comes back
// whole, in order, cut in note records (a 1,000-byte one takes six); a
// cancel ends it with Canceled; an unexported region and one not there are
// refused; the ring serves on.
func TestRingWatch(t *testing.T) {
	p := newRingPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	box, err := p.a.c.RegisterHost(ctx, 4096, "wbox")
	if err != nil {
		t.Fatal(err)
	}
	hidden, err := p.a.c.RegisterHost(ctx, 4096, "")
	if err != nil {
		t.Fatal(err)
	}
	_, reg := hostileRingWith(t, p.sock, ring.HelloArena, 0)
	copy(reg.Arena[0:], box.Id)
	copy(reg.Arena[64:], hidden.Id)
	copy(reg.Arena[128:], "r999")
	recs := []ring.Request{
		{Tag: 1, Op: ring.OpWatch, BlobOff: 0, BlobLen: uint32(len(box.Id))},
		{Tag: 2, Op: ring.OpWatch, BlobOff: 64, BlobLen: uint32(len(hidden.Id))},
		{Tag: 3, Op: ring.OpWatch, BlobOff: 128, BlobLen: 4},
	}
	publish(reg, recs)
	got := map[uint64]ring.Completion{}
	for _, c := range completions(t, reg, 3) {
		got[c.Tag] = c
	}
	if c := got[1]; c.Code != ring.CodeNote || c.Wire != 0 {
		t.Fatalf("the watch's first record: %+v; want an empty note record", c)
	}
	if c := got[2]; codes.Code(c.Code) != codes.FailedPrecondition || !strings.Contains(c.Msg, "is not exported") {
		t.Fatalf("an unexported region: %+v", c)
	}
	if c := got[3]; codes.Code(c.Code) != codes.NotFound || !strings.Contains(c.Msg, `"r999"`) {
		t.Fatalf("a region not there: %+v", c)
	}
	notes := [][]byte{[]byte("first"), bytes.Repeat([]byte("0123456789"), 100), []byte("third")}
	for _, n := range notes {
		if _, err := p.b.c.BatchTransfer(ctx, client.Transfer{SrcRegion: p.dst.Id, Peer: p.a.d.PeerAddr(), DstRegion: "wbox",
			Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{0}, BlockLength: 8}, Notification: n}); err != nil {
			t.Fatal(err)
		}
	}
	// 1 + 6 + 1 note records after the first three completions.
	var frame []byte
	var seen [][]byte
	for _, c := range completions(t, reg, 3+1+6+1)[3:] {
		if c.Tag != 1 || c.Code != ring.CodeNote || c.Total != int64(len(frame)) {
			t.Fatalf("note record %+v after %d bytes of its frame", c, len(frame))
		}
		frame = append(frame, c.Msg...)
		if int64(len(frame)) == c.Wire {
			n, err := ring.DecodeNoteFrame(frame)
			if err != nil || n.Sender != "b" || n.Region != "wbox" || n.Dropped != 0 {
				t.Fatalf("frame %+v, %v", n, err)
			}
			seen = append(seen, append([]byte(nil), n.Note...))
			frame = nil
		}
	}
	if len(seen) != 3 || !bytes.Equal(seen[0], notes[0]) || !bytes.Equal(seen[1], notes[1]) || !bytes.Equal(seen[2], notes[2]) {
		t.Fatalf("notes %q", seen)
	}
	ring.Request{Tag: 4, Op: ring.OpCancel, Target: 1}.Encode(reg.SQ.Slot(3))
	reg.SQ.Publish(4)
	end := map[uint64]ring.Completion{}
	for _, c := range completions(t, reg, 3+8+2)[3+8:] {
		end[c.Tag] = c
	}
	if c, ok := end[1]; !ok || codes.Code(c.Code) != codes.Canceled {
		t.Fatalf("the watch after its cancel: %+v (%v)", c, ok)
	}
	if c, ok := end[4]; !ok || c.Code != 0 {
		t.Fatalf("the cancel: %+v (%v)", c, ok)
	}
	p.healthy(t, 23)
}

// TestRingWatchSmallRing: a watch on a completion ring of 4 records. A
// note that needs more records than the whole ring holds can never be
// posted: it is dropped and counted in the next note's frame. Notes past
// what the ring holds wait in the daemon until the client reads, then come
// in order.
func TestRingWatchSmallRing(t *testing.T) {
	p := newRingPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	box, err := p.a.c.RegisterHost(ctx, 4096, "sbox")
	if err != nil {
		t.Fatal(err)
	}
	_, reg := hostileRingWith(t, p.sock, ring.HelloArena, 4<<32)
	if n := reg.CQ.Entries(); n != 4 {
		t.Fatalf("completion ring of %d entries, asked for 4", n)
	}
	copy(reg.Arena[0:], box.Id)
	publish(reg, []ring.Request{{Tag: 1, Op: ring.OpWatch, BlobOff: 0, BlobLen: uint32(len(box.Id))}})
	var head uint32
	take := func(want int) []ring.Completion {
		t.Helper()
		var out []ring.Completion
		deadline := time.Now().Add(20 * time.Second)
		for len(out) < want && time.Now().Before(deadline) {
			tail := reg.CQ.Tail()
			for ; head != tail; head++ {
				c, err := ring.DecodeCompletion(reg.CQ.Slot(head))
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, c)
			}
			reg.CQ.Consumed(head)
			if len(out) < want {
				reg.CQ.Wait(tail, 0, 50*time.Millisecond)
			}
		}
		if len(out) != want {
			t.Fatalf("%d completions, want %d: %+v", len(out), want, out)
		}
		return out
	}
	if c := take(1)[0]; c.Code != ring.CodeNote || c.Wire != 0 {
		t.Fatalf("not subscribed: %+v", c)
	}
	send := func(note []byte) {
		t.Helper()
		if _, err := p.b.c.BatchTransfer(ctx, client.Transfer{SrcRegion: p.dst.Id, Peer: p.a.d.PeerAddr(), DstRegion: "sbox",
			Blocks: client.Descriptors{Src: []uint64{0}, Dst: []uint64{0}, BlockLength: 8}, Notification: note}); err != nil {
			t.Fatal(err)
		}
	}
	send(bytes.Repeat([]byte("x"), 1000)) // 6 records: never fits a ring of 4
	for i := range 9 {                    // one record each: 4 fit, 5 wait in the daemon
		send([]byte{'a' + byte(i)})
	}
	for i, c := range take(9) {
		n, err := ring.DecodeNoteFrame([]byte(c.Msg))
		if err != nil || c.Code != ring.CodeNote || string(n.Note) != string(rune('a'+i)) {
			t.Fatalf("note %d: %+v, %+v, %v", i, c, n, err)
		}
		want := uint64(0)
		if i == 0 {
			want = 1 // the note too large, told with the next
		}
		if n.Dropped != want {
			t.Fatalf("note %d: dropped %d, want %d", i, n.Dropped, want)
		}
	}
}
