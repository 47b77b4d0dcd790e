//go:build !cgo || !linux

package verbs

// QP is a queue pair (stub).
type QP struct{}

func (pd *PD) NewRCQP(cfg QPConfig) (*QP, error) { return nil, errUnavailable }

func (q *QP) Num() uint32                          { return 0 }
func (q *QP) Caps() QPCaps                         { return QPCaps{} }
func (q *QP) ToInit(port int, access Access) error { return errUnavailable }
func (q *QP) ToRTR(a RTRAttr) error                { return errUnavailable }
func (q *QP) ToRTS(a RTSAttr) error                { return errUnavailable }
func (q *QP) ToError() error                       { return errUnavailable }
func (q *QP) State() (int, error)                  { return 0, errUnavailable }
func (q *QP) Close() error                         { return nil }
func (q *QP) PostSend(wrID uint64, op WROpcode, imm uint32, addr uint64, n, lkey uint32, signaled bool) error {
	return errUnavailable
}
