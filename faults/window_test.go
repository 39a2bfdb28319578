//go:build faults

package faults

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fallbackLog samples the gateways' fallback admissions
// (admitted_total{path="fallback"}, summed) while a case runs, so that
// the bound over a window can count the fallback admissions that may lie
// in it and the debt they may leave.
type fallbackLog struct {
	stop chan struct{} // closed by end
	done chan struct{} // closed once the sampling goroutine has returned

	mu      sync.Mutex
	samples []fallbackSample
	err     error // the first failed scrape
}

// fallbackSample is one scrape of every gateway: the count is read
// somewhere between from and to.
type fallbackSample struct {
	from, to time.Time
	count    float64
}

// sampleFallback scrapes urls (gateway instances) every interval until
// end is called. Its first sample is taken before it returns: start it
// before the load, so that it reads 0 before the first request.
func sampleFallback(ctx context.Context, t *testing.T, urls []string, every time.Duration) *fallbackLog {
	t.Helper()
	l := &fallbackLog{stop: make(chan struct{}), done: make(chan struct{})}
	l.sample(ctx, urls)
	if l.err != nil {
		t.Fatal(l.err)
	}
	go func() {
		defer close(l.done)
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-l.stop:
				return
			case <-tk.C:
				l.sample(ctx, urls)
			}
		}
	}()
	return l
}

func (l *fallbackLog) sample(ctx context.Context, urls []string) {
	from := time.Now()
	c, err := readGateways(ctx, urls)
	s := fallbackSample{from: from, to: time.Now(), count: c.fallback}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		if l.err == nil {
			l.err = fmt.Errorf("sampling the gateways' fallback admissions: %w", err)
		}
		return
	}
	l.samples = append(l.samples, s)
}

// end stops the sampling and takes a last sample, after every answer the
// windows count; it fails the test if a scrape failed.
func (l *fallbackLog) end(ctx context.Context, t *testing.T, urls []string) {
	t.Helper()
	close(l.stop)
	<-l.done
	l.sample(ctx, urls)
	if l.err != nil {
		t.Fatal(l.err)
	}
}

// atMost returns an upper bound of the fallback admissions made by
// instant at: the first sample read wholly after it. ok is false if there
// is none.
func (l *fallbackLog) atMost(at time.Time) (n float64, ok bool) {
	i := slices.IndexFunc(l.samples, func(s fallbackSample) bool { return !s.from.Before(at) })
	if i < 0 {
		return 0, false
	}
	return l.samples[i].count, true
}

// atLeast returns a lower bound of the fallback admissions made by
// instant at: the last sample read wholly before it (0 if none).
func (l *fallbackLog) atLeast(at time.Time) float64 {
	n := 0.0
	for _, s := range l.samples {
		if s.to.After(at) {
			break
		}
		n = s.count
	}
	return n
}

// fault is one fault a case injected, from the moment it began to the
// moment the fleet was whole again: a window spans it if it contains both.
type fault struct {
	name     string
	from, to time.Time
}

// windows is a run's traffic on one key, for checkWindows.
type windows struct {
	rpm      int           // the key's limit: C = rpm requests, ρ = rpm/60 a second
	ttl      time.Duration // the allocator's lease TTL
	start    time.Time     // before the first request (the key is fresh: nothing admitted, no debt before)
	end      time.Time     // after the last answer
	admits   []span        // the clients' requests answered 200
	fallback []fallbackSample
	faults   []fault // reported: the tightest window spanning each
}

// window is one window's count against its limit.
type window struct {
	a, b     time.Time
	admitted int
	limit    float64
}

func (w window) margin() float64 { return w.limit - float64(w.admitted) }

func (w window) String() string {
	return fmt.Sprintf("%d admitted in a %.2f s window, limit %.1f", w.admitted, w.b.Sub(w.a).Seconds(), w.limit)
}

// windowReport is what checking every window found.
type windowReport struct {
	windows    int      // windows checked
	tightest   window   // the smallest margin
	perFault   []window // the smallest margin among the windows spanning each fault; limit +Inf if none does
	violations []window // windows over their limit (the first few)
}

