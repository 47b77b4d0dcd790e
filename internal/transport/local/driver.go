package local

import (
	"flag"
	"fmt"

	"github.com/b2bd/b2bd/internal/config"
	"github.com/b2bd/b2bd/internal/memory"
	"github.com/b2bd/b2bd/internal/transport"
)

// The same-host transport as a driver: the highest rank, usable only with
// a peer that proved it shares this host (Usable runs the proof on the
// peer's advert).
func init() {
	_ = transport.Register(transport.Driver{
		Kind:   transport.Local,
		Flags:  flags,
		Ranges: ranges,
		New:    newDriver,
		Caps: transport.Caps{Rank: 30, SameHostOnly: true, SingleConn: true, Memory: []memory.Kind{memory.Host, memory.CUDA}, Ops: transport.OpWrite | transport.OpRead, Blocks: true, Prepared: true,
			Keys: transport.KeyCaps{PerAccess: true, Rekey: true, RekeyRead: true}},
		Usable: usable,
	})
}

// settings are the kind's flags.
type settings struct {
	Streams int // --local-streams
}

func flags(fs *flag.FlagSet) any {
	s := &settings{}
	fs.IntVar(&s.Streams, "local-streams", 4, "local transport: streams a large GPU batch is spread over (a share of 1 MiB at least each, of blocks averaging 64 KiB or more), and a batch of smaller blocks is queued on in parts by as many threads (512 copies at least each, at most 4)")
	return s
}

var ranges = config.Ranges{
	"local-streams": config.Int{Min: 1, Max: MaxStreams},
}

func newDriver(env transport.Env) (transport.Transport, error) {
	s, ok := env.Settings.(*settings)
	if !ok {
		return nil, fmt.Errorf("samehost: settings %T are not the local driver's", env.Settings)
	}
	return New(Config{Dir: env.ShmDir, Group: env.Group, Node: env.Node, CUDA: env.CUDA, Streams: s.Streams}, env.Inbound, env.Log)
}

// usable is the same-host proof of the peer's advert.
func usable(t transport.Transport, advert []byte) error {
	lt, ok := t.(*Transport)
	if !ok {
		return fmt.Errorf("samehost: transport %T is not the local transport", t)
	}
	return lt.Reaches(advert)
}
