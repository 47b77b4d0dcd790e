package notify_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
	"github.com/b2bd/b2bd/internal/notify"
)

func TestParseKeys(t *testing.T) {
	good, err := notify.AppendKeys(nil, [][]byte{[]byte("a"), bytes.Repeat([]byte{0xff}, notify.MaxKeyLen)}, []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	m := notify.KeyMagic
	cases := []struct {
		name    string
		in      []byte
		keys    []string
		payload string
		ok      bool
	}{
		{"two keys and a payload", good, []string{"a", string(bytes.Repeat([]byte{0xff}, notify.MaxKeyLen))}, "{}", true},
		{"no payload", []byte(m + "\x01\x02ab"), []string{"ab"}, "", true},
		{"plain JSON", []byte(`{"t":"ready"}`), nil, "", false},
		{"magic alone", []byte(m), nil, "", false},
		{"zero keys", []byte(m + "\x00"), nil, "", false},
		{"empty key", []byte(m + "\x01\x00"), nil, "", false},
		{"key past the end", []byte(m + "\x01\x05ab"), nil, "", false},
		{"second key missing", []byte(m + "\x02\x01a"), nil, "", false},
		{"key over the limit", append([]byte(m+"\x01\x41"), bytes.Repeat([]byte("k"), 65)...), nil, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			keys, payload, ok := notify.ParseKeys(tc.in)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			if len(keys) != len(tc.keys) || string(payload) != tc.payload {
				t.Fatalf("keys %q payload %q, want %q %q", keys, payload, tc.keys, tc.payload)
			}
			for i := range keys {
				if string(keys[i]) != tc.keys[i] {
					t.Fatalf("keys[%d] = %q, want %q", i, keys[i], tc.keys[i])
				}
			}
		})
	}
}

func TestAppendKeysRefuses(t *testing.T) {
	for _, keys := range [][][]byte{nil, {{}}, {bytes.Repeat([]byte("k"), notify.MaxKeyLen+1)}, make([][]byte, notify.MaxKeys+1)} {
		if _, err := notify.AppendKeys(nil, keys, nil); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("%d keys: err %v, want InvalidArgument", len(keys), err)
		}
	}
}

func FuzzParseKeys(f *testing.F) {
	good, _ := notify.AppendKeys(nil, [][]byte{[]byte("req-1"), []byte("x")}, []byte("payload"))
	f.Add(good)
	f.Add([]byte(notify.KeyMagic + "\x01\x05ab"))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		keys, payload, ok := notify.ParseKeys(b)
		if !ok {
			return
		}
		again, err := notify.AppendKeys(nil, keys, payload)
		if err != nil {
			t.Fatalf("parsed keys %q do not encode: %v", keys, err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("round trip %q != %q", again, b)
		}
	})
}

func keyNote(t *testing.T, keys ...string) notify.Notification {
	t.Helper()
	var ks [][]byte
	for _, k := range keys {
		ks = append(ks, []byte(k))
	}
	b, err := notify.AppendKeys(nil, ks, []byte("p"))
	if err != nil {
		t.Fatal(err)
	}
	return notify.Notification{Notification: b}
}

func TestWaitKey(t *testing.T) {
	var h notify.Hub
	ctx := context.Background()
	fired := make(chan error, 1)
	go func() {
		_, err := h.WaitKey(ctx, "r1", []byte("k"))
		fired <- err
	}()
	for h.KeyWaiters() == 0 {
		time.Sleep(time.Millisecond)
	}
	h.Publish("r2", keyNote(t, "k"))                                // another region's key
	h.Publish("r1", notify.Notification{Notification: []byte("k")}) // not a key note
	select {
	case err := <-fired:
		t.Fatalf("fired early: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	h.Publish("r1", keyNote(t, "j", "k"))
	if err := <-fired; err != nil {
		t.Fatal(err)
	}
	if n := h.KeyWaiters(); n != 0 {
		t.Fatalf("%d waiters left", n)
	}
	// Landed before the wait: at once.
	if _, err := h.WaitKey(ctx, "r2", []byte("k")); err != nil {
		t.Fatal(err)
	}
	// Never landed: the context's end.
	c2, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := h.WaitKey(c2, "r1", []byte("never")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want DeadlineExceeded", err)
	}
	if n := h.KeyWaiters(); n != 0 {
		t.Fatalf("%d waiters left after a deadline", n)
	}
}

func TestRecentKeysBounded(t *testing.T) {
	var h notify.Hub
	for i := range notify.RecentKeys + 10 {
		h.Publish("r", keyNote(t, fmt.Sprint(i)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := h.WaitKey(ctx, "r", []byte("0")); err == nil {
		t.Fatal("the oldest key was still remembered past RecentKeys")
	}
	if _, err := h.WaitKey(context.Background(), "r", []byte(fmt.Sprint(notify.RecentKeys+9))); err != nil {
		t.Fatal(err)
	}
}
