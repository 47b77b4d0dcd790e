package staging

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/b2bd/b2bd/gpudirect/cudatest"
	"github.com/b2bd/b2bd/internal/memory"
)

func TestPlanRead(t *testing.T) {
	cases := []struct {
		name         string
		off, lens    []uint64
		capacity     uint64
		wantN        int
		wantCovering bool
	}{
		// 10,000 x 128 B in 192 B slots: one covering copy beats 10,000 block copies.
		{"dense small", seq(10000, 192), fill(10000, 128), 64 << 20, 10000, true},
		// 1,000 x 1 MiB spread 64 MiB apart: covering would copy 64 GiB.
		{"sparse large", seq(1000, 64<<20), fill(1000, 1<<20), 1 << 30, 1000, false},
		// The compact size decides how many fit in a round.
		{"rounds", seq(100, 4096), fill(100, 4096), 10 * 4096, 10, true},
		{"block larger than buffer", []uint64{0}, []uint64{100}, 50, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var p Plan
			n := PlanRead(&p, c.off, c.lens, c.capacity)
			if n != c.wantN || (n > 0 && p.Covering != c.wantCovering) {
				t.Fatalf("n=%d covering=%v, want %d %v", n, p.Covering, c.wantN, c.wantCovering)
			}
			if p.HostBytes > c.capacity {
				t.Fatalf("plan uses %d bytes of a %d-byte buffer", p.HostBytes, c.capacity)
			}
			// Every block must be covered by exactly the bytes its host offset names.
			for i := 0; i < n; i++ {
				found := false
				for _, op := range p.Ops {
					if c.off[i] >= op.Dev && c.off[i]+c.lens[i] <= op.Dev+op.Len && p.HostOff[i] == op.Host+(c.off[i]-op.Dev) {
						found = true
					}
				}
				if !found {
					t.Fatalf("block %d is not covered by the plan", i)
				}
			}
		})
	}
}

// TestStagerRoundTrip moves random blocks device -> host -> device through
// the pinned buffer, on the gpudirect mock (which moves real bytes).
func TestStagerRoundTrip(t *testing.T) {
	m := cudatest.New()
	const size = 1 << 20
	src, _ := m.MemAlloc(0, size)
	dst, _ := m.MemAlloc(0, size)
	sb, _ := m.DeviceBytes(src, size)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range sb {
		sb[i] = byte(r.Uint32())
	}
	st, err := New(m, 0, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var off, lens []uint64
	for i := 0; i < 500; i++ {
		off = append(off, uint64(r.IntN(size/1024))*1024)
		lens = append(lens, uint64(1+r.IntN(1000)))
	}
	srcMem := memory.Memory{Kind: memory.CUDA, Addr: src, Len: size}
	dstMem := memory.Memory{Kind: memory.CUDA, Addr: dst, Len: size}
	for lo := 0; lo < len(off); {
		n, hostOff, err := st.Read(srcMem, off[lo:], lens[lo:])
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			o, l := off[lo+i], lens[lo+i]
			if !bytes.Equal(st.Buffer()[hostOff[i]:hostOff[i]+l], sb[o:o+l]) {
				t.Fatalf("block %d staged wrong", lo+i)
			}
		}
		if err := st.Write(dstMem, off[lo:lo+n], lens[lo:lo+n], hostOff[:n]); err != nil {
			t.Fatal(err)
		}
		lo += n
	}
	db, _ := m.DeviceBytes(dst, size)
	for i := range off {
		if !bytes.Equal(db[off[i]:off[i]+lens[i]], sb[off[i]:off[i]+lens[i]]) {
			t.Fatalf("block %d differs after the round trip", i)
		}
	}
}

func seq(n int, stride uint64) []uint64 {
	s := make([]uint64, n)
	for i := range s {
		s[i] = uint64(i) * stride
	}
	return s
}

func fill(n int, v uint64) []uint64 {
	s := make([]uint64, n)
	for i := range s {
		s[i] = v
	}
	return s
}
