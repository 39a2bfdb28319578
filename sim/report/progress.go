package report

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Progress draws a one-line progress bar over a sequence of runs. It
// stays silent until the whole sequence has taken more than two seconds
// of wall-clock time, so short invocations print nothing extra. The wall
// clock is read only for that decision and for redraw throttling; it
// never reaches a simulation.
type Progress struct {
	w       io.Writer
	on      bool
	runs    int
	done    int // runs finished
	start   time.Time
	last    time.Time
	drawn   bool
	current string
}

// NewProgress returns a bar for runs runs written to w; enabled false
// makes every method a no-op.
func NewProgress(w io.Writer, runs int, enabled bool) *Progress {
	return &Progress{w: w, on: enabled, runs: runs, start: time.Now()}
}

// Run starts the next run, named name, and returns the callback for
// engine.Config.Progress.
func (p *Progress) Run(name string) func(done, total time.Duration) {
	if !p.on {
		return nil
	}
	if p.current != "" {
		p.done++
	}
	p.current = name
	return func(done, total time.Duration) {
		frac := (float64(p.done) + float64(done)/float64(max(total, 1))) / float64(p.runs)
		p.draw(frac)
	}
}

func (p *Progress) draw(frac float64) {
	now := time.Now()
	if now.Sub(p.start) < 2*time.Second || now.Sub(p.last) < 100*time.Millisecond && frac < 1 {
		return
	}
	p.last, p.drawn = now, true
	const width = 30
	n := min(width, int(frac*width))
	fmt.Fprintf(p.w, "\r[%s%s] %3.0f%% run %d/%d %-28s", strings.Repeat("#", n), strings.Repeat(".", width-n), 100*frac, min(p.done+1, p.runs), p.runs, p.current)
}

// Done ends the bar's line, if it drew one.
func (p *Progress) Done() {
	if p.on && p.drawn {
		p.draw(1)
		fmt.Fprintln(p.w)
	}
}
