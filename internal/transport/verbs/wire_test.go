package verbs

import "testing"

func TestMessageRoundTrip(t *testing.T) {
	for _, m := range []message{
		{kind: msgMeta, tag: 7, nqp: 4, rkey: 0xdeadbeef, blocks: 10000, bytes: 1 << 40},
		{kind: msgMeta, tag: tagMask, nqp: 0},
		{kind: msgBye},
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
		if m.kind == msgMeta && (m.nqp > maxQPsPerConn || m.tag > tagMask) {
			t.Fatalf("accepted %+v", m)
		}
		var b [recvBufLen]byte
		m.encode(b[:])
		var again message
		if !again.decode(b[:]) || again != m {
			t.Fatalf("%+v does not round-trip", m)
		}
	})
}
