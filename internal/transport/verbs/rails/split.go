package rails

import "github.com/b2bd/b2bd/internal/desc"

// The slice policy, as the verbs QP split: blocks up to WholeBlock stay
// whole (on the rail whose share they start in), bigger ones may be cut at
// CutAlign boundaries of the block so the rails end together.
const (
	WholeBlock = 64 << 10
	CutAlign   = 4 << 10
)

// scratch holds one striped batch's shares; pooled, so a batch striped
// over rails allocates nothing once the pool is warm.
type scratch struct {
	src, dst, len []uint64
	shares        []desc.Batch
	bytes         []uint64
}

// reset forgets every share (their memory is reused by the next split).
func (sc *scratch) reset() {
	sc.src, sc.dst, sc.len, sc.shares, sc.bytes = sc.src[:0], sc.dst[:0], sc.len[:0], sc.shares[:0], sc.bytes[:0]
}

// split cuts b (total bytes) into at most n shares of about total/n bytes
// each, contiguous in b's order, appended to sc (shares made since the last
// reset stay valid); empty shares are dropped. It returns the new shares
// and their byte counts.
func (sc *scratch) split(b *desc.Batch, total uint64, n int) ([]desc.Batch, []uint64) {
	if need := len(sc.src) + b.N() + n; cap(sc.src) < need {
		// Shares made before keep the old arrays; nothing writes them again.
		sc.src, sc.dst, sc.len = make([]uint64, 0, need), make([]uint64, 0, need), make([]uint64, 0, need)
	}
	src, dst, ln := sc.src, sc.dst, sc.len
	shares, bytes := sc.shares, sc.bytes
	first := len(shares)
	start := len(src) // the current share's first entry in src/dst/len
	if n < 1 {
		n = 1
	}
	per := total / uint64(n)
	k := 0          // share being filled
	var acc uint64  // bytes placed in shares 0..k
	var from uint64 // acc when share k started
	tk := per       // target: shares 0..k end at this many bytes
	if n == 1 {
		tk = ^uint64(0)
	}
	for i, l := range b.Len {
		s, d := b.Src[i], b.Dst[i]
		var off uint64
		for off < l {
			piece := l - off
			if acc+piece > tk && l > WholeBlock {
				// Cut a big block where share k is full, at a CutAlign
				// boundary of the block.
				if cut := off + (tk-acc+CutAlign-1)/CutAlign*CutAlign; cut < l {
					piece = cut - off
				}
			}
			src, dst, ln = append(src, s+off), append(dst, d+off), append(ln, piece)
			acc += piece
			off += piece
			for acc >= tk {
				if len(src) > start {
					shares = append(shares, desc.Batch{Src: src[start:len(src):len(src)], Dst: dst[start:len(dst):len(dst)], Len: ln[start:len(ln):len(ln)]})
					bytes = append(bytes, acc-from)
				}
				start, from = len(src), acc
				k++
				tk += per
				if k == n-1 {
					tk = ^uint64(0)
				}
			}
		}
	}
	if len(src) > start {
		shares = append(shares, desc.Batch{Src: src[start:], Dst: dst[start:], Len: ln[start:]})
		bytes = append(bytes, acc-from)
	}
	sc.src, sc.dst, sc.len, sc.shares, sc.bytes = src, dst, ln, shares, bytes
	return shares[first:], bytes[first:]
}
