package tcp

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/b2bd/b2bd/internal/errs"
	tcpv1 "github.com/b2bd/b2bd/proto/b2b/transport/tcp/v1"
)

// The handshake's "tcp" advert (proto/b2b/transport/tcp/v1): the data
// listener and the session token a data stream presents.

// MarshalAdvert is what Advertise hands peers; tests build peers with it.
func MarshalAdvert(addr string, token []byte) []byte { return marshalAdvert(addr, token) }

func marshalAdvert(addr string, token []byte) []byte {
	b, _ := proto.Marshal(&tcpv1.Advert{DataAddress: addr, SessionToken: token})
	return b
}

func parseAdvert(b []byte) (*tcpv1.Advert, error) {
	var a tcpv1.Advert
	if err := proto.Unmarshal(b, &a); err != nil {
		return nil, fmt.Errorf("%w: tcp advert: %v", errs.ErrInvalidArgument, err)
	}
	return &a, nil
}
