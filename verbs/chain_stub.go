//go:build !cgo || !linux

package verbs

// Chain is a WR chain (stub: the planner is C, so it needs cgo).
type Chain struct{}

// NewChain is unavailable without cgo.
func NewChain(capWR, capSGE int) (*Chain, error) { return nil, errUnavailable }

func (ch *Chain) Cap() (wrs, sges int)                         { return 0, 0 }
func (ch *Chain) Setup(p *ChainParams)                         {}
func (ch *Chain) SetMaxWR(n int)                               {}
func (ch *Chain) Start(from, to Pos, immLast bool, imm uint32) {}
func (ch *Chain) Cursor() Pos                                  { return Pos{} }
func (ch *Chain) Seq() uint32                                  { return 0 }
func (ch *Chain) SetSeq(s uint32)                              {}
func (ch *Chain) WR(j int) WRInfo                              { return WRInfo{} }
func (ch *Chain) Close() error                                 { return nil }

// Plan is unavailable without cgo.
func (ch *Chain) Plan(src, dst, lens []uint64) (ChainResult, error) {
	return ChainResult{}, errUnavailable
}

// PostChain is unavailable without cgo.
func (q *QP) PostChain(ch *Chain, src, dst, lens []uint64) (ChainResult, error) {
	return ChainResult{}, errUnavailable
}
