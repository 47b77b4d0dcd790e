package ring

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
)

func TestDecodeTable(t *testing.T) {
	good := func(r Request) []byte { b := make([]byte, RecLen); r.Encode(b); return b }
	with := func(b []byte, f func([]byte)) []byte { f(b); return b }
	for _, tc := range []struct {
		name string
		rec  []byte
		want Request
		err  error
		msg  string
	}{
		{"ping", good(Request{Tag: 7, Op: OpPing}), Request{Tag: 7, Op: OpPing}, nil, ""},
		{"submit", good(Request{Tag: 8, Op: OpSubmit, Handle: 42}), Request{Tag: 8, Op: OpSubmit, Handle: 42}, nil, ""},
		{"cancel", good(Request{Tag: 9, Op: OpCancel, Target: 8}), Request{Tag: 9, Op: OpCancel, Target: 8}, nil, ""},
		{"short", make([]byte, 10), Request{}, errs.ErrInvalidArgument, "is 10 bytes"},
		{"tag 0", good(Request{Op: OpPing}), Request{Op: OpPing}, errs.ErrInvalidArgument, "tag is 0"},
		{"bad op", with(good(Request{Tag: 1, Op: OpPing}), func(b []byte) { b[8] = 99 }), Request{Tag: 1, Op: 99}, errs.ErrInvalidArgument, "op 99 unknown"},
		{"flags", with(good(Request{Tag: 1, Op: OpPing}), func(b []byte) { b[10] = 1 }), Request{Tag: 1, Op: OpPing}, errs.ErrInvalidArgument, "flags 0x1"},
		{"length", with(good(Request{Tag: 1, Op: OpSubmit, Handle: 3}), func(b []byte) { b[12] = 200 }), Request{Tag: 1, Op: OpSubmit}, errs.ErrInvalidArgument, "length 200 for op submit, want 16"},
		{"junk past body", with(good(Request{Tag: 1, Op: OpCancel, Target: 3}), func(b []byte) { b[63] = 5 }), Request{Tag: 1, Op: OpCancel}, errs.ErrInvalidArgument, "byte 63"},
		{"handle 0", good(Request{Tag: 1, Op: OpSubmit}), Request{Tag: 1, Op: OpSubmit}, errs.ErrInvalidArgument, "handle is 0"},
		{"patch", good(Request{Tag: 1, Op: OpSubmit, Handle: 2, Patch: 4096}), Request{Tag: 1, Op: OpSubmit, Handle: 2, Patch: 4096}, errs.ErrUnimplemented, "offset patch 4096"},
		{"cancel 0", good(Request{Tag: 1, Op: OpCancel}), Request{Tag: 1, Op: OpCancel}, errs.ErrInvalidArgument, "target tag is 0"},
		{"submit with deadline", good(Request{Tag: 8, Op: OpSubmit, Handle: 42, TimeoutMs: 1500}), Request{Tag: 8, Op: OpSubmit, Handle: 42, TimeoutMs: 1500}, nil, ""},
		{"deadline 0", with(good(Request{Tag: 1, Op: OpSubmit, Handle: 3}), func(b []byte) { b[12] = 24 }), Request{Tag: 1, Op: OpSubmit}, errs.ErrInvalidArgument, "timeout_ms 0: want 1 to 86400000"},
		{"deadline past the limit", good(Request{Tag: 1, Op: OpSubmit, Handle: 3, TimeoutMs: MaxTimeoutMs + 1}), Request{Tag: 1, Op: OpSubmit}, errs.ErrInvalidArgument, "timeout_ms 86400001"},
		{"blocks 1", good(blk(5, 77, 0, 2, 3)), blk(5, 77, 0, 2, 3), nil, ""},
		{"blocks 4 with deadline", good(blk(5, 77, 900, 0, 1, 2, 3, 4, 5, 6, 7)), blk(5, 77, 900, 0, 1, 2, 3, 4, 5, 6, 7), nil, ""},
		{"blocks no ids", with(good(blk(5, 77, 0, 2, 3)), func(b []byte) { b[12], b[28], b[32], b[36] = 16, 0, 0, 0 }), Request{Tag: 5, Op: OpBlocks}, errs.ErrInvalidArgument, "length 16 for op blocks, want 16 + 8 per id pair (1 to 4 pairs): 24 to 48"},
		{"blocks odd length", with(good(blk(5, 77, 0, 2, 3)), func(b []byte) { b[12] = 28 }), Request{Tag: 5, Op: OpBlocks}, errs.ErrInvalidArgument, "length 28 for op blocks"},
		{"blocks count past length", with(good(blk(5, 77, 0, 2, 3)), func(b []byte) { b[28] = 2 }), Request{Tag: 5, Op: OpBlocks}, errs.ErrInvalidArgument, "count 2 in a body of 24 bytes, want 1"},
		{"blocks huge count", with(good(blk(5, 77, 0, 2, 3)), func(b []byte) { b[31] = 0xff }), Request{Tag: 5, Op: OpBlocks}, errs.ErrInvalidArgument, "count 4278190081"},
		{"blocks handle 0", good(blk(5, 0, 0, 2, 3)), Request{Tag: 5, Op: OpBlocks}, errs.ErrInvalidArgument, "route handle is 0"},
		{"blocks deadline past the limit", good(blk(5, 1, MaxTimeoutMs+1, 2, 3)), Request{Tag: 5, Op: OpBlocks}, errs.ErrInvalidArgument, "timeout_ms 86400001: want 0 (none) or 1 to 86400000"},
		{"blocks junk past pairs", with(good(blk(5, 77, 0, 2, 3)), func(b []byte) { b[45] = 1 }), Request{Tag: 5, Op: OpBlocks}, errs.ErrInvalidArgument, "byte 45 is 0x1 past the blocks body"},
		{"submit length", with(good(Request{Tag: 1, Op: OpSubmit, Handle: 3}), func(b []byte) { b[12] = 20 }), Request{Tag: 1, Op: OpSubmit}, errs.ErrInvalidArgument, "want 16 or 24 (with a deadline)"},
	} {
		got, err := Decode(tc.rec)
		if tc.err == nil {
			if err != nil || got != tc.want {
				t.Errorf("%s: Decode = %+v, %v; want %+v", tc.name, got, err, tc.want)
			}
			continue
		}
		if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) || got.Tag != tc.want.Tag {
			t.Errorf("%s: Decode = %+v, %v; want tag %d and %v containing %q", tc.name, got, err, tc.want.Tag, tc.err, tc.msg)
		}
	}
}

