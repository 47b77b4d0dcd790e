// Package staging moves GPU blocks through pinned host buffers with the copy
// engines only (no kernels), for the TCP transport and for checksums.
//
// The measured costs drive the plan (../shared/notes/device.md and the
// gpudirect GPU test on an H100): a batched device-to-host copy costs about
// 0.4 us per block plus bytes at PCIe speed, whatever the block size, while a
// single copy of a covering range costs one launch plus its bytes. So dense
// sets of small blocks are staged by copying the range that covers them and
// picking the blocks out on the host; sparse or large blocks are copied one
// by one in a single batched call.
package staging

// Cost model constants (seconds), from the measurements above.
const (
	perBlockCopy = 0.4e-6 // batched copy engine cost per block
	perCopyCall  = 20e-6  // one cuMemcpy*Async + stream sync round trip
	pcieBytesPS  = 20e9   // effective host<->device bandwidth
)

// Op is one planned copy of Len bytes between device offset Dev and host
// buffer offset Host.
type Op struct{ Dev, Host, Len uint64 }

// Plan describes how blocks [0,n) land in (or come from) a host buffer.
type Plan struct {
	Ops []Op
	// HostOff[i] is block i's offset in the host buffer.
	HostOff []uint64
	// HostBytes is the host buffer space the plan uses.
	HostBytes uint64
	Covering  bool
}

// Reset empties p for reuse, keeping its arrays.
func (p *Plan) Reset() {
	p.Ops, p.HostOff, p.HostBytes, p.Covering = p.Ops[:0], p.HostOff[:0], 0, false
}

// PlanRead plans copying blocks (off[i], lens[i]) of device memory into a
// host buffer of capacity bytes, choosing covering or per-block copies by
// cost. It returns how many leading blocks the plan covers (at least one
// when lens[0] <= capacity), so callers stage a long list in rounds.
func PlanRead(p *Plan, off, lens []uint64, capacity uint64) int {
	p.Reset()
	// Take blocks while their compact size fits.
	n, bytes := 0, uint64(0)
	lo, hi := ^uint64(0), uint64(0)
	for n < len(off) && bytes+lens[n] <= capacity {
		bytes += lens[n]
		lo, hi = min(lo, off[n]), max(hi, off[n]+lens[n])
		n++
	}
	if n == 0 {
		return 0
	}
	span := hi - lo
	covering := float64(span)/pcieBytesPS + perCopyCall
	perBlock := float64(n)*perBlockCopy + float64(bytes)/pcieBytesPS + perCopyCall
	if span <= capacity && covering < perBlock {
		p.Covering = true
		p.Ops = append(p.Ops, Op{Dev: lo, Host: 0, Len: span})
		for i := 0; i < n; i++ {
			p.HostOff = append(p.HostOff, off[i]-lo)
		}
		p.HostBytes = span
		return n
	}
	var h uint64
	for i := 0; i < n; i++ {
		p.Ops = append(p.Ops, Op{Dev: off[i], Host: h, Len: lens[i]})
		p.HostOff = append(p.HostOff, h)
		h += lens[i]
	}
	p.HostBytes = h
	return n
}

// PlanWrite plans copying host-staged blocks to device memory. Writes are
// always per block: a covering write would also write the gaps between the
// blocks, clobbering bytes the batch does not own.
func PlanWrite(p *Plan, off, lens []uint64, capacity uint64) int {
	p.Reset()
	var h uint64
	n := 0
	for n < len(off) && h+lens[n] <= capacity {
		p.Ops = append(p.Ops, Op{Dev: off[n], Host: h, Len: lens[n]})
		p.HostOff = append(p.HostOff, h)
		h += lens[n]
		n++
	}
	p.HostBytes = h
	return n
}
