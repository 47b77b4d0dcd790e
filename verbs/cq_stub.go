//go:build !cgo || !linux

package verbs

// CompChannel is a completion channel (stub).
type CompChannel struct{}

func (c *Context) NewCompChannel() (*CompChannel, error) { return nil, errUnavailable }

func (ch *CompChannel) FD() int          { return -1 }
func (ch *CompChannel) DrainEvents() int { return 0 }
func (ch *CompChannel) Close() error     { return nil }

// CQ is a completion queue (stub).
type CQ struct{}

func (c *Context) NewCQ(cqe int, ch *CompChannel) (*CQ, error) { return nil, errUnavailable }

func (cq *CQ) Depth() int                 { return 0 }
func (cq *CQ) Arm() error                 { return errUnavailable }
func (cq *CQ) Poll(b *WCBuf) (int, error) { return 0, errUnavailable }
func (cq *CQ) Close() error               { return nil }

// WCBuf is a poll buffer (stub).
type WCBuf struct{}

// NewWCBuf is unavailable without cgo.
func NewWCBuf(n int) (*WCBuf, error) { return nil, errUnavailable }
func (b *WCBuf) At(i int) WC         { return WC{} }
func (b *WCBuf) Close() error        { return nil }
