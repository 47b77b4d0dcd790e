package transport

import (
	"fmt"
	"strings"
)

// Auto is the transport name that lets the daemons choose (local when the
// peer is on this host, else verbs when both have RDMA, else tcp).
const Auto = "auto"

// Names are the transport names every b2bd program accepts, in this order:
// the daemon's --transport, b2bctl transfer --transport, the Go and Python
// clients. Refusals list them (NamesList).
var Names = []string{Auto, string(TCP), string(Verbs), string(Local)}

// NamesList is Names as a phrase for messages: "auto, tcp, verbs or local".
func NamesList() string {
	return strings.Join(Names[:len(Names)-1], ", ") + " or " + Names[len(Names)-1]
}

// CheckName refuses a name that is not one of Names, listing them.
func CheckName(name string) error {
	for _, n := range Names {
		if name == n {
			return nil
		}
	}
	return fmt.Errorf("transport %q: want %s", name, NamesList())
}
