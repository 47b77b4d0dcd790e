package e2e

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/status"
)

// faultCases is the set of TestRemoteFaults' cases that B2B_FAULTS_CASES
// names (comma-separated: kill, link, deadline, cut, deregister, acl,
// load); every case when it is empty.
type faultCases map[string]bool

func parseFaultCases(v string) faultCases {
	if v == "" {
		return nil
	}
	c := faultCases{}
	for _, k := range strings.Split(v, ",") {
		c[strings.TrimSpace(k)] = true
	}
	return c
}

func (c faultCases) has(k string) bool { return c == nil || c[k] }

// faultRow is one line of the fault table: how many trials, how each
// ended, the slowest detection and how many trials had their data checked.
type faultRow struct {
	fault, transport string
	trials           int
	outcomes         map[string]int
	worst            time.Duration
	verified         int
	note             string
}

func newRow(fault, transport string) *faultRow {
	return &faultRow{fault: fault, transport: transport, outcomes: map[string]int{}}
}

func (f *faultRow) add(outcome string, detect time.Duration, verified bool) {
	f.trials++
	f.outcomes[outcome]++
	f.worst = max(f.worst, detect)
	if verified {
		f.verified++
	}
}

func (f *faultRow) print() {
	var oc []string
	for k, v := range f.outcomes {
		oc = append(oc, fmt.Sprintf("%s:%d", k, v))
	}
	note := ""
	if f.note != "" {
		note = "; " + f.note
	}
	sort.Strings(oc)
	fmt.Printf("FAULT | %s | %s | %d | %s | %v | %d/%d%s\n", f.fault, f.transport, f.trials, strings.Join(oc, " "),
		f.worst.Round(time.Millisecond), f.verified, f.trials, note)
}

// outcome names how a batch ended: OK or its gRPC code.
func outcome(err error) string {
	if err == nil {
		return "OK"
	}
	return status.Code(err).String()
}