// blk is a blocks request of pairs (local, remote, local, remote, ...).
func blk(tag, handle, ms uint64, pairs ...uint32) Request {
	r := Request{Tag: tag, Op: OpBlocks, Handle: handle, TimeoutMs: ms, N: uint32(len(pairs) / 2)}
	for i := 0; i < len(pairs)/2; i++ {
		r.Local[i], r.Remote[i] = pairs[2*i], pairs[2*i+1]
	}
	return r
}

func TestPackedIDs(t *testing.T) {
	l, r := blk(1, 2, 0, 1, 2, 3, 4, 0xdeadbeef, 5).PackedIDs()
	if wl, wr := "\x01\x00\x00\x00\x03\x00\x00\x00\xef\xbe\xad\xde", "\x02\x00\x00\x00\x04\x00\x00\x00\x05\x00\x00\x00"; string(l) != wl || string(r) != wr {
		t.Fatalf("PackedIDs = %x, %x", l, r)
	}
	if l, _ := (Request{Op: OpBlocks, N: 99}).PackedIDs(); len(l) != 4*MaxInlineIDs {
		t.Fatalf("PackedIDs of N 99: %d bytes, want %d", len(l), 4*MaxInlineIDs)
	}
}

// FuzzDecode: any 64 bytes decode without panic; what decodes re-encodes to
// the same bytes (nothing is silently ignored).
func FuzzDecode(f *testing.F) {
	for _, r := range []Request{{Tag: 1, Op: OpPing}, {Tag: 2, Op: OpSubmit, Handle: 9}, {Tag: 4, Op: OpSubmit, Handle: 9, TimeoutMs: 7}, {Tag: 3, Op: OpCancel, Target: 2}, blk(5, 9, 0, 1, 2), blk(6, 9, 40, 1, 2, 3, 4, 5, 6, 7, 8), {Tag: 7, Op: OpBatch, BlobOff: 64, BlobLen: 48, TimeoutMs: 5}} {
		b := make([]byte, RecLen)
		r.Encode(b)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Decode(b)
		if err != nil {
			if !errors.Is(err, errs.ErrInvalidArgument) && !errors.Is(err, errs.ErrUnimplemented) {
				t.Fatalf("error of no class: %v", err)
			}
			return
		}
		again := make([]byte, RecLen)
		r.Encode(again)
		if string(again) != string(b) {
			t.Fatalf("decoded %+v re-encodes to %x, was %x", r, again, b)
		}
	})
}

