package local

import (
	"fmt"
	"os"
	"time"
	"unsafe"

	"github.com/b2bd/b2bd/gpudirect"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/staging"
	"github.com/b2bd/b2bd/internal/transport"
)

// The host side of a host<->GPU batch is a region's shared memory: the
// sender's own region (host -> GPU) or its mapping of the receiver's file
// (GPU -> host). Pageable, the driver stages such copies itself on the
// compute engine, i.e. the SMs (host -> GPU: 2-16+ stalls of every SM per
// batch on an H100), and slowly (GPU -> host 170-360 ms for 10,000 blocks;
// docs/samehost.md). Registered with the driver (cuMemHostRegister,
// portable), the copies reach it by DMA on the copy engines, and gpudirect
// sends host -> GPU batches in primed chunks. The registration is made once
// per mapping, by the first Warm or batch that pairs it with a GPU, and
// undone before the memory is unmapped. Where the driver refuses it (the
// memlock limit, a file system whose pages cannot be pinned), the batches
// still run from pageable memory, and Status and the log (once) say so.

// hostPin is one host range registered with the CUDA driver, or the
// attempt that failed. Its owner's lock guards it.
type hostPin struct {
	tried bool
	addr  uintptr // page-aligned start of the registration; 0: none
	dev   int     // the device whose context registered it
}

// pin registers b, widened to whole pages, on dev; only the first call on
// p tries, so a refused registration is not retried batch after batch.
func (t *Transport) pin(p *hostPin, dev int, b []byte, what string) {
	cu := t.cfg.CUDA
	if p.tried || cu == nil || len(b) == 0 {
		return
	}
	p.tried = true
	base, n, _, ok := gpudirect.AlignRange(uintptr(unsafe.Pointer(unsafe.SliceData(b))), uint64(len(b)), uint64(os.Getpagesize()))
	if !ok {
		return
	}
	t0 := time.Now()
	if err := cu.HostRegister(dev, base, n); err != nil {
		t.pinFailed(what, n, err)
		return
	}
	p.addr, p.dev = base, dev
	t.log.Debug("samehost: host memory registered with the CUDA driver for host-GPU batches", "memory", what, "bytes", n, "device", dev, "took", time.Since(t0))
}

// unpin undoes pin; the memory may be unmapped after it returns.
func (t *Transport) unpin(p *hostPin) error {
	if p.addr == 0 {
		return nil
	}
	addr := p.addr
	p.addr = 0
	if err := t.cfg.CUDA.HostUnregister(p.dev, addr); err != nil {
		return fmt.Errorf("samehost: unregister host memory at %#x (device %d): %w", addr, p.dev, staging.DomainError(err))
	}
	return nil
}

func (t *Transport) pinFailed(what string, n uint64, err error) {
	t.pinMu.Lock()
	t.pinFails++
	first := t.pinFails == 1
	t.pinErr = err
	t.pinMu.Unlock()
	if first {
		t.log.Warn("samehost: cuMemHostRegister refused host memory of a host-GPU batch; such batches run from pageable memory, which the driver stages on the SMs, slowly (raise the memlock limit, or use --transport tcp for host-GPU batches); logged once, Status counts the rest",
			"memory", what, "bytes", n, "error", err)
		return
	}
	t.log.Debug("samehost: host memory left pageable", "memory", what, "bytes", n, "error", err)
}

// hostRoute is the Status line for host<->GPU batches.
func (t *Transport) hostRoute() string {
	t.pinMu.Lock()
	fails, err := t.pinFails, t.pinErr
	t.pinMu.Unlock()
	if fails == 0 {
		return "; host-GPU batches: host memory registered with the driver (pinned: copy engines, 0 SMs)"
	}
	return fmt.Sprintf("; host-GPU batches: %d host mapping(s) left pageable, the driver refused to register them (%v): those copies run on the SMs, slowly; TCP is the SM-free path for them", fails, err)
}

// pinHostSide registers the host side of a host<->GPU pair, once per
// mapping: the source region, or this connection's mapping of the
// destination. c.mu is held.
func (c *Conn) pinHostSide(src transport.Registration, sm memory.Memory, rm *remote) {
	if c.t.cfg.CUDA == nil {
		return
	}
	switch {
	case sm.Kind == memory.Host && rm.kind == kindCUDA:
		if r, ok := src.(*registration); ok {
			r.pinSource(rm.dev)
		}
	case sm.Kind == memory.CUDA && rm.kind == kindHost:
		c.t.pin(&rm.pin, sm.Device, rm.mm, "destination mapping")
	}
}

// pinSource registers the region's memory as a host-to-GPU source.
func (r *registration) pinSource(dev int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.closed && r.mem.Kind == memory.Host {
		r.t.pin(&r.pin, dev, r.mem.Host, "source region")
	}
}
