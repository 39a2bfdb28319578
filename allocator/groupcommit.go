package allocator

import (
	"context"
	"sync"
	"time"
)

// groupCommit is the group commit that both durable paths of a Ledger
// share: the journal (store.go), where a commit is one bbolt transaction,
// and the cluster (replicated.go), where it is one raft log entry. Calls
// queue their work with the path, which numbers it (positions 1, 2, ...),
// then wait for their position.
//
// At most one commit is in flight. A call that finds none starts one,
// which commits everything queued so far on behalf of all the calls
// waiting; a call that finds one running waits for it, and if that commit
// did not cover its position, the first waiter to wake starts the next.
// So the calls that arrive during one commit share the next. Under
// concurrent load a commit first lingers (see lingerFor) so that more
// calls join. A commit runs on a goroutine of its own, so that a call
// whose context ends can leave without abandoning the commit halfway.
type groupCommit struct {
	linger time.Duration       // the longest a commit lingers; 0: never
	sleep  func(time.Duration) // time.Sleep; tests replace it

	// flush commits everything queued and returns the last position it
	// covered (what was queued when it took the queue). It runs on one
	// goroutine at a time. On error, nothing it took counts as committed:
	// the path keeps it for the next flush, the call that started it gets
	// the error, and the others waiting start one of their own.
	flush func() (end uint64, err error)

	mu        sync.Mutex
	inFlight  *commitRound // the commit running; nil: none
	done      uint64       // positions committed so far
	arrived   int          // calls that waited since the last commit began
	lastBatch int          // calls that waited during the previous commit cycle
}

// commitRound is one commit: finished is closed when it ends, once err
// (its flush's error) is set.
type commitRound struct {
	finished chan struct{}
	err      error
}

func newGroupCommit(linger time.Duration, flush func() (uint64, error)) *groupCommit {
	return &groupCommit{linger: linger, sleep: time.Sleep, flush: flush}
}

// wait returns once every position up to target is committed, with the
// error of a failed commit this call started, or with ctx.Err() as soon
// as ctx ends: what the call queued stays queued, and a commit in flight
// goes on (a commit cannot be abandoned halfway).
func (g *groupCommit) wait(ctx context.Context, target uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.arrived++
	var mine *commitRound // the last commit this call started
	for g.done < target {
		r := g.inFlight
		if r == nil {
			if mine != nil && mine.err != nil {
				return mine.err
			}
			r = g.start()
			mine = r
		}
		g.mu.Unlock()
		select {
		case <-r.finished:
		case <-ctx.Done():
			g.mu.Lock()
			return ctx.Err()
		}
		g.mu.Lock()
	}
	return nil
}

// start starts a commit; g.mu is held.
func (g *groupCommit) start() *commitRound {
	r := &commitRound{finished: make(chan struct{})}
	g.inFlight = r
	last := g.lastBatch
	go func() {
		// Under concurrent load, linger so that more calls share the
		// commit; a lone caller commits at once.
		if g.linger > 0 && last > 1 {
			g.lingerFor(g.linger, last)
		}
		g.mu.Lock()
		g.lastBatch, g.arrived = g.arrived, 0
		g.mu.Unlock()

		end, err := g.flush()

		g.mu.Lock()
		if err == nil {
			g.done = max(g.done, end)
		}
		r.err = err
		g.inFlight = nil
		close(r.finished)
		g.mu.Unlock()
	}()
	return r
}

// lingerStep is the step of a commit's linger.
const lingerStep = time.Millisecond

// lingerCalls is the batch that ends a linger early: shared by this many
// calls, a commit's fsyncs cost a few µs per call, so waiting longer would
// add latency for little gain.
const lingerCalls = 64

// sustainedBatch is the number of calls in a commit cycle from which the
// next linger counts the load as sustained (see lingerFor).
const sustainedBatch = lingerCalls / 4

// lingerFor waits for more calls to join the next commit, in steps of
// lingerStep, until lingerCalls calls wait for it, at most max in all; last
// is the number of calls in the previous commit cycle. After a light cycle
// (last below sustainedBatch) a step without a call ends it, so a sparse
// caller waits one step at most. After a sustained one a quiet step ends
// it only once as many calls wait as last time: under load calls arrive in
// bursts (a commit releases its batch at once), so a quiet millisecond says
// little, but once every caller of a small closed population waits, no
// call is coming.
func (g *groupCommit) lingerFor(max time.Duration, last int) {
	for waited := time.Duration(0); waited < max; waited += lingerStep {
		g.mu.Lock()
		before := g.arrived
		g.mu.Unlock()
		if before >= lingerCalls {
			return
		}
		g.sleep(min(lingerStep, max-waited))
		g.mu.Lock()
		now := g.arrived
		g.mu.Unlock()
		if now == before && (last < sustainedBatch || now >= last) {
			return
		}
	}
}
