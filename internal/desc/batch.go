// Package desc decodes, validates and plans descriptor lists: the blocks of a
// BatchTransfer.
package desc

// Batch is a validated list of blocks as parallel arrays (structure of
// arrays, so transports and C code walk them without conversion). Entry i
// copies Len[i] bytes from Src[i] in the source region to Dst[i] in the
// destination region.
type Batch struct {
	Src []uint64
	Dst []uint64
	Len []uint64
}

// N is the number of blocks.
func (b *Batch) N() int { return len(b.Src) }

// Bytes is the total payload.
func (b *Batch) Bytes() uint64 {
	var t uint64
	for _, l := range b.Len {
		t += l
	}
	return t
}