// checkWindows checks the bound of docs/bound.md over every window of the
// run (see checkEveryWindow) and logs the tightest windows.
func checkWindows(t *testing.T, w windows) windowReport {
	t.Helper()
	r, err := checkEveryWindow(w)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range r.violations {
		t.Errorf("over-admission in the window (%.3f s, %.3f s] of the run (C=%d, ρ=%.1f/s, TTL=%v): %v",
			v.a.Sub(w.start).Seconds(), v.b.Sub(w.start).Seconds(), w.rpm, float64(w.rpm)/60, w.ttl, v)
	}
	t.Logf("bound over every window: %d windows of %d admissions; tightest (%.3f s, %.3f s]: %v",
		r.windows, len(w.admits), r.tightest.a.Sub(w.start).Seconds(), r.tightest.b.Sub(w.start).Seconds(), r.tightest)
	var margins []string
	for i, f := range w.faults {
		if math.IsInf(r.perFault[i].limit, 1) {
			t.Errorf("no window spans the fault %q: no request was answered 200 after it", f.name)
			continue
		}
		margins = append(margins, fmt.Sprintf("%s %.0f", f.name, r.perFault[i].margin()))
	}
	t.Logf("smallest margin (limit - admitted) over the windows spanning each fault: %s", strings.Join(margins, ", "))
	return r
}

// checkEveryWindow checks, for every window (a, b] of the run of length
// t, that
//
//	admitted ≤ C + ρ·(t + TTL) + D(a) + F(a, b)
//
// where D(a) is the debt the key's bucket owes at a and F(a, b) the
// fallback admissions in the window. Why: docs/bound.md's proof bounds
// what spenders admit from leases in (a, b], plus the debt charged in it,
// by C + ρ·(t + TTL) + D(b); the level goes below zero only by debt
// charged, so D(b) ≤ D(a) + the debt charged in (a, b], and the leased
// admissions alone are at most C + ρ·(t + TTL) + D(a). Fallback
// admissions are outside that (made without a grant, charged as debt
// later), so they are added. Here the only debt is fallback admissions
// reported (see checkBound), so D(a) is at most the fallback admissions
// made by a, and 0 at the run's start (a fresh key). Both fallback terms
// come from the samples, bounded from the side that loosens the limit.
//
// The clients do not see when a gateway admitted a request, only that it
// did so between sending it and reading the answer: a request is counted
// in every window that interval overlaps, which can only raise a window's
// count. The count of (a, b] is then the requests sent by b less those
// answered before a, so for a given a the excess is largest at some b
// that is a send instant, and for a given b at some a that is an answer
// instant or the start; checking every such pair checks every window.
// Windows that end at the run's end are checked too, so that a fault
// after which nothing was admitted (the key's bucket paying off debt) is
// still spanned by some.
func checkEveryWindow(w windows) (windowReport, error) {
	c, rho := float64(w.rpm), float64(w.rpm)/60
	sent := make([]time.Time, 0, len(w.admits))
	answered := make([]time.Time, 0, len(w.admits))
	for _, s := range w.admits {
		sent, answered = append(sent, s.sent), append(answered, s.answered)
	}
	slices.SortFunc(sent, time.Time.Compare)
	slices.SortFunc(answered, time.Time.Compare)
	fb := &fallbackLog{samples: w.fallback}
	// Per end b: requests sent by b (ties included), fallback admissions
	// made by b at most.
	type end struct {
		at     time.Time
		sentBy int
		fbMost float64
	}
	ends := make([]end, len(sent)+1)
	for i, b := range append(slices.Clone(sent), w.end) {
		n, ok := fb.atMost(b)
		if !ok {
			return windowReport{}, fmt.Errorf("no fallback sample read after a request sent %v into the run", b.Sub(w.start))
		}
		j, _ := slices.BinarySearchFunc(sent, b, func(x, y time.Time) int {
			if x.After(y) {
				return 1
			}
			return -1
		})
		ends[i] = end{at: b, sentBy: j, fbMost: n}
	}
	r := windowReport{tightest: window{limit: math.Inf(1)}, perFault: make([]window, len(w.faults))}
	for i := range r.perFault {
		r.perFault[i] = window{limit: math.Inf(1)}
	}
	for k, a := range append([]time.Time{w.start}, answered...) {
		before, _ := slices.BinarySearchFunc(answered, a, time.Time.Compare) // answered strictly before a
		debt, ok := fb.atMost(a)
		switch {
		case k == 0:
			debt = 0
		case !ok:
			return windowReport{}, fmt.Errorf("no fallback sample read after a request answered %v into the run", a.Sub(w.start))
		}
		fbLeast := fb.atLeast(a)
		for _, e := range ends {
			if e.at.Before(a) {
				continue
			}
			r.windows++
			win := window{a: a, b: e.at, admitted: e.sentBy - before,
				limit: c + rho*(e.at.Sub(a)+w.ttl).Seconds() + debt + (e.fbMost - fbLeast)}
			if win.margin() < r.tightest.margin() {
				r.tightest = win
			}
			for i, f := range w.faults {
				if !a.After(f.from) && !e.at.Before(f.to) && win.margin() < r.perFault[i].margin() {
					r.perFault[i] = win
				}
			}
			if win.margin() < 0 && len(r.violations) < 5 {
				r.violations = append(r.violations, win)
			}
		}
	}
	return r, nil
}