func TestCompletionMessageBound(t *testing.T) {
	for _, n := range []int{0, 10, MsgMax, MsgMax + 1, 5000} {
		msg := strings.Repeat("x", n)
		b := make([]byte, CompLen)
		Completion{Tag: 5, Code: 3, Msg: msg, Blocks: 1, Bytes: 2, Wire: 3, Total: 4}.Encode(b)
		c, err := DecodeCompletion(b)
		if err != nil {
			t.Fatal(err)
		}
		want := msg
		if n > MsgMax {
			want = msg[:MsgMax-len(truncMark)] + truncMark
		}
		if c.Msg != want || c.Tag != 5 || c.Code != 3 || c.Blocks != 1 || c.Bytes != 2 || c.Wire != 3 || c.Total != 4 {
			t.Errorf("len %d: got %+v (msg %d bytes)", n, c, len(c.Msg))
		}
	}
}

// TestCompletionTimes: a success carries the daemon's three wall-clock
// times; a refusal's are not read, as a daemon before them wrote message
// bytes there (up to 208).
func TestCompletionTimes(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Completion
		want [3]int64
	}{
		{"done", Completion{Tag: 1, Msg: "tcp", TriggerSeen: 10, Posted: 20, Landed: 30}, [3]int64{10, 20, 30}},
		{"done, no trigger", Completion{Tag: 1, Msg: "local", Posted: 1 << 62, Landed: 1<<62 + 1}, [3]int64{0, 1 << 62, 1<<62 + 1}},
		{"negative kept out", Completion{Tag: 1, Posted: -5}, [3]int64{}},
		{"refused", Completion{Tag: 1, Code: 3, Msg: strings.Repeat("m", 500), Posted: 7}, [3]int64{}},
	} {
		b := make([]byte, CompLen)
		tc.in.Encode(b)
		c, err := DecodeCompletion(b)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := [3]int64{c.TriggerSeen, c.Posted, c.Landed}; got != tc.want {
			t.Errorf("%s: times %v, want %v", tc.name, got, tc.want)
		}
		if tc.in.Code != 0 && len(c.Msg) != MsgMax {
			t.Errorf("%s: message %d bytes, want cut to %d", tc.name, len(c.Msg), MsgMax)
		}
	}
	// A record from a daemon before the times: 208 bytes of message on a
	// refusal, read as message, not as times.
	old := make([]byte, CompLen)
	binary.LittleEndian.PutUint64(old[0:], 9)
	binary.LittleEndian.PutUint32(old[8:], 13)
	binary.LittleEndian.PutUint32(old[12:], 208)
	copy(old[compHdr:], strings.Repeat("z", 208))
	c, err := DecodeCompletion(old)
	if err != nil || c.Msg != strings.Repeat("z", 208) || c.Posted != 0 {
		t.Errorf("an older daemon's refusal: %+v, %v", c, err)
	}
}

