package local

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/b2bd/b2bd/internal/errs"
	localv1 "github.com/b2bd/b2bd/proto/b2b/transport/local/v1"
)

// Endpoint is what a daemon advertises for the same-host path: its boot
// ID, its Unix socket, and the file holding its secret token with the
// token's digest (never the token itself). Verify checks it. Peers carry
// it as the handshake's "local" advert (proto/b2b/transport/local/v1).
type Endpoint struct {
	BootID      string
	Socket      string
	TokenPath   string
	TokenDigest []byte
}

// MarshalEndpoint is ep as the handshake's local advert.
func MarshalEndpoint(ep Endpoint) []byte {
	b, _ := proto.Marshal(&localv1.Advert{BootId: ep.BootID, Socket: ep.Socket, TokenPath: ep.TokenPath, TokenDigest: ep.TokenDigest})
	return b
}

// ParseEndpoint reads a peer's local advert; CheckEndpoint checks its
// fields, Verify the proof.
func ParseEndpoint(b []byte) (Endpoint, error) {
	var a localv1.Advert
	if err := proto.Unmarshal(b, &a); err != nil {
		return Endpoint{}, fmt.Errorf("%w: local advert: %v", errs.ErrInvalidArgument, err)
	}
	return Endpoint{BootID: a.GetBootId(), Socket: a.GetSocket(), TokenPath: a.GetTokenPath(), TokenDigest: a.GetTokenDigest()}, nil
}

// verifyAdvert is Verify of a peer's advert bytes.
func verifyAdvert(b []byte) (Endpoint, []byte, error) {
	ep, err := ParseEndpoint(b)
	if err != nil {
		return ep, nil, err
	}
	tok, err := Verify(ep)
	return ep, tok, err
}
