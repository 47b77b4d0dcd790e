//go:build !cgo || !linux

package verbs

// Plan is a prepared batch (stub: the builder is C, so it needs cgo).
type Plan struct{}

// MaxPlanShares is the most shares (QPs) a Plan may have.
const MaxPlanShares = 256

// NewPlan is unavailable without cgo.
func NewPlan(p *ChainParams, src, dst, lens []uint64, cuts []Pos) (*Plan, error) {
	return nil, errUnavailable
}

func (pl *Plan) Shares() int                                   { return 0 }
func (pl *Plan) Totals() (wrs, sges int, bytes uint64)         { return 0, 0, 0 }
func (pl *Plan) ShareSize(k int) (wrs, sges int, bytes uint64) { return 0, 0, 0 }
func (pl *Plan) Start(k int, seq uint32)                       {}
func (pl *Plan) Left(k int) int                                { return 0 }
func (pl *Plan) Seq(k int) uint32                              { return 0 }
func (pl *Plan) Restamp(lkey uint32, srcBase uint64)           {}
func (pl *Plan) LKey() uint32                                  { return 0 }
func (pl *Plan) WR(k, j int) WRInfo                            { return WRInfo{} }
func (pl *Plan) WRNext(k, j int) bool                          { return false }
func (pl *Plan) Close() error                                  { return nil }

// Patch is unavailable without cgo.
func (pl *Plan) Patch(k int, maxWR int, maxBytes uint64, tag uint32) (int, uint64, error) {
	return 0, 0, errUnavailable
}

// PostPlan is unavailable without cgo.
func (q *QP) PostPlan(pl *Plan, k int, maxWR int, maxBytes uint64, tag uint32) (int, uint64, error) {
	return 0, 0, errUnavailable
}