// TestCompletionFigures: a success carries its response's figures (found
// by their magic); a refusal, a success without them (an older daemon)
// and one whose name leaves no room for them read as none.
func TestCompletionFigures(t *testing.T) {
	full := Completion{Tag: 1, Msg: "verbs", Figures: true, Segments: 10000, WorkRequests: 157,
		Validate: 1, Resolve: 2, Plan: 3, Post: 4, Notify: 5, Armed: 6, Posted: 7}
	for _, tc := range []struct {
		name string
		in   Completion
		want bool
	}{
		{"done", full, true},
		{"done, none given", Completion{Tag: 1, Msg: "tcp", Segments: 3}, false},
		{"refused", Completion{Tag: 1, Code: 5, Msg: "no", Figures: true, Segments: 3}, false},
		{"a name past the room", Completion{Tag: 1, Msg: strings.Repeat("k", extNameMax+1), Figures: true, Segments: 3}, false},
	} {
		b := make([]byte, CompLen)
		tc.in.Encode(b)
		c, err := DecodeCompletion(b)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if c.Figures != tc.want {
			t.Fatalf("%s: figures %v, want %v", tc.name, c.Figures, tc.want)
		}
		if tc.want && (c.Segments != 10000 || c.WorkRequests != 157 || c.Validate != 1 || c.Resolve != 2 || c.Plan != 3 ||
			c.Post != 4 || c.Notify != 5 || c.Armed != 6 || c.Posted != 7 || c.Msg != "verbs") {
			t.Errorf("%s: %+v", tc.name, c)
		}
		if !tc.want && (c.Segments != 0 || c.Validate != 0) {
			t.Errorf("%s: figures read where none were: %+v", tc.name, c)
		}
	}
}

// TestIndicesChecked: a tail behind the head or beyond the ring, and a head
// past the tail, are refused; in-range indices count right across the
// 2^32 wrap.
func TestIndicesChecked(t *testing.T) {
	fd, r, err := Create(8, 4, ArenaUnit)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := Map(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		head, tail uint32
		ready      uint32
		bad        bool
	}{
		{0, 0, 0, false}, {0, 8, 8, false}, {0, 9, 0, true}, {5, 4, 0, true},
		{1<<32 - 2, 3, 5, false}, {1<<32 - 2, 7, 0, true},
	} {
		*c.SQ.tail = tc.tail // the client's side writes its tail
		n, err := r.SQ.Ready(tc.head)
		if (err != nil) != tc.bad || n != tc.ready {
			t.Errorf("head %d tail %d: Ready = %d, %v", tc.head, tc.tail, n, err)
		}
		if tc.bad && !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("head %d tail %d: %v is no InvalidArgument", tc.head, tc.tail, err)
		}
	}
	*c.CQ.head = 10 // past the daemon's tail
	if _, err := r.CQ.Free(3); err == nil {
		t.Error("CQ head past the tail: Free took it")
	}
	*c.CQ.head = 3
	if f, err := r.CQ.Free(5); err != nil || f != 2 {
		t.Errorf("Free = %d, %v; want 2", f, err)
	}
}

// TestWakeCrossesMapping: a waiter sleeping on one mapping wakes when the
// other mapping publishes.
func TestWakeCrossesMapping(t *testing.T) {
	fd, r, err := Create(4, 4, ArenaUnit)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := Map(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	woke := make(chan time.Duration)
	go func() {
		start := time.Now()
		r.SQ.Wait(0, 0, time.Minute)
		woke <- time.Since(start)
	}()
	time.Sleep(50 * time.Millisecond)
	c.SQ.Publish(1)
	select {
	case d := <-woke:
		if d >= time.Minute {
			t.Fatalf("woke after the timeout: %v", d)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("waiter never woke")
	}
}

func TestCreateRefusesSizes(t *testing.T) {
	for _, n := range []uint32{0, 1, 3, 100, MaxEntries * 2} {
		if _, _, err := Create(n, 4, ArenaUnit); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("Create(%d): %v", n, err)
		}
	}
}
