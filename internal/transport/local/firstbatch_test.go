package local

import (
	"context"
	"encoding/binary"
	"os"
	"strings"
	"testing"

	"github.com/b2bd/b2bd/internal/desc"
	"github.com/b2bd/b2bd/internal/transport"
)

// presentPages reads /proc/self/pagemap: how many of b's pages have a
// page-table entry in this process (bit 63), of how many.
func presentPages(t *testing.T, b []byte) (present, total int) {
	t.Helper()
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Skipf("pagemap: %v", err)
	}
	defer f.Close()
	page := uintptr(os.Getpagesize())
	start := uintptrOf(b) / page
	total = (len(b) + int(page) - 1) / int(page)
	buf := make([]byte, 8*total)
	if _, err := f.ReadAt(buf, int64(start*8)); err != nil {
		t.Fatalf("read pagemap: %v", err)
	}
	for i := 0; i < total; i++ {
		if binary.LittleEndian.Uint64(buf[8*i:])&(1<<63) != 0 {
			present++
		}
	}
	return present, total
}

// cachedMapping is the sender's mapping of the destination with key k.
func cachedMapping(t *testing.T, c transport.Conn, key uint64) []byte {
	t.Helper()
	sc := c.(*Conn)
	sc.lock()
	defer sc.unlock()
	rm := sc.cache[key]
	if rm == nil || rm.host == nil {
		t.Fatalf("no cached host mapping of key %#x", key)
	}
	return rm.host
}

// TestFirstBatchDestinationMappedWhole: the sender's fresh mapping of a
// destination gets every page-table entry when it is made, not by page
// faults during the first batch's copy (1.6 us a 4 KiB page on a 2-core VM:
// 0.2 s for a 512 MiB destination, over 1 s for 4 GiB, in the first batch's
// post phase, even with the destination's pages already touched by its
// owner).
func TestFirstBatchDestinationMappedWhole(t *testing.T) {
	const region = 8 << 20
	p := newPair(t, region)
	fill(p.dst.Memory().Host, 1) // the owner touched every page
	fill(p.src.Memory().Host, 2)
	one := &desc.Batch{Src: []uint64{0}, Dst: []uint64{0}, Len: []uint64{64}}
	if _, err := transport.Write(context.Background(), p.conn, p.src, transport.RemoteRegion{Name: "d", Size: region, Key: p.dst.Key()}, one); err != nil {
		t.Fatal(err)
	}
	if present, total := presentPages(t, cachedMapping(t, p.conn, p.dst.Key().Key)); present != total {
		t.Fatalf("after a first batch of one block, %d of the destination mapping's %d pages have page-table entries; want all (the rest would fault in during later batches' copies)", present, total)
	}
}

// TestWarmMapsBeforeTheFirstBatch: Warm (and Prepare, which warms) maps the
// destination with every page-table entry before any batch, lets its pin
// go, and the first batch then maps nothing more.
func TestWarmMapsBeforeTheFirstBatch(t *testing.T) {
	const region = 4 << 20
	for _, how := range []string{"warm", "prepare"} {
		t.Run(how, func(t *testing.T) {
			p := newPair(t, region)
			fill(p.dst.Memory().Host, 1)
			fill(p.src.Memory().Host, 2)
			dst := transport.RemoteRegion{Name: "d", Size: region, Key: p.dst.Key()}
			b := gapped(16, 4096)
			write := func() error {
				_, err := transport.Write(context.Background(), p.conn, p.src, dst, b)
				return err
			}
			switch how {
			case "warm":
				if err := p.conn.(*Conn).Warm(context.Background(), p.src, dst); err != nil {
					t.Fatal(err)
				}
			case "prepare":
				pr, err := transport.Prepare(p.conn, p.src, dst, b)
				if err != nil {
					t.Fatal(err)
				}
				defer pr.Close()
				write = func() error {
					_, err := pr.Write(context.Background())
					return err
				}
			}
			mapped := cachedMapping(t, p.conn, dst.Key.Key)
			if present, total := presentPages(t, mapped); present != total {
				t.Fatalf("after %s, %d of the destination mapping's %d pages have page-table entries; want all", how, present, total)
			}
			if _, _, _, pins := p.in.snap(); pins != 0 {
				t.Fatalf("after %s, %d pins held; want 0", how, pins)
			}
			if err := write(); err != nil {
				t.Fatal(err)
			}
			if got := cachedMapping(t, p.conn, dst.Key.Key); uintptrOf(got) != uintptrOf(mapped) {
				t.Fatal("the first batch mapped the destination again")
			}
			src, d := p.src.Memory().Host, p.dst.Memory().Host
			for i := range b.Len {
				if string(src[b.Src[i]:b.Src[i]+b.Len[i]]) != string(d[b.Dst[i]:b.Dst[i]+b.Len[i]]) {
					t.Fatalf("block %d differs", i)
				}
			}
			if nb, _, _, pins := p.in.snap(); nb != 1 || pins != 0 {
				t.Fatalf("landed %d batches with %d pins held; want 1 and 0", nb, pins)
			}
		})
	}
}

// TestWarmRefused: a destination the receiver refuses is named, and
// nothing stays mapped for it.
func TestWarmRefused(t *testing.T) {
	p := newPair(t, 1<<16)
	bad := transport.RemoteRegion{Name: "gone", Size: 1 << 16, Key: transport.RemoteKey{Key: p.dst.Key().Key + 1}}
	err := p.conn.(*Conn).Warm(context.Background(), p.src, bad)
	if err == nil || !strings.Contains(err.Error(), `"gone"`) {
		t.Fatalf("err = %v, want a refusal naming dst_region \"gone\"", err)
	}
	sc := p.conn.(*Conn)
	sc.lock()
	n := len(sc.cache)
	sc.unlock()
	if n != 0 {
		t.Fatalf("%d destinations cached after a refusal", n)
	}
	// The connection is still usable.
	if _, err := transport.Write(context.Background(), p.conn, p.src, transport.RemoteRegion{Name: "d", Size: 1 << 16, Key: p.dst.Key()}, gapped(4, 1024)); err != nil {
		t.Fatal(err)
	}
}
