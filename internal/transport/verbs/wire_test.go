package verbs

import "testing"

func TestCancelRejectsBadTag(t *testing.T) {
	var b [recvBufLen]byte
	m := message{kind: msgCancel, tag: tagMask}
	m.encode(b[:])
	if m.decode(b[:msgLen]) {
		t.Fatal("a cancel with tag tagMask (outside 1..tagMask-1) decoded")
	}
}

func TestMessageRoundTrip(t *testing.T) {
	for _, m := range []message{
		{kind: msgMeta, tag: 7, nqp: 4, rkey: 0xdeadbeef, blocks: 10000, bytes: 1 << 40},
		{kind: msgMeta, tag: tagMask - 1, nqp: 0},
		{kind: msgMeta, tag: 9, nqp: 2, nkeys: maxBatchKeys, blocks: 3, bytes: 4},
		{kind: msgBye},
		{kind: msgCancel, tag: 12},
		{kind: msgCancel, tag: tagMask - 1},
	} {
		var b [recvBufLen]byte
		m.encode(b[:])
		var got message
		if !got.decode(b[:msgLen]) || got != m {
			t.Fatalf("%+v decoded as %+v", m, got)
		}
	}
}

func FuzzMessageDecode(f *testing.F) {
	var b [recvBufLen]byte
	(&message{kind: msgMeta, tag: 1, nqp: 2}).encode(b[:])
	f.Add(b[:])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var m message
		if !m.decode(data) {
			return
		}
		if m.kind == msgMeta && (m.nqp > maxQPsPerConn || m.tag >= tagMask) {
			t.Fatalf("accepted %+v", m)
		}
		var b [recvBufLen]byte
		if m.kind == msgKeys {
			if m.nkeys == 0 || m.nkeys > keysPerMsg || m.first >= maxBatchKeys {
				t.Fatalf("accepted %+v", m)
			}
			encodeKeys(b[:], m.tag, m.first, m.keys[:m.nkeys])
		} else {
			m.encode(b[:])
		}
		var again message
		if !again.decode(b[:]) || again != m {
			t.Fatalf("%+v does not round-trip", m)
		}
	})
}

func TestKeysRoundTrip(t *testing.T) {
	keys := []uint32{0x11, 0xdeadbeef, 7, 8, 9, 10, 11, 12, 13, 14}[:keysPerMsg]
	for _, n := range []int{1, keysPerMsg} {
		var b [recvBufLen]byte
		encodeKeys(b[:], 5, 20, keys[:n])
		var m message
		if !m.decode(b[:]) || m.kind != msgKeys || m.tag != 5 || m.first != 20 || int(m.nkeys) != n {
			t.Fatalf("%d keys decoded as %+v", n, m)
		}
		for i := 0; i < n; i++ {
			if m.keys[i] != keys[i] {
				t.Fatalf("key %d = %#x, want %#x", i, m.keys[i], keys[i])
			}
		}
		if m.decode(b[:msgLen]) {
			t.Fatal("a truncated keys message decoded")
		}
	}
}

// Tags stay in 1..tagMask-1, so an ack (tag), a refusal (tag|refuseBit) and
// the keepalive immediate (pingImm) never collide.
func TestNextTag(t *testing.T) {
	for _, tc := range []struct{ in, want uint32 }{{0, 1}, {1, 2}, {tagMask - 2, tagMask - 1}, {tagMask - 1, 1}} {
		if got := nextTag(tc.in); got != tc.want {
			t.Errorf("nextTag(%#x) = %#x, want %#x", tc.in, got, tc.want)
		}
	}
	for _, tag := range []uint32{1, tagMask - 1} {
		if tag|refuseBit == pingImm || tag == pingImm || tag&refuseBit != 0 {
			t.Fatalf("tag %#x collides", tag)
		}
	}
}
