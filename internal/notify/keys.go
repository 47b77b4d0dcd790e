package notify

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/b2bd/b2bd/internal/errs"
)

// Key notes (docs/notes.md): a notification may start with a list of keys,
//
//	KeyMagic (8 bytes) | count u8 (1..MaxKeys) | count × (len u8 (1..MaxKeyLen), key) | payload
//
// Landing on a region, it is delivered to the region's watchers whole, as
// any notification, and it also fires every transfer armed on the region
// with one of its keys (a pull that waits for its source's "ready"), in
// the daemon, without a round trip through the client.
const (
	KeyMagic  = "\x00b2bkeys"
	MaxKeys   = 255
	MaxKeyLen = 64
)

// ParseKeys splits a key note into its keys (sub-slices of b) and payload;
// ok is false when b is not one (no magic, or a malformed list: then it is
// only a plain notification).
func ParseKeys(b []byte) (keys [][]byte, payload []byte, ok bool) {
	if !bytes.HasPrefix(b, []byte(KeyMagic)) || len(b) < len(KeyMagic)+1 {
		return nil, nil, false
	}
	n := int(b[len(KeyMagic)])
	at := len(KeyMagic) + 1
	if n == 0 {
		return nil, nil, false
	}
	keys = make([][]byte, 0, n)
	for range n {
		if at >= len(b) {
			return nil, nil, false
		}
		l := int(b[at])
		at++
		if l == 0 || l > MaxKeyLen || at+l > len(b) {
			return nil, nil, false
		}
		keys = append(keys, b[at:at+l])
		at += l
	}
	return keys, b[at:], true
}

// AppendKeys appends the key note of keys and payload to dst.
func AppendKeys(dst []byte, keys [][]byte, payload []byte) ([]byte, error) {
	if len(keys) == 0 || len(keys) > MaxKeys {
		return dst, fmt.Errorf("%w: %d keys: want 1 to %d", errs.ErrInvalidArgument, len(keys), MaxKeys)
	}
	dst = append(append(dst, KeyMagic...), byte(len(keys)))
	for i, k := range keys {
		if len(k) == 0 || len(k) > MaxKeyLen {
			return dst, fmt.Errorf("%w: keys[%d] is %d bytes: want 1 to %d", errs.ErrInvalidArgument, i, len(k), MaxKeyLen)
		}
		dst = append(append(dst, byte(len(k))), k...)
	}
	return append(dst, payload...), nil
}

// RecentKeys is how many (region, key) signals the hub remembers, so that a
// transfer armed after its key landed fires at once.
const RecentKeys = 16384

// keyWaits are the transfers armed on keys, and the keys seen lately.
type keyWaits struct {
	mu      sync.Mutex
	waiters map[string]map[*keyWaiter]struct{}
	recent  map[string]time.Time
	order   []string // recent's keys, oldest first (a ring of RecentKeys)
	next    int
}

type keyWaiter struct{ fired chan time.Time }

func keyOf(regionID string, key []byte) string { return regionID + "\x00" + string(key) }

// WaitKey waits until a key note naming key lands on region regionID (or
// landed among the last RecentKeys keys), and returns when this daemon saw
// it; ctx's end returns its error.
func (h *Hub) WaitKey(ctx context.Context, regionID string, key []byte) (time.Time, error) {
	k := keyOf(regionID, key)
	kw := &h.keys
	kw.mu.Lock()
	if at, ok := kw.recent[k]; ok {
		kw.mu.Unlock()
		return at, nil
	}
	w := &keyWaiter{fired: make(chan time.Time, 1)}
	if kw.waiters == nil {
		kw.waiters = map[string]map[*keyWaiter]struct{}{}
	}
	if kw.waiters[k] == nil {
		kw.waiters[k] = map[*keyWaiter]struct{}{}
	}
	kw.waiters[k][w] = struct{}{}
	kw.mu.Unlock()
	select {
	case at := <-w.fired:
		return at, nil
	case <-ctx.Done():
		kw.mu.Lock()
		delete(kw.waiters[k], w)
		if len(kw.waiters[k]) == 0 {
			delete(kw.waiters, k)
		}
		kw.mu.Unlock()
		select {
		case at := <-w.fired: // fired as ctx ended: it counts
			return at, nil
		default:
		}
		return time.Time{}, ctx.Err()
	}
}

// signal fires the waiters of each key on regionID and remembers the keys.
// It reports whether it fired any.
func (h *Hub) signal(regionID string, keys [][]byte) (fired bool) {
	now := time.Now()
	kw := &h.keys
	kw.mu.Lock()
	defer kw.mu.Unlock()
	if kw.recent == nil {
		kw.recent = make(map[string]time.Time, 1024)
		kw.order = make([]string, RecentKeys)
	}
	for _, key := range keys {
		k := keyOf(regionID, key)
		for w := range kw.waiters[k] {
			w.fired <- now
			fired = true
		}
		delete(kw.waiters, k)
		if _, ok := kw.recent[k]; ok {
			continue
		}
		if old := kw.order[kw.next]; old != "" {
			delete(kw.recent, old)
		}
		kw.order[kw.next] = k
		kw.next = (kw.next + 1) % RecentKeys
		kw.recent[k] = now
	}
	return fired
}

// KeyWaiters counts the transfers armed on keys (tests, status).
func (h *Hub) KeyWaiters() int {
	h.keys.mu.Lock()
	defer h.keys.mu.Unlock()
	n := 0
	for _, ws := range h.keys.waiters {
		n += len(ws)
	}
	return n
}
