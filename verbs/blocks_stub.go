//go:build !cgo || !linux

package verbs

// BlockTable is a layout pair's templates in C memory (stub: needs cgo).
type BlockTable struct{}

// NewBlockTable is unavailable without cgo.
func NewBlockTable(groups []BlockGroup, nsrc, ndst int) (*BlockTable, error) {
	return nil, errUnavailable
}

func (t *BlockTable) SetSrc(i int, r BlockRegion) {}
func (t *BlockTable) SetDst(i int, r BlockRegion) {}
func (t *BlockTable) Src(i int) BlockRegion       { return BlockRegion{} }
func (t *BlockTable) Dst(i int) BlockRegion       { return BlockRegion{} }
func (t *BlockTable) Close() error                { return nil }

// BlockCursor is a QP's share of a block request (stub: needs cgo).
type BlockCursor struct{}

// NewBlockCursor is unavailable without cgo.
func NewBlockCursor(chunk int) (*BlockCursor, error) { return nil, errUnavailable }

func (c *BlockCursor) Start(from, to BlockPos)    {}
func (c *BlockCursor) Bad() (group, entry uint32) { return 0, 0 }
func (c *BlockCursor) Close() error               { return nil }

// ExpandBlocks is unavailable without cgo.
func (c *BlockCursor) ExpandBlocks(t *BlockTable, sid, did []uint32, src, dst, lens []uint64, first []uint32) (int, uint32, error) {
	return 0, 0, errUnavailable
}

// PlanBlocks is unavailable without cgo.
func (ch *Chain) PlanBlocks(t *BlockTable, c *BlockCursor, sid, did []uint32) (ChainResult, error) {
	return ChainResult{}, errUnavailable
}

// PostBlocks is unavailable without cgo.
func (q *QP) PostBlocks(ch *Chain, t *BlockTable, c *BlockCursor, sid, did []uint32) (ChainResult, error) {
	return ChainResult{}, errUnavailable
}
