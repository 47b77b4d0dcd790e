package region

import (
	"testing"
	"time"
)

// BenchmarkAllocHost measures registering a 1 GiB host region, which maps
// every page up front.
func BenchmarkAllocHost1G(b *testing.B) {
	g, err := New(Config{ShmDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		start := time.Now()
		r, err := g.AllocHost(1<<30, Export{}, Caller{})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(1<<30)/time.Since(start).Seconds()/1e9, "GB/s")
		if err := g.Deregister(r.ID); err != nil {
			b.Fatal(err)
		}
	}
}
