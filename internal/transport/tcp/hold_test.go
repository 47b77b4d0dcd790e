package tcp

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

// TestStoppedSenderLetsGo: a sender that sent part of a batch and then
// nothing more, nor a fence (a stopped daemon), holds the receiver's
// destination only until the time it said it had for the batch and the
// grace: then its streams are closed and the pin goes, so the
// destination's owner can deregister it (review 4, finding 5). A frame
// that says no time (an older sender) holds it as before.
func TestStoppedSenderLetsGo(t *testing.T) {
	defer func(g time.Duration) { holdGrace = g }(holdGrace)
	holdGrace = 100 * time.Millisecond
	for _, tc := range []struct {
		name   string
		holdMS uint64
		letsGo bool
	}{{"200 ms said", 200, true}, {"no time said", 0, false}} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, 1<<20, 1)
			c, err := net.Dial("tcp", p.b.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			le := binary.LittleEndian
			var hello [helloLen]byte
			le.PutUint32(hello[0:], helloMagic)
			le.PutUint32(hello[4:], version)
			copy(hello[8:24], p.b.Token())
			le.PutUint64(hello[24:], 77) // the conn id
			le.PutUint32(hello[32:], 1)  // one stream
			if _, err := c.Write(hello[:]); err != nil {
				t.Fatal(err)
			}
			var welcome [welcomeLen]byte
			if _, err := io.ReadFull(c, welcome[:]); err != nil || le.Uint32(welcome[:]) != welcomeMagic {
				t.Fatalf("welcome %x, %v", welcome, err)
			}
			// The first frame of two of the stream's share: it pins.
			h := frameHeader{batch: 1, key: p.dst.Key.Key, segs: 1, streams: 1, payload: 64, holdMS: tc.holdMS}
			frame := make([]byte, headerLen+segLen+64)
			h.put(frame)
			le.PutUint64(frame[headerLen:], 4096)
			le.PutUint64(frame[headerLen+8:], 64)
			if _, err := c.Write(frame); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(2 * time.Second)
			for p.in.pins.Load() == 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if p.in.pins.Load() != 1 {
				t.Fatalf("%d pins after the first frame, want 1", p.in.pins.Load())
			}
			// Then nothing.
			start := time.Now()
			if !tc.letsGo {
				time.Sleep(holdGrace + time.Second)
				if got := p.in.pins.Load(); got != 1 {
					t.Fatalf("%d pins with no time said, want 1 (held as before)", got)
				}
				return
			}
			for p.in.pins.Load() != 0 && time.Since(start) < 20*time.Second {
				time.Sleep(10 * time.Millisecond)
			}
			if got, held := p.in.pins.Load(), time.Since(start); got != 0 || held < time.Duration(tc.holdMS)*time.Millisecond {
				t.Fatalf("%d pins %v after the sender stopped (it said %d ms, grace %v)", got, held, tc.holdMS, holdGrace)
			}
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Fatal("the stopped sender's stream is still open")
			}
		})
	}
}
