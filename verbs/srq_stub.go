//go:build !cgo || !linux

package verbs

// SRQ is a shared receive queue (stub).
type SRQ struct{}

func (pd *PD) NewSRQ(maxWR, maxSGE int) (*SRQ, error) { return nil, errUnavailable }

func (s *SRQ) PostRecv(idx []uint32, base uint64, bufLen, lkey uint32) error { return errUnavailable }
func (s *SRQ) Close() error                                                  { return nil }
