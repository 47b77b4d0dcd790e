package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

// progress draws a one-line bar on stderr while it is a terminal; anywhere
// else (a log, a pipe, CI) it stays silent so output files hold only results.
type progress struct {
	mu      sync.Mutex
	w       io.Writer
	on      bool
	width   int
	total   int // steps in the whole run
	done    int
	label   string
	start   time.Time
	drawn   bool
	lastLen int
}

func newProgress(stderr io.Writer, total int) *progress {
	p := &progress{w: stderr, total: max(1, total), start: time.Now(), width: 80}
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.on = true
		if w, _, err := term.GetSize(int(f.Fd())); err == nil && w > 40 {
			p.width = w
		}
	}
	return p
}

// step marks one unit of work done and shows what comes next.
func (p *progress) step(label string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = min(p.done+1, p.total)
	p.label = label
	p.draw()
}

// set shows what is happening without counting a step.
func (p *progress) set(label string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.label = label
	p.draw()
}

func (p *progress) draw() {
	if !p.on {
		return
	}
	el := time.Since(p.start).Round(time.Second)
	suffix := fmt.Sprintf(" %3d%% %s  %s", 100*p.done/p.total, el, p.label)
	const barLen = 30 // fixed, so the bar does not jump as labels change
	fill := barLen * p.done / p.total
	line := "[" + strings.Repeat("=", fill) + strings.Repeat(" ", barLen-fill) + "]" + suffix
	if len(line) > p.width-1 {
		line = line[:p.width-1]
	}
	pad := max(0, p.lastLen-len(line))
	fmt.Fprint(p.w, "\r"+line+strings.Repeat(" ", pad))
	p.lastLen = len(line)
	p.drawn = true
}

// clear erases the bar so that other output starts on a clean line; the
// next draw brings it back.
func (p *progress) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.on && p.drawn {
		fmt.Fprint(p.w, "\r"+strings.Repeat(" ", p.lastLen)+"\r")
		p.drawn, p.lastLen = false, 0
	}
}

// redraw shows the bar again after clear.
func (p *progress) redraw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.draw()
}
